"""STQ1_0 prompt batches on CUDA's mmq (patch 0034) on a real GPU.

Runs test-backend-ops of a CUDA build of the series (env STQ_CUDA_BUILD, a build dir with bin/, e.g. the one
bench/stq1_0_mmq/run.sh or harness/cuda_device.sh builds on the lent H200): the STQ1_0 cases of MUL_MAT and
MUL_MAT_ID, among them more than 8 columns / tokens (mmq; patch 0035 adds 512 columns at k = 2048 and 512 tokens
with 256 experts top-8), and test-mul-mat-batch-invariance (1..8 columns stay on the mat-vec kernels). Without a
build or a GPU it skips with the reason printed (CI has no GPU); mmq's STQ1_0 tile loader is also checked without
a GPU by tests/test_cuda_stq1_0_mmq_hostemu.py.
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.build


@pytest.fixture(scope="module")
def bindir() -> Path:
    env = os.environ.get("STQ_CUDA_BUILD")
    if not env:
        pytest.skip("no CUDA build: set STQ_CUDA_BUILD to a CUDA build dir of the series with test-backend-ops")
    if not shutil.which("nvidia-smi"):
        pytest.skip("no NVIDIA GPU on this machine (nvidia-smi not found)")
    p = Path(env) / "bin"
    if not (p / "test-backend-ops").is_file():
        pytest.fail(f"{p}/test-backend-ops is missing (build the target test-backend-ops)")
    return p


@pytest.mark.parametrize("op", ["MUL_MAT", "MUL_MAT_ID"])
def test_cuda_stq1_0_mmq_backend_ops(bindir, op):
    r = subprocess.run([str(bindir / "test-backend-ops"), "test", "-b", "CUDA0", "-o", op, "-p", "stq1_0"],
                       capture_output=True, text=True, timeout=900)
    out = re.sub(r"\x1b\[[0-9;]*m", "", r.stdout + r.stderr)  # test-backend-ops colours OK / FAIL
    lines = [l for l in out.splitlines() if "stq1_0" in l]
    print("\n".join(l for l in lines if not l.rstrip().endswith("OK"))[-4000:])
    m = re.search(r"(\d+)/(\d+) tests passed", out)
    assert r.returncode == 0 and m and m.group(1) == m.group(2), out[-6000:]
    # the prompt-batch cases ran (not "not supported") and passed
    big = [l for l in lines if re.search(r"\bn=(512|33|17)\b", l)]
    assert big and all(l.rstrip().endswith("OK") for l in big), "\n".join(big) or out[-4000:]


def test_cuda_stq1_0_mmq_batch_invariance(bindir):
    exe = bindir / "test-mul-mat-batch-invariance"
    if not exe.is_file():
        pytest.skip(f"{exe} is not built")
    r = subprocess.run([str(exe), "-b", "CUDA0", "-t", "stq1_0"], capture_output=True, text=True, timeout=600)
    print(r.stdout[-3000:])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
