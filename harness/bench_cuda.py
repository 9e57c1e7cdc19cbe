"""`stq-metal bench cuda`: STQ1_0 mat-vec speed against its peers on an NVIDIA GPU (the lent H200).

Runs from a CUDA build of the series (``--build DIR``, a build dir with bin/ and the shared
libraries) through the build's own ggml (ctypes, harness/ggml.py): every timed call is a real
``ggml_mul_mat`` / ``ggml_mul_mat_id`` node on the CUDA0 backend, so the time includes what
llama.cpp runs for it (the q8_1 quantization of the activations, the kernel, the launch gaps inside
one CUDA graph).

Workloads (``--workloads``, comma separated):

* ``big``: one 32768 x 16384 matrix (ne00 = K = 16384, ne01 = M = 32768), decode (1 column);
* ``routed``: MUL_MAT_ID, 256 experts of 6144 x 2048 (ne00 = 6144, ne01 = 2048: Hy4-preview's
  STQ1_0 gate/up stacks), top-8, 1 token, fresh random experts for every call;
* ``verify``: 4096 x 14336 (ne00 = K = 14336, ne01 = M = 4096) at widths n = 1..5 (speculative
  verify), each width its own row in the table.
* ``routed-verify``: the routed case with n = 2..5 tokens (speculative verify of an MoE model; every
  token draws its own 8 experts).
* ``decode``: the n = 1 row of ``verify`` alone.
* ``prefill``: 4096 x 14336 at n = 512 columns (a prompt batch: ggml-cuda's mmq, patch 0034);
* ``routed-prefill``: the routed case with 512 tokens (mmq's MUL_MAT_ID path).

The prefill workloads are not in the default list (name them). Their GB/s counts each weight byte once per call
(for routed-prefill: every expert used at least once, at most all of them), so for them compare times, not GB/s.

Working sets exceed the 60 MB L2: a MUL_MAT workload rotates among R copies of the weights (R such
that R copies hold at least ``--min-set-mb``), a routed one draws 8 of 256 experts per call.  One
sample of a (workload, type) is the mean per-call time over ``--graphs`` computes of one ggml graph
of N such nodes; samples of all types alternate within a round, in forward order in even rounds and
reversed order in odd rounds (balanced AB/BA); the report gives medians over ``--rounds`` rounds,
GB/s of weight bytes per call, the share of the device-to-device copy bandwidth measured in the same
run (bytes read + written, like the copy figure in FACTS.md), and for every peer the median of the
per-round ratios time(STQ1_0) / time(peer) (< 1: STQ1_0 is faster).

Example (on the device, from the repo root, after harness/cuda_device.sh built the tree)::

    python3 harness/bench_cuda.py --build .dev/build --json $OUT/bench.json

``--help`` works anywhere; nothing loads a library until a benchmark runs.
"""

from __future__ import annotations

import argparse
import ctypes as C
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make `harness` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "harness"

from harness.util import HarnessError  # noqa: E402

TYPES = ("stq1_0", "q4_0", "q8_0", "q1_0", "f16", "stq1_0_rp16")
# pseudo types: (ggml type, extra buffer type of the device whose name contains this) -- the weights of
# stq1_0_rp16 are STQ1_0 placed in CUDA's RP16 repack buffer type (patch 0032: MUL_MAT; patch 0033: MUL_MAT_ID,
# the routed expert stack in one buffer of it)
EXTRA_BUFT = {"stq1_0_rp16": ("stq1_0", "STQ1_0_RP16")}
WORKLOADS = ("big", "routed", "verify", "decode", "routed-verify", "prefill", "routed-prefill")
DEFAULT_WORKLOADS = ("big", "routed", "verify", "decode", "routed-verify")
PREFILL_N = 512
# offset of the fp16 scale in a block (the rest of a block is random bytes: every byte pattern of these
# types is a valid block; scales are kept small and finite)
SCALE_OFFSET = {"stq1_0": 40, "q4_0": 0, "q8_0": 0, "q1_0": 0}


@dataclass
class Case:
    name: str     # row label
    k: int        # ne00
    m: int        # ne01
    n: int = 1    # columns (tokens for routed)
    n_expert: int = 0
    n_used: int = 0


@dataclass
class Result:
    case: Case
    type: str
    bytes_per_call: int
    times_us: list = field(default_factory=list)  # one per round

    @property
    def median_us(self) -> float:
        return statistics.median(self.times_us)


def cases_for(workloads) -> list[Case]:
    out = []
    for w in workloads:
        if w == "big":
            out.append(Case("32768x16384 n=1", k=16384, m=32768))
        elif w == "routed":
            out.append(Case("routed 256x(6144x2048) top-8", k=6144, m=2048, n=1, n_expert=256, n_used=8))
        elif w == "verify":
            out += [Case(f"4096x14336 n={n}", k=14336, m=4096, n=n) for n in range(1, 6)]
        elif w == "routed-verify":
            out += [Case(f"routed 256x(6144x2048) top-8 n={n}", k=6144, m=2048, n=n, n_expert=256, n_used=8)
                    for n in range(2, 6)]
        elif w == "decode":
            out.append(Case("4096x14336 n=1", k=14336, m=4096, n=1))
        elif w == "prefill":
            out.append(Case(f"4096x14336 n={PREFILL_N}", k=14336, m=4096, n=PREFILL_N))
        elif w == "routed-prefill":
            out.append(Case(f"routed 256x(6144x2048) top-8 n={PREFILL_N}", k=6144, m=2048, n=PREFILL_N,
                            n_expert=256, n_used=8))
        else:
            raise HarnessError(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    return out


class Bench:
    def __init__(self, build: Path, device: str):
        from harness.ggml import GGML, ggml_tensor  # noqa: F401 (loads nothing at import)

        self.g = GGML(build)
        self.T = C.POINTER(ggml_tensor)
        self.device = device
        self.be = self.g.backend(device)
        f = self.g.fn("ggml_new_graph_custom")
        f.restype, f.argtypes = C.c_void_p, [C.c_void_p, C.c_size_t, C.c_bool]
        f = self.g.fn("ggml_graph_overhead_custom")
        f.restype, f.argtypes = C.c_size_t, [C.c_size_t, C.c_bool]
        self.rng = np.random.default_rng(1234)

    def desc(self) -> str:
        return dict(self.g.devices()).get(self.device, "?")

    # -- tensors ---------------------------------------------------------------------------

    def _extra_buft(self, tname: str):
        """The device's extra buffer type for pseudo type tname, or None when it offers none."""
        g = self.g
        want = EXTRA_BUFT[tname][1]
        dev = g.fn("ggml_backend_dev_by_name")(self.device.encode())
        reg = g.fn("ggml_backend_dev_backend_reg")(dev)
        addr = g.fn("ggml_backend_reg_get_proc_address")(reg, b"ggml_backend_dev_get_extra_bufts")
        if not addr:
            return None
        lst = C.CFUNCTYPE(C.POINTER(C.c_void_p), C.c_void_p)(addr)(dev)
        name = g.fn("ggml_backend_buft_name")
        name.restype, name.argtypes = C.c_char_p, [C.c_void_p]
        i = 0
        while lst and lst[i]:
            if want in name(lst[i]).decode():
                return lst[i]
            i += 1
        return None

    def _pattern(self, tname: str, nbytes: int) -> np.ndarray:
        """nbytes of valid random data for type tname (a whole number of blocks)."""
        tname = EXTRA_BUFT.get(tname, (tname,))[0]
        t = self.g.type_id(tname)
        if tname == "f16":
            return self.rng.standard_normal(nbytes // 2).astype(np.float16).view(np.uint8)
        bs = self.g.type_size(t)
        nb = nbytes // bs
        b = self.rng.integers(0, 256, size=(nb, bs), dtype=np.uint8)
        off = SCALE_OFFSET[tname]
        d = self.rng.uniform(1e-3, 1e-2, nb).astype(np.float16)
        b[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
        return b.reshape(-1)

    def _fill(self, t, tname: str) -> None:
        """Upload random valid data: a 64 MB random pattern repeated (L2 works on addresses, so
        repeated content still streams from memory)."""
        nbytes = self.g.fn("ggml_nbytes")(t)
        bs = self.g.type_size(self.g.type_id(EXTRA_BUFT.get(tname, (tname,))[0]))
        chunk = max(bs, (64 << 20) // bs * bs)
        pat = self._pattern(tname, min(chunk, nbytes))
        if tname in EXTRA_BUFT:  # repacking buffer types take whole tensors only
            full = np.resize(pat, nbytes)
            self.g.fn("ggml_backend_tensor_set")(t, C.c_void_p(full.ctypes.data), 0, nbytes)
            return
        off = 0
        while off < nbytes:
            n = min(len(pat), nbytes - off)
            self.g.fn("ggml_backend_tensor_set")(t, C.c_void_p(pat.ctypes.data), off, n)
            off += n

    # -- one graph of N nodes ------------------------------------------------------------------

    def build(self, case: Case, tname: str, min_set_mb: int, min_nodes: int):
        g = self.g
        t = g.type_id(EXTRA_BUFT.get(tname, (tname,))[0])
        row = g.row_size(t, case.k)
        routed = case.n_expert > 0
        extra = None
        if tname in EXTRA_BUFT:
            extra = self._extra_buft(tname)
            if extra is None:
                return None
        w_bytes = row * case.m * (case.n_expert if routed else 1)
        # weight bytes per call: the matrix (MUL_MAT, read once for all columns) or the experts used by every token
        # (at most all of them: a prompt batch reads each expert once)
        per_call = row * case.m * (min(case.n_used * case.n, case.n_expert) if routed else 1)
        copies = 1 if routed else max(2, math.ceil(min_set_mb * 2**20 / w_bytes))
        nodes = max(min_nodes, copies)
        nodes = (nodes + copies - 1) // copies * copies
        n_tensors = copies + 2 + 3 * nodes
        ctx = g.fn("ggml_init")(self._params(n_tensors, nodes))
        ws = []
        for _ in range(copies):
            ne = (case.k, case.m, case.n_expert) if routed else (case.k, case.m)
            ws.append(g.fn("ggml_new_tensor")(ctx, t, len(ne), (C.c_int64 * len(ne))(*ne)))
        f32, i32 = g.type_id("f32"), g.type_id("i32")
        if routed:
            x = g.fn("ggml_new_tensor")(ctx, f32, 3, (C.c_int64 * 3)(case.k, 1, case.n))
        else:
            x = g.fn("ggml_new_tensor")(ctx, f32, 2, (C.c_int64 * 2)(case.k, case.n))
        gf = g.fn("ggml_new_graph_custom")(ctx, 2 * n_tensors, False)
        ids = []
        outs = []
        for i in range(nodes):
            if routed:
                idt = g.fn("ggml_new_tensor")(ctx, i32, 2, (C.c_int64 * 2)(case.n_used, case.n))
                ids.append(idt)
                out = g.fn("ggml_mul_mat_id")(ctx, ws[i % copies], x, idt)
            else:
                out = g.fn("ggml_mul_mat")(ctx, ws[i % copies], x)
            if not g.fn("ggml_backend_supports_op")(self.be, out):
                g.fn("ggml_free")(ctx)
                return None
            outs.append(out)
            g.fn("ggml_build_forward_expand")(gf, out)
        extra_bufs = []
        if extra is not None:
            # the weights in the extra buffer type (one buffer each), the rest as usual
            for f, res, args in (("ggml_backend_buft_get_alloc_size", C.c_size_t, [C.c_void_p, C.c_void_p]),
                                 ("ggml_backend_buft_alloc_buffer", C.c_void_p, [C.c_void_p, C.c_size_t]),
                                 ("ggml_backend_buffer_get_base", C.c_void_p, [C.c_void_p]),
                                 ("ggml_backend_tensor_alloc", C.c_int, [C.c_void_p, C.c_void_p, C.c_void_p])):
                g.fn(f).restype, g.fn(f).argtypes = res, args
            for w in ws:
                wb = g.fn("ggml_backend_buft_alloc_buffer")(extra, g.fn("ggml_backend_buft_get_alloc_size")(extra, w))
                if not wb or g.fn("ggml_backend_tensor_alloc")(wb, w, g.fn("ggml_backend_buffer_get_base")(wb)) != 0:
                    raise HarnessError(f"{case.name} {tname}: allocation in the extra buffer type failed")
                extra_bufs.append(wb)
            for out in outs:
                if not g.fn("ggml_backend_supports_op")(self.be, out):
                    raise HarnessError(f"{case.name} {tname}: {self.device} does not run the node with its weights "
                                       f"in the extra buffer type (for STQ1_0 RP16: a supported shape, and "
                                       f"GGML_CUDA_STQ1_0_REPACK=all below 32 Mi weights streamed per column; "
                                       f"MUL_MAT_ID needs patch 0033)")
        buf = g.fn("ggml_backend_alloc_ctx_tensors")(ctx, self.be)
        if not buf:
            g.fn("ggml_free")(ctx)
            raise HarnessError(f"{case.name} {tname}: allocation of {copies} x {w_bytes/2**20:.0f} MB failed")
        for w in ws:
            self._fill(w, tname)
        xv = self.rng.standard_normal(case.k * case.n).astype(np.float32)
        g.fn("ggml_backend_tensor_set")(x, C.c_void_p(xv.ctypes.data), 0, xv.nbytes)
        for idt in ids:
            iv = np.stack([self.rng.choice(case.n_expert, case.n_used, replace=False)
                           for _ in range(case.n)]).astype(np.int32)
            g.fn("ggml_backend_tensor_set")(idt, C.c_void_p(iv.ctypes.data), 0, iv.nbytes)
        return dict(ctx=ctx, buf=buf, gf=gf, nodes=nodes, copies=copies, per_call=per_call, out=outs[-1],
                    extra_bufs=extra_bufs)

    def _params(self, n_tensors: int, nodes: int):
        from harness.ggml import ggml_init_params
        mem = self.g.fn("ggml_tensor_overhead")() * n_tensors + \
            self.g.fn("ggml_graph_overhead_custom")(2 * n_tensors, False) + (1 << 16)
        return ggml_init_params(mem, None, True)

    def free(self, gr) -> None:
        self.g.fn("ggml_backend_buffer_free")(gr["buf"])
        for wb in gr["extra_bufs"]:
            self.g.fn("ggml_backend_buffer_free")(wb)
        self.g.fn("ggml_free")(gr["ctx"])

    def run(self, gr, n_graphs: int) -> float:
        """Mean µs per node over n_graphs computes of the graph."""
        g = self.g
        g.fn("ggml_backend_synchronize")(self.be)
        t0 = time.perf_counter()
        for _ in range(n_graphs):
            if g.fn("ggml_backend_graph_compute")(self.be, gr["gf"]) != 0:
                raise HarnessError("graph compute failed")
        g.fn("ggml_backend_synchronize")(self.be)
        return (time.perf_counter() - t0) * 1e6 / (n_graphs * gr["nodes"])

    def check_finite(self, gr) -> None:
        out = gr["out"]
        n = self.g.fn("ggml_nbytes")(out) // 4
        a = np.empty(n, np.float32)
        self.g.fn("ggml_backend_tensor_get")(out, C.c_void_p(a.ctypes.data), 0, a.nbytes)
        if not np.isfinite(a).all():
            raise HarnessError("non-finite results")

    def copy_bandwidth_cudart(self, mb: int, reps: int, rounds: int) -> float | None:
        """GB/s of cudaMemcpy device to device (bytes read + written) through the CUDA runtime the build
        links, or None where it cannot be loaded."""
        import ctypes.util
        import glob
        cands = sorted(glob.glob("/usr/local/cuda/lib64/libcudart.so*")) + [ctypes.util.find_library("cudart") or ""]
        rt = None
        for c in cands:
            if c:
                try:
                    rt = C.CDLL(c)
                    break
                except OSError:
                    continue
        if rt is None:
            return None
        n = mb * 2**20
        a, b = C.c_void_p(), C.c_void_p()
        if rt.cudaMalloc(C.byref(a), C.c_size_t(n)) or rt.cudaMalloc(C.byref(b), C.c_size_t(n)):
            return None
        rt.cudaMemset(a, 1, C.c_size_t(n))
        ts = []
        for r in range(rounds + 1):
            rt.cudaDeviceSynchronize()
            t0 = time.perf_counter()
            for _ in range(reps):
                rt.cudaMemcpy(b, a, C.c_size_t(n), 3)  # cudaMemcpyDeviceToDevice
            rt.cudaDeviceSynchronize()
            if r:  # the first round is a warm-up
                ts.append((time.perf_counter() - t0) / reps)
        rt.cudaFree(a)
        rt.cudaFree(b)
        return 2 * n / statistics.median(ts) / 1e9

    def copy_bandwidth(self, mb: int, n_graphs: int, rounds: int) -> float:
        """GB/s of a device-to-device copy (ggml_cpy f32 -> f32 of mb MB), bytes read + written."""
        g = self.g
        n = mb * 2**20 // 4
        ctx = g.fn("ggml_init")(self._params(8, 1))
        f32 = g.type_id("f32")
        a = g.fn("ggml_new_tensor")(ctx, f32, 1, (C.c_int64 * 1)(n))
        b = g.fn("ggml_new_tensor")(ctx, f32, 1, (C.c_int64 * 1)(n))
        out = g.fn("ggml_cpy")(ctx, a, b)
        gf = g.fn("ggml_new_graph_custom")(ctx, 16, False)
        g.fn("ggml_build_forward_expand")(gf, out)
        buf = g.fn("ggml_backend_alloc_ctx_tensors")(ctx, self.be)
        gr = dict(ctx=ctx, buf=buf, gf=gf, nodes=1)
        self.run(gr, 3)
        ts = [self.run(gr, n_graphs) for _ in range(rounds)]
        self.free(gr)
        return 2 * n * 4 / (statistics.median(ts) * 1e-6) / 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="stq-metal bench cuda", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Workloads: " + ", ".join(WORKLOADS) + ". Types: " + ", ".join(TYPES))
    ap.add_argument("--build", type=Path, required=True, help="CUDA build dir of the series (bin/, shared libs)")
    ap.add_argument("--device", default="CUDA0")
    ap.add_argument("--types", default=",".join(TYPES), help="comma separated; the first is the candidate")
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    ap.add_argument("--rounds", type=int, default=7, help="alternating rounds (medians over them)")
    ap.add_argument("--graphs", type=int, default=5, help="graph computes per sample")
    ap.add_argument("--min-set-mb", type=int, default=240, help="least weight bytes a MUL_MAT rotates over")
    ap.add_argument("--min-nodes", type=int, default=32, help="least mul_mat nodes per graph")
    ap.add_argument("--copy-mb", type=int, default=2048, help="size of the copy-bandwidth probe")
    ap.add_argument("--json", type=Path, help="write all samples here")
    a = ap.parse_args(argv)

    types = [t.strip() for t in a.types.split(",") if t.strip()]
    for t in types:
        if t not in TYPES:
            ap.error(f"unknown type {t!r}; choose from {', '.join(TYPES)}")
    cases = cases_for([w.strip() for w in a.workloads.split(",") if w.strip()])

    b = Bench(a.build, a.device)
    print(f"device {a.device}: {b.desc()}", flush=True)
    copy_gbs = b.copy_bandwidth_cudart(a.copy_mb, a.graphs, a.rounds)
    if copy_gbs is not None:
        print(f"cudaMemcpy device to device: {copy_gbs:.0f} GB/s (read + write, {a.copy_mb} MB)", flush=True)
    else:
        copy_gbs = b.copy_bandwidth(a.copy_mb, a.graphs, a.rounds)
        print(f"ggml_cpy device to device (no libcudart found): {copy_gbs:.0f} GB/s (read + write, {a.copy_mb} MB)",
              flush=True)

    results: list[Result] = []
    for case in cases:
        graphs = {}
        for t in types:
            gr = b.build(case, t, a.min_set_mb, a.min_nodes)
            if gr is None:
                print(f"  {case.name} {t}: not supported by {a.device}, skipped", flush=True)
                continue
            b.run(gr, 2)  # warm-up (CUDA graph capture)
            b.check_finite(gr)
            graphs[t] = gr
        res = {t: Result(case, t, graphs[t]["per_call"]) for t in graphs}
        order = list(graphs)
        for r in range(a.rounds):
            for t in (order if r % 2 == 0 else order[::-1]):
                res[t].times_us.append(b.run(graphs[t], a.graphs))
        for t in order:
            b.free(graphs[t])
        results += res.values()
        cand = res.get(types[0])
        line = []
        for t in order:
            x = res[t]
            line.append(f"{t} {x.median_us:.1f} us ({x.bytes_per_call / x.median_us / 1e3:.0f} GB/s)")
        print(f"  {case.name}: " + "; ".join(line), flush=True)
        if cand:
            for t in order[1:]:
                ratios = [c / p for c, p in zip(cand.times_us, res[t].times_us)]
                print(f"    {types[0]}/{t}: {statistics.median(ratios):.3f} (median of {len(ratios)} paired rounds)")

    # final table (the device tool returns the end of the output)
    print()
    print(f"copy bandwidth {copy_gbs:.0f} GB/s; medians of {a.rounds} rounds x {a.graphs} graphs")
    hdr = f"{'case':32s} {'type':11s} {'us/call':>9s} {'GB/s':>7s} {'%copy':>6s} {'ratio':>7s}"
    print(hdr)
    cand_t = {}
    for x in results:
        if x.type == types[0]:
            cand_t[x.case.name] = x
    rows = []
    for x in results:
        gbs = x.bytes_per_call / x.median_us / 1e3
        c = cand_t.get(x.case.name)
        ratio = statistics.median([p / q for p, q in zip(c.times_us, x.times_us)]) if c else float("nan")
        print(f"{x.case.name:32s} {x.type:11s} {x.median_us:9.2f} {gbs:7.0f} {100 * gbs / copy_gbs:5.0f}% {ratio:7.3f}")
        rows.append(dict(case=x.case.name, type=x.type, k=x.case.k, m=x.case.m, n=x.case.n,
                         n_expert=x.case.n_expert, n_used=x.case.n_used, bytes_per_call=x.bytes_per_call,
                         times_us=x.times_us, median_us=x.median_us, gbs=gbs, ratio_vs_candidate=ratio))
    if a.json:
        tmp = a.json.with_suffix(a.json.suffix + ".tmp")
        tmp.write_text(json.dumps(dict(device=b.desc(), copy_gbs=copy_gbs, rounds=a.rounds, graphs=a.graphs,
                                       candidate=types[0], results=rows), indent=1))
        tmp.replace(a.json)
    b.g.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
