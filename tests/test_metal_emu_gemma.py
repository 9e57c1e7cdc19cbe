"""Gemma 3 270M (Q4_K_M) with every layer on the metal-emu backend (-ngl 99) generates the same
8 greedy tokens as the CPU backend of the same build. Flash attention is on (auto: the emulated
device supports FLASH_ATTN_EXT with f16 K/V and head size 256 since issue 4 session 2), so the
prompt and every decode step run kernel_flash_attn_ext_vec_f16_dk256_dv256 (NE = 1)."""
import subprocess

import pytest

PROMPTS = ["The capital of France is"]


def _complete(build, model, prompt, gpu: bool):
    exe = build / "bin" / "llama-completion"
    if not exe.exists():
        pytest.fail(f"{exe} does not exist (build the llama-completion target)")
    cmd = [str(exe), "-m", str(model), "-p", prompt, "-n", "8", "--temp", "0", "-s", "1", "-no-cnv",
           "--no-warmup", "-c", "512", "-lv", "4"]  # -lv 4: the library's info lines (devices, flash attention)
    cmd += ["-ngl", "99", "-dev", "MTL0"] if gpu else ["-ngl", "0", "-dev", "none"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}"
    return r.stdout, r.stderr


@pytest.mark.parametrize("prompt", PROMPTS)
def test_gemma_greedy_matches_cpu(metal_emu_build, gemma_model, prompt):
    cpu, _ = _complete(metal_emu_build, gemma_model, prompt, gpu=False)
    emu, log = _complete(metal_emu_build, gemma_model, prompt, gpu=True)
    assert "MTL0" in log and "metal-emu" in log
    assert "Flash Attention enabled" in log, "flash attention was not enabled on metal-emu:\n" + log[-3000:]
    print(f"\n[metal-emu] cpu: {cpu!r}\n[metal-emu] emu: {emu!r}")
    assert emu == cpu
