#!/usr/bin/env python3
"""Per-instruction reading of an ncu source page (`ncu -i REP --page source --csv --print-source sass`, plain or .gz):
the rows with the most long-scoreboard stall samples, with how often each ran, and (with --raw, the same launch's raw
CSV) the sampling interval, so that samples per execution become time: one sample per SM every N cycles, one warp of the
SM's W resident warps each time, so a warp's sample stands for ~W*N cycles of that warp.

    python3 bench/megakernel-sass/ncu-rows.py bench/megakernel-h200-2026-12-04/s29C-ncu-sass.csv.gz \
        --raw bench/megakernel-h200-2026-12-04/s29C-ncu-raw.csv.gz [--top 40] [--rows 7716-7886] [--by-count 7249-13282]

--by-count A-B groups rows A..B (e.g. one device function's: `harness.cuda_toolkit --sass --ncu` names them) by how
often each ran: code run by every warp (a prologue) apart from code run only by the warps with work (a chunk body),
each group's samples per execution as time and its top stall reasons.
"""
import argparse
import csv
import gzip


def rows_of(path):
    op = gzip.open if str(path).endswith(".gz") else open
    with op(path, "rt") as f:
        return list(csv.reader(f))


def num(x):
    try:
        return float(str(x).replace(",", "") or 0)
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", help="the ncu source page CSV (first row names the kernel)")
    ap.add_argument("--raw", help="the same launch's raw-metrics CSV: sampling interval, duration, clock")
    ap.add_argument("--top", type=int, default=40, help="rows with the most long-scoreboard samples (default 40)")
    ap.add_argument("--rows", action="append", default=[], help="A-B: also sum the samples of rows A..B (repeatable)")
    ap.add_argument("--by-count", action="append", default=[],
                    help="A-B: rows A..B grouped by their execution count (repeatable)")
    ap.add_argument("--warps", type=int, default=16, help="resident warps per SM (default 16: one 512-thread block)")
    a = ap.parse_args()
    t = rows_of(a.source)
    hdr, data = t[1], t[2:]
    ix = {h: i for i, h in enumerate(hdr)}
    S, EX, LSB, SRC = (ix["Warp Stall Sampling (All Samples)"], ix["Instructions Executed"], ix["stall_long_sb"],
                       ix["Source"])
    total = sum(num(r[S]) for r in data)
    us_per_sample = None
    if a.raw:
        r = rows_of(a.raw)
        h, u, v = r[0], r[1], r[2]
        m = {k: (u[i], v[i]) for i, k in enumerate(h)}
        cyc = num(m["smsp__pcsamp_interval_cycles"][1])
        ghz = num(m["gpc__cycles_elapsed.avg.per_second"][1])
        dur = num(m["gpu__time_duration.sum"][1])
        us_per_sample = a.warps*cyc/(ghz*1e3)
        print(f"launch {dur} ms, SM clock {ghz} GHz, one sample per SM every {cyc:.0f} cycles: a warp's sample ~ "
              f"{us_per_sample:.1f} us of that warp ({a.warps} resident warps)")
    print(f"{len(data)} SASS rows, {total:.0f} samples; long scoreboard {sum(num(r[LSB]) for r in data)/total*100:.1f} %")
    top = sorted(range(len(data)), key=lambda n: -num(data[n][LSB]))[:a.top]
    print(f"{'row':>6} {'long_sb':>8} {'executed':>9} {'us/exec':>8}  instruction")
    for n in sorted(top):
        r = data[n]
        ex = num(r[EX])
        per = f"{num(r[LSB])/ex*us_per_sample:8.3f}" if us_per_sample and ex else "       -"
        print(f"{n:6d} {num(r[LSB]):8.0f} {ex:9.0f} {per}  {r[SRC].strip()[:70]}")
    for span in a.rows:
        lo, hi = (int(x) for x in span.split("-"))
        part = data[lo:hi + 1]
        s = sum(num(r[S]) for r in part)
        ex = max((num(r[EX]) for r in part), default=0)
        per = f", {s/ex*us_per_sample:.2f} us a warp per execution" if us_per_sample and ex else ""
        print(f"rows {lo}-{hi}: {s:.0f} samples ({s/total*100:.2f} %), long scoreboard "
              f"{sum(num(r[LSB]) for r in part):.0f}, executed up to {ex:.0f} times{per}")
    stall = [(h[len("stall_"):], i) for h, i in ix.items() if h.startswith("stall_") and "Not Issued" not in h]
    for span in a.by_count:
        lo, hi = (int(x) for x in span.split("-"))
        groups = {}
        for r in data[lo:hi + 1]:
            g = groups.setdefault(num(r[EX]), {"rows": 0, "samples": 0.0, "stalls": {}})
            g["rows"] += 1
            g["samples"] += num(r[S])
            for k, i in stall:
                g["stalls"][k] = g["stalls"].get(k, 0.0) + num(r[i])
        print(f"rows {lo}-{hi} by execution count (the groups with the most samples):")
        for ex, g in sorted(groups.items(), key=lambda kv: -kv[1]["samples"])[:8]:
            per = g["samples"]/ex if ex else 0.0
            t = f", {per*us_per_sample:.2f} us a warp per execution" if us_per_sample and ex else ""
            top = ", ".join(f"{k} {v/g['samples']*100:.0f} %" for k, v in
                            sorted(g["stalls"].items(), key=lambda kv: -kv[1])[:4]) if g["samples"] else ""
            print(f"  executed {ex:8.0f} times: {g['rows']:5d} rows, {g['samples']:6.0f} samples, {per:.3f} an execution{t}; {top}")


if __name__ == "__main__":
    main()
