"""CUDA device code compiled on a machine without a GPU or a CUDA installation.

NVIDIA publishes the CUDA headers and ptxas as PyPI wheels; clang-19 compiles CUDA with them
(`--cuda-path`, device side only: no fatbinary, no GPU). That checks the megakernel's CUDA sources
and reports registers and spills on every CI run, between the rare runs on a lent GPU.

    python -m harness.cuda_toolkit [--arch sm_90] FILE.cu ...          # compile check, ptxas report
    python -m harness.cuda_toolkit --sass [-I DIR ...] FILE.cu ...     # + per function: instructions, spills
                                                                         #   and spills inside loops (nvdisasm)

The SASS report reads the compiled code with nvdisasm (also a PyPI wheel): local-memory loads and stores
(spills) inside a loop of a hot function cost every iteration an L1/L2 round trip; ptxas -v only gives
per-function byte totals, and those include the cheap saves at a function's entry and exit.

    python -m harness.cuda_toolkit --nvcc --sass [-I DIR ...] FILE.cu ...  # the same with nvcc itself

clang's code is a proxy: nvcc (CUDA 13.0, the lent H200's compiler, also PyPI wheels: nvcc, cudafe++, cicc, ptxas and
the headers) makes other code from the same source, e.g. the megakernel's mat-vec without the spills clang gives it,
and shared-memory loads where clang emits generic ones (and nvcc too, where an address went through an integer).
With --nvcc the report is of the code the device build runs (ggml-cuda's flags; a host compiler for nvcc's
preprocessing, g++, is needed).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import csv
import gzip
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from . import config
from .util import HarnessError, say

# the wheels and what is taken from each (the cuBLAS wheel only for its headers: ggml-cuda includes them)
WHEELS = {
    "nvidia-cuda-nvcc-cu12==12.8.93": ("nvidia/cuda_nvcc/include/", "nvidia/cuda_nvcc/bin/ptxas",
                                       "nvidia/cuda_nvcc/nvvm/libdevice/"),
    "nvidia-cuda-runtime-cu12==12.8.90": ("nvidia/cuda_runtime/include/",),
    "nvidia-cuda-cccl-cu12==12.9.27": ("nvidia/cuda_cccl/include/",),
    "nvidia-cublas-cu12==12.8.4.1": ("nvidia/cublas/include/",),
}
VERSION = "12.8"
# nvdisasm for the SASS report (its own wheel; any recent one reads sm_90 code)
NVDISASM_WHEEL = "nvidia-cuda-nvdisasm==13.5.37"


# nvcc itself: CUDA 13.0, the version of the lent H200's toolkit (megakernel/device.sh builds with it), as wheels: the
# compiler driver and front end, NVVM (cicc), the C runtime and the headers (cuBLAS's, which ggml-cuda includes, come
# from the CUDA 12.8 tree above: only declarations)
NVCC_VERSION = "13.0"
NVCC_WHEELS = {
    "nvidia-cuda-nvcc==13.0.88": ("nvidia/cu13/bin/nvcc", "nvidia/cu13/bin/nvcc.profile", "nvidia/cu13/bin/cudafe++",
                                  "nvidia/cu13/bin/ptxas", "nvidia/cu13/bin/crt/"),
    "nvidia-nvvm==13.0.88": ("nvidia/cu13/nvvm/",),
    "nvidia-cuda-crt==13.0.88": ("nvidia/cu13/include/",),
    "nvidia-cuda-runtime==13.0.96": ("nvidia/cu13/include/",),
    "nvidia-cuda-cccl==13.0.85": ("nvidia/cu13/include/",),
}
# ggml-cuda's flags for its .cu files (ggml/src/ggml-cuda/CMakeLists.txt, a Release build) and the megakernel's define
NVCC_FLAGS = ["-std=c++17", "-O3", "-DNDEBUG", "-use_fast_math", "-extended-lambda", "-DGGML_CUDA_MEGAKERNEL"]


def toolkit_dir() -> Path:
    return config.cache_dir() / f"cuda-headers-{VERSION}"


def _pip_download(specs: list[str]) -> Path:
    """pip download of the wheels specs ("name==version") into the cache's download folder (pip skips those there); returns
    the folder"""
    dl = config.cache_dir() / "downloads" / "cuda-wheels"
    dl.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--platform", "manylinux_2_27_x86_64", "--platform", "manylinux2014_x86_64",
                        "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux_2_12_x86_64", "-d", str(dl), *specs],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise HarnessError(f"pip download of {', '.join(specs)} failed:\n{r.stderr[-2000:]}")
    return dl


def _wheel(spec: str, dl: Path) -> Path:
    """the downloaded wheel of spec ("name==version") in dl"""
    name, ver = spec.split("==")
    whl = sorted(dl.glob(f"{name.replace('-', '_')}-{ver}-*.whl"))
    if not whl:
        raise HarnessError(f"{spec}: no wheel in {dl} after pip download")
    return whl[0]


def ensure_toolkit() -> Path:
    """A minimal CUDA tree (include/, bin/ptxas, nvvm/libdevice/) for clang's --cuda-path."""
    tk = toolkit_dir()
    if (tk / ".complete").exists():
        return tk
    say(f"fetching the CUDA {VERSION} headers and ptxas from PyPI into {tk} (once)")
    dl = _pip_download(list(WHEELS))
    tmp = tk.with_name(tk.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for spec, parts in WHEELS.items():
        with zipfile.ZipFile(_wheel(spec, dl)) as z:
            for member in z.namelist():
                for part in parts:
                    if member.startswith(part) and not member.endswith("/"):
                        rel = member[len(part):] if part.endswith("/") else Path(member).name
                        sub = "include" if "/include/" in part else ("nvvm/libdevice" if "libdevice" in part else "bin")
                        dest = tmp / sub / rel
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        dest.write_bytes(z.read(member))
    (tmp / "bin" / "ptxas").chmod(0o755)
    # clang's CUDA wrapper includes a cuRAND header that the kernels never use
    (tmp / "include" / "curand_mtgp32_kernel.h").write_text("// stub: cuRAND is not used (stq-metal)\n")
    (tmp / "version.txt").write_text(f"CUDA Version {VERSION}.0\n")
    (tmp / ".complete").write_text("ok\n")
    shutil.rmtree(tk, ignore_errors=True)
    tmp.rename(tk)
    return tk


def ensure_nvcc() -> Path:
    """nvcc (NVCC_VERSION) with what it runs (cudafe++, cicc, ptxas) and the headers, from PyPI wheels (fetched once,
    ~105 MB): a tree whose bin/nvcc compiles device code as the device build does. Returns the nvcc executable."""
    tk = config.cache_dir() / f"cuda-nvcc-{NVCC_VERSION}"
    if (tk / ".complete").exists():
        return tk / "bin" / "nvcc"
    headers = ensure_toolkit()   # (cuBLAS's headers)
    say(f"fetching nvcc {NVCC_VERSION} (nvcc, cudafe++, cicc, ptxas, headers; ~105 MB) from PyPI into {tk} (once)")
    dl = _pip_download(list(NVCC_WHEELS))
    tmp = tk.with_name(tk.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    prefix = "nvidia/cu13/"
    for spec, parts in NVCC_WHEELS.items():
        with zipfile.ZipFile(_wheel(spec, dl)) as z:
            for member in z.namelist():
                if member.endswith("/") or not any(member == p or (p.endswith("/") and member.startswith(p)) for p in parts):
                    continue
                dest = tmp / member[len(prefix):]
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(z.read(member))
    for exe in [tmp / "bin" / "nvcc", tmp / "bin" / "cudafe++", tmp / "bin" / "ptxas", tmp / "nvvm" / "bin" / "cicc"]:
        if not exe.exists():
            raise HarnessError(f"{exe.relative_to(tmp)} is missing from the nvcc {NVCC_VERSION} wheels")
        exe.chmod(0o755)
    for h in (headers / "include").glob("cublas*.h"):
        shutil.copy(h, tmp / "include" / h.name)
    (tmp / ".complete").write_text("ok\n")
    shutil.rmtree(tk, ignore_errors=True)
    tmp.rename(tk)
    return tk / "bin" / "nvcc"


def ensure_nvdisasm() -> Path:
    """nvdisasm from its PyPI wheel, under the toolkit folder (fetched once)."""
    exe = toolkit_dir().with_name(f"nvdisasm-{NVDISASM_WHEEL.split('==')[1]}") / "nvdisasm"
    if exe.exists():
        return exe
    say(f"fetching nvdisasm ({NVDISASM_WHEEL}) from PyPI into {exe.parent} (once)")
    dl = _pip_download([NVDISASM_WHEEL])
    whl = _wheel(NVDISASM_WHEEL, dl)
    with zipfile.ZipFile(whl) as z:
        member = next((m for m in z.namelist() if m.endswith("/bin/nvdisasm")), None)
        if member is None:
            raise HarnessError(f"{whl.name} holds no bin/nvdisasm")
        exe.parent.mkdir(parents=True, exist_ok=True)
        tmp = exe.with_suffix(".tmp")
        tmp.write_bytes(z.read(member))
        tmp.chmod(0o755)
        tmp.rename(exe)
    return exe


def sass_report(cubin: Path) -> dict[str, dict]:
    """Per function of a cubin (the kernels and the device functions they call): 'instructions', 'spills' (local
    loads/stores, STL/LDL), 'loop_spills' (those between a backward branch and its target; the stubs after the last
    return that branch back into the body are not loops) and 'opcodes' (a Counter of the instructions' opcodes, without
    predicate and modifiers: IMAD.MOV.U32 counts as IMAD)."""
    r = subprocess.run([str(ensure_nvdisasm()), "-c", "-sf", str(cubin)], capture_output=True, text=True)
    if r.returncode != 0:
        raise HarnessError(f"nvdisasm {cubin} failed:\n{r.stderr[-2000:]}")
    funcs: dict[str, list[tuple[int, str]]] = {}
    # the kernel whose text section holds the function: the section's name (.text.KERNEL), else the label's first part
    # ($kernel$function); nvcc's own helpers in a kernel's section ($__internal_0_$__cuda_sm20_div_s64) are that kernel's
    kernel_of: dict[str, str] = {}
    section = None
    labels: dict[str, int] = {}
    pending: list[str] = []
    cur = None
    for line in r.stdout.splitlines():
        t = line.strip()
        m = re.match(r"^\.section\s+\.text\.([^,\s]+)", t)
        if m:
            section = m.group(1)
            continue
        m = re.match(r"^(\$?[A-Za-z_][\w$.]*):$", t)
        if m and not t.startswith(".L") and not t.startswith(".text"):
            cur = m.group(1).split("$")[-1] or m.group(1)
            kernel_of[cur] = section or [p for p in m.group(1).split("$") if p][0]
            funcs.setdefault(cur, [])
            continue
        m = re.match(r"^(\.L_x_\d+):", t)
        if m:
            pending.append(m.group(1))
            continue
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m and cur is not None:
            addr = int(m.group(1), 16)
            for lb in pending:
                labels[lb] = addr
            pending = []
            funcs[cur].append((addr, m.group(2)))
    out = {}
    for name, ins in funcs.items():
        # the out-of-line stubs after the body's last return (e.g. a shuffle's divergent path) branch back into the
        # body: not loops
        last_ret = max((a for a, text in ins if re.search(r"\b(RET|EXIT)\b", text)), default=None)
        loops = []
        for addr, text in ins:
            b = re.search(r"\bBRA\b.*`\((\.L_x_\d+)\)", text)
            if b and labels.get(b.group(1), addr + 1) <= addr:
                if last_ret is not None and addr > last_ret and labels[b.group(1)] < last_ret:
                    continue
                loops.append((labels[b.group(1)], addr))
        spill = [a for a, text in ins if re.search(r"\b(STL|LDL)(\.\S+)?\s", text)]

        def opcodes(part):
            return collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0] for _, text in part)
        out[name] = {"instructions": len(ins), "spills": len(spill), "kernel": kernel_of.get(name, name),
                     "start": min((a for a, _ in ins), default=0), "end": max((a for a, _ in ins), default=0),
                     "loop_spills": sum(1 for a in spill if any(s0 <= a <= s1 for s0, s1 in loops)),
                     "opcodes": opcodes(ins),
                     # each loop (a backward branch and its target, in address order; loops nest): the instructions
                     # between them, their spills and opcodes
                     "loops": [{"start": s0, "end": s1, "instructions": sum(1 for a, _ in ins if s0 <= a <= s1),
                                "spills": sum(1 for a in spill if s0 <= a <= s1),
                                "opcodes": opcodes([(a, t) for a, t in ins if s0 <= a <= s1])}
                               for s0, s1 in sorted(loops)]}
    return out


def ncu_by_function(csv_path: Path, report: dict[str, dict]) -> list[dict]:
    """An ncu source page (`ncu -i REP --page source --csv --print-source sass`, plain or .gz) of one kernel, its warp
    stall samples and executed instructions summed per function of that kernel, the functions taken from sass_report of
    the same code (every device function is a label in its kernel's text section, so a sample's address minus the
    kernel's first is its offset there). Returns, busiest first: {'function', 'samples', 'share', 'instructions',
    'stalls' (a Counter of the stall_* columns), 'wavefronts' and 'excess_wavefronts' (shared memory)}. Raises HarnessError when the
    CSV's code does not fit this SASS (another build)."""
    opener = gzip.open if str(csv_path).endswith(".gz") else open
    with opener(csv_path, "rt", newline="") as fh:
        rows = list(csv.reader(fh))
    if len(rows) < 3 or len(rows[0]) < 2 or rows[0][0] != "Kernel Name":
        raise HarnessError(f"{csv_path}: not an ncu source page CSV (its first row names the kernel)")
    kname = rows[0][1].split("(")[0]
    head = rows[1]
    ix = {n: i for i, n in enumerate(head)}
    for col in ("Address", "Warp Stall Sampling (All Samples)", "Instructions Executed"):
        if col not in ix:
            raise HarnessError(f"{csv_path}: no column {col!r}")
    body = [r for r in rows[2:] if len(r) == len(head)]
    if not body:
        raise HarnessError(f"{csv_path}: no instruction rows")
    funcs = sorted((f["start"], f["end"], name) for name, f in report.items() if kname in f.get("kernel", ""))
    if not funcs:
        raise HarnessError(f"{csv_path}: kernel {kname} is not in this SASS")

    def num(v):
        try:
            return float(v.replace(",", ""))
        except ValueError:
            return 0.0
    base = int(body[0][ix["Address"]], 16)
    span = int(body[-1][ix["Address"]], 16) - base
    if span > max(e for _, e, _ in funcs) or span < max(e for _, e, _ in funcs) - 64:
        raise HarnessError(f"{csv_path}: its code spans {span:#x} bytes, this SASS's kernel {max(e for _, e, _ in funcs):#x}: "
                           "not the same build")
    stall_cols = [n for n in head if n.startswith("stall_") and "Not Issued" not in n]
    exc = ix.get("L1 Wavefronts Shared Excessive")
    wav = ix.get("L1 Wavefronts Shared")
    acc: dict[str, dict] = {}
    starts = [s0 for s0, _, _ in funcs]
    for r in body:
        off = int(r[ix["Address"]], 16) - base
        k = bisect.bisect_right(starts, off) - 1
        name = funcs[k][2] if k >= 0 else "?"
        a = acc.setdefault(name, {"function": name, "samples": 0.0, "instructions": 0.0, "stalls": collections.Counter(),
                                  "wavefronts": 0.0, "excess_wavefronts": 0.0})
        a["samples"] += num(r[ix["Warp Stall Sampling (All Samples)"]])
        a["instructions"] += num(r[ix["Instructions Executed"]])
        for c in stall_cols:
            a["stalls"][c[len("stall_"):]] += num(r[ix[c]])
        if exc is not None:
            a["excess_wavefronts"] += num(r[exc])
        if wav is not None:
            a["wavefronts"] += num(r[wav])
    total = sum(a["samples"] for a in acc.values()) or 1.0
    for a in acc.values():
        a["share"] = a["samples"]/total
    return sorted(acc.values(), key=lambda a: -a["samples"])


def compile_check(source: Path, includes: list[Path], arch: str = "sm_90", defines: list[str] | None = None,
                  nvcc: bool = False) -> dict:
    """Compile one .cu for the device only (clang, or with nvcc=True nvcc itself, ensure_nvcc); return {'ok', 'log',
    'cubin', 'registers', 'spill_stores', 'spill_loads'} (the registers and spills ptxas -v reports for the last function)."""
    out = config.cache_dir() / "cuda-check" / (source.stem + f".{arch}{'.nvcc' if nvcc else ''}.cubin")
    out.parent.mkdir(parents=True, exist_ok=True)
    if nvcc:
        if not shutil.which("g++"):
            raise HarnessError("g++ is needed as nvcc's host compiler for the nvcc compile check")
        cmd = [str(ensure_nvcc()), "-cubin", f"-arch={arch}", *NVCC_FLAGS, str(source), "-o", str(out), "-Xptxas", "-v",
               *[f"-I{p}" for p in includes], *[f"-D{d}" for d in defines or []]]
    else:
        clang = shutil.which("clang++-19")
        if not clang:
            raise HarnessError("clang++-19 is needed for the CUDA compile check (`./RUNBOOK.sh setup` installs it)")
        tk = ensure_toolkit()
        cmd = [clang, "-x", "cuda", f"--cuda-gpu-arch={arch}", f"--cuda-path={tk}", "--cuda-device-only",
               "-Wno-unknown-cuda-version", "-Wno-invalid-noreturn", "-std=c++17", "-O2", "-c", str(source),
               "-o", str(out), "-Xcuda-ptxas", "-v", *[f"-I{p}" for p in includes], *[f"-D{d}" for d in defines or []]]
    r = subprocess.run(cmd, capture_output=True, text=True)
    log = r.stdout + r.stderr
    res = {"ok": r.returncode == 0, "log": log, "cmd": " ".join(cmd), "cubin": out}
    m = re.search(r"Used (\d+) registers", log)
    s = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if m:
        res["registers"] = int(m.group(1))
    if s:
        res["spill_stores"], res["spill_loads"] = int(s.group(1)), int(s.group(2))
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="stq-metal cuda-check", description=__doc__.split("\n\n")[0])
    ap.add_argument("sources", nargs="+", type=Path, help=".cu files to compile for the device")
    ap.add_argument("--arch", default="sm_90", help="GPU architecture (default sm_90, the H200)")
    ap.add_argument("-I", dest="includes", action="append", type=Path, default=[], help="include directory")
    ap.add_argument("--sass", action="store_true",
                    help="also print, per function, SASS instructions, spill loads/stores and those inside loops (nvdisasm)")
    ap.add_argument("--loops", metavar="NAME",
                    help="with --sass: also list every loop of the functions whose name contains NAME (address range, "
                         "instructions, dp4a, shared and generic loads, spills)")
    ap.add_argument("--ncu", metavar="CSV", type=Path,
                    help="with --sass: an ncu source page of the kernel built from the same code (`ncu -i REP --page "
                         "source --csv --print-source sass`, plain or .gz): its stall samples per function")
    ap.add_argument("--nvcc", action="store_true",
                    help=f"compile with nvcc {NVCC_VERSION} (PyPI wheels, fetched once) and ggml-cuda's flags instead of clang: "
                         "the code the device build makes")
    args = ap.parse_args(argv)
    if (args.loops or args.ncu) and not args.sass:
        ap.error("--loops and --ncu go with --sass")
    rc = 0
    for src in args.sources:
        res = compile_check(src, args.includes, args.arch, nvcc=args.nvcc)
        print(f"{src}: {'ok' if res['ok'] else 'FAILED'}; registers {res.get('registers', '?')}, "
              f"spill stores {res.get('spill_stores', '?')} B, spill loads {res.get('spill_loads', '?')} B")
        if not res["ok"]:
            print(res["log"][-4000:])
            rc = 1
        elif args.sass:
            print(f"  {'function':60s} {'instr':>7s} {'spills':>7s} {'in loops':>8s} {'generic loads':>13s}")
            for name, f in sass_report(res["cubin"]).items():
                print(f"  {short_name(name)[:60]:60s} {f['instructions']:7d} {f['spills']:7d} {f['loop_spills']:8d} "
                      f"{f['opcodes'].get('LD', 0):13d}")
                if args.loops and args.loops in name:
                    for lp in f["loops"]:
                        o = lp["opcodes"]
                        print(f"      loop {lp['start']:#x}..{lp['end']:#x}: {lp['instructions']} instructions, dp4a "
                              f"{o.get('IDP', 0)}, LDS {o.get('LDS', 0)}, LD {o.get('LD', 0)}, spills {lp['spills']}")
            if args.ncu:
                print(f"  {args.ncu}: stall samples per function")
                print(f"  {'function':60s} {'share':>6s} {'instr exec':>11s} {'excess wavefronts':>17s}  top stalls (% of its samples)")
                per = ncu_by_function(args.ncu, sass_report(res["cubin"]))
                print(f"  all: {sum(a['samples'] for a in per):.0f} samples, shared wavefronts "
                      f"{sum(a['wavefronts'] for a in per)/1e6:.1f}M, of them excess {sum(a['excess_wavefronts'] for a in per)/1e6:.1f}M")
                for a in per:
                    if a["share"] < 0.001:
                        continue
                    top = ", ".join(f"{k} {v/max(a['samples'], 1)*100:.0f}" for k, v in a["stalls"].most_common(3))
                    print(f"  {short_name(a['function'])[:60]:60s} {a['share']*100:5.1f}% {a['instructions']/1e6:10.1f}M "
                          f"{a['excess_wavefronts']/1e6:16.1f}M  {top}")
    return rc


def short_name(name: str) -> str:
    """A function's mangled name without nvcc's prefix for file-local functions (_ZN41_INTERNAL_<hash>_<n>_<file>_<hash>_
    <n>), which otherwise fills the report's column before the function's own name."""
    return re.sub(r"^_ZN\d+_INTERNAL_\w+?_\d+_\w+?_[0-9a-f]+_\d+", "", name)


if __name__ == "__main__":
    sys.exit(main())
