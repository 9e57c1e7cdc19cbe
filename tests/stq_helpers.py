"""Helpers for the STQ1_0 tests: where the CPU build is, the patched gguf-py, random blocks.

Build-dependent tests use the ``stq_cpu_build`` fixture: env STQ_CPU_BUILD (a build dir with
``bin/`` and the shared libraries) if set, else the lead's ``cpu_build`` fixture from conftest.py
if there is one; otherwise they skip with the reason printed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness import stq1_0


def _build_from_env() -> Path | None:
    env = os.environ.get("STQ_CPU_BUILD")
    if not env:
        return None
    p = Path(env)
    if not p.is_dir():
        pytest.fail(f"STQ_CPU_BUILD={env} is not a directory")
    return p


@pytest.fixture(scope="session")
def stq_cpu_build(request) -> Path:
    p = _build_from_env()
    if p is None:
        try:
            p = Path(request.getfixturevalue("cpu_build"))
        except pytest.FixtureLookupError:
            pytest.skip("no CPU build: set STQ_CPU_BUILD to a llama.cpp build dir with the STQ1_0 patches")
    return p


@pytest.fixture(scope="session")
def stq_lib(stq_cpu_build):
    from harness import ggml

    lib = ggml.GGML(stq_cpu_build, n_threads=2)
    if not lib.has_stq1_0():
        pytest.skip(f"{stq_cpu_build}: libggml-base has no STQ1_0 (dequantize_row_stq1_0 missing): patch 0001 not applied")
    lib.self_check()
    yield lib
    lib.close()


def cpu_build_or_skip() -> Path:
    """For tests that cannot take fixtures: the env build or a skip."""
    p = _build_from_env()
    if p is None:
        pytest.skip("no CPU build: set STQ_CPU_BUILD to a llama.cpp build dir with the STQ1_0 patches")
    return p


def source_tree(build: Path) -> Path:
    """The llama.cpp source tree a CMake build dir was configured from."""
    cache = Path(build) / "CMakeCache.txt"
    if cache.exists():
        m = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", cache.read_text(), re.M)
        if m:
            return Path(m.group(1))
    env = os.environ.get("STQ_LLAMA_TREE")
    if env:
        return Path(env)
    pytest.skip(f"{build}: cannot tell its source tree (no CMakeCache.txt); set STQ_LLAMA_TREE")


def cxx() -> str:
    """A C++ compiler for the host-emulation drivers (CXX, c++, g++, clang++), or a skip."""
    import shutil
    for c in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if c and shutil.which(c):
            return c
    pytest.skip("no C++ compiler (CXX, c++, g++, clang++)")


def run_patched_gguf_py(build: Path, code: str, timeout: int = 300) -> str:
    """Run ``code`` in a fresh Python whose ``import gguf`` is the build's source tree gguf-py
    (the PyPI gguf of this environment does not know STQ1_0).  Returns stdout; skips when the
    tree's gguf-py has no STQ1_0 yet."""
    tree = source_tree(build)
    gp = tree / "gguf-py"
    if "STQ1_0" not in (gp / "gguf" / "constants.py").read_text():
        pytest.skip(f"{gp}: gguf-py without STQ1_0 (patch 0003 not applied)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(gp), str(Path(__file__).resolve().parent.parent)]))
    p = subprocess.run([sys.executable, "-c", code], env=env, text=True, capture_output=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"patched gguf-py script failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    return p.stdout


def random_blocks(rng, nb: int, d_scale: float = 1.0, finite: bool = True) -> np.ndarray:
    """``nb`` random STQ1_0 blocks (uint8 (nb, 42)): random codes and sign bits, normal scales."""
    nbytes = nb * stq1_0.BLOCK_BYTES
    words = rng.integers(0, np.iinfo(np.uint64).max, (nbytes + 7) // 8, dtype=np.uint64, endpoint=True)
    b = words.view(np.uint8)[:nbytes].reshape(nb, stq1_0.BLOCK_BYTES)
    with np.errstate(over="ignore"):
        d = (rng.standard_normal(nb) * d_scale).astype(np.float16)
    if finite:
        d[~np.isfinite(d)] = 1
    b[:, 40:42] = d.view(np.uint8).reshape(nb, 2)
    return b


def matrix_blocks(rng, m: int, k: int) -> np.ndarray:
    """(m, k/256*42) uint8 weight rows: uniformly random codes and sign bits (every byte pattern is a
    valid group) with finite positive scales in [0.25, 2]."""
    nb = k // stq1_0.QK
    b = rng.integers(0, 256, size=(m * nb, stq1_0.BLOCK_BYTES), dtype=np.uint8)
    d = rng.uniform(0.25, 2.0, m * nb).astype(np.float16)
    b[:, 40:42] = d.view(np.uint8).reshape(-1, 2)
    return b.reshape(m, nb * stq1_0.BLOCK_BYTES)


def decoded(blocks: np.ndarray, k: int) -> np.ndarray:
    """The exact weights of `blocks` (numpy reference) as float64 rows of length k."""
    return stq1_0.decode(blocks.reshape(-1)).reshape(-1, k).astype(np.float64)


def nmse(a, ref) -> float:
    a = np.asarray(a, np.float64)
    ref = np.asarray(ref, np.float64)
    return float(((a - ref) ** 2).sum() / max((ref ** 2).sum(), 1e-300))


def bits(a) -> np.ndarray:
    """float32 bit patterns, for bit-exact comparisons (signed zeros count)."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
