"""The fused MTP draft on Metal (issue 14) on metal-emu: ggml-metal's ggml_backend_mk_draft_create/_eval/_free
(patch 0051; ggml-metal/mk/ggml-metal-mk.cpp, kernel_mk_draft in ggml-metal/mk/mk-kernel.metal: k chained draft
steps of the assistant in one persistent dispatch) against llama.cpp's own gemma4-assistant graph on the same emulated
Metal device.

megakernel/tests/test-mk-draft.cpp --fused, built against the metal-emu build, decodes live states of the synthetic
gemma4 target (harness/synth_gemma4.py, the small pair of tests/test_megakernel_draft.py: 4096 tokens, sliding window
16, an assistant that reads the target's hidden state strongly) and at each state drafts k tokens twice: as
common/speculative.cpp's draft-mtp does (k one-token batches of the assistant's graph) and in one launch of the fused
kernel on the same inputs (llama_mk_draft_init without host_ok: the plan llama-mk.cpp derives, the Metal registry's
entry points). Checked: the tokens step by step (a divergence passes only at a near tie of llama.cpp's own logits),
the logits and h_next of every step (NMSE vs the graph's), a tokens-only relaunch drafting the same tokens; two
sequences in their own KV streams (--np 2), F16 and Q4_0 weights. Planted bugs (LLAMA_MEGAKERNEL_DEBUG, the plan's
debug_flags, which the draft kernel honours) must fail: grid barriers off, the barrier without its fences, h_next not
chained to the next step, a threadgroup's partial pick left out of the argmax (MK_MTL_DEBUG_DRAFT_* in mk-plan.h).
The emulated GPU has 1 core (GGML_METAL_EMU_GPU_CORES=1: 4 co-resident threadgroups); few states, small k: metal-emu
runs every thread of the persistent dispatch on the CPU.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from test_megakernel_draft import _build as _build_test_mk_draft

HANG = 900


@pytest.fixture(scope="module")
def test_mk_draft(tmp_path_factory, metal_emu_build) -> Path:
    return _build_test_mk_draft(tmp_path_factory.mktemp("test_mk_draft_metal"), metal_emu_build)


@pytest.fixture(scope="module", params=["F16", "Q4_0"])
def pair(request, gemma_model) -> tuple[str, Path, Path]:
    from harness import synth_gemma4
    p = synth_gemma4.SynthParams(matrix_type=request.param, n_vocab=4096, window=16, h_gain=1.0)
    target, assistant = synth_gemma4.ensure_pair(gemma_model, p=p)
    return request.param, target, assistant


@pytest.fixture(scope="module")
def pair_f16(gemma_model) -> tuple[str, Path, Path]:
    """The F16 pair alone: one weight type is enough for the launch sizes and the planted bugs."""
    from harness import synth_gemma4
    p = synth_gemma4.SynthParams(matrix_type="F16", n_vocab=4096, window=16, h_gain=1.0)
    target, assistant = synth_gemma4.ensure_pair(gemma_model, p=p)
    return "F16", target, assistant


def _run(exe: Path, target: Path, assistant: Path, *args: str, **env) -> tuple[int, str]:
    e = dict(os.environ, GGML_METAL_EMU_GPU_CORES="1")
    for k in ("GGML_METAL_EMU_RESIDENCY", "GGML_METAL_EMU_ORDER", "GGML_METAL_EMU_TG_SCHED", "LLAMA_MEGAKERNEL_DEBUG",
              "LLAMA_MEGAKERNEL_VARIANT", "GGML_METAL_MK_THREADGROUPS", "LLAMA_MEGAKERNEL_DRAFT"):
        e.pop(k, None)
    e.update({k: str(v) for k, v in env.items()})
    r = subprocess.run([str(exe), "-m", str(target), "-md", str(assistant), "--fused", *args], capture_output=True,
                       text=True, timeout=HANG, env=e)
    out = r.stdout + r.stderr
    print("\n".join(line for line in out.splitlines()
                    if "ggml_metal_mk" in line or line.startswith(("OK", "FAIL", "near tie", "timing", "draft plan", "test-mk-draft"))))
    return r.returncode, out


# states of the target per sequence: positions 13.. of the prompt onwards, so that they cross the 16-cell window
N_STATES = 10


def test_metal_fused_draft_matches_metal_assistant_graph(test_mk_draft, pair):
    """kernel_mk_draft == llama.cpp's assistant graph on metal-emu: k = 3 over N_STATES live states of two sequences
    (--np 2, their own KV streams), across the sliding window; every step's tokens identical (or a near tie), logits
    and h_next NMSE within bounds, a tokens-only relaunch drafts the same tokens."""
    mt, target, assistant = pair
    k = 3
    rc, out = _run(test_mk_draft, target, assistant, "-k", str(k), "-n", str(N_STATES), "--np", "2",
                   "--max-nmse", "1e-4", "--max-nmse-h", "1e-5")
    assert "ggml_metal_mk_draft_create: kernel_mk_draft" in out, f"the fused draft did not run on the Metal kernel:\n{out[-3000:]}"
    assert rc == 0 and "test-mk-draft: passed" in out, out[-4000:]
    m = re.search(r"^OK draft tokens, (\d+) states x k=(\d+) \((\d+) sequence\(s\).*: (\d+) of (\d+)", out, re.M)
    assert m, out[-3000:]
    assert int(m.group(2)) == k and int(m.group(3)) == 2, m.group(0)
    # (a divergence at a near tie ends a state's comparison early: most steps must still be compared and equal)
    assert int(m.group(5)) == 2*N_STATES*k and int(m.group(4)) >= int(m.group(5)) - 2*k, m.group(0)
    assert re.search(r"^OK logits and h_next while the tokens agree", out, re.M), out[-3000:]
    assert re.search(r"^OK assistant layer 1 reads target layer 5's cache: .* \(sequence 1, stream 1\)", out, re.M), out[-3000:]


def test_metal_fused_draft_k1_and_k8(test_mk_draft, pair_f16):
    """The smallest and the largest launch (k = 1 and k = GGML_MK_DRAFT_MAX_K = 8) on one sequence."""
    mt, target, assistant = pair_f16
    for k, n in ((1, 6), (8, 3)):
        rc, out = _run(test_mk_draft, target, assistant, "-k", str(k), "-n", str(n), "--max-nmse", "1e-4", "--max-nmse-h", "1e-5")
        assert rc == 0 and "test-mk-draft: passed" in out, f"k={k}:\n{out[-4000:]}"
        m = re.search(r"^OK draft tokens, (\d+) states x k=(\d+) .*: (\d+) of (\d+)", out, re.M)
        assert m and int(m.group(2)) == k and int(m.group(4)) == n*k, out[-3000:]


@pytest.mark.parametrize("cores,tgs,sched,order", [("2", "3", "random", "shuffle"), ("2", "", "rr", "rev")])
def test_metal_fused_draft_schedules_and_grid_sizes(test_mk_draft, pair_f16, cores, tgs, sched, order):
    """Results may not depend on the grid or on how the emulator schedules the threadgroups: 3 threadgroups (uneven
    slices of the vocabulary for the argmax: 1366, 1366, 1364) and the 2-core device's 8, under other schedules."""
    mt, target, assistant = pair_f16
    env = dict(GGML_METAL_EMU_GPU_CORES=cores, GGML_METAL_EMU_TG_SCHED=sched, GGML_METAL_EMU_ORDER=order)
    if tgs:
        env["GGML_METAL_MK_THREADGROUPS"] = tgs
    rc, out = _run(test_mk_draft, target, assistant, "-k", "4", "-n", "3", "--max-nmse", "1e-4", "--max-nmse-h", "1e-5", **env)
    m = re.search(r"ggml_metal_mk_draft_create: kernel_mk_draft, (\d+) threadgroups", out)
    assert m and int(m.group(1)) == int(tgs or 8), out[-3000:]
    assert rc == 0 and "test-mk-draft: passed" in out, out[-4000:]
    m = re.search(r"^OK draft tokens, .*: (\d+) of (\d+) compared steps identical", out, re.M)
    assert m and int(m.group(1)) == int(m.group(2)) == 12, out[-3000:]


@pytest.mark.parametrize("flags,what", [
    ("1", "grid barriers removed"),
    ("65536", "the grid barrier without its fences"),
    ("131072", "every step reads the launch's h, not the step before's h_next"),      # (logits/h_next NMSE ~1e-2)
    ("262144", "the last threadgroup's partial pick left out of the argmax"),          # (a token in its slice lost)
])
def test_metal_fused_draft_planted_bug_fails(test_mk_draft, pair_f16, flags, what):
    """Planted bugs in the draft kernel (the plan's debug_flags, LLAMA_MEGAKERNEL_DEBUG): the comparison with the
    graph must fail."""
    mt, target, assistant = pair_f16
    rc, out = _run(test_mk_draft, target, assistant, "-k", "3", "-n", "3", "--max-nmse", "1e-4", "--max-nmse-h", "1e-5",
                   LLAMA_MEGAKERNEL_DEBUG=flags)
    assert "ggml_metal_mk_draft_create: kernel_mk_draft" in out, out[-3000:]
    assert rc == 1 and "test-mk-draft: FAILED" in out and re.search(r"^FAIL ", out, re.M), \
        f"{what}: the planted bug went unnoticed:\n{out[-3000:]}"
