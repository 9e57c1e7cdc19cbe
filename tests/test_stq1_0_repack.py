"""STQ1_0 weights in the CPU backend's repack buffer (CPU_REPACK): the lookup-table gemv (patch 0042).

llama.cpp places model weights in the first of the CPU device's extra buffer types whose
``supports_op`` accepts the op that uses them.  On x86 with AVX2, STQ1_0 matrices whose row count
is a multiple of 16 go to CPU_REPACK, are interleaved 16 rows at a time and multiplied by a
lookup-table gemv; other row counts (and other CPUs) stay in the plain CPU buffer (vec_dot).  This
file places the weights the same way through ctypes (``place``) and checks, on the native build
and on the AVX2-only build:

* exact integers: weights with d = 1 and activations that Q8_K represents with d = +-1 (integers,
  one |x| = 127 per block) make every output an integer below 2^24, so the result must EQUAL the
  integer product; one wrong table entry, sign or lane moves it by at least 1.
* real data (quantized normal weights, normal activations): within ``bound`` of the float64
  product of the same Q8_K activations, and within twice that of the plain vec_dot path, where
  ``bound = 8 * 2^-24 * sum_b |d_b * dy_b| * (sum |q| + 1)`` per output (float32 roundings only).
* batch invariance: each column of an n-column product is bit-identical to the product of that
  column alone (speculative decoding's lossless check needs it).
* row counts that are not a multiple of 16 are refused by CPU_REPACK (so they fall back to the
  plain buffer), and MUL_MAT_ID with experts, including the Hy4 shape (256 experts of 6144 x 2048,
  top-8).
"""

from __future__ import annotations

import ctypes as C
import os
import platform

import numpy as np
import pytest

from harness import ggml
from harness import stq1_0 as S

from stq_helpers import stq_cpu_build  # noqa: F401 (fixture)

STQ = S.TYPE_ID
Q8K_BYTES = 4 + 256 + 2 * 16  # block_q8_K: float d, int8 qs[256], int16 bsums[16]
P = C.c_void_p
T = C.POINTER(ggml.ggml_tensor)
DEV_TYPE_CPU = 0  # GGML_BACKEND_DEVICE_TYPE_CPU

_SIGS = {
    "ggml_backend_dev_by_type": (P, [C.c_int]),
    "ggml_backend_buft_name": (C.c_char_p, [P]),
    "ggml_backend_buft_alloc_buffer": (P, [P, C.c_size_t]),
    "ggml_backend_alloc_ctx_tensors_from_buft": (P, [P, P]),
    "ggml_backend_dev_supports_op": (C.c_bool, [P, T]),
    "ggml_backend_cpu_buffer_type": (P, []),
}


def fn(lib, name):
    f = lib.fn(name)
    if name in _SIGS:
        f.restype, f.argtypes = _SIGS[name]
    return f


class Weights(ggml.ContextBuffer):
    """A weight tensor placed like llama.cpp places model weights (or forced into the plain CPU
    buffer with ``plain=True``); ``buft`` names the buffer type it went to."""

    def __init__(self, lib, ne, data, plain=False, n_used=1):
        self.lib = lib
        ov = lib.fn("ggml_tensor_overhead")()
        dev = fn(lib, "ggml_backend_dev_by_type")(DEV_TYPE_CPU)
        reg = lib.fn("ggml_backend_dev_backend_reg")(dev)
        addr = lib.fn("ggml_backend_reg_get_proc_address")(reg, b"ggml_backend_dev_get_extra_bufts")
        bufts = []
        if addr:
            arr = C.CFUNCTYPE(C.POINTER(C.c_void_p), C.c_void_p)(addr)(dev)
            i = 0
            while arr and arr[i]:
                bufts.append(arr[i])
                i += 1
        bufts.append(fn(lib, "ggml_backend_cpu_buffer_type")())
        if plain:
            bufts = bufts[-1:]

        self.ctx = lib._ctx(4 * ov, no_alloc=True)
        arr = (C.c_int64 * len(ne))(*ne)
        self.t = lib.fn("ggml_new_tensor")(self.ctx, STQ, len(ne), arr)

        # the op that uses the weights, for supports_op (llama.cpp's loader asks the same question)
        pctx = lib._ctx(8 * ov, no_alloc=True)
        try:
            f32, i32 = lib.type_id("f32"), lib.type_id("i32")
            if len(ne) == 2:
                x = lib.fn("ggml_new_tensor")(pctx, f32, 2, (C.c_int64 * 2)(ne[0], 1))
                op = lib.fn("ggml_mul_mat")(pctx, self.t, x)
            else:
                x = lib.fn("ggml_new_tensor")(pctx, f32, 3, (C.c_int64 * 3)(ne[0], n_used, 1))
                ids = lib.fn("ggml_new_tensor")(pctx, i32, 2, (C.c_int64 * 2)(n_used, 1))
                op = lib.fn("ggml_mul_mat_id")(pctx, self.t, x, ids)
            chosen = bufts[-1]
            for b in bufts:
                probe = fn(lib, "ggml_backend_buft_alloc_buffer")(b, 0)
                if not probe:
                    continue
                self.t.contents.buffer = probe
                ok = fn(lib, "ggml_backend_dev_supports_op")(dev, op)
                self.t.contents.buffer = None
                lib.fn("ggml_backend_buffer_free")(probe)
                if ok:
                    chosen = b
                    break
        finally:
            lib.fn("ggml_free")(pctx)

        self.buft = fn(lib, "ggml_backend_buft_name")(chosen).decode()
        self.buf = fn(lib, "ggml_backend_alloc_ctx_tensors_from_buft")(self.ctx, chosen)
        if not self.buf:
            raise ggml.GGMLError(f"cannot allocate {ne} STQ1_0 weights in {self.buft}")
        data = np.ascontiguousarray(np.frombuffer(bytes(data), dtype=np.uint8) if isinstance(data, (bytes, bytearray)) else data)
        assert data.nbytes == lib.fn("ggml_nbytes")(self.t)
        lib.fn("ggml_backend_tensor_set")(self.t, C.c_void_p(data.ctypes.data), 0, data.nbytes)


def mul_mat(lib, w: Weights, x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    with lib.graph("CPU") as g:
        b = g.tensor(lib.type_id("f32"), (x.shape[1], x.shape[0]), x)
        return g.compute(g.op("ggml_mul_mat", w.t, b)).reshape(x.shape[0], -1)


def mul_mat_id(lib, w: Weights, x, ids):
    x = np.ascontiguousarray(x, dtype=np.float32)
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    n_tokens, n_used = ids.shape
    with lib.graph("CPU") as g:
        b = g.tensor(lib.type_id("f32"), (x.shape[2], x.shape[1], n_tokens), x)
        i = g.tensor(lib.type_id("i32"), (n_used, n_tokens), ids)
        return g.compute(g.op("ggml_mul_mat_id", w.t, b, i)).reshape(n_tokens, n_used, -1)


# ---------------------------------------------------------------------------------------------
# data


def unit_blocks(rng, n_blocks):
    """Random codes and sign bits with d = 1.0 (every one of the 32 patterns, both signs)."""
    b = rng.integers(0, 256, (n_blocks, 42), dtype=np.uint8)
    b[:, 40:42] = np.array([1.0], dtype=np.float16).view(np.uint8)
    return b


def integer_activations(rng, shape):
    """Integers in -127..127 with one |x| = 127 per 256-block: Q8_K stores them with d = +-1."""
    x = rng.integers(-127, 128, shape).astype(np.float32)
    xb = x.reshape(-1, 256)
    xb[np.arange(xb.shape[0]), rng.integers(0, 256, xb.shape[0])] = rng.choice([-127.0, 127.0], xb.shape[0])
    return x


def ternary(blocks, m, k):
    t, d = S.ternary_from_blocks(blocks)
    return t.reshape(m, k), d.reshape(m, k // 256)


def q8k_reference(lib, blocks, m, k, x):
    """float64 products of STQ1_0 rows with the Q8_K form of every column of x (n, k), and the
    float32 rounding bound of each output.  Returns (want (n, m), bound (n, m))."""
    t, d = ternary(blocks, m, k)
    nb = k // 256
    t = t.reshape(m, nb, 256).astype(np.int32)
    d = d.astype(np.float64)
    want, bound = [], []
    for col in x:
        yb = lib.from_float_cpu(lib.type_id("q8_K"), col).reshape(nb, Q8K_BYTES)
        dy = yb[:, :4].copy().view("<f4").reshape(-1).astype(np.float64)
        qy = yb[:, 4:260].view(np.int8).astype(np.int32)
        isum = np.einsum("mbi,bi->mb", t, qy, dtype=np.int64)
        scale = np.abs(d * dy)
        want.append((d * dy * isum).sum(axis=1))
        bound.append(8 * 2.0**-24 * (scale * (np.abs(qy).sum(axis=1) + 1)).sum(axis=1))
    return np.array(want), np.array(bound)


# ---------------------------------------------------------------------------------------------
# builds


def _x86_avx2(lib) -> bool:
    return platform.machine() in ("x86_64", "AMD64") and bool(lib.fn("ggml_cpu_has_avx2")())


@pytest.fixture(scope="module", params=["native", "avx2"])
def lib(request):
    if request.param == "native":
        build = request.getfixturevalue("stq_cpu_build")
    else:
        if platform.machine() not in ("x86_64", "AMD64"):
            pytest.skip("the AVX2-only build is for x86-64 hosts")
        build = os.environ.get("STQ_CPU_AVX2_BUILD") or request.getfixturevalue("cpu_avx2_build")
    lib = ggml.GGML(build, n_threads=2)
    if not lib.has_stq1_0():
        pytest.skip(f"{build}: no STQ1_0")
    if not _x86_avx2(lib):
        pytest.skip("CPU_REPACK has an STQ1_0 layout only on x86 with AVX2 (elsewhere: plain vec_dot)")
    yield lib
    lib.close()


# ---------------------------------------------------------------------------------------------
# MUL_MAT


SHAPES = [(16, 256, 1), (48, 512, 3), (160, 1024, 2), (64, 4096, 5), (2048, 768, 7), (6144, 2048, 1), (6144, 2048, 8)]


@pytest.mark.parametrize("m,k,n", SHAPES, ids=[f"{m}x{k}-n{n}" for m, k, n in SHAPES])
def test_exact_integer_products(lib, m, k, n):
    rng = np.random.default_rng(m * 7 + k + n)
    blocks = unit_blocks(rng, m * k // 256)
    x = integer_activations(rng, (n, k))
    t, _ = ternary(blocks, m, k)
    want = (x.astype(np.int64) @ t.astype(np.int64).T).astype(np.float64)
    assert np.abs(want).max() < 2**24
    with Weights(lib, (k, m), blocks) as w:
        assert w.buft == "CPU_REPACK", f"{m}x{k} STQ1_0 went to {w.buft}, not CPU_REPACK"
        got = mul_mat(lib, w, x)
    bad = np.argwhere(got != want)
    assert bad.size == 0, (f"{len(bad)} of {got.size} outputs differ from the integer product, first "
                           f"(col, row) {tuple(bad[0])}: {got[tuple(bad[0])]} vs {want[tuple(bad[0])]}")


REAL = [(32, 256, 1), (96, 2048, 4), (2048, 6144, 2), (6144, 2048, 3)]


@pytest.mark.parametrize("m,k,n", REAL, ids=[f"{m}x{k}-n{n}" for m, k, n in REAL])
def test_real_data_against_q8k_reference_and_vec_dot(lib, m, k, n):
    rng = np.random.default_rng(1000 + m + k + n)
    blocks = lib.quantize(STQ, rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((n, k)).astype(np.float32)
    want, bound = q8k_reference(lib, blocks, m, k, x)
    with Weights(lib, (k, m), blocks) as w, Weights(lib, (k, m), blocks, plain=True) as wp:
        assert (w.buft, wp.buft) == ("CPU_REPACK", "CPU")
        got = mul_mat(lib, w, x)
        plain = mul_mat(lib, wp, x)
    err = np.abs(got - want)
    assert (err <= bound).all(), f"max err/bound {float((err / bound).max()):.3g} vs the Q8_K reference"
    diff = np.abs(got - plain)
    assert (diff <= 2 * bound).all(), f"max |lut - vec_dot| / bound {float((diff / bound).max()):.3g}"


def test_batch_invariance(lib):
    """Column j of an n-column product == the product of column j alone, bit for bit."""
    m, k = 512, 2048
    rng = np.random.default_rng(7)
    blocks = lib.quantize(STQ, rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((8, k)).astype(np.float32)
    with Weights(lib, (k, m), blocks) as w:
        assert w.buft == "CPU_REPACK"
        for n in (2, 5, 8):
            batch = mul_mat(lib, w, x[:n])
            for j in range(n):
                one = mul_mat(lib, w, x[j:j + 1])[0]
                assert np.array_equal(batch[j].view(np.uint32), one.view(np.uint32)), f"n={n} column {j}"


@pytest.mark.parametrize("m", [8, 40, 100])
def test_rows_not_multiple_of_16_stay_plain(lib, m):
    k = 512
    rng = np.random.default_rng(m)
    blocks = unit_blocks(rng, m * k // 256)
    x = integer_activations(rng, (3, k))
    t, _ = ternary(blocks, m, k)
    with Weights(lib, (k, m), blocks) as w:
        assert w.buft == "CPU", f"{m} rows: CPU_REPACK must refuse (got {w.buft})"
        got = mul_mat(lib, w, x)
    assert np.array_equal(got, (x.astype(np.int64) @ t.astype(np.int64).T).astype(np.float32))


# ---------------------------------------------------------------------------------------------
# MUL_MAT_ID


MOE = [(8, 2, 1, False, 64, 512), (8, 2, 5, True, 64, 512), (16, 4, 32, False, 32, 1024), (8, 8, 3, True, 2048, 256)]


@pytest.mark.parametrize("n_expert,n_used,n_tokens,shared,m,k", MOE,
                         ids=[f"e{e}-top{u}-t{t}-{'shared' if s else 'per-slot'}-{m}x{k}" for e, u, t, s, m, k in MOE])
def test_mul_mat_id_exact(lib, n_expert, n_used, n_tokens, shared, m, k):
    rng = np.random.default_rng(n_expert * 100 + n_used * 10 + n_tokens)
    blocks = unit_blocks(rng, n_expert * m * k // 256)
    x = integer_activations(rng, (n_tokens, 1 if shared else n_used, k))
    ids = np.stack([rng.permutation(n_expert)[:n_used] for _ in range(n_tokens)]).astype(np.int32)
    t = ternary(blocks, n_expert * m, k)[0].reshape(n_expert, m, k).astype(np.int64)
    want = np.empty((n_tokens, n_used, m))
    for tok in range(n_tokens):
        for s in range(n_used):
            want[tok, s] = t[ids[tok, s]] @ x[tok, 0 if shared else s].astype(np.int64)
    with Weights(lib, (k, m, n_expert), blocks, n_used=x.shape[1]) as w:
        assert w.buft == "CPU_REPACK"
        got = mul_mat_id(lib, w, x, ids)
    assert np.array_equal(got, want), f"{int((got != want).sum())} of {got.size} outputs differ"


def test_mul_mat_id_hy4_expert_shape(lib):
    """Hy4-preview's routed experts: 256 x (6144 -> 2048) STQ1_0, top-8, one token and three."""
    n_expert, n_used, m, k = 256, 8, 2048, 6144
    rng = np.random.default_rng(4)
    blocks = unit_blocks(rng, n_expert * m * k // 256)
    with Weights(lib, (k, m, n_expert), blocks) as w:
        assert w.buft == "CPU_REPACK"
        for n_tokens in (1, 3):
            x = integer_activations(rng, (n_tokens, 1, k))
            ids = np.stack([rng.permutation(n_expert)[:n_used] for _ in range(n_tokens)]).astype(np.int32)
            got = mul_mat_id(lib, w, x, ids)
            for tok in range(n_tokens):
                for s in range(n_used):
                    e = int(ids[tok, s])
                    eb = blocks[e * m * k // 256:(e + 1) * m * k // 256]
                    want = ternary(eb, m, k)[0].astype(np.int64) @ x[tok, 0].astype(np.int64)
                    assert np.array_equal(got[tok, s], want), f"token {tok} slot {s} (expert {e})"
