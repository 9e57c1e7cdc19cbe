"""STQ1_0 through llama.cpp's own tools: test-quantize-fns, and llama-quantize of the real Gemma 3
270M into an STQ1_0 (mixed) GGUF that llama-completion then loads and runs on the CPU."""

from __future__ import annotations

import subprocess

import pytest

from harness import gguf_layout

pytestmark = pytest.mark.build

STQ1_0 = 43
BLOCK = 256


def test_quantize_fns_passes_with_stq1_0(cpu_build):
    p = subprocess.run([str(cpu_build / "bin" / "test-quantize-fns"), "-v"], text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
    assert "stq1_0" in p.stdout, "test-quantize-fns does not know stq1_0: is patch 0004 applied?"
    assert p.returncode == 0, p.stdout[-3000:]
    assert "0 tests failed" in p.stdout, p.stdout[-3000:]


@pytest.fixture(scope="module")
def gemma_stq1_0(cpu_build, gemma_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("stq") / "gemma-3-270m-stq1_0.gguf"
    p = subprocess.run([str(cpu_build / "bin" / "llama-quantize"), "--allow-requantize", str(gemma_model),
                        str(out), "STQ1_0", "2"], text=True, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:]
    return out


def test_llama_quantize_makes_stq1_0_tensors(gemma_stq1_0, gemma_model):
    lay = gguf_layout.read_layout(gemma_stq1_0)
    stq = [t for t in lay.tensors if t.type_id == STQ1_0]
    assert stq, "no tensor was quantized to STQ1_0"
    # only rows that are a multiple of 256 can take STQ1_0; the others fell back to another type
    assert all(t.dims[0] % BLOCK == 0 for t in stq)
    narrow = [t for t in lay.tensors if len(t.dims) >= 2 and t.dims[0] % BLOCK != 0]
    assert narrow and all(t.type_id != STQ1_0 for t in narrow)
    assert lay.kv.get("general.file_type") == 42  # LLAMA_FTYPE_MOSTLY_STQ1_0
    # the STQ1_0 tensors' bytes are exactly n/256*42 (FACTS), and the file is smaller than the Q4_K_M
    ext = lay.extents()
    for t in stq:
        assert ext[t.name] >= t.n_elements // BLOCK * 42
    assert gemma_stq1_0.stat().st_size < gemma_model.stat().st_size


def test_llama_completion_runs_stq1_0_model(cpu_build, gemma_stq1_0):
    p = subprocess.run([str(cpu_build / "bin" / "llama-completion"), "-m", str(gemma_stq1_0), "-p",
                        "The capital of France is", "-n", "8", "--temp", "0", "-t", "2", "-no-cnv",
                        "--no-warmup"], text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-3000:]
    assert "The capital of France is" in p.stdout
    import re
    m = re.search(r"\beval time =.*?/\s+(\d+) runs", p.stdout)
    assert m and int(m.group(1)) == 7, "expected 7 decode runs after the first token"  # 8 tokens generated
