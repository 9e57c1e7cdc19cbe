"""End to end: an STQ1_0 model (Gemma 3 270M requantized by llama-quantize) served by llama-server on
metal-emu with -ngl 99; its first-token log-probabilities are compared with the CPU build.

Oracle: the same STQ1_0 file converted back to F32 by llama-quantize (exact weights: every STQ1_0
weight is +-d or 0, which F32 holds exactly) and run on the CPU backend. The Metal kernels keep f32
activations in mul_mv, so they must land within TOL = 0.05 of that reference on every token of both
top-10 lists, with the same top-1 token. The CPU's own STQ1_0 path is printed beside it: it rounds
activations to Q8_K, which this ternary model (random-looking logits) amplifies to gaps of ~1 - so
a direct CPU-vs-Metal comparison of this model would say nothing about the kernels. Measured
2026-11-29: Metal-vs-F32 max gap 0.0079, CPU-STQ1_0-vs-F32 1.22 (Q4_K_M model, CPU vs Metal: 0.115)."""

from __future__ import annotations

import subprocess

import pytest
import requests

from harness import server

pytestmark = pytest.mark.build

PROMPT = "The capital of France is"
TOL = 0.05
COMMON = ["-c", "256", "-t", "2", "--no-warmup", "-np", "1"]


def quantize(cpu_build, src, dst, ftype):
    p = subprocess.run([str(cpu_build / "bin" / "llama-quantize"), "--allow-requantize", str(src), str(dst),
                        ftype, "2"], text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:]
    return dst


@pytest.fixture(scope="module")
def models(cpu_build, gemma_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("stq-e2e")
    stq = quantize(cpu_build, gemma_model, d / "gemma-3-270m-stq1_0.gguf", "STQ1_0")
    f32 = quantize(cpu_build, stq, d / "gemma-3-270m-stq1_0-as-f32.gguf", "F32")
    return stq, f32


def first_token_logprobs(binary, model, args) -> dict[int, float]:
    with server.running(binary, model, args=args, timeout=600) as info:
        r = requests.post(f"http://127.0.0.1:{info['port']}/completion",
                          json={"prompt": PROMPT, "n_predict": 1, "n_probs": 10, "temperature": 0,
                                "cache_prompt": False}, timeout=900)
        r.raise_for_status()
    probs = r.json()["completion_probabilities"][0]
    top = probs.get("top_logprobs") or probs.get("top_probs")
    assert top, f"no top log-probabilities in {probs}"
    return {t["id"]: t["logprob"] for t in top}


def max_gap(a: dict[int, float], b: dict[int, float]) -> tuple[float, int]:
    both = set(a) & set(b)
    return max(abs(a[t] - b[t]) for t in both), len(both)


def test_stq1_0_model_first_token_on_metal_emu(cpu_build, metal_emu_build, models):
    stq, f32 = models
    ref = first_token_logprobs(cpu_build / "bin" / "llama-server", f32, COMMON + ["-ngl", "0"])
    emu = first_token_logprobs(metal_emu_build / "bin" / "llama-server", stq, COMMON + ["-ngl", "99"])
    cpu = first_token_logprobs(cpu_build / "bin" / "llama-server", stq, COMMON + ["-ngl", "0"])
    g_emu, n_emu = max_gap(emu, ref)
    g_cpu, n_cpu = max_gap(cpu, ref)
    print(f"first-token logprob gap vs exact-weight F32: metal-emu {g_emu:.4f} (overlap {n_emu}), "
          f"CPU STQ1_0 {g_cpu:.4f} (overlap {n_cpu})")
    assert max(emu, key=emu.get) == max(ref, key=ref.get), (emu, ref)
    assert n_emu >= 8, (emu, ref)
    assert g_emu <= TOL, (emu, ref)
