"""metal-emu self-test: kernels with planted bugs must fail, their correct twins must pass.

Builds ggml-metal/emu/selftest (runtime + translated planted.metal + driver) with clang++-19, once
normally and once with ASan+UBSan. No llama.cpp build needed.
"""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EMU = ROOT / "ggml-metal" / "emu"
CXX = os.environ.get("STQ_CLANGXX", "clang++-19")


def _build(tmp: Path, sanitize: bool) -> Path:
    if shutil.which(CXX) is None:
        pytest.skip(f"{CXX} not found (metal-emu needs clang >= 19)")
    tmp.mkdir(parents=True, exist_ok=True)
    gen = tmp / "planted.cpp"
    subprocess.run(["python3", str(EMU / "msl2cpp.py"), "--source", str(EMU / "selftest" / "planted.metal"),
                    "--out", str(gen)], check=True)
    exe = tmp / ("planted_asan" if sanitize else "planted")
    cmd = [CXX, "-std=c++20", "-O1", "-g", "-march=native", "-fmax-type-align=8", f"-I{EMU}", str(gen), str(EMU / "emu-runtime.cpp"),
           str(EMU / "selftest" / "planted_driver.cpp"), "-o", str(exe), "-lpthread"]
    if sanitize:
        cmd[1:1] = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"building the metal-emu self-test failed:\n{r.stderr[-4000:]}"
    return exe


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("emu_planted"), sanitize=False)


@pytest.fixture(scope="module")
def planted_asan(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("emu_planted_asan"), sanitize=True)


def _run(exe, case, order="fwd"):
    env = dict(os.environ, GGML_METAL_EMU_ORDER=order, GGML_METAL_EMU_THREADS="2",
               ASAN_OPTIONS="detect_leaks=0")
    return subprocess.run([str(exe), case], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("case", ["copy_ok", "block_u16", "rotate_ok", "rowsum"])
def test_correct_kernels_pass(planted, case):
    r = _run(planted, case)
    assert r.returncode == 0, r.stdout + r.stderr


def test_oob_read_caught_by_asan(planted_asan):
    ok = _run(planted_asan, "copy_ok")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = _run(planted_asan, "copy_oob")
    assert bad.returncode != 0
    assert "heap-buffer-overflow" in bad.stderr
    assert "kernel_copy_oob" in bad.stderr


def test_misaligned_u32_load_caught(planted):
    r = _run(planted, "block_u32")
    assert r.returncode != 0
    assert "misaligned typed pointer" in r.stderr
    assert "kernel_block_u32" in r.stderr


@pytest.mark.parametrize("order", ["fwd", "rev", "shuffle"])
def test_missing_barrier_caught(planted, order):
    ok = _run(planted, "rotate_ok", order)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = _run(planted, "rotate_nobarrier", order)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert " 0 wrong" not in bad.stdout
