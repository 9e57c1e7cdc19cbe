#!/usr/bin/env python3
"""Where one megakernel launch's time and instructions go, per device function, from ncu's per-SASS-instruction CSV
(megakernel/device.sh stage ncusrc writes it as ncu-sass.csv; the bench folders keep it gzipped).

    python3 ncu_functions.py callC-ncu-sass.csv.gz [--opcodes N]

The CSV lists the kernel's SASS with addresses; a function starts at the kernel's first address or at a target of a
`CALL.REL.NOINC` (the non-inlined device functions: mk_mv_run<1>, mk_stage, mk_mv_begin, ...). Per function: its
instructions, its share of the warp-state samples, the warp-instructions executed, the top stall reasons of its
samples and (--opcodes) its most executed opcodes. Name the functions by their sizes against a SASS listing
(harness/cuda_toolkit.sass_report) of the same build.
"""
import argparse
import bisect
import collections
import csv
import gzip
import re
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output (.csv or .csv.gz)")
    ap.add_argument("--opcodes", type=int, default=8, help="most executed opcodes to print per function (0: none)")
    args = ap.parse_args()
    opener = gzip.open if args.csv.endswith(".gz") else open
    with opener(args.csv, "rt", newline="") as f:
        rows = list(csv.reader(f))
    hdr_at = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if hdr_at is None:
        print(f"{args.csv}: no 'Address' header row: not an ncu source page CSV", file=sys.stderr)
        return 1
    hdr, data = rows[hdr_at], [r for r in rows[hdr_at + 1:] if r and r[0].startswith("0x")]
    ix = {h: i for i, h in enumerate(hdr)}
    for need in ("Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"):
        if need not in ix:
            print(f"{args.csv}: column '{need}' missing", file=sys.stderr)
            return 1
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    base = int(data[0][0], 16)
    starts = {base}
    for r in data:
        m = re.search(r"CALL\.REL\.NOINC (0x[0-9a-f]+)", r[ix["Source"]])
        if m:
            starts.add(int(m.group(1), 16))
    starts = sorted(starts)
    agg = collections.defaultdict(collections.Counter)
    ops = collections.defaultdict(collections.Counter)

    def num(r, col):
        v = r[ix[col]].strip()
        return int(v) if v.isdigit() else 0

    for r in data:
        f = starts[bisect.bisect_right(starts, int(r[0], 16)) - 1]
        c = agg[f]
        c["n"] += 1
        c["samples"] += num(r, "Warp Stall Sampling (All Samples)")
        e = num(r, "Instructions Executed")
        c["exec"] += e
        for s in stalls:
            c[s] += num(r, s)
        words = r[ix["Source"]].split()
        if words and words[0].startswith("@"):
            words = words[1:]
        if words:
            ops[f][words[0].split(".")[0]] += e
    tot = sum(c["samples"] for c in agg.values()) or 1
    tot_exec = sum(c["exec"] for c in agg.values()) or 1
    print(f"{args.csv}: {len(data)} SASS instructions, {len(starts)} functions, {tot} samples, {tot_exec:.3e} warp-instructions")
    for f in starts:
        c = agg[f]
        if c["exec"] == 0 and c["samples"] == 0:
            continue
        top = sorted(((c[s], s) for s in stalls), reverse=True)[:4]
        print(f"+0x{f - base:06x} {c['n']:5d} instr  samples {100*c['samples']/tot:5.1f} %  executed {c['exec']:.3e} "
              f"({100*c['exec']/tot_exec:4.1f} %)  " + " ".join(f"{s[6:]}={100*v/max(1, c['samples']):.0f}%" for v, s in top))
        if args.opcodes:
            print("          " + ", ".join(f"{o} {n/1e6:.1f}M" for o, n in ops[f].most_common(args.opcodes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
