"""`stq-metal bench`: the benchmark front door (each benchmark is a module of its own).

Without arguments it lists the benchmarks with whether this machine can run them: a probe of what
each needs (a CUDA GPU that nvidia-smi lists; macOS on Apple silicon; a C compiler), not
the presence of its module."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import platform
import subprocess

from .util import which

BENCHES = {
    "cpu": ("harness.bench_cpu", "CPU matvec time ratios STQ1_0 / TQ2_0 / TQ1_0 / Q4_0"),
    "cuda": ("harness.bench_cuda", "CUDA STQ1_0 vs peers on the lent GPU"),
    "metal": ("harness.bench_metal", "Metal A/B kernels on a Mac"),
    "spec": ("harness.bench_spec", "cost of the batch-invariant CPU path (llama-bench, AB/BA)"),
    "megakernel": ("harness.bench_megakernel", "Gemma decode megakernel vs the CUDA/Metal graph (tok/s, verify cost)"),
    "mtp": ("harness.bench_mtp", "MTP speculation end to end through llama-server: megakernel and graph vs greedy"),
    "rpc": ("harness.bench_rpc", "ggml-rpc on loopback vs one process: tok/s ratio and bytes per token"),
}


def _cuda_gpus() -> list[str]:
    smi = which(["nvidia-smi"])
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [x for x in out.splitlines() if x.startswith("GPU ")]


def readiness(which_bench: str, system: str | None = None, machine: str | None = None) -> tuple[bool, str]:
    """(ready, why) for one benchmark on this machine (system/machine override platform for tests)."""
    system = system or platform.system()
    machine = machine or platform.machine()
    mod, _ = BENCHES[which_bench]
    if not importlib.util.find_spec(mod):
        return False, f"module {mod} does not exist yet"
    if which_bench == "megakernel" and system == "Darwin" and machine == "arm64":
        return True, "macOS arm64 (--backend metal)"
    if which_bench == "mtp" and system == "Darwin" and machine == "arm64":
        return True, "macOS arm64 (a Metal build of the series)"
    if which_bench in ("cuda", "megakernel", "mtp"):
        gpus = _cuda_gpus()
        if not gpus:
            return False, "needs an NVIDIA GPU (nvidia-smi lists none here)"
        return True, gpus[0]
    if which_bench == "metal":
        if system != "Darwin" or machine != "arm64":
            return False, f"needs macOS on Apple silicon (this is {system} {machine})"
        return True, "macOS arm64"
    if which_bench == "cpu" and not which(["cc", "gcc", "clang"]):
        return False, "needs a C compiler (cc, gcc or clang) for its driver"
    return True, "CPU build of the series"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="stq-metal bench", description="Run one benchmark; each prints ratios "
                                 "measured in one run (balanced AB/BA order, medians). Without a name: the list, "
                                 "with whether this machine can run each.")
    ap.add_argument("which", nargs="?", choices=sorted(BENCHES), help="benchmark to run")
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for that benchmark (see its --help)")
    args = ap.parse_args(argv)
    if not args.which:
        for k, (mod, desc) in BENCHES.items():
            ok, why = readiness(k)
            print(f"  {k:10s} {desc} [{'ready' if ok else 'not here'}: {why}]")
        return 0
    mod, _ = BENCHES[args.which]
    if not importlib.util.find_spec(mod):
        print(f"bench {args.which}: not yet (module {mod} does not exist yet)")
        return 0
    return importlib.import_module(mod).main(args.rest)
