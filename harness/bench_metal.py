"""`stq-metal bench metal`: A/B timing of Metal mat-vec kernels on a Mac (Apple GPU).

Candidate and baseline kernels are compiled from llama.cpp source trees at run time (the kernel
sources are assembled exactly like the embed step of ggml/src/ggml-metal/CMakeLists.txt), run in
one process on one command queue, and timed from the GPU timestamps of completed command buffers.
The two sides alternate in a balanced, deterministically shuffled AB/BA order; the report gives the
median of the paired time ratios (candidate / baseline, < 1 means the candidate is faster), the same
median split by order, the win count, and the GB/s of the weights streamed by each side.

Workloads (``--shape``):

* ``square``: one 16384 x 16384 matrix (ne00 = ne01 = 16384), decode (one src1 column);
* ``routed``: eight distinct 6144 x 2048 matrices (ne00 = 6144, ne01 = 2048: Hy4-preview's STQ1_0
  gate/up experts, top-8), one dispatch each per timed command buffer -- the working set of one
  routed MoE layer at decode (about 16.5 MB of STQ1_0 weights);
* ``KxM[xE]``: any other shape, E matrices.

``--thrash-mb N`` writes an N MB buffer (blit fill) in a command buffer of its own before every
timed one, so that each timed run starts from cold GPU caches (the system level cache of an
M-series chip is tens of MB; the 16.5 MB routed set otherwise stays resident).

A kernel spec is ``KERNEL[:nsg=N]`` with an optional ``TREE=`` prefix selecting a source tree given
with ``--tree NAME=DIR`` (default: the harness's applied tree).  Rows per simdgroup are never given
by hand: they follow from the kernel name and the tree's own ggml-metal-impl.h (``N_R0_<TYPE>``;
``_r0_4`` variants use 4), so a variant can never run with another variant's geometry.  Every side
is checked against a numpy reference (or against the other side) before it is timed.

Examples (on a Mac with ``pip install pyobjc-framework-Metal``)::

    stq-metal bench metal --shape routed --thrash-mb 256
    stq-metal bench metal --shape square --candidate kernel_mul_mv_stq1_0_f32_r0_4:nsg=4 \\
        --baseline kernel_mul_mv_stq1_0_f32:nsg=4
    stq-metal bench metal --tree old=/path/to/other/llama.cpp --baseline old=kernel_mul_mv_stq1_0_f32
    stq-metal bench metal --shape square --baseline kernel_mul_mv_q1_0_f32   # the seed's family ceiling

Nothing here imports Metal at module import time: ``--help`` and the argument handling work on
any OS (tests/test_bench_metal.py covers them on Linux).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import random
import re
import statistics
import struct
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make `harness` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "harness"

from harness import config  # noqa: E402
from harness.util import HarnessError  # noqa: E402

# the weight types a side can stream: (elements per block, bytes per block, byte offset of the fp16
# scale).  Layouts are the pinned ggml-common.h structs.  Only types whose decode kernel is
# dispatched like STQ1_0's (nr0*nsg rows per threadgroup, no threadgroup memory) are listed:
# q1_0 is the seed's "family ceiling" reference, q4_0 a mature peer.
WEIGHT_TYPES = {
    "stq1_0": (256, 42, 40),
    "q1_0": (128, 18, 0),
    "q4_0": (32, 18, 0),
}

SHAPES = {
    "square": (16384, 16384, 1),
    "routed": (6144, 2048, 8),
}

KARGS_MUL_MV = "ggml_metal_kargs_mul_mv"
KARGS_MUL_MV_EXT = "ggml_metal_kargs_mul_mv_ext"

KERNEL_RE = re.compile(r"^kernel_mul_mv(?P<ext>_ext)?_(?P<type>[a-z0-9_]+?)_f32(?P<var>_r0_4)?(?:_r1_(?P<r1>[2-5]))?$")


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    tree: str      # name of the source tree ("default" unless TREE= given)
    name: str      # kernel host name
    nsg: int | None
    wtype: str     # weight type streamed
    ext: bool      # small-batch kernel (kernel_mul_mv_ext_*)
    r1ptg: int     # src1 columns per threadgroup

    @property
    def label(self) -> str:
        s = self.name + (f":nsg={self.nsg}" if self.nsg else "")
        return s if self.tree == "default" else f"{self.tree}={s}"


def parse_kernel_spec(text: str) -> KernelSpec:
    """``[TREE=]KERNEL[:nsg=N]`` -> KernelSpec; raises ValueError with the reason."""
    tree = "default"
    if "=" in text.split(":", 1)[0]:
        tree, text = text.split("=", 1)
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", tree):
            raise ValueError(f"bad tree name {tree!r}")
    name, _, opts = text.partition(":")
    m = KERNEL_RE.match(name)
    if not m:
        raise ValueError(f"{name!r} is not a mat-vec kernel name (kernel_mul_mv[_ext]_<type>_f32[_r0_4][_r1_N])")
    if bool(m.group("ext")) != bool(m.group("r1")):
        raise ValueError(f"{name!r}: ext kernels end in _r1_2.._r1_5, decode kernels do not")
    if m.group("type") not in WEIGHT_TYPES:
        raise ValueError(f"{name!r}: weight type {m.group('type')!r} not in {', '.join(sorted(WEIGHT_TYPES))}")
    if m.group("type") != "stq1_0" and (m.group("ext") or m.group("var")):
        raise ValueError(f"{name!r}: only the STQ1_0 ext/_r0_4 kernels share the decode dispatch geometry")
    nsg = None
    if opts:
        mm = re.fullmatch(r"nsg=(\d+)", opts)
        if not mm or int(mm.group(1)) not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"{text!r}: option must be nsg=N with N a power of two <= 32")
        nsg = int(mm.group(1))
    return KernelSpec(tree, name, nsg, m.group("type"), bool(m.group("ext")), int(m.group("r1") or 1))


def parse_shape(text: str) -> tuple[int, int, int]:
    if text in SHAPES:
        return SHAPES[text]
    m = re.fullmatch(r"(\d+)x(\d+)(?:x(\d+))?", text)
    if not m:
        raise ValueError(f"shape {text!r}: use square, routed or KxM[xE]")
    k, mm, e = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)
    if k % 256 or k <= 0 or mm <= 0 or e <= 0:
        raise ValueError(f"shape {text!r}: K must be a positive multiple of 256, M and E positive")
    return k, mm, e


def balanced_orders(pairs: int, seed: int) -> list[str]:
    """``pairs`` orders, exactly half "AB" and half "BA", shuffled deterministically by ``seed``."""
    if pairs < 2 or pairs % 2:
        raise ValueError("--pairs must be an even number >= 2 (balanced AB/BA)")
    orders = ["AB", "BA"] * (pairs // 2)
    random.Random(seed).shuffle(orders)
    return orders


def summarize(times_c: list[float], times_b: list[float], orders: list[str], nbytes: int) -> dict:
    """Paired ratios (candidate/baseline) overall and per order, wins, GB/s medians."""
    if not (len(times_c) == len(times_b) == len(orders)) or not orders:
        raise ValueError("summarize: one candidate and one baseline time per order")
    ratios = [c / b for c, b in zip(times_c, times_b)]
    by = {o: [r for r, oo in zip(ratios, orders) if oo == o] for o in ("AB", "BA")}
    res = {
        "ratio_median": statistics.median(ratios),
        "ratio_median_ab": statistics.median(by["AB"]) if by["AB"] else float("nan"),
        "ratio_median_ba": statistics.median(by["BA"]) if by["BA"] else float("nan"),
        "candidate_wins": sum(r < 1.0 for r in ratios),
        "pairs": len(ratios),
        "gbps_candidate": nbytes / statistics.median(times_c) / 1e9,
        "gbps_baseline": nbytes / statistics.median(times_b) / 1e9,
    }
    # a result whose direction depends on the order is noise, not a finding
    res["order_consistent"] = (res["ratio_median_ab"] < 1.0) == (res["ratio_median_ba"] < 1.0)
    return res


# ---------------------------------------------------------------------------------------------
# sources: assembled like the embed step, structs and constants read from the tree's own headers


def assemble_source(tree: Path, kind: str = "mul_mv") -> str:
    mdir = tree / "ggml" / "src" / "ggml-metal"
    kdir = mdir / "kernels"
    src_path = kdir / f"{kind}.metal"
    if not src_path.is_file():
        raise HarnessError(f"{src_path}: no such kernel source (is {tree} a llama.cpp tree?)")
    src = src_path.read_text()
    parts = [kdir / "common.h"]
    for hdr in ("dequantize.h", "quantize.h"):
        if f'#include "{hdr}"' in src:
            parts.append(kdir / hdr)
    text = "".join(p.read_text() for p in parts) + src
    drop = ('#include "common.h"', '#include "dequantize.h"', '#include "quantize.h"', "#pragma once")
    lines = [ln for ln in text.split("\n") if not any(d in ln for d in drop)]
    text = "\n".join(lines)
    text = text.replace("__embed_ggml-common.h__", (mdir.parent / "ggml-common.h").read_text())
    text = text.replace('#include "ggml-metal-impl.h"', (mdir / "ggml-metal-impl.h").read_text())
    return text


_CTYPES = {"int16_t": ctypes.c_int16, "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64,
           "uint16_t": ctypes.c_uint16, "uint32_t": ctypes.c_uint32, "uint64_t": ctypes.c_uint64,
           "float": ctypes.c_float, "int": ctypes.c_int32}


def kargs_struct(impl_text: str, name: str) -> type:
    """The ctypes Structure of ``typedef struct {...} name;`` in ggml-metal-impl.h (scalar fields
    only, C layout = Metal layout for these types)."""
    m = re.search(r"typedef\s+struct\s*\{([^{}]*)\}\s*" + re.escape(name) + r"\s*;", impl_text)
    if not m:
        raise HarnessError(f"struct {name} not found in ggml-metal-impl.h")
    fields = []
    for decl in m.group(1).split(";"):
        decl = re.sub(r"//.*", "", decl).strip()
        if not decl:
            continue
        mm = re.fullmatch(r"(\w+)\s+(\w+)", decl)
        if not mm or mm.group(1) not in _CTYPES:
            raise HarnessError(f"struct {name}: unsupported field {decl!r}")
        fields.append((mm.group(2), _CTYPES[mm.group(1)]))
    return type(name, (ctypes.Structure,), {"_fields_": fields})


def impl_define(impl_text: str, name: str) -> int:
    m = re.search(r"^#define\s+" + re.escape(name) + r"\s+(\d+)\s*$", impl_text, re.M)
    if not m:
        raise HarnessError(f"#define {name} not found in ggml-metal-impl.h")
    return int(m.group(1))


def rows_per_simdgroup(spec: KernelSpec, impl_text: str) -> int:
    """NR0 of a kernel, from its name and the tree's ggml-metal-impl.h."""
    if spec.name.endswith("_r0_4"):
        return 4
    t = spec.wtype.upper()
    return impl_define(impl_text, f"N_R0_{t}_EXT" if spec.ext and t == "STQ1_0" else f"N_R0_{t}")


def default_nsg(spec: KernelSpec, impl_text: str) -> int:
    if spec.nsg:
        return spec.nsg
    if spec.wtype == "stq1_0":
        return 4 if spec.ext or spec.name.endswith("_r0_4") else 16
    return impl_define(impl_text, f"N_SG_{spec.wtype.upper()}")


def random_weights(wtype: str, k: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """Random blocks with finite, positive fp16 scales (random bytes would give ~3% inf/nan scales)."""
    qk, bs, doff = WEIGHT_TYPES[wtype]
    nblk = m * (k // qk)
    b = rng.integers(0, 256, size=(nblk, bs), dtype=np.uint8)
    if doff is not None:
        d = (rng.uniform(0.5, 1.5, nblk) / 64).astype(np.float16)
        b[:, doff:doff + 2] = d.view(np.uint8).reshape(nblk, 2)
    return b.reshape(-1)


def reference_matvec(wtype: str, w: np.ndarray, k: int, m: int, x: np.ndarray) -> np.ndarray | None:
    """float64 reference of W @ x for one matrix, or None where no numpy decoder is at hand."""
    if wtype == "stq1_0":
        from harness import stq1_0
        wf = stq1_0.decode(w.reshape(-1, 42)).reshape(m, k).astype(np.float64)
    else:
        try:
            import gguf
            from gguf import quants
            qt = getattr(gguf.GGMLQuantizationType, wtype.upper())
            wf = quants.dequantize(w.reshape(m, -1), qt).reshape(m, k).astype(np.float64)
        except Exception:  # noqa: BLE001 - any missing decoder just skips the check
            return None
    return x.astype(np.float64) @ wf.T


# ---------------------------------------------------------------------------------------------
# Metal (macOS only)


class MetalRunner:
    """Compiles the sources of each tree once and runs decode mat-vec dispatches."""

    def __init__(self, trees: dict[str, Path], timeout_s: float):
        try:
            import Metal  # noqa: F401  (pyobjc-framework-Metal)
        except ImportError as e:
            raise HarnessError("bench metal needs macOS with an Apple GPU and pyobjc-framework-Metal "
                               "(pip install pyobjc-framework-Metal)") from e
        import Metal
        self.M = Metal
        self.dev = Metal.MTLCreateSystemDefaultDevice()
        if self.dev is None:
            raise HarnessError("no Metal device (MTLCreateSystemDefaultDevice returned nil)")
        self.queue = self.dev.newCommandQueue()
        self.timeout_s = timeout_s
        self.trees = trees
        self.libs: dict[str, object] = {}
        self.impl: dict[str, str] = {}
        self.psos: dict[tuple, object] = {}

    def _lib(self, tree: str):
        if tree not in self.libs:
            path = self.trees[tree]
            opts = self.M.MTLCompileOptions.alloc().init()
            opts.setPreprocessorMacros_({"GGML_METAL_EMBED_LIBRARY": "1"})
            lib, err = self.dev.newLibraryWithSource_options_error_(assemble_source(path), opts, None)
            if lib is None:
                raise HarnessError(f"tree {tree} ({path}): mul_mv.metal failed to compile: {err}")
            self.libs[tree] = lib
            self.impl[tree] = (path / "ggml" / "src" / "ggml-metal" / "ggml-metal-impl.h").read_text()
        return self.libs[tree]

    def pipeline(self, spec: KernelSpec, nsg: int):
        key = (spec.tree, spec.name, nsg)
        if key in self.psos:
            return self.psos[key]
        lib = self._lib(spec.tree)
        fc_base = impl_define(self.impl[spec.tree], "FC_MUL_MV")
        fcv = self.M.MTLFunctionConstantValues.alloc().init()
        for off, val in ((0, nsg), (1, 8), (2, 1), (3, 1), (4, 1)):  # nsg, nxpsg, ne12, r2, r3
            fcv.setConstantValue_type_atIndex_(struct.pack("<h", val), self.M.MTLDataTypeShort, fc_base + off)
        fcv.setConstantValue_type_atIndex_(struct.pack("<?", False), self.M.MTLDataTypeBool, fc_base + 5)
        fn, err = lib.newFunctionWithName_constantValues_error_(spec.name, fcv, None)
        if fn is None:
            raise HarnessError(f"{spec.label}: no such kernel in tree {spec.tree}: {err}")
        pso, err = self.dev.newComputePipelineStateWithFunction_error_(fn, None)
        if pso is None:
            raise HarnessError(f"{spec.label}: pipeline creation failed: {err}")
        self.psos[key] = pso
        return pso

    def buffer(self, data: np.ndarray | None, nbytes: int | None = None):
        opts = self.M.MTLResourceStorageModeShared
        if data is None:
            return self.dev.newBufferWithLength_options_(nbytes, opts)
        data = np.ascontiguousarray(data)
        return self.dev.newBufferWithBytes_length_options_(data.tobytes(), data.nbytes, opts)

    def read(self, buf, n: int) -> np.ndarray:
        return np.frombuffer(bytes(buf.contents().as_buffer(4 * n)), dtype=np.float32).copy()

    def _wait(self, cb, what: str) -> None:
        # poll instead of waitUntilCompleted: a hung kernel must not hang the benchmark
        t0 = time.monotonic()
        while cb.status() < self.M.MTLCommandBufferStatusCompleted:
            if time.monotonic() - t0 > self.timeout_s:
                raise HarnessError(f"{what}: command buffer not completed after {self.timeout_s} s")
            time.sleep(0.0005)
        if cb.status() != self.M.MTLCommandBufferStatusCompleted:
            raise HarnessError(f"{what}: command buffer failed: {cb.error()}")

    def thrash(self, buf, nbytes: int, value: int) -> None:
        cb = self.queue.commandBuffer()
        blit = cb.blitCommandEncoder()
        blit.fillBuffer_range_value_(buf, (0, nbytes), value)
        blit.endEncoding()
        cb.commit()
        self._wait(cb, "cache thrash")

    def run(self, spec: KernelSpec, mats: list, k: int, m: int, xbuf, ncols: int, outs: list, inner: int) -> float:
        """``inner`` x (one dispatch per matrix) in one command buffer; returns its GPU seconds."""
        self._lib(spec.tree)
        impl = self.impl[spec.tree]
        nsg = default_nsg(spec, impl)
        nr0 = rows_per_simdgroup(spec, impl)
        pso = self.pipeline(spec, nsg)
        qk, bs, _ = WEIGHT_TYPES[spec.wtype]
        nb01 = (k // qk) * bs
        K = kargs_struct(impl, KARGS_MUL_MV_EXT if spec.ext else KARGS_MUL_MV)
        vals = dict(ne00=k, ne01=m, ne02=1, nb00=bs, nb01=nb01, nb02=nb01 * m, nb03=nb01 * m,
                    ne10=k, ne11=ncols, ne12=1, nb10=4, nb11=4 * k, nb12=4 * k * ncols, nb13=4 * k * ncols,
                    ne0=m, ne1=ncols, nr0=nr0, r2=1, r3=1)
        a = K(**{f: vals[f] for f, _ in K._fields_})
        args = bytes(a)
        r0ptg = nr0 * nsg
        grid = self.M.MTLSizeMake((m + r0ptg - 1) // r0ptg, (ncols + spec.r1ptg - 1) // spec.r1ptg, 1)
        tg = self.M.MTLSizeMake(32, nsg, 1)
        cb = self.queue.commandBuffer()
        enc = cb.computeCommandEncoder()
        enc.setComputePipelineState_(pso)
        for _ in range(inner):
            for wbuf, obuf in zip(mats, outs):
                enc.setBytes_length_atIndex_(args, len(args), 0)
                enc.setBuffer_offset_atIndex_(wbuf, 0, 1)
                enc.setBuffer_offset_atIndex_(xbuf, 0, 2)
                enc.setBuffer_offset_atIndex_(obuf, 0, 3)
                enc.dispatchThreadgroups_threadsPerThreadgroup_(grid, tg)
        enc.endEncoding()
        cb.commit()
        self._wait(cb, spec.label)
        return cb.GPUEndTime() - cb.GPUStartTime()


# ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="stq-metal bench metal",
        description="A/B timing of Metal mat-vec kernels (candidate vs baseline) on a Mac: balanced "
                    "AB/BA order, paired time ratios, GB/s of the streamed weights.",
        epilog=("Examples " + __doc__.split("Examples ", 1)[1].split("Nothing here", 1)[0].strip()) if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidate", default="kernel_mul_mv_stq1_0_f32", type=_spec_arg,
                    help="candidate kernel spec [TREE=]KERNEL[:nsg=N] (default: %(default)s)")
    ap.add_argument("--baseline", default="kernel_mul_mv_stq1_0_f32", type=_spec_arg,
                    help="baseline kernel spec (default: %(default)s)")
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=DIR", type=_tree_arg,
                    help="a llama.cpp source tree usable as NAME= in a kernel spec (repeatable); "
                         "'default' is the harness's applied tree unless given")
    ap.add_argument("--shape", default="routed", type=_shape_arg,
                    help="square (16384x16384), routed (8 x 6144x2048) or KxM[xE] (default: routed)")
    ap.add_argument("--batch", type=int, default=1, choices=range(1, 9), metavar="N",
                    help="src1 columns (1..8; > 1 needs kernel_mul_mv_ext_* specs)")
    ap.add_argument("--pairs", type=int, default=20, help="timed A/B pairs, even (default: 20)")
    ap.add_argument("--inner", type=int, default=10,
                    help="repetitions of the workload per timed command buffer (default: 10)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed runs of each side first (default: 3)")
    ap.add_argument("--thrash-mb", type=int, default=0,
                    help="write an N MB buffer before every timed run (cold caches; 0 = off)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the data and of the order shuffle")
    ap.add_argument("--timeout-s", type=float, default=30.0, help="per command buffer (default: 30)")
    ap.add_argument("--max-rel-err", type=float, default=1e-3,
                    help="refuse to time a side whose result differs more from the reference")
    return ap


def _spec_arg(text: str) -> KernelSpec:
    try:
        return parse_kernel_spec(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _shape_arg(text: str) -> tuple[int, int, int]:
    try:
        return parse_shape(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _tree_arg(text: str) -> tuple[str, Path]:
    name, sep, d = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or not d:
        raise argparse.ArgumentTypeError(f"--tree {text!r}: use NAME=DIR")
    return name, Path(d).expanduser()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.pairs < 2 or args.pairs % 2:
        ap.error("--pairs must be an even number >= 2 (balanced AB/BA)")
    if args.inner < 1 or args.warmup < 0 or args.thrash_mb < 0:
        ap.error("--inner must be >= 1, --warmup and --thrash-mb >= 0")
    trees = dict(args.tree)
    trees.setdefault("default", config.default_tree())
    for side in (args.candidate, args.baseline):
        if side.tree not in trees:
            ap.error(f"{side.label}: tree {side.tree!r} not given with --tree {side.tree}=DIR")
        if (args.batch > 1) != side.ext:
            ap.error(f"{side.label}: batch {args.batch} needs "
                     + ("a kernel_mul_mv_ext_* kernel" if args.batch > 1 else "a decode kernel (not _ext)"))
        if side.ext and side.r1ptg > args.batch:
            ap.error(f"{side.label}: {side.r1ptg} columns per threadgroup > batch {args.batch}")
    args.trees = trees
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    k, m, n_mat = args.shape
    for name, d in args.trees.items():
        if not (d / "ggml" / "src" / "ggml-metal" / "kernels" / "mul_mv.metal").is_file():
            print(f"bench metal: tree {name} = {d} is not a llama.cpp tree with Metal kernels "
                  f"(apply the series first: python harness/build.py --apply)", file=sys.stderr)
            return 2
    try:
        runner = MetalRunner(args.trees, args.timeout_s)
    except HarnessError as e:
        print(f"bench metal: {e}", file=sys.stderr)
        return 2

    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal((args.batch, k)).astype(np.float32)
    xbuf = runner.buffer(x)
    sides = {"candidate": args.candidate, "baseline": args.baseline}
    data, bufs, outs, nbytes = {}, {}, {}, {}
    for role, spec in sides.items():
        key = spec.wtype
        if key not in data:
            data[key] = [random_weights(spec.wtype, k, m, rng) for _ in range(n_mat)]
            bufs[key] = [runner.buffer(w) for w in data[key]]
        outs[role] = [runner.buffer(None, 4 * m * args.batch) for _ in range(n_mat)]
        nbytes[role] = sum(w.nbytes for w in data[key])

    # correctness first: each side against a reference (or against the other side)
    results = {}
    for role, spec in sides.items():
        runner.run(spec, bufs[spec.wtype], k, m, xbuf, args.batch, outs[role], 1)
        y = runner.read(outs[role][0], m * args.batch).reshape(args.batch, m)
        results[role] = y
        ref = reference_matvec(spec.wtype, data[spec.wtype][0], k, m, x)
        if ref is not None:
            err = float(np.abs(y - ref).max() / max(np.abs(ref).max(), 1e-30))
            print(f"{role:9s} {spec.label}: max rel err vs float64 reference {err:.3e}")
            if not err <= args.max_rel_err:
                print(f"bench metal: {spec.label} is wrong (rel err {err:.3e} > {args.max_rel_err}); "
                      f"not timing it", file=sys.stderr)
                return 1
    if args.candidate.wtype == args.baseline.wtype:
        d = float(np.abs(results["candidate"] - results["baseline"]).max())
        print(f"candidate vs baseline: max abs diff {d:.3e}")

    thrash = runner.buffer(None, args.thrash_mb << 20) if args.thrash_mb else None
    fill = random.Random(args.seed)

    def timed(role: str) -> float:
        if thrash is not None:
            runner.thrash(thrash, args.thrash_mb << 20, fill.randrange(256))
        spec = sides[role]
        return runner.run(spec, bufs[spec.wtype], k, m, xbuf, args.batch, outs[role], args.inner)

    for _ in range(args.warmup):
        timed("candidate")
        timed("baseline")

    orders = balanced_orders(args.pairs, args.seed)
    tc, tb = [], []
    for o in orders:
        first, second = ("candidate", "baseline") if o == "AB" else ("baseline", "candidate")
        t = {first: timed(first)}
        t[second] = timed(second)
        tc.append(t["candidate"])
        tb.append(t["baseline"])

    if nbytes["candidate"] != nbytes["baseline"]:
        print("note: the sides stream different weight types; compare GB/s, the time ratio is per call")
    s = summarize(tc, tb, orders, nbytes["candidate"] * args.inner)
    s["gbps_baseline"] = nbytes["baseline"] * args.inner / statistics.median(tb) / 1e9
    print(f"shape {k}x{m} x{n_mat} batch {args.batch}, {args.pairs} pairs ({orders.count('AB')} AB / "
          f"{orders.count('BA')} BA), inner {args.inner}, thrash {args.thrash_mb} MB, device {runner.dev.name()}")
    print(f"candidate {args.candidate.label}: median {statistics.median(tc) / args.inner * 1e6:9.1f} us/call, "
          f"{s['gbps_candidate']:7.1f} GB/s")
    print(f"baseline  {args.baseline.label}: median {statistics.median(tb) / args.inner * 1e6:9.1f} us/call, "
          f"{s['gbps_baseline']:7.1f} GB/s")
    print(f"ratio candidate/baseline: median {s['ratio_median']:.4f} (AB {s['ratio_median_ab']:.4f}, "
          f"BA {s['ratio_median_ba']:.4f}), candidate faster in {s['candidate_wins']}/{s['pairs']} pairs"
          + ("" if s["order_consistent"] else "  [direction depends on the order: no finding]"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
