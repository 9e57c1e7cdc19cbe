"""STQ1_0 weights in CUDA's RP16 repack buffer type (patch 0032) on a real GPU.

Runs tests/test-stq1_0-rp16 of the applied series from a CUDA build (env STQ_CUDA_BUILD, a build dir with bin/,
e.g. the one .dev/h17b/run.sh or harness/cuda_device.sh builds on the lent H200): which weights the buffer type
takes, the get_tensor round trip, MUL_MAT n = 1..8 and 16 against float64 and the ordinary buffer at 32x1024 ..
32768x16384 (4096x14336 and Hy4's 6144x2048 included), and batch invariance (0 differing columns). Without a build
or a GPU it skips with the reason printed (CI has no GPU); the layout and kernel are also checked without a GPU
by tests/test_cuda_stq1_0_rp16_hostemu.py.
"""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.build


@pytest.fixture(scope="module")
def exe() -> Path:
    env = os.environ.get("STQ_CUDA_BUILD")
    if not env:
        pytest.skip("no CUDA build: set STQ_CUDA_BUILD to a CUDA build dir of the series with test-stq1_0-rp16")
    if not shutil.which("nvidia-smi"):
        pytest.skip("no NVIDIA GPU on this machine (nvidia-smi not found)")
    p = Path(env) / "bin" / "test-stq1_0-rp16"
    if not p.is_file():
        pytest.fail(f"{p} is missing (build the target test-stq1_0-rp16)")
    return p


@pytest.mark.parametrize("quick", [True, False], ids=["quick", "full"])
def test_cuda_stq1_0_rp16(exe, quick):
    r = subprocess.run([str(exe), "-b", "CUDA0"] + (["--quick"] if quick else []), capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, GGML_CUDA_STQ1_0_REPACK="all"))
    print(r.stdout[-8000:])
    if r.returncode == 77:
        pytest.skip(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "skipped")
    assert r.returncode == 0 and "PASSED" in r.stdout, r.stdout[-6000:] + r.stderr[-3000:]


def test_cuda_stq1_0_rp16_env_off(exe):
    """GGML_CUDA_STQ1_0_REPACK=0: the device offers no RP16 buffer type (the test says so and skips itself)."""
    r = subprocess.run([str(exe), "-b", "CUDA0", "--quick"], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, GGML_CUDA_STQ1_0_REPACK="0"))
    print(r.stdout)
    assert r.returncode == 77 and "offers no STQ1_0_RP16" in r.stdout, r.stdout + r.stderr
