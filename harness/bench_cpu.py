"""CPU mat-vec benchmark: STQ1_0 against TQ2_0, TQ1_0 and Q4_0, reported as time ratios.

    python harness/bench_cpu.py --build BUILD_DIR [--shapes 6144x2048,16384x16384] [--threads 1,2]

BUILD_DIR is a CPU build of the patched llama.cpp (libggml*.so under BUILD_DIR/bin, as the harness
builds it; default: $STQ_CPU_BUILD, else the harness builds the `ggml` target). The script compiles
harness/bench_cpu_matvec.c against that build (cached next to it), then runs, per shape and thread
count, ONE process that holds a random M x K matrix in every type and times y = W x (N = 1 column):
each round runs REPS calls per type, the types in forward order on even rounds and reverse order on
odd rounds (balanced AB/BA), and keeps the median per type and round. The reported ratio is the
median over rounds of time(STQ1_0) / time(other) within the same round. Ratios < 1 mean STQ1_0 is
faster. Never a pass/fail: numbers to record in NOTES.md with the command, machine and date.

Weights are placed as llama.cpp places model weights by default (--buffers default): in the CPU
backend's repack buffer (CPU_REPACK) where it takes the type and shape, else in a plain CPU buffer.
--buffers plain forces plain buffers (the vec_dot path of every type); --buffers both times every
type both ways in the same process ("TYPE" and "TYPE:plain"). The buffer each entry went to is
printed ("path" lines) and shown in the table header.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `harness` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "harness"

from harness.util import HarnessError, atomic_write_bytes, say, which  # noqa: E402

DRIVER_SRC = Path(__file__).resolve().parent / "bench_cpu_matvec.c"
DEFAULT_TYPES = ("stq1_0", "tq2_0", "tq1_0", "q4_0")


def parse_shape(s: str) -> tuple[int, int]:
    try:
        m, k = (int(v) for v in s.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {s!r} is not MxK (rows x row length), e.g. 6144x2048")
    if m <= 0 or k <= 0 or k % 256:
        raise argparse.ArgumentTypeError(f"shape {s!r}: M and K must be > 0 and K a multiple of 256")
    return m, k


def source_dir_of(build: Path) -> Path:
    """The llama.cpp source tree a cmake build dir was configured from (for ggml/include)."""
    cache = build / "CMakeCache.txt"
    if not cache.exists():
        raise HarnessError(f"{build} is not a cmake build dir (no CMakeCache.txt); pass --build")
    for line in cache.read_text(errors="replace").splitlines():
        if line.startswith("CMAKE_HOME_DIRECTORY:INTERNAL="):
            return Path(line.split("=", 1)[1])
    raise HarnessError(f"{cache} does not name CMAKE_HOME_DIRECTORY")


def compile_driver(build: Path, cc: str | None) -> Path:
    bindir = build / "bin"
    if not (bindir / "libggml-cpu.so").exists() and not (bindir / "libggml-cpu.dylib").exists():
        raise HarnessError(f"no libggml-cpu in {bindir}: build the `ggml` target of a CPU build first")
    include = source_dir_of(build) / "ggml" / "include"
    cc = cc or os.environ.get("CC") or which(["cc", "clang", "gcc", "clang-19"])
    if not cc:
        raise HarnessError("no C compiler found (set CC or pass --cc)")
    out = build / "stq-bench" / "bench_cpu_matvec"
    src_mtime = DRIVER_SRC.stat().st_mtime
    if out.exists() and out.stat().st_mtime >= src_mtime:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    cmd = [cc, "-O2", "-o", str(tmp), str(DRIVER_SRC), f"-I{include}", f"-L{bindir}",
           "-lggml", "-lggml-base", "-lggml-cpu", f"-Wl,-rpath,{bindir}"]
    p = subprocess.run(cmd, text=True, capture_output=True)
    if p.returncode != 0:
        raise HarnessError(f"compiling {DRIVER_SRC.name} failed:\n$ {' '.join(cmd)}\n{p.stderr[-4000:]}")
    os.replace(tmp, out)
    return out


def run_shape(driver: Path, m: int, k: int, threads: int, rounds: int, reps: int,
              types: list[str], paths: dict[str, str] | None = None) -> dict[str, list[float]]:
    cmd = [str(driver), str(m), str(k), "1", str(threads), str(rounds), str(reps), *types]
    p = subprocess.run(cmd, text=True, capture_output=True)
    if p.returncode != 0:
        raise HarnessError(f"benchmark run failed ({p.returncode}):\n$ {' '.join(cmd)}\n{p.stderr[-4000:]}")
    per_round: dict[int, dict[str, float]] = {}
    for line in p.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "round":
            per_round.setdefault(int(parts[1]), {})[parts[2]] = float(parts[3])
        elif len(parts) == 3 and parts[0] == "path" and paths is not None:
            paths[parts[1]] = parts[2]
    times: dict[str, list[float]] = {t: [] for t in types}
    for r in sorted(per_round):
        for t in types:
            if t not in per_round[r]:
                raise HarnessError(f"benchmark output lacks round {r} of {t}:\n{p.stdout[-2000:]}")
            times[t].append(per_round[r][t])
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="stq-metal bench cpu", description=__doc__.split("\n\n")[0],
                                 epilog="Prints a table of median times and ratios STQ1_0 / other "
                                        "(balanced AB/BA rounds, medians).")
    ap.add_argument("--build", type=Path, default=None,
                    help="CPU build dir of the patched tree (default: $STQ_CPU_BUILD, else the harness builds one)")
    ap.add_argument("--shapes", type=lambda s: [parse_shape(x) for x in s.split(",")],
                    default=[(6144, 2048), (16384, 16384)],
                    help="comma-separated MxK (rows x row length), default 6144x2048,16384x16384")
    ap.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2],
                    help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--types", default=",".join(DEFAULT_TYPES),
                    help="candidate first, then the baselines (default stq1_0,tq2_0,tq1_0,q4_0)")
    ap.add_argument("--rounds", type=int, default=8, help="AB/BA rounds per shape (default 8, even)")
    ap.add_argument("--reps", type=int, default=0,
                    help="timed calls per type and round (default: about 0.1 s worth, at least 5)")
    ap.add_argument("--buffers", choices=("default", "plain", "both"), default="default",
                    help="weights as llama.cpp places them (default: CPU_REPACK where supported), in plain "
                         "CPU buffers (plain), or each type both ways (both)")
    ap.add_argument("--cc", default=None, help="C compiler for the driver (default: $CC, cc, clang, gcc)")
    args = ap.parse_args(argv)

    types = [t.strip().lower() for t in args.types.split(",") if t.strip()]
    if args.buffers == "plain":
        types = [f"{t}:plain" for t in types]
    elif args.buffers == "both":
        types = [v for t in types for v in (t, f"{t}:plain")]
    if len(types) < 2:
        ap.error("--types needs a candidate and at least one baseline")
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (one AB and one BA)")

    build = args.build or (Path(os.environ["STQ_CPU_BUILD"]) if os.environ.get("STQ_CPU_BUILD") else None)
    if build is None:
        from harness import build as hbuild
        build = hbuild.ensure_build("cpu", targets=("ggml",))
    build = build.resolve()
    driver = compile_driver(build, args.cc)

    cand = types[0]
    say(f"machine: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} cpus; build {build}")
    say(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; rounds {args.rounds}")
    rows = []
    paths: dict[str, str] = {}
    for (m, k) in args.shapes:
        for th in args.threads:
            reps = args.reps or max(5, min(200, int(0.1e6 / max(1.0, m * k / 4e3 / th))))
            times = run_shape(driver, m, k, th, args.rounds, reps, types, paths)
            med = {t: statistics.median(v) for t, v in times.items()}
            ratios = {t: statistics.median(a / b for a, b in zip(times[cand], times[t])) for t in types[1:]}
            rows.append((m, k, th, reps, med, ratios))
            line = f"{m}x{k} t={th}: " + "  ".join(f"{t} {med[t]:.1f} us" for t in types)
            line += "  |  " + "  ".join(f"{cand}/{t} {ratios[t]:.3f}" for t in types[1:])
            print(line, flush=True)

    print()
    print("buffers: " + ", ".join(f"{t} -> {paths.get(t, '?')}" for t in types))
    print()
    print("| shape (MxK) | threads | " + " | ".join(f"{t} us" for t in types) + " | " +
          " | ".join(f"{cand}/{t}" for t in types[1:]) + " |")
    print("|---|---|" + "---|" * (2 * len(types) - 1))
    for (m, k, th, reps, med, ratios) in rows:
        print(f"| {m}x{k} | {th} | " + " | ".join(f"{med[t]:.1f}" for t in types) + " | " +
              " | ".join(f"{ratios[t]:.3f}" for t in types[1:]) + " |")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
