"""STQ1_0 on CUDA (patch 0030): the real ggml-cuda backend ("CUDA0") on an NVIDIA GPU.

Needs a CUDA build of the applied series (env STQ_CUDA_BUILD = a build dir with bin/ and the shared
libraries, e.g. the one harness/cuda_device.sh builds on the lent H200) and a GPU; without them every
test skips with the reason printed (CI has no GPU).

Oracles: the independent numpy STQ1_0 reference (harness/stq1_0.py) in float64 (the build's own
to_float for the large expert stacks), the CPU reference quantizer (cpy f32 -> stq1_0 must give the same
bytes), test-backend-ops (CUDA vs CPU, whatever STQ1_0 cases patch 0004 adds) and the batch-invariance
test (tests/test-mul-mat-batch-invariance.cpp of patch 0030): each column of a 2..8-column mat-vec must
have the bits of the one-column product, and the same test must catch Q4_0, whose upstream mmvq changes
its K split with the batch size (the proof that it can fail).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from harness import stq1_0 as R
from harness.ggml import GGML

from stq_helpers import bits, decoded, nmse
from stq_helpers import matrix_blocks as random_blocks

pytestmark = pytest.mark.build

MV_BATCHES = (1, 2, 3, 4, 5, 6, 7, 8)  # mmvq
MM_BATCHES = (9, 32, 128, 512)         # mmq (patch 0034; dequantize + cuBLAS before it)


@pytest.fixture(scope="module")
def cuda_build() -> Path:
    env = os.environ.get("STQ_CUDA_BUILD")
    if not env:
        pytest.skip("no CUDA build: set STQ_CUDA_BUILD to a CUDA build dir of the series "
                    "(harness/cuda_device.sh builds and runs this on the lent GPU)")
    p = Path(env)
    if not (p / "bin").is_dir():
        pytest.fail(f"STQ_CUDA_BUILD={env} has no bin/ folder")
    if not shutil.which("nvidia-smi"):
        pytest.skip("no NVIDIA GPU on this machine (nvidia-smi not found)")
    return p


@pytest.fixture(scope="module")
def g(cuda_build):
    lib = GGML(cuda_build)
    names = [n for n, _ in lib.devices()]
    if "CUDA0" not in names:
        pytest.skip(f"{cuda_build}: no CUDA0 device (devices: {names}); is the GPU visible?")
    yield lib
    lib.close()


@pytest.fixture(scope="module")
def T(g):
    return g.type_id(R.TYPE_NAME)


# q8_1 activations (mmvq) and half activations (cuBLAS) against a float64 product of exact weights
TOL = 5e-4


# ---------------------------------------------------------------------------------------------
# test-backend-ops (CUDA vs CPU) and the batch-invariance test


def _must_be_supported(line: str) -> bool:
    op = line.strip().split("(", 1)[0]
    if op in ("MUL_MAT", "MUL_MAT_ID"):
        return "type_b=f32" in line
    if op == "GET_ROWS":
        return True
    if op == "CPY":
        return ("type_src=f32" in line and "type_dst=stq1_0" in line) or \
               ("type_src=stq1_0" in line and "type_dst=f32" in line)
    return False


@pytest.mark.parametrize("op", ["MUL_MAT", "MUL_MAT_ID", "GET_ROWS", "CPY"])
def test_backend_ops(cuda_build, g, op):
    exe = cuda_build / "bin" / "test-backend-ops"
    if not exe.exists():
        pytest.skip(f"{exe} was not built")
    r = subprocess.run([str(exe), "test", "-b", "CUDA0", "-o", op, "-p", "stq1_0"],
                       capture_output=True, text=True, timeout=1800)
    out = r.stdout + r.stderr
    m = re.search(r"(\d+)/(\d+) tests passed", out)
    assert r.returncode == 0 and m, f"test-backend-ops -o {op} -p stq1_0 on CUDA0 failed:\n{out[-4000:]}"
    unsupported = [ln.strip() for ln in out.splitlines() if "not supported" in ln and _must_be_supported(ln)]
    assert not unsupported, "CUDA0 refuses STQ1_0 cases:\n" + "\n".join(unsupported[:20])
    if int(m.group(2)) == 0:
        pytest.skip(f"test-backend-ops has no STQ1_0 {op} cases (patch 0004 adds them)")
    assert m.group(1) == m.group(2), out[-4000:]


@pytest.mark.parametrize("wtype, expect_invariant", [("stq1_0", True), ("q4_0", False)])
def test_batch_invariance(cuda_build, g, wtype, expect_invariant):
    exe = cuda_build / "bin" / "test-mul-mat-batch-invariance"
    if not exe.exists():
        pytest.fail(f"{exe} was not built (patch 0030 adds it)")
    cmd = [str(exe), "-b", "CUDA0", "-t", wtype] + ([] if expect_invariant else ["--expect-variant"])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    out = r.stdout + r.stderr
    print(out[-3000:])
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{out[-4000:]}"


# ---------------------------------------------------------------------------------------------
# MUL_MAT: decode, verify widths (mmvq), prefill (mmq); non-square; odd row counts


@pytest.mark.parametrize("k, m", [(256, 37), (768, 100), (2048, 129), (6144, 40), (14336, 64)])
@pytest.mark.parametrize("n", MV_BATCHES + MM_BATCHES)
def test_mul_mat(g, T, k, m, n):
    rng = np.random.default_rng(1000 * k + 10 * m + n)
    w = random_blocks(rng, m, k)
    x = rng.standard_normal((n, k)).astype(np.float32)
    ref = x.astype(np.float64) @ decoded(w, k).T
    y = g.mul_mat(T, w, k, m, x, backend="CUDA0")
    assert y.shape == (n, m)
    err = nmse(y, ref)
    assert err < TOL, f"K={k} M={m} N={n}: NMSE {err:.3e} vs the float64 reference"


# ---------------------------------------------------------------------------------------------
# MUL_MAT_ID: routed experts (mmvq up to 8 tokens, mmq beyond)


def routed_ids(rng, n_tokens: int, n_expert: int, n_used: int) -> np.ndarray:
    return np.stack([rng.choice(n_expert, n_used, replace=False) for _ in range(n_tokens)]).astype(np.int32)


MOE_CASES = [
    # (k, m, n_expert, n_used, tokens)
    (512, 64, 8, 2, (1, 5, 32)),
    (512, 96, 256, 8, (1, 5, 32)),
    (6144, 2048, 8, 8, (1, 5, 32)),     # Hy4-preview's expert shape
    (6144, 2048, 256, 8, (1, 5)),       # ... with its 256 experts, top-8 (528 MB of weights)
]


@pytest.mark.parametrize("k, m, n_expert, n_used, tokens", MOE_CASES,
                         ids=[f"{c[0]}x{c[1]}-e{c[2]}-top{c[3]}" for c in MOE_CASES])
def test_mul_mat_id(g, T, k, m, n_expert, n_used, tokens):
    rng = np.random.default_rng(k + m + n_expert + n_used)
    w = random_blocks(rng, n_expert * m, k)

    def expert(e):  # the build's to_float for the big stacks (checked against numpy in test_get_rows)
        blk = w[e * m:(e + 1) * m]
        if m * k <= 1 << 20:
            return decoded(blk, k)
        return g.dequantize(T, blk.reshape(-1)).reshape(m, k).astype(np.float64)

    for n_tokens in tokens:
        ids = routed_ids(rng, n_tokens, n_expert, n_used)
        x = rng.standard_normal((n_tokens, 1, k)).astype(np.float32)
        y = g.mul_mat_id(T, w, k, m, n_expert, x, ids, backend="CUDA0")
        ref = np.empty((n_tokens, n_used, m))
        for e in np.unique(ids):
            we = expert(int(e))
            for t, j in zip(*np.nonzero(ids == e)):
                ref[t, j] = we @ x[t, 0].astype(np.float64)
        err = nmse(y, ref)
        assert err < TOL, f"{k}x{m}, {n_expert} experts top-{n_used}, {n_tokens} tokens: NMSE {err:.3e}"


# ---------------------------------------------------------------------------------------------
# GET_ROWS and CPY


@pytest.mark.parametrize("k, n_rows", [(256, 3), (1024, 19), (6144, 40)])
def test_get_rows(g, T, k, n_rows):
    rng = np.random.default_rng(7 + k)
    w = random_blocks(rng, n_rows, k)
    rows = rng.integers(0, n_rows, 11).astype(np.int32)
    y = g.get_rows(T, w, k, n_rows, rows, backend="CUDA0")
    ref = decoded(w, k)[rows].astype(np.float32)
    assert np.array_equal(bits(y), bits(ref))
    # the build's to_float (used as the reference for the big expert stacks) agrees with numpy
    assert np.array_equal(bits(g.dequantize(T, w.reshape(-1)).reshape(n_rows, k)), bits(decoded(w, k).astype(np.float32)))


@pytest.mark.parametrize("k, n_rows", [(256, 1), (1024, 9), (6144, 4)])
def test_cpy_f32_to_stq1_0_matches_the_cpu_quantizer(g, T, k, n_rows):
    rng = np.random.default_rng(k + n_rows)
    x = (rng.standard_normal((n_rows, k)) * rng.uniform(1e-3, 1e2, (n_rows, 1))).astype(np.float32)
    x[0, :64] = np.round(x[0, :64])           # ties in |x| exercise the first-lane rule
    q_cpu = np.frombuffer(g.quantize(T, x), dtype=np.uint8).reshape(n_rows, -1)
    q_gpu = g.cpy(g.type_id("f32"), x, T, k, n_rows, backend="CUDA0")
    nb = n_rows * k // R.QK
    diff = (q_gpu.reshape(nb, -1) != q_cpu.reshape(nb, -1)).any(axis=1)
    assert not diff.any(), f"{diff.sum()} of {nb} blocks differ from quantize_row_stq1_0_ref"


def test_cpy_stq1_0_to_f32(g, T):
    rng = np.random.default_rng(3)
    k, n_rows = 768, 5
    w = random_blocks(rng, n_rows, k)
    y = g.cpy(T, w, g.type_id("f32"), k, n_rows, backend="CUDA0")
    assert np.array_equal(bits(y), bits(decoded(w, k).astype(np.float32)))


def test_supports_op_is_honest(g, T):
    """CUDA0 claims only what patch 0030 implements: no SET_ROWS to STQ1_0, no CPY to f16."""
    k, n_rows = 256, 2
    with g.graph("CUDA0") as gr:
        a = gr.tensor(T, (k, n_rows), None)
        d = gr.tensor(g.type_id("f16"), (k, n_rows), None)
        assert not gr.supports(gr.op("ggml_cpy", a, d))
