"""Gemma 3 270M (Q4_K_M) with every layer on the metal-emu backend (-ngl 99) generates the same
8 greedy tokens as the CPU backend of the same build."""
import subprocess

import pytest

PROMPTS = ["The capital of France is"]


def _complete(build, model, prompt, gpu: bool):
    exe = build / "bin" / "llama-completion"
    if not exe.exists():
        pytest.fail(f"{exe} does not exist (build the llama-completion target)")
    cmd = [str(exe), "-m", str(model), "-p", prompt, "-n", "8", "--temp", "0", "-s", "1", "-no-cnv",
           "--no-warmup", "-c", "512"]
    cmd += ["-ngl", "99", "-dev", "MTL0"] if gpu else ["-ngl", "0", "-dev", "none"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}"
    return r.stdout, r.stderr


@pytest.mark.parametrize("prompt", PROMPTS)
def test_gemma_greedy_matches_cpu(metal_emu_build, gemma_model, prompt):
    cpu, _ = _complete(metal_emu_build, gemma_model, prompt, gpu=False)
    emu, log = _complete(metal_emu_build, gemma_model, prompt, gpu=True)
    assert "MTL0" in log and "metal-emu" in log
    print(f"\n[metal-emu] cpu: {cpu!r}\n[metal-emu] emu: {emu!r}")
    assert emu == cpu
