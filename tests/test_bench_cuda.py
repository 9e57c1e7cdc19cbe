"""The CUDA device tooling on any machine (no GPU): harness/bench_cuda.py's arguments and workloads,
harness/cuda_device.sh's usage and its source packing (what travels to the lent GPU machine)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from harness import bench_cuda
from harness.util import HarnessError

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "harness" / "cuda_device.sh"


def test_bench_help_runs_without_a_gpu():
    r = subprocess.run([sys.executable, str(ROOT / "harness" / "bench_cuda.py"), "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "--build" in r.stdout and "32768 x 16384" in r.stdout


def test_bench_rejects_unknown_type_and_workload():
    with pytest.raises(SystemExit):
        bench_cuda.main(["--build", "/nonexistent", "--types", "stq1_0,q9_9"])
    with pytest.raises(HarnessError):
        bench_cuda.cases_for(["huge"])


def test_bench_workloads_match_the_issue():
    cases = {c.name: c for c in bench_cuda.cases_for(["big", "routed", "verify"])}
    big = cases["32768x16384 n=1"]
    assert (big.k, big.m, big.n) == (16384, 32768, 1)
    routed = cases["routed 256x(6144x2048) top-8"]
    assert (routed.k, routed.m, routed.n_expert, routed.n_used) == (6144, 2048, 256, 8)
    widths = sorted(c.n for c in cases.values() if c.name.startswith("4096x14336"))
    assert widths == [1, 2, 3, 4, 5]
    assert all(c.k == 14336 and c.m == 4096 for c in cases.values() if c.name.startswith("4096x14336"))
    rv = bench_cuda.cases_for(["routed-verify"])
    assert [(c.k, c.m, c.n_expert, c.n_used, c.n) for c in rv] == [(6144, 2048, 256, 8, n) for n in range(2, 6)]
    assert len({c.name for c in rv} | set(cases)) == len(rv) + len(cases)  # row labels stay unique


def test_bench_prefill_workloads():
    """Prompt batches (issue 17 item 2, mmq): named only, not in the default list."""
    (p,) = bench_cuda.cases_for(["prefill"])
    assert (p.k, p.m, p.n, p.n_expert) == (14336, 4096, 512, 0)
    (r,) = bench_cuda.cases_for(["routed-prefill"])
    assert (r.k, r.m, r.n, r.n_expert, r.n_used) == (6144, 2048, 512, 256, 8)
    assert "prefill" not in bench_cuda.DEFAULT_WORKLOADS and "routed-prefill" not in bench_cuda.DEFAULT_WORKLOADS
    assert set(bench_cuda.DEFAULT_WORKLOADS) < set(bench_cuda.WORKLOADS)


def test_device_script_usage():
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "pack" in r.stdout and "remote" in r.stdout


def test_device_script_refuses_unknown_stage(tmp_path):
    r = subprocess.run(["bash", str(SCRIPT), "remote", "nonsense"], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path), "STQ_CUDA_WORK": str(tmp_path / "w")})
    # without a packed tree it stops before any stage; with one it names the unknown stage
    assert r.returncode != 0
    assert "src.tar.xz is missing" in r.stderr or "unknown stage" in r.stderr


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_pack_keeps_cuda_and_drops_other_backends(tmp_path):
    tree = tmp_path / "llama.cpp"
    files = [
        "CMakeLists.txt", "ggml/src/ggml-cuda/mmvq.cu", "ggml/src/ggml-cpu/ggml-cpu.c",
        "ggml/src/ggml-metal/ggml-metal.cpp", "ggml/src/ggml-vulkan/ggml-vulkan.cpp",
        "tests/test-backend-ops.cpp", "models/ggml-vocab-llama-bpe.gguf", "docs/build.md",
        "examples/simple/simple.cpp", "common/common.cpp",
    ]
    for f in files:
        p = tree / f
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"// {f}\n")
    _git(tree, "init", "-q")
    _git(tree, "add", ".")
    _git(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "t")
    # pack into a scratch copy of the script's repo layout so the real .dev/ is left alone
    repo = tmp_path / "repo"
    (repo / "harness").mkdir(parents=True)
    (repo / "harness" / "cuda_device.sh").write_text(SCRIPT.read_text())
    r = subprocess.run(["bash", str(repo / "harness" / "cuda_device.sh"), "pack", str(tree)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with tarfile.open(repo / ".dev" / "cuda" / "src.tar.xz") as tf:
        names = set(tf.getnames())
    assert {"CMakeLists.txt", "ggml/src/ggml-cuda/mmvq.cu", "ggml/src/ggml-cpu/ggml-cpu.c",
            "tests/test-backend-ops.cpp", "common/common.cpp"} <= names
    assert not any(n.startswith(("ggml/src/ggml-metal/", "ggml/src/ggml-vulkan/", "models/", "docs/", "examples/"))
                   for n in names), sorted(names)
