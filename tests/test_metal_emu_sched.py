"""ggml-backend scheduler on metal-emu + CPU: an op whose result is a view of a tensor on another backend.

tests/sched/sched_view_dst.cpp builds the DSA attention mask of llama-graph.cpp at toy size (FILL F16, which
the emulated device reports unsupported, then SET_ROWS into a view of it, next to a MUL_MAT with a device
weight) and checks the result against a host reference. Before patch 0064 the device encoded SET_ROWS into
the CPU's compute buffer ("tensor ' (view) (view)' is not inside its buffer", SIGSEGV; issue 15).
"""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CXX = os.environ.get("STQ_CLANGXX", "clang++-19")


def test_set_rows_into_a_cpu_view_runs_where_the_view_lives(metal_emu_build, llama_tree, tmp_path):
    if shutil.which(CXX) is None:
        pytest.skip(f"{CXX} not found")
    bin_dir = Path(metal_emu_build) / "bin"
    exe = tmp_path / "sched_view_dst"
    cmd = [CXX, "-std=c++17", "-O1", f"-I{Path(llama_tree) / 'ggml' / 'include'}",
           str(ROOT / "tests" / "sched" / "sched_view_dst.cpp"), f"-L{bin_dir}", "-lggml", "-lggml-base",
           "-lggml-cpu", f"-Wl,-rpath,{bin_dir}", "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    r = subprocess.run([str(exe), "MTL0"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    # the case needs FILL F16 off the device: if the emulator ever reports FILL supported, this fails here and
    # the reproducer needs another op that the device declines
    assert "FILL on CPU" in r.stdout, r.stdout
    assert "SET_ROWS on CPU" in r.stdout and r.stdout.strip().endswith("ok"), r.stdout
