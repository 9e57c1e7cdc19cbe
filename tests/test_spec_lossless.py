"""Lossless speculative decoding on the CPU (issue 6), through the llama-server HTTP API.

Every check compares a speculative run with a plain greedy run of the same prompts: token ids
must be equal and so must the log-probability of every token (bit-equal logits), and the
speculative run must have accepted drafts (a run that never accepts proves nothing).

A self-draft (the target as its own draft) computes exactly the target's one-token logits, so with
the batch-invariant path it accepts every draft; the Q8_0 requantized draft and the synthetic
Gemma 4 MTP head disagree with the target now and then, so those runs also exercise rejection and
the KV rollback (across the 512-token sliding window of Gemma 3 and the 128-token window of the
synthetic Gemma 4).

Default set (about 6 minutes on 2 quiet cores): 2 prompts x 128 tokens; self-draft and Q8_0 draft
k = 1, 2, 4, 8; ngram; flash attention off; 640 tokens across the sliding window; -np 2 with
concurrent requests; the synthetic Gemma 4 pair with draft-mtp k = 1..4; the batch-invariant path
disabled, which must break the property; the op-level test-batch-invariance program.
STQ_FULL=1: 8 prompts.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from harness import spec, synth_gemma4

FULL = os.environ.get("STQ_FULL", "") not in ("", "0")
N_PROMPTS = len(spec.PROMPTS) if FULL else 2
PROMPTS = spec.PROMPTS[:N_PROMPTS]
N_PREDICT = 128


def _spec_args(draft: Path, k: int, spec_type: str = "draft-simple") -> list[str]:
    return ["-md", str(draft), "--spec-type", spec_type, "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0"]


def _check(ref: spec.Run, got: spec.Run, need_accept: bool = True) -> None:
    cmp = spec.compare(ref, got)
    print(spec.summary(ref, got, cmp))
    assert cmp.tokens_equal, f"speculative token ids differ from greedy: {cmp.token_diffs}"
    assert cmp.bits_equal, f"speculative log-probabilities differ from greedy: {cmp.logprob_diffs}"
    if need_accept:
        assert got.draft_n > 0 and got.draft_accepted > 0, \
            f"no draft was accepted ({got.draft_accepted}/{got.draft_n}): the check would prove nothing"


@pytest.fixture(scope="module")
def bin_dir(cpu_build) -> Path:
    d = Path(cpu_build) / "bin"
    for exe in ("llama-server", "llama-quantize"):
        if not (d / exe).exists():
            pytest.fail(f"{d / exe} is missing: the CPU build must include the llama-server and llama-quantize targets")
    return d


@pytest.fixture(scope="module")
def greedy(bin_dir, gemma_model) -> spec.Run:
    return spec.run(bin_dir, gemma_model, PROMPTS, N_PREDICT, label="greedy")


@pytest.fixture(scope="module")
def q8_draft(bin_dir, gemma_model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("draft") / "gemma-3-270m-q8_0.gguf"
    r = subprocess.run([str(bin_dir / "llama-quantize"), "--allow-requantize", str(gemma_model), str(out), "Q8_0", "2"],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        pytest.fail(f"llama-quantize failed ({r.returncode}): {r.stderr[-2000:]}")
    return out


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_self_draft(bin_dir, gemma_model, greedy, k):
    got = spec.run(bin_dir, gemma_model, PROMPTS, N_PREDICT, args=_spec_args(gemma_model, k), label=f"self-draft k={k}")
    _check(greedy, got)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_requantized_draft(bin_dir, gemma_model, greedy, q8_draft, k):
    got = spec.run(bin_dir, gemma_model, PROMPTS, N_PREDICT, args=_spec_args(q8_draft, k), label=f"q8_0 draft k={k}")
    _check(greedy, got)


def test_ngram(bin_dir, gemma_model):
    # text that repeats itself, so that n-gram drafts get accepted
    prompts = ["Repeat after me ten times: the quick brown fox jumps over the lazy dog. "
               "The quick brown fox jumps over the lazy dog. The quick brown fox"]
    ref = spec.run(bin_dir, gemma_model, prompts, N_PREDICT, label="greedy")
    got = spec.run(bin_dir, gemma_model, prompts, N_PREDICT,
                   args=spec.NGRAM_ARGS, label="ngram-simple")
    _check(ref, got)


def test_flash_attn_off(bin_dir, gemma_model):
    ref = spec.run(bin_dir, gemma_model, PROMPTS, N_PREDICT, args=["-fa", "off"], label="greedy -fa off")
    got = spec.run(bin_dir, gemma_model, PROMPTS, N_PREDICT, args=["-fa", "off", *_spec_args(gemma_model, 4)],
                   label="self-draft k=4 -fa off")
    _check(ref, got)


def test_across_sliding_window(bin_dir, gemma_model, q8_draft):
    # Gemma 3's SWA layers keep a 512-token window; 640 tokens wrap it while drafts get rejected
    prompts = PROMPTS[:1]
    ref = spec.run(bin_dir, gemma_model, prompts, 640, label="greedy 640")
    got = spec.run(bin_dir, gemma_model, prompts, 640, args=_spec_args(q8_draft, 8), label="q8_0 draft k=8, 640")
    _check(ref, got)
    assert len(got.gens[0].tokens) == 640
    assert got.draft_accepted < got.draft_n, "no draft was rejected: the rollback across the window was not exercised"


def test_two_slots_concurrent(bin_dir, gemma_model, greedy, q8_draft):
    # two slots decode (and verify) in shared batches; each must equal its own greedy run
    prompts = PROMPTS[:2]
    got = spec.run(bin_dir, gemma_model, prompts, N_PREDICT, args=["-np", "2", *_spec_args(q8_draft, 4)],
                   concurrent=True, label="-np 2 concurrent, q8_0 draft k=4")
    ref = spec.Run("greedy", greedy.gens[:2])
    _check(ref, got)


def test_disabled_breaks_property(bin_dir, gemma_model):
    """With the batch-invariant path off (upstream kernel selection), the verify pass computes
    different logits than the one-token pass: the log-probabilities must differ somewhere."""
    off = {"GGML_CPU_BATCH_INVARIANT": "0"}
    ref = spec.run(bin_dir, gemma_model, PROMPTS, N_PREDICT, env=off, label="greedy, invariance off")
    got = spec.run(bin_dir, gemma_model, PROMPTS, N_PREDICT, args=_spec_args(gemma_model, 4), env=off,
                   label="self-draft k=4, invariance off")
    cmp = spec.compare(ref, got)
    print(spec.summary(ref, got, cmp))
    assert got.draft_accepted > 0
    assert not cmp.bits_equal, "with GGML_CPU_BATCH_INVARIANT=0 the verify pass was expected to differ"


@pytest.fixture(scope="module")
def gemma4_pair(gemma_model) -> tuple[Path, Path]:
    return synth_gemma4.ensure_pair(gemma_model)


# 160 tokens after the prompt cross the synthetic model's 128-token sliding window
G4_PREDICT = 160


@pytest.fixture(scope="module")
def gemma4_greedy(bin_dir, gemma4_pair) -> spec.Run:
    return spec.run(bin_dir, gemma4_pair[0], PROMPTS, G4_PREDICT, label="gemma4 greedy")


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_gemma4_mtp(bin_dir, gemma4_pair, gemma4_greedy, k):
    target, assistant = gemma4_pair
    got = spec.run(bin_dir, target, PROMPTS, G4_PREDICT, args=_spec_args(assistant, k, "draft-mtp"),
                   label=f"gemma4 draft-mtp k={k}")
    _check(gemma4_greedy, got)


def test_op_level_batch_invariance(bin_dir):
    """Every row of an n-row op equals the op over that row alone, for the ops of a decoder; with the
    invariant path off, the upstream kernel selection shows variant rows (the check can fail)."""
    exe = bin_dir / "test-batch-invariance"
    if not exe.exists():
        pytest.skip(f"{exe} was not built (add the test-batch-invariance target to the CPU build)")
    on = subprocess.run([str(exe)], capture_output=True, text=True, timeout=900)
    print(on.stdout[-3000:])
    assert on.returncode == 0, f"test-batch-invariance failed:\n{on.stdout[-3000:]}"
    off = subprocess.run([str(exe)], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "GGML_CPU_BATCH_INVARIANT": "0"})
    n_variant = sum(1 for line in off.stdout.splitlines() if line.strip().startswith("variant"))
    print(f"with GGML_CPU_BATCH_INVARIANT=0: {n_variant} variant cases")
    assert n_variant > 0, "the upstream kernel selection was expected to show batch-variant rows"
