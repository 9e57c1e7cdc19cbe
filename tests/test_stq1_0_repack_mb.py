"""The STQ1_0 CUDA repack micro-benchmark's layout check, on the host (no GPU).

bench/stq1_0_repack/mb.cu times candidate kernels on a load-time repacked STQ1_0 layout (RP16) on a lent GPU; its
`selftest` mode needs no GPU: it repacks random blocks with the same code the GPU runs, decodes them through the
table, assembles the mma.m16n8k32 A/B fragments as the PTX ISA defines them and compares the products with the
FACTS dequantization. Skipped where nvcc is missing (about 10 s to compile where it is present).
"""
import shutil
import subprocess
from pathlib import Path

import pytest

MB = Path(__file__).resolve().parent.parent / "bench" / "stq1_0_repack" / "mb.cu"


def _nvcc():
    return shutil.which("nvcc") or (Path("/usr/local/bin/nvcc").exists() and "/usr/local/bin/nvcc") or None


@pytest.mark.skipif(_nvcc() is None, reason="nvcc not found")
@pytest.mark.parametrize("plant", [False, True], ids=["layout", "planted-bug"])
def test_repack_mb_selftest(tmp_path, plant):
    exe = tmp_path / "mb"
    r = subprocess.run([_nvcc(), "-std=c++17", "-O1", "-arch=sm_90", *(["-DMB_PLANT"] if plant else []), str(MB),
                        "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([str(exe), "selftest"], capture_output=True, text=True, timeout=120)
    if plant:  # two activation lanes swapped: the check must catch it
        assert r.returncode != 0 and "FAIL" in r.stdout, r.stdout + r.stderr
    else:
        assert r.returncode == 0 and "selftest" in r.stdout and ": ok" in r.stdout, r.stdout + r.stderr
