"""Entry point: pinned source, patch stack and cmake builds.

    python harness/build.py --apply              # fetch the pin (first time) and apply patches/
    python harness/build.py --build              # ... and build (backend: cpu on Linux, metal on macOS arm64)
    python harness/build.py --status | --revert | --export
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `harness` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "harness"

from harness import config, patches, source  # noqa: E402
from harness.util import HarnessError, cache_lock, run, run_logged, say, which  # noqa: E402

BACKENDS = ("cpu", "metal", "cuda", "metal-emu")
DEFAULT_TARGETS = ("llama-server", "llama-cli", "llama-completion", "llama-quantize", "llama-bench",
                   "test-backend-ops", "test-quantize-fns", "test-batch-invariance", "ggml", "llama")
RPC_TARGETS = ("ggml-rpc-server",)  # built wherever -DGGML_RPC=ON is among the options
KEEP_BUILDS = 3  # per backend
# kernel files metal-emu translates by default: the ones its tests verify (ops of other files report
# unsupported); STQ_METAL_EMU_KERNELS=all (or a ;-list) overrides. Compile time is the reason.
METAL_EMU_KERNELS = ("mul_mv", "mul_mm", "quantize", "norm", "rope", "softmax", "binbcast", "unary",
                     "fa_aux", "fa_f16", "fa_vec_f16")


def default_backend() -> str:
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return "metal"
    return "cpu"


def default_cuda_arch() -> str:
    if which(["nvidia-smi"]):
        return "native"
    return "75;80;86;89;90"  # portable default: Turing .. Hopper


def default_targets(backend: str, extra: list[str] | None = None) -> tuple[str, ...]:
    """DEFAULT_TARGETS, plus the rpc-server for builds configured with ggml-rpc."""
    if "-DGGML_RPC=ON" in backend_flags(backend) + list(extra or []):
        return DEFAULT_TARGETS + RPC_TARGETS
    return DEFAULT_TARGETS


def metal_emu_missing() -> str | None:
    """Why this machine cannot build metal-emu (None when it can): the build, the tests' fixture and
    `./RUNBOOK.sh test`'s prebuild all ask here."""
    emu = config.METAL_SRC_DIR / "emu"
    if not emu.is_dir():
        return f"backend metal-emu needs the emulator sources in {emu}, which do not exist"
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"backend metal-emu runs on x86-64 hosts only (its fibers' context switch, {emu / 'emu-fiber.h'}); this is {platform.machine()}"
    if not (which(["clang-19"]) and which(["clang++-19"])):
        return "backend metal-emu needs clang-19/clang++-19 (`./RUNBOOK.sh setup` installs them on Debian/Ubuntu)"
    return None


def backend_flags(backend: str, cuda_arch: str | None = None) -> list[str]:
    if backend == "cpu":
        return ["-DGGML_RPC=ON"]  # ggml-rpc client + ggml-rpc-server (scale-out, issue 16)
    if backend == "metal":
        return ["-DGGML_METAL=ON", "-DGGML_METAL_EMBED_LIBRARY=ON"]
    if backend == "cuda":
        return ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch or default_cuda_arch()}"]
    if backend == "metal-emu":
        missing = metal_emu_missing()
        if missing:
            raise HarnessError(missing)
        emu = config.METAL_SRC_DIR / "emu"
        cc, cxx = which(["clang-19"]), which(["clang++-19"])
        kernels = os.environ.get("STQ_METAL_EMU_KERNELS", ";".join(METAL_EMU_KERNELS))
        return [f"-DCMAKE_C_COMPILER={cc}", f"-DCMAKE_CXX_COMPILER={cxx}",
                "-DGGML_METAL=ON", "-DGGML_METAL_EMU=ON", f"-DGGML_METAL_EMU_DIR={emu}",
                f"-DGGML_METAL_EMU_KERNELS={'' if kernels == 'all' else kernels}"]
    raise HarnessError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")


@functools.cache
def native_amx() -> bool:
    """Whether `-march=native` turns AMX on for this machine's CPU (the C compiler's predefined macros)."""
    cc = which(["cc", "gcc", "clang-19"])
    if not cc:
        return False
    r = subprocess.run([cc, "-march=native", "-dM", "-E", "-x", "c", os.devnull], capture_output=True, text=True)
    return r.returncode == 0 and "__AMX_INT8__" in r.stdout


AMX_OFF = "-U__AMX_TILE__ -U__AMX_INT8__ -U__AMX_BF16__"


def host_flags(backend: str) -> list[str]:
    """cmake options this machine's CPU needs. On a CPU with AMX, `-march=native` (GGML_NATIVE) compiles ggml-cpu's AMX
    path, which puts Q4_0/Q4_K/Q6_K/Q8_0 weights in its own buffer type whose matrix products give a batch's rows other
    bits than one row alone (test-batch-invariance: the series' lossless CPU speculation needs them equal; without patch
    0067 the path also crashed, upstream issue #20824). So the builds undefine the AMX macros: ggml-cpu then has no AMX
    buffer type and takes its AVX-512 kernels. Part of the build key. A later `--cmake-arg -DCMAKE_C_FLAGS=...` replaces
    these flags (cmake keeps the last value): that is how a test builds the AMX variant."""
    if backend in ("cpu", "metal-emu", "cuda") and native_amx():
        return [f"-DCMAKE_C_FLAGS={AMX_OFF}", f"-DCMAKE_CXX_FLAGS={AMX_OFF}"]
    return []


def cmake_args(src: Path, bdir: Path, backend: str, extra: list[str], cuda_arch: str | None) -> list[str]:
    args = ["cmake", "-S", str(src), "-B", str(bdir), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
            "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_BUILD_TESTS=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_USE_PREBUILT_UI=OFF"]
    if config.MEGAKERNEL_DIR.is_dir():  # the Gemma decode megakernel (patch 0050): host side + backend kernels
        args += [f"-DGGML_MEGAKERNEL_DIR={config.MEGAKERNEL_DIR}"]
    if which(["ccache"]):
        args += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
        if backend == "cuda":
            args += ["-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"]
    return args + host_flags(backend) + backend_flags(backend, cuda_arch) + list(extra)


def _dir_hash(d: Path, suffixes: tuple[str, ...] | None = None, skip: tuple[str, ...] = ()) -> str:
    h = hashlib.sha256()
    if d.is_dir():
        for p in sorted(d.rglob("*")):
            rel_parts = p.relative_to(d).parts
            if suffixes and p.suffix not in suffixes or rel_parts[0] in skip:
                continue
            if p.is_file() and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(d)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def build_key(tree: Path, backend: str, options: list[str]) -> str:
    """(pin, applied series / work-tree state, backend, options, emulator sources) -> key."""
    h = hashlib.sha256()
    h.update(config.PIN.encode())
    h.update(run(["git", "-C", str(tree), "rev-parse", "HEAD^{tree}"]).stdout.strip().encode())
    if patches.dirty_files(tree):  # a developer's uncommitted edits count too
        h.update(run(["git", "-C", str(tree), "diff", "HEAD"]).stdout.encode())
        h.update("\n".join(patches.dirty_files(tree)).encode())
    h.update(backend.encode())
    h.update("\0".join(options).encode())
    if backend == "metal-emu":
        h.update(_dir_hash(config.METAL_SRC_DIR).encode())
    # the sources the build compiles (not megakernel/tests, its scripts or docs)
    h.update(_dir_hash(config.MEGAKERNEL_DIR, suffixes=(".h", ".cpp", ".cu", ".cuh"), skip=("tests",)).encode())
    return h.hexdigest()[:16]


def _prune(backend: str, keep_dir: Path) -> None:
    dirs = sorted((d for d in config.builds_dir().glob(f"{backend}-*") if d.is_dir() and d != keep_dir),
                  key=lambda d: d.stat().st_mtime, reverse=True)
    for d in dirs[KEEP_BUILDS - 1:]:
        shutil.rmtree(d, ignore_errors=True)


def build(tree: Path, backend: str = "cpu", targets: tuple[str, ...] | list[str] = DEFAULT_TARGETS,
          jobs: int | None = None, extra: list[str] | None = None, cuda_arch: str | None = None) -> Path:
    """Configure and build `targets` for `backend`; reuse the keyed build dir when nothing changed."""
    extra = list(extra or [])
    opts = host_flags(backend) + backend_flags(backend, cuda_arch) + extra  # every cmake option is part of the key
    bdir = config.builds_dir() / f"{backend}-{build_key(tree, backend, opts)}"
    stamp = bdir / ".stq-built.json"
    want = sorted(set(targets))
    if stamp.exists():
        have = set(json.loads(stamp.read_text()).get("targets", []))
        if set(want) <= have:
            say(f"build {bdir.name} is up to date ({backend}, {len(want)} targets)")
            os.utime(bdir)
            return bdir
    bdir.mkdir(parents=True, exist_ok=True)
    jobs = jobs or os.cpu_count() or 2
    # relative paths inside the cache let ccache hit across cache roots (CI's, a developer's)
    env = {"CCACHE_BASEDIR": os.environ.get("CCACHE_BASEDIR", str(config.cache_dir()))}
    t0 = time.time()
    if not (bdir / "CMakeCache.txt").exists():
        say(f"configuring {backend} build in {bdir}")
        if host_flags(backend):
            say(f"this CPU has AMX: building {backend} without ggml's AMX path (its batched matrix products are not "
                f"batch-invariant, which lossless speculation on the CPU needs)")
        run_logged(cmake_args(tree, bdir, backend, extra, cuda_arch), bdir / "configure.log",
                   step=f"cmake configure ({backend})", echo=False, env=env)
    say(f"building {', '.join(want)} with {jobs} jobs (compiler output: {bdir / 'build.log'})")
    run_build(["cmake", "--build", str(bdir), "-j", str(jobs), "--target", *want], bdir / "build.log",
              step=f"cmake build ({backend})", env=env)
    have = set(want)
    if stamp.exists():
        have |= set(json.loads(stamp.read_text()).get("targets", []))
    stamp.write_text(json.dumps({"targets": sorted(have), "backend": backend, "seconds": time.time() - t0}))
    say(f"built in {time.time() - t0:.0f} s: {bdir}")
    _prune(backend, bdir)
    return bdir


_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\] ")


def run_build(cmd: list[str], log: Path, step: str, env: dict[str, str] | None = None,
              every: int = 10) -> None:
    """Run a build with all compiler output in `log` and only progress on the terminal: a line at
    every `every` percent of ninja's [done/total] steps, then the number of warnings (GCC 12 prints
    hundreds of false -Wuninitialized ones from its AVX-512 headers; they stay in the log).
    On failure raise HarnessError naming the step, the log, and the errors from its end."""
    full_env = dict(os.environ, **(env or {}))
    log.parent.mkdir(parents=True, exist_ok=True)
    last: deque[str] = deque(maxlen=60)
    warnings = shown = 0
    with open(log, "w") as lf:
        lf.write(f"$ {shlex.join(cmd)}\n")
        p = subprocess.Popen(cmd, env=full_env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             bufsize=1, errors="replace")
        assert p.stdout is not None
        for line in p.stdout:
            lf.write(line)
            last.append(line.rstrip("\n"))
            if "warning:" in line:
                warnings += 1
            m = _NINJA_STEP.match(line)
            if m:
                done, total = int(m.group(1)), int(m.group(2))
                pct = done * 100 // max(total, 1)
                if pct >= shown + every or done == total:
                    shown = pct - pct % every
                    say(f"  {step}: {done}/{total} steps ({pct}%)")
        rc = p.wait()
    if warnings:
        say(f"  {warnings} compiler warnings (in {log})")
    if rc != 0:
        errs = [x for x in last if "error" in x.lower() or "FAILED" in x]
        raise HarnessError(f"{step} failed (exit {rc}).\n  command: {shlex.join(cmd)}\n  full log: {log}\n"
                           f"--- last lines ---\n" + "\n".join(errs[-20:] or list(last)[-30:]))


def ensure_build(backend: str = "cpu", targets=None, tree: Path | None = None,
                 jobs: int | None = None, extra: list[str] | None = None) -> Path:
    """Fetch the pin if needed, apply patches/, build. What tests and the demo call. One process at a time does
    this (tree_lock): the work tree and its build folders are shared by every process on this cache."""
    with tree_lock():
        tree = source.ensure_tree(tree)
        patches.apply(tree)
        return build(tree, backend, targets or default_targets(backend), jobs, extra=extra)


def tree_lock():
    """The lock held while fetching, patching or building in this cache (harness.util.cache_lock)."""
    return cache_lock(config.cache_dir() / "locks" / "tree.lock", "fetching, patching or building llama.cpp")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python harness/build.py",
        description="Pinned llama.cpp + the stq-metal patch stack + cmake builds. With no action, "
                    "prints the patch status.")
    act = ap.add_argument_group("actions (combine --apply and --build; --build implies --apply)")
    act.add_argument("--apply", action="store_true",
                     help="fetch the pinned source if absent and apply patches/*.patch as commits "
                          "(a second --apply changes nothing)")
    act.add_argument("--revert", action="store_true",
                     help="return the work tree to the pin exactly (refuses work not saved in patches/)")
    act.add_argument("--status", action="store_true",
                     help="list applied / missing / locally modified patches and uncommitted files")
    act.add_argument("--export", action="store_true",
                     help="regenerate patches/ from the work-tree commits (stable bytes: no churn)")
    act.add_argument("--build", action="store_true", help="apply, then build the targets for --backend")
    ap.add_argument("command", nargs="?", choices=["export"],
                    help="`export` is the same as --export")
    src = ap.add_argument_group("source")
    src.add_argument("--source", choices=["sdist", "git"], default="sdist",
                     help="where to get the pin the first time: the llama-cpp-python sdist from PyPI "
                          "(default, sha256-verified) or a git clone of upstream")
    src.add_argument("--sdist", type=Path, help="use this local copy of the sdist instead of downloading it")
    src.add_argument("--llama-dir", type=Path,
                     help="use your own llama.cpp checkout (must be at the pin) as the work tree")
    src.add_argument("--cache-dir", type=Path,
                     help=f"cache root (default $STQ_METAL_CACHE or the XDG cache: {config.cache_dir()})")
    b = ap.add_argument_group("build")
    b.add_argument("--backend", choices=BACKENDS, default=None,
                   help=f"backend to build (default here: {default_backend()})")
    b.add_argument("--target", action="append", dest="targets",
                   help=f"cmake target, repeatable (default: {' '.join(DEFAULT_TARGETS)}; plus "
                        f"{' '.join(RPC_TARGETS)} when -DGGML_RPC=ON is set, as for cpu)")
    b.add_argument("--jobs", "-j", type=int, help="parallel build jobs (default: all cores)")
    b.add_argument("--cmake-arg", action="append", default=[], help="extra cmake -D option, repeatable")
    b.add_argument("--cuda-arch", help="CMAKE_CUDA_ARCHITECTURES for --backend cuda "
                                       "(default: native with a GPU, else 75;80;86;89;90)")
    ap.add_argument("--force", action="store_true", help="with --revert: discard commits not in patches/")
    args = ap.parse_args(argv)
    if args.cache_dir:
        os.environ["STQ_METAL_CACHE"] = str(args.cache_dir.expanduser().resolve())
    if args.command == "export":
        args.export = True
    try:
        with tree_lock():   # one process at a time in this cache's work tree and builds
            if args.llama_dir:
                tree = source.ensure_tree(args.llama_dir, user_tree=True)
            elif args.revert or args.status or args.export:
                tree = config.default_tree()
                if not tree.exists():
                    raise HarnessError(f"no work tree at {tree} yet: run `python harness/build.py --apply` first")
                source.check_user_tree(tree)
            else:
                tree = source.ensure_tree(None, source=args.source, sdist=args.sdist)
            if args.revert:
                patches.revert(tree, force=args.force)
            if args.export:
                rep = patches.export(tree)
                for k in ("written", "removed"):
                    for n in rep[k]:
                        say(f"{k} patches/{n}")
                say(f"export: {len(rep['written'])} written, {len(rep['unchanged'])} unchanged, "
                    f"{len(rep['removed'])} removed")
            if args.apply or args.build:
                patches.apply(tree)
            if args.build:
                backend = args.backend or default_backend()
                bdir = build(tree, backend, tuple(args.targets or default_targets(backend, args.cmake_arg)),
                             args.jobs, args.cmake_arg, args.cuda_arch)
                print(bdir)
            if args.status or not (args.apply or args.build or args.revert or args.export):
                st = patches.state(tree)
                print(f"work tree: {tree}\npin: {config.PIN}\n{patches.format_status(st)}")
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
