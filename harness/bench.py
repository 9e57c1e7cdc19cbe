"""`stq-metal bench`: the benchmark front door (each benchmark is a module of its own)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util

BENCHES = {
    "cpu": ("harness.bench_cpu", "CPU matvec time ratios STQ1_0 / TQ2_0 / TQ1_0 / Q4_0"),
    "cuda": ("harness.bench_cuda", "CUDA STQ1_0 vs peers on the lent GPU"),
    "metal": ("harness.bench_metal", "Metal A/B kernels on a Mac"),
    "spec": ("harness.bench_spec", "cost of the batch-invariant CPU path (llama-bench, AB/BA)"),
    "rpc": ("harness.bench_rpc", "ggml-rpc on loopback vs one process: tok/s ratio and bytes per token"),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="stq-metal bench", description="Run one benchmark; each prints ratios "
                                 "measured in one run (balanced AB/BA order, medians).")
    ap.add_argument("which", nargs="?", choices=sorted(BENCHES), help="benchmark to run")
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for that benchmark (see its --help)")
    args = ap.parse_args(argv)
    if not args.which:
        for k, (mod, desc) in BENCHES.items():
            state = "ready" if importlib.util.find_spec(mod) else "not yet"
            print(f"  {k:6s} {desc} [{state}]")
        return 0
    mod, _ = BENCHES[args.which]
    if not importlib.util.find_spec(mod):
        print(f"bench {args.which}: not yet (module {mod} does not exist yet)")
        return 0
    return importlib.import_module(mod).main(args.rest)
