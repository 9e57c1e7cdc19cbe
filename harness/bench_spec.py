"""What the batch-invariant CPU path costs: llama-bench with GGML_CPU_BATCH_INVARIANT=0 (upstream
kernel selection, "off") against the default ("on"), in one run, balanced AB/BA order, medians.

    python -m harness.bench_spec --bin BUILD/bin --model gemma-3-270m-q4_k_m.gguf [--rounds 4] [-t 2]

Tests: tg (plain one-token decode), pp512 (prompt processing at batch 512) and ppN for small N
(pp5 and pp9 cost what a verify pass of k = 4 and k = 8 drafts costs). Each round runs llama-bench
once per setting (order alternating AB, BA, ...); the ratio on/off is the median over rounds of
the per-round ratios of mean tokens per second. Above 1 means the invariant path is faster.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
from pathlib import Path


def bench_once(bin_dir: Path, model: Path, env_value: str | None, threads: int, reps: int,
               pp: list[int], tg: int, fa: str) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("GGML_CPU_BATCH_INVARIANT", None)
    if env_value is not None:
        env["GGML_CPU_BATCH_INVARIANT"] = env_value
    cmd = [str(bin_dir / "llama-bench"), "-m", str(model), "-t", str(threads), "-r", str(reps), "-o", "json",
           "-fa", fa, "-p", ",".join(str(p) for p in pp), "-n", str(tg)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    out = {}
    for row in json.loads(r.stdout):
        name = f"pp{row['n_prompt']}" if row["n_prompt"] else f"tg{row['n_gen']}"
        out[name] = float(row["avg_ts"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="stq-metal bench spec", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", type=Path, required=True, help="folder with llama-bench")
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=4, help="AB/BA rounds (default 4)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--reps", type=int, default=3, help="llama-bench repetitions per run (default 3)")
    ap.add_argument("--pp", default="5,9,512", help="prompt sizes (default 5,9,512)")
    ap.add_argument("--tg", type=int, default=64, help="generated tokens for tg (default 64)")
    ap.add_argument("-fa", default="1", help="flash attention for llama-bench (default 1)")
    ap.add_argument("--on", default=None, help="GGML_CPU_BATCH_INVARIANT value for 'on' (default: unset)")
    args = ap.parse_args(argv)

    pp = [int(x) for x in args.pp.split(",") if x]
    runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    for r in range(args.rounds):
        order = ["off", "on"] if r % 2 == 0 else ["on", "off"]
        for which in order:
            res = bench_once(args.bin, args.model, "0" if which == "off" else args.on, args.threads, args.reps,
                             pp, args.tg, args.fa)
            runs[which].append(res)
            print(f"round {r} {which:3s}: " + ", ".join(f"{k} {v:.1f}" for k, v in res.items()), flush=True)

    print()
    print(f"{'test':8s} {'off tok/s':>10s} {'on tok/s':>10s} {'on/off':>8s}   (medians over {args.rounds} rounds, "
          f"-t {args.threads}, -fa {args.fa})")
    for name in runs["off"][0]:
        off = [x[name] for x in runs["off"]]
        on = [x[name] for x in runs["on"]]
        ratio = statistics.median(b / a for a, b in zip(off, on))
        print(f"{name:8s} {statistics.median(off):10.1f} {statistics.median(on):10.1f} {ratio:8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
