"""STQ1_0 in the built ggml (CPU) against the numpy reference, through ctypes.

Needs a CPU build with the STQ1_0 patches (fixture ``stq_cpu_build``: env STQ_CPU_BUILD or the
harness's ``cpu_build``).  What is compared, and how exactly:

* dequantize (type traits ``to_float``), ``get_rows`` and ``cpy`` STQ1_0 -> F32: bit-exact with
  ``harness.stq1_0.decode`` (compared as uint32, so signed zeros count too).
* quantize: the C quantizer and the numpy encoder are two implementations of the same PTQ
  algorithm, so they are compared by *result*, not required to be bit-exact everywhere:
  without an imatrix the optimum is unique (zero the smallest |x|, least-squares scale), and the
  only freedom left is the fp16 rounding of a float32 vs a float64 sum, so >= 99.9 % of blocks
  must be identical and every other block may differ only by one fp16 ulp of d; with an imatrix
  the weighted errors must agree within 1e-3 relative.  Both quantizers must reproduce each
  other's bytes from the other's decoded weights (exactly representable input).
* mul_mat / mul_mat_id / get_rows / cpy run on the CPU and, where a metal-emu build is available
  (fixture ``metal_emu_build`` or env STQ_METAL_EMU_BUILD), on its MTL0 device, against the same
  numpy references and tolerances (ops a backend does not support skip with the reason).
* mul_mat / mul_mat_id on the CPU quantize activations to Q8_K.  With activations that Q8_K
  represents exactly (k * 2^e, |k| <= 127, one |k| = 127 per 256-block) the CPU result must
  match the float64 numpy product within 1e-5 of sum |x||w| (float32 accumulation only).  With
  normal activations it must be within 6 sigma of the Q8_K rounding noise
  (sigma^2 = sum w^2 step^2 / 12, step = amax/127 per 256-block) plus the same 1e-5 term.
* vec_dot: the CPU kernel against an exact numpy integer dot over the Q8_K bytes; AVX2 and
  generic kernels against each other when both symbols are exported.
"""

from __future__ import annotations

import ctypes as C
import os
from pathlib import Path

import numpy as np
import pytest

from harness import stq1_0 as S

import stq_helpers
from stq_helpers import random_blocks, stq_cpu_build, stq_lib  # noqa: F401 (fixtures)

STQ = S.TYPE_ID
Q8K_BYTES = 4 + 256 + 2 * 16  # block_q8_K: float d, int8 qs[256], int16 bsums[16] (ggml-common.h)


def _f16_bytes(v):
    return np.array([v], dtype=np.float16).view(np.uint8)


def f32(lib):
    return lib.type_id("f32")


# ---------------------------------------------------------------------------------------------
# the ctypes layer itself (works on any build, with or without STQ1_0)


def test_layer_on_plain_types(stq_cpu_build):
    from harness import ggml

    lib = ggml.GGML(stq_cpu_build)
    try:
        lib.self_check()
        assert ("CPU" in [n for n, _ in lib.devices()])
        f32_, q8_0 = lib.type_id("f32"), lib.type_id("q8_0")
        assert (lib.blck_size(q8_0), lib.type_size(q8_0)) == (32, 34)
        rng = np.random.default_rng(0)
        w = rng.standard_normal((7, 64)).astype(np.float32)
        x = rng.standard_normal((3, 64)).astype(np.float32)
        np.testing.assert_allclose(lib.mul_mat(f32_, w, 64, 7, x), x @ w.T, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(lib.get_rows(f32_, w, 64, 7, [6, 0, 6]), w[[6, 0, 6]])
        q = lib.quantize(q8_0, w)
        assert q.shape == (7, lib.row_size(q8_0, 64))
        np.testing.assert_allclose(lib.dequantize(q8_0, q).reshape(7, 64), w, atol=np.abs(w).max() / 100)
        ids = np.array([[1, 0], [0, 1], [1, 1]], dtype=np.int32)
        we = rng.standard_normal((2, 5, 64)).astype(np.float32)
        got = lib.mul_mat_id(f32_, we, 64, 5, 2, x[:, None, :], ids)
        want = np.einsum("tk,tjmk->tjm", x, we[ids])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        with pytest.raises(ggml.GGMLError, match="no backend device 'NOPE0'"):
            lib.backend("NOPE0")
        with pytest.raises(ggml.GGMLError, match="not a ggml type"):
            lib.type_name(500)
    finally:
        lib.close()


SECOND_BUILD_CHECK = """
import shutil, sys
from pathlib import Path
import numpy as np
from harness import ggml
build, tmp = Path(sys.argv[1]), Path(sys.argv[2])
first = ggml.GGML(build)
(tmp / "bin").mkdir()
for p in first.paths.values():
    for f in p.parent.glob(p.name + "*"):
        shutil.copy2(f, tmp / "bin" / f.name, follow_symlinks=True)
second = ggml.GGML(tmp)
assert second._dl is not None and first._dl is None, "the copy was not loaded into a namespace of its own"
second.self_check()
rng = np.random.default_rng(3)
w = rng.standard_normal((5, 64)).astype(np.float32)
q8_0 = first.type_id("q8_0")
assert (first.quantize(q8_0, w) == second.quantize(q8_0, w)).all()
x = rng.standard_normal((2, 64)).astype(np.float32)
f32_ = first.type_id("f32")
np.testing.assert_array_equal(first.mul_mat(f32_, w, 64, 5, x), second.mul_mat(f32_, w, 64, 5, x))
first.close()
second.close()
print("OK: two builds side by side")
"""


def test_second_build_in_one_process(stq_cpu_build, tmp_path):
    """A second build (here: a copy of the libraries at another path) loads beside the first one,
    in its own link-map namespace, and both work.

    Run in a child process: a namespace made by dlmopen brings its own copy of libc, and when the
    build uses OpenMP, that copy's libgomp threads leave the parent's libc in a state where later
    OpenSSL hashing (hashlib on a large file) segfaults; other tests in this session hash files."""
    import subprocess
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("dlmopen namespaces are a glibc feature")
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-c", SECOND_BUILD_CHECK, str(stq_cpu_build), str(tmp_path)],
                       cwd=root, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(root)))
    assert r.returncode == 0 and "OK" in r.stdout, f"rc {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"


def test_layer_errors(tmp_path):
    from harness import ggml

    with pytest.raises(ggml.GGMLError, match="does not exist"):
        ggml.GGML(tmp_path / "nope")
    (tmp_path / "bin").mkdir()
    with pytest.raises(ggml.GGMLError, match="libggml-base"):
        ggml.GGML(tmp_path)


# ---------------------------------------------------------------------------------------------
# type, dequantize, validation


def test_traits(stq_lib):
    lib = stq_lib
    assert lib.type_name(STQ) == S.TYPE_NAME
    assert lib.type_id("stq1_0") == STQ
    assert (lib.blck_size(STQ), lib.type_size(STQ)) == (S.QK, S.BLOCK_BYTES)
    assert lib.row_size(STQ, 6144) == S.row_bytes(6144) == 1008
    assert lib.is_quantized(STQ)
    tr = lib.traits(STQ)
    assert tr.to_float and tr.from_float_ref
    assert lib.type_name(42) == "q2_0"


@pytest.mark.parametrize("d_scale", [1.0, 1e-6, 3e4])
def test_dequantize_bit_exact(stq_lib, d_scale):
    rng = np.random.default_rng(int(d_scale * 1000) % 2**32)
    b = random_blocks(rng, 4099, d_scale)
    b[0, 40:42] = _f16_bytes(0.0)
    b[1, 40:42] = _f16_bytes(-0.0)
    b[2, 40:42] = _f16_bytes(6e-8)  # subnormal
    got = stq_lib.dequantize(STQ, b)
    want = S.decode(b)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_validate_row_data_rejects_non_finite_scales(stq_lib):
    rng = np.random.default_rng(5)
    b = random_blocks(rng, 8)
    assert stq_lib.validate_row_data(STQ, b)
    for bad in (np.inf, -np.inf, np.nan):
        c = b.copy()
        c[5, 40:42] = _f16_bytes(bad)
        assert not stq_lib.validate_row_data(STQ, c)


# ---------------------------------------------------------------------------------------------
# quantizers


def _check_same_result(xb_c, xb_n, x, im):
    bc = xb_c.reshape(-1, S.BLOCK_BYTES)
    bn = xb_n.reshape(-1, S.BLOCK_BYTES)
    same = (bc == bn).all(axis=1)
    if im is None:
        assert same.mean() >= 0.999, f"only {same.mean():.5f} of blocks identical"
        diff = ~same
        # differing blocks: same codes and signs, d one fp16 ulp apart
        assert (bc[diff, :40] == bn[diff, :40]).all()
        dc = bc[diff, 40:42].copy().view("<u2").astype(np.int32)
        dn = bn[diff, 40:42].copy().view("<u2").astype(np.int32)
        assert (np.abs(dc - dn) <= 1).all()
    ec, en = S.weighted_error(x, xb_c, im), S.weighted_error(x, xb_n, im)
    assert abs(ec - en) <= 1e-3 * en, (ec, en)


QSHAPES = [(1, 256), (3, 768), (17, 512), (5, 6144), (6144, 2048)]


@pytest.mark.parametrize("shape", QSHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("use_imatrix", [False, True], ids=["plain", "imatrix"])
def test_quantize_agrees_with_numpy(stq_lib, shape, use_imatrix):
    rng = np.random.default_rng(shape[0] * 7 + shape[1] + use_imatrix)
    x = (rng.standard_normal(shape) * rng.uniform(0.01, 3)).astype(np.float32)
    im = rng.uniform(0.05, 5.0, shape[1]).astype(np.float32) if use_imatrix else None
    bc = stq_lib.quantize(STQ, x, im)
    bn = S.encode(x, imatrix=im)
    assert bc.shape == bn.shape
    _check_same_result(bc, bn, x, im)
    # every group of the C output has exactly one zero lane
    t, _ = S.ternary_from_blocks(bc)
    lanes = t[:, S.GROUP_INDEX]
    assert ((lanes == 0).sum(axis=-1) == 1).all()
    # each reproduces the other's bytes from the other's decoded weights
    yc = S.decode(bc).reshape(shape)
    yn = S.decode(bn).reshape(shape)
    assert (S.encode(yc, imatrix=im) == bc).all()
    assert (stq_lib.quantize(STQ, yn, im) == bn).all()


def test_reference_quantizer(stq_lib):
    """``from_float_ref`` (quantize_row_stq1_0_ref) on one long row, against numpy encode."""
    rng = np.random.default_rng(21)
    x = rng.standard_normal(256 * 301).astype(np.float32)
    tr = stq_lib.traits(STQ)
    out = np.empty(S.row_bytes(x.size), dtype=np.uint8)
    fn = C.CFUNCTYPE(None, C.c_void_p, C.c_void_p, C.c_int64)(tr.from_float_ref)
    fn(x.ctypes.data, out.ctypes.data, x.size)
    _check_same_result(out, S.encode(x), x, None)


def test_quantize_special_blocks(stq_lib):
    x = np.zeros((3, 256), dtype=np.float32)
    x[1, 100] = 5.0
    x[2, :] = 1e-3
    x[2, 9] = -4e5  # above the fp16 range
    bc = stq_lib.quantize(STQ, x)
    bn = S.encode(x)
    assert stq_lib.validate_row_data(STQ, bc)
    yc = S.decode(bc).reshape(x.shape)
    assert np.isfinite(yc).all() and (yc[0] == 0).all()
    assert (bc[:2] == bn[:2]).all()
    assert yc[1, 100] > 0 and yc[2, 9] < 0


# ---------------------------------------------------------------------------------------------
# patched gguf-py


def test_gguf_py_dequantize_and_quantize(stq_lib, stq_cpu_build, tmp_path):
    rng = np.random.default_rng(9)
    b = random_blocks(rng, 1001)
    x = rng.standard_normal((7, 512)).astype(np.float32)
    np.save(tmp_path / "b.npy", b)
    np.save(tmp_path / "x.npy", x)
    code = f"""
import numpy as np, gguf
from gguf.quants import dequantize, quantize
T = gguf.GGMLQuantizationType.STQ1_0
assert int(T) == 43 and gguf.GGML_QUANT_SIZES[T] == (256, 42)
assert int(gguf.LlamaFileType.MOSTLY_STQ1_0) == 42
b = np.load({str(tmp_path / "b.npy")!r})
np.save({str(tmp_path / "y.npy")!r}, dequantize(b.reshape(-1), T))
try:
    q = quantize(np.load({str(tmp_path / "x.npy")!r}), T)
    np.save({str(tmp_path / "q.npy")!r}, q)
    print("quantize ok")
except NotImplementedError:
    print("no quantize")
"""
    out = stq_helpers.run_patched_gguf_py(stq_cpu_build, code)
    y = np.load(tmp_path / "y.npy").reshape(-1)
    np.testing.assert_array_equal(y.view(np.uint32), S.decode(b).view(np.uint32))
    np.testing.assert_array_equal(y.view(np.uint32), stq_lib.dequantize(STQ, b).view(np.uint32))
    if "quantize ok" in out:
        q = np.load(tmp_path / "q.npy")
        _check_same_result(q, S.encode(x), x, None)


# ---------------------------------------------------------------------------------------------
# graph ops: on the CPU, and on the metal emulator's MTL0 where a metal-emu build is available


@pytest.fixture
def cpu_kernels(stq_lib):
    tr = stq_lib.traits_cpu(STQ)
    if not tr.vec_dot or not tr.from_float:
        pytest.skip("the CPU backend has no STQ1_0 vec_dot/from_float (patch 0002 not applied)")
    return stq_lib


_EMU_LIBS: dict = {}


def _metal_emu_lib(request):
    import os

    from harness import ggml

    if os.environ.get("STQ_METAL_EMU_BUILD"):
        build = os.environ["STQ_METAL_EMU_BUILD"]
    else:
        try:
            build = request.getfixturevalue("metal_emu_build")
        except pytest.FixtureLookupError:
            pytest.skip("no metal-emu build (set STQ_METAL_EMU_BUILD)")
    if build not in _EMU_LIBS:
        _EMU_LIBS[build] = ggml.GGML(build)
    lib = _EMU_LIBS[build]
    if not lib.has_stq1_0():
        pytest.skip(f"{build}: no STQ1_0 in this metal-emu build")
    if "MTL0" not in [n for n, _ in lib.devices()]:
        pytest.skip(f"{build}: no MTL0 device")
    return lib


@pytest.fixture(params=["CPU", "MTL0"])
def ops(request, stq_lib):
    """(lib, backend name) to run graph ops on; MTL0 comes from the metal-emu build."""
    if request.param == "CPU":
        return request.getfixturevalue("cpu_kernels"), "CPU"
    return _metal_emu_lib(request), "MTL0"


def run_or_skip(fn, backend):
    """Run an op; a backend that does not support it (not the CPU) skips with the reason."""
    from harness import ggml

    try:
        return fn()
    except ggml.GGMLError as e:
        if backend != "CPU" and "does not support" in str(e):
            pytest.skip(f"{backend}: {e}")
        raise


def exact_q8k_activations(rng, shape):
    """Float32 activations that Q8_K represents exactly: k * 2^e per 256-block, one |k| = 127."""
    k = rng.integers(-127, 128, shape).astype(np.float64)
    kb = k.reshape(-1, 256)
    kb[np.arange(kb.shape[0]), rng.integers(0, 256, kb.shape[0])] = rng.choice([-127.0, 127.0], kb.shape[0])
    e = rng.integers(-10, 3, kb.shape[0]).astype(np.float64)
    return (kb * np.exp2(e)[:, None]).reshape(shape).astype(np.float32)


def tolerance(x, w, exact: bool):
    """Per-output bound for x (n, k) @ w (m, k).T computed by the CPU with Q8_K activations."""
    x = x.astype(np.float64)
    w = w.astype(np.float64)
    tol = 1e-5 * (np.abs(x) @ np.abs(w).T) + 1e-30
    if not exact:
        step = np.abs(x).reshape(x.shape[0], -1, 256).max(axis=2) / 127.0  # (n, k/256)
        step = np.repeat(step, 256, axis=1)
        tol += 6.0 * np.sqrt((step**2) @ (w**2).T / 12.0)
    return tol


def check_close(got, want, tol, what):
    err = np.abs(got.astype(np.float64) - want)
    bad = err > tol
    assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} outputs off; worst err {err.max():.3g} "
                           f"(tol there {tol.reshape(-1)[np.argmax((err - tol).reshape(-1))]:.3g})")


# (k, m, n): non-square, odd counts, the Hy4 expert shape 6144x2048 (ne0 = 6144 inputs)
MM_SHAPES = [(256, 1, 1), (256, 7, 5), (512, 33, 3), (768, 64, 32), (2048, 6144, 1), (6144, 2048, 1),
             (6144, 2048, 5)]


@pytest.mark.parametrize("kmn", MM_SHAPES, ids=lambda s: "k{}m{}n{}".format(*s))
@pytest.mark.parametrize("exact", [True, False], ids=["q8k-exact", "normal"])
def test_mul_mat(ops, kmn, exact):
    lib, be = ops
    k, m, n = kmn
    rng = np.random.default_rng(k + 3 * m + 7 * n + exact)
    wb = random_blocks(rng, m * k // 256, d_scale=0.05)
    x = exact_q8k_activations(rng, (n, k)) if exact else rng.standard_normal((n, k)).astype(np.float32)
    got = run_or_skip(lambda: lib.mul_mat(STQ, wb, k, m, x, backend=be), be)
    w = S.decode(wb).reshape(m, k)
    want = x.astype(np.float64) @ w.astype(np.float64).T
    assert got.shape == (n, m)
    check_close(got, want, tolerance(x, w, exact), f"{be} mul_mat k={k} m={m} n={n}")


# (k, m, n_expert, n_used, n_tokens, shared_x)
MOE = [
    (256, 64, 8, 2, 1, True), (256, 64, 8, 2, 5, False), (512, 32, 8, 8, 32, True),
    (256, 96, 256, 8, 1, True), (256, 96, 256, 8, 5, False), (512, 64, 256, 2, 32, True),
    (256, 64, 256, 8, 32, False),
    (6144, 2048, 256, 8, 1, True), (6144, 2048, 256, 8, 5, True),
]


@pytest.mark.parametrize("cfg", MOE, ids=lambda c: "k{}m{}e{}top{}t{}{}".format(*c[:5], "s" if c[5] else ""))
def test_mul_mat_id(ops, cfg):
    lib, be = ops
    k, m, n_expert, n_used, n_tokens, shared = cfg
    rng = np.random.default_rng(k + m + n_expert + n_used * 13 + n_tokens * 17 + shared)
    wb = random_blocks(rng, n_expert * m * k // 256, d_scale=0.05)
    ids = np.stack([rng.choice(n_expert, n_used, replace=False) for _ in range(n_tokens)]).astype(np.int32)
    x = exact_q8k_activations(rng, (n_tokens, 1 if shared else n_used, k))
    got = run_or_skip(lambda: lib.mul_mat_id(STQ, wb, k, m, n_expert, x, ids, backend=be), be)
    assert got.shape == (n_tokens, n_used, m)
    # the reference for (a sample of) output rows: all rows of small experts, 64 of the Hy4 ones
    rows = np.arange(m) if m * k <= 1 << 20 else np.sort(rng.choice(m, 64, replace=False))
    row_bytes = S.row_bytes(k)
    wrows = wb.reshape(n_expert, m, row_bytes)
    for e in np.unique(ids):  # every expert decoded once, all its (token, slot) uses at once
        w = S.decode(wrows[e, rows]).reshape(rows.size, k)
        ts, js = np.nonzero(ids == e)
        xv = x[ts, 0] if shared else x[ts, js]
        want = xv.astype(np.float64) @ w.astype(np.float64).T
        check_close(got[ts, js][:, rows], want, tolerance(xv, w, True),
                    f"{be} mul_mat_id expert {e} (tokens {ts.tolist()}, slots {js.tolist()})")


@pytest.mark.parametrize("k,n_rows,rows", [(256, 1, [0]), (512, 9, [8, 0, 3, 3, 7]), (6144, 33, list(range(32, -1, -3)))])
def test_get_rows_bit_exact(ops, k, n_rows, rows):
    lib, be = ops
    rng = np.random.default_rng(k + n_rows)
    wb = random_blocks(rng, n_rows * k // 256)
    got = run_or_skip(lambda: lib.get_rows(STQ, wb, k, n_rows, rows, backend=be), be)
    want = S.decode(wb).reshape(n_rows, k)[rows]
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("k,n_rows", [(256, 1), (768, 5), (2048, 17)])
def test_cpy_f32_to_stq1_0(ops, k, n_rows):
    lib, be = ops
    rng = np.random.default_rng(k * n_rows)
    x = rng.standard_normal((n_rows, k)).astype(np.float32)
    got = run_or_skip(lambda: lib.cpy(f32(lib), x, STQ, k, n_rows, backend=be), be)
    assert got.shape == (n_rows, S.row_bytes(k))
    _check_same_result(got, S.encode(x), x, None)
    # exactly representable input comes back as the same bytes
    bn = S.encode(x)
    again = lib.cpy(f32(lib), S.decode(bn).reshape(n_rows, k), STQ, k, n_rows, backend=be)
    assert (again == bn).all()


def test_cpy_stq1_0_to_f32(ops):
    lib, be = ops
    rng = np.random.default_rng(77)
    k, n_rows = 512, 6
    wb = random_blocks(rng, n_rows * k // 256)
    try:
        got = lib.cpy(STQ, wb, f32(lib), k, n_rows, backend=be)
    except Exception as e:  # noqa: BLE001
        if "does not support" in str(e):
            pytest.skip(f"{be} backend: {e}")
        raise
    np.testing.assert_array_equal(got.view(np.uint32).reshape(-1), S.decode(wb).view(np.uint32))


# ---------------------------------------------------------------------------------------------
# vec_dot


def q8k_exact_dot(wb, yq, n):
    """Exact float64 dot of STQ1_0 blocks with Q8_K blocks (raw bytes), and a float32 rounding
    bound for a kernel that forms integer sums per block and combines them with the two scales.

    The bound is ``8 * 2^-24 * sum_b |d_b * dy_b| * (sum_i |q_i| + 1)`` (a few roundings of
    terms as large as the Q8_K offset sums a kernel may fold in).  It is asserted to be below half
    of the smallest ``|d_b * dy_b|``, so a kernel within it has the exact integer sums: being one
    integer off in a block moves the result by at least that much."""
    t, d = S.ternary_from_blocks(wb)
    yb = np.frombuffer(bytes(yq), dtype=np.uint8).reshape(-1, Q8K_BYTES)
    dy = yb[:, :4].copy().view("<f4").reshape(-1).astype(np.float64)
    qy = yb[:, 4:260].view(np.int8).astype(np.int64)
    isum = (t.astype(np.int64) * qy).sum(axis=1)
    scale = np.abs(d.astype(np.float64) * dy)
    bound = 8 * 2.0**-24 * float((scale * (np.abs(qy).sum(axis=1) + 1)).sum())
    assert bound < 0.5 * scale.min(), "test data too long for the bound to pin the integer sums"
    return float((d.astype(np.float64) * dy * isum).sum()), bound


@pytest.mark.parametrize("n", [256, 512, 2048])
def test_vec_dot_against_exact_integer_sums(cpu_kernels, stq_lib, n):
    lib = stq_lib
    vt = lib.traits_cpu(STQ).vec_dot_type
    assert lib.type_name(vt) == "q8_K"
    rng = np.random.default_rng(n)
    for _ in range(30):
        wb = random_blocks(rng, n // 256, d_scale=0.1)
        wb[:, 40:42] = _f16_bytes(0.1)  # equal scales: keeps the bound tight over several blocks
        y = lib.from_float_cpu(vt, rng.standard_normal(n).astype(np.float32) * rng.uniform(0.1, 10))
        got = lib.vec_dot(STQ, n, wb, y)
        want, bound = q8k_exact_dot(wb, y, n)
        assert abs(got - want) <= bound, (got, want, bound)


def _vec_dot_symbol(lib, name):
    if not lib.has_symbol(name):
        return None
    f = lib.fn(name)
    f.restype = None
    f.argtypes = [C.c_int, C.POINTER(C.c_float), C.c_size_t, C.c_void_p, C.c_size_t, C.c_void_p, C.c_size_t, C.c_int]
    return f


_EXTRA_CPU_LIBS: dict = {}


@pytest.fixture(params=["native", "avx2"])
def simd_lib(request, stq_lib):
    """The session's CPU build ("native": its best SIMD path, e.g. AVX-512 VNNI) and, when env
    STQ_CPU_AVX2_BUILD names one, a build configured with GGML_NATIVE=OFF GGML_AVX2=ON (its AVX2
    path), loaded beside the first in its own namespace."""
    import os

    from harness import ggml

    if request.param == "native":
        return request.getfixturevalue("cpu_kernels")
    build = str(os.environ.get("STQ_CPU_AVX2_BUILD") or request.getfixturevalue("cpu_avx2_build"))
    if build not in _EXTRA_CPU_LIBS:
        _EXTRA_CPU_LIBS[build] = ggml.GGML(build)
    lib = _EXTRA_CPU_LIBS[build]
    if not lib.has_stq1_0() or not lib.traits_cpu(STQ).vec_dot:
        pytest.skip(f"{build}: no STQ1_0 CPU kernels")
    return lib


def test_vec_dot_simd_equals_generic(simd_lib):
    """The SIMD kernel (whichever the build compiled: AVX2, AVX-512, NEON) and the generic C
    kernel have the same integer sums: both are within the rounding bound of the exact result,
    which pins the integer sums (see q8k_exact_dot).  Their float results may differ in the last
    bits (FMA, summation order)."""
    lib = simd_lib
    simd = _vec_dot_symbol(lib, "ggml_vec_dot_stq1_0_q8_K")
    generic = _vec_dot_symbol(lib, "ggml_vec_dot_stq1_0_q8_K_generic")
    if simd is None or generic is None:
        pytest.skip("ggml_vec_dot_stq1_0_q8_K and/or its _generic variant are not exported by libggml-cpu")
    vt = lib.traits_cpu(STQ).vec_dot_type
    rng = np.random.default_rng(1234)
    worst = 0.0
    for n in (256, 512, 2048):
        for _ in range(50):
            wb = random_blocks(rng, n // 256)
            wb[:, 40:42] = _f16_bytes(rng.uniform(0.01, 1))
            y = lib.from_float_cpu(vt, rng.standard_normal(n).astype(np.float32) * 4)
            s1, s2 = C.c_float(), C.c_float()
            simd(n, C.byref(s1), 0, wb.ctypes.data, 0, y.ctypes.data, 0, 1)
            generic(n, C.byref(s2), 0, wb.ctypes.data, 0, y.ctypes.data, 0, 1)
            want, bound = q8k_exact_dot(wb, y, n)
            assert abs(s1.value - want) <= bound, ("simd", n, s1.value, want, bound)
            assert abs(s2.value - want) <= bound, ("generic", n, s2.value, want, bound)
            worst = max(worst, abs(s1.value - s2.value) / bound)
    print(f"{lib.build_dir}: simd vs generic: worst |difference| = {worst:.3f} of the rounding bound")
