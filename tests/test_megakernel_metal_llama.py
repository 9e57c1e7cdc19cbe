"""The Metal megakernel inside llama.cpp on metal-emu (issue 13): ggml-metal's ggml_backend_mk_* (patch 0051,
ggml-metal/mk/ggml-metal-mk.cpp) run kernel_mk_decode for llama.cpp's decode/verify batches.

megakernel/tests/test-mk.cpp, built against the metal-emu build, holds two contexts on one model in one
process: the megakernel (LLAMA_MEGAKERNEL=1) and llama.cpp's standard Metal graph (the oracle: ggml's own
Metal kernels on the same emulated device). Checked on the synthetic gemma4 model (harness/synth_gemma4.py:
sliding/global/shared-KV layers, proportional rope, per-layer inputs, softcap), made small for 2 CPU cores
(the tokenizer's first 4096 tokens, sliding window 16 so that the steps cross it):
  - teacher-forced logits, megakernel vs graph: NMSE per step below a bound, argmax agreement;
  - verify == decode: a batch of M = 2..8 tokens gives each row the bits of M one-token steps;
  - planted bugs must fail: grid barriers removed (LLAMA_MEGAKERNEL_DEBUG=1) and the barrier without its
    device-scope fences (LLAMA_MEGAKERNEL_DEBUG=65536, MK_MTL_DEBUG_BARRIER_NO_FENCES in mk-plan.h);
  - the hidden states an MTP draft reads (embeddings_nextn, unmasked and masked): megakernel vs graph NMSE per row,
    and a verify batch's rows equal to its one-token steps' bitwise;
  - llama-server with the megakernel on: speculative decoding gives greedy's ids and log-probabilities, with a
    draft model and with draft-mtp (the target's hidden states from the megakernel: the drafts are accepted as
    often as with the graph's);
  - the real Gemma 3 270M Q4_K_M (Q5_0, Q4_K, Q6_K, Q8_0 weights), its LM head cut to 4096 tokens: logits vs
    the graph (and vs the CPU) over 8 teacher-forced steps, greedy agreement over 16 tokens, verify == decode;
  - the source a Mac compiles at run time (embedded by mk.cmake) is the one metal-emu translated, whole.
The emulated GPU has 1 core (GGML_METAL_EMU_GPU_CORES=1: 4 co-resident threadgroups of 256 threads), and the
host sizes the grid from it. Subprocess timeouts only turn a hang into a failure; no test measures time.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from stq_helpers import source_tree
from test_megakernel import _build_test_mk

ROOT = Path(__file__).resolve().parents[1]
HANG = 900
# megakernel vs the Metal graph: both read the same weights with float activations; what separates them is
# float32 summation order (and the graph's F16 rounding of some intermediates). A wrong phase, lane mapping or
# barrier costs orders of magnitude more (the planted bugs give NaN / NMSE >= 1e-2).
MAX_NMSE = 1e-5


@pytest.fixture(scope="module")
def test_mk(tmp_path_factory, metal_emu_build) -> Path:
    return _build_test_mk(tmp_path_factory.mktemp("test_mk_metal"), metal_emu_build)


def _synth(gemma_model: Path, matrix_type: str) -> Path:
    from harness import synth_gemma4
    p = synth_gemma4.SynthParams(matrix_type=matrix_type, n_vocab=4096, window=16)
    target, _ = synth_gemma4.ensure_pair(gemma_model, p=p)
    return target


@pytest.fixture(scope="module")
def synth_small(gemma_model):
    return {mt: _synth(gemma_model, mt) for mt in ("F16", "Q4_0")}


def _run(test_mk: Path, model: Path, n: int, *extra: str, **env) -> tuple[int, str]:
    e = dict(os.environ, GGML_METAL_EMU_GPU_CORES="1")
    for k in ("GGML_METAL_EMU_RESIDENCY", "GGML_METAL_EMU_ORDER", "GGML_METAL_EMU_TG_SCHED", "LLAMA_MEGAKERNEL_DEBUG",
              "LLAMA_MEGAKERNEL_VARIANT", "GGML_METAL_MK_THREADGROUPS"):
        e.pop(k, None)
    e.update({k: str(v) for k, v in env.items()})
    r = subprocess.run([str(test_mk), "-m", str(model), "-n", str(n), "--rounds", "0", "-c", "256", "--max-nmse", "1e-4", *extra],
                       capture_output=True, text=True, timeout=HANG, env=e)
    out = r.stdout + r.stderr
    print("\n".join(line for line in out.splitlines()
                    if "llama_mk" in line or "ggml_metal_mk" in line or line.startswith(("verify", "vs the CPU", "teacher", "free", "hidden", "test-mk"))))
    return r.returncode, out


@pytest.mark.parametrize("matrix_type", ["F16", "Q4_0"])
def test_metal_megakernel_matches_metal_graph_and_verify_equals_decode(test_mk, synth_small, matrix_type):
    rc, out = _run(test_mk, synth_small[matrix_type], 16)
    assert "llama_mk: megakernel on MTL0" in out, "the megakernel did not turn on:\n" + out[-3000:]
    assert re.search(r"ggml_metal_mk_create: kernel_mk_decode, 4 threadgroups", out), "grid not sized from the emulated device"
    m = re.search(r"^teacher-forced 16 steps: NMSE mean \S+ max (\S+); argmax disagreements (\d+)", out, re.M)
    assert m, out[-3000:]
    assert float(m.group(1)) < MAX_NMSE and int(m.group(2)) == 0, m.group(0)
    for M in range(2, 9):
        assert f"verify M={M}: 0 of {M} rows differ from one-token decode" in out, out[-3000:]
    # the hidden states an MTP draft reads (embeddings_nextn), every token's row and the output rows only
    hid = re.findall(r"^hidden states \((unmasked|masked)[^)]*\), \d+ batches of M = 1\.\.4: (\d+) rows, NMSE max (\S+): ok$", out, re.M)
    assert len(hid) == 2 and all(int(r) > 0 and float(e) < MAX_NMSE for _, r, e in hid), out[-3000:]
    assert "hidden states, verify M=4 == one-token steps (bitwise): 0 rows differ: ok" in out, out[-3000:]
    assert rc == 0 and "test-mk: passed" in out, out[-3000:]


@pytest.mark.parametrize("flags,what", [("1", "grid barriers removed"), ("65536", "grid barrier without its fences")])
def test_metal_megakernel_planted_barrier_bug_fails(test_mk, synth_small, flags, what):
    rc, out = _run(test_mk, synth_small["F16"], 8, LLAMA_MEGAKERNEL_DEBUG=flags)
    assert "llama_mk: megakernel on MTL0" in out, out[-3000:]
    m = re.search(r"^teacher-forced 8 steps: NMSE mean \S+ max (\S+);", out, re.M)
    assert m and not float(m.group(1)) < MAX_NMSE, f"{what} went unnoticed:\n" + out[-3000:]
    assert rc != 0 and "test-mk: FAILED" in out, f"{what} went unnoticed:\n" + out[-3000:]


# the real Gemma 3 270M: its LM head (262144 tokens) cut to the first REAL_VOCAB for CI (each emulated step pays
# for the head twice, megakernel and graph); the full model's run is recorded in NOTES.md
REAL_VOCAB = 4096
REAL_STEPS = 8


@pytest.fixture(scope="module")
def gemma3_real_cut(gemma_model) -> Path:
    from harness import synth_gemma4
    return synth_gemma4.cut_vocab(gemma_model, REAL_VOCAB)


def test_metal_megakernel_real_gemma3_270m(test_mk, gemma3_real_cut):
    """The real Gemma 3 270M Q4_K_M (the harness's default model: its 18 layers as shipped, Q5_0 where the 640-wide
    rows do not fit Q4_K's 256-value blocks, Q4_K, Q6_K, Q8_0 V and the Q8_0 embedding = LM head, cut to the first
    4096 tokens) through the megakernel vs llama.cpp's Metal graph on metal-emu: teacher-forced logits (and both vs a
    CPU copy of the model) over REAL_STEPS steps, greedy agreement over 16 tokens (test-mk runs at least 16: its verify
    check uses them), verify == decode bitwise for M = 2..8."""
    from harness.gguf_layout import read_layout
    types = {t.type_id for t in read_layout(gemma3_real_cut).tensors if len(t.dims) > 1}
    assert {6, 8, 12, 14} <= types, f"the model no longer holds Q5_0, Q8_0, Q4_K and Q6_K matrices: {types}"
    n = REAL_STEPS
    rc, out = _run(test_mk, gemma3_real_cut, n, "--cpu-ref")
    assert "llama_mk: megakernel on MTL0" in out, "the megakernel did not take the real model:\n" + out[-3000:]
    # and both against a CPU copy of the model in the same steps: the megakernel no further from it than the graph
    m = re.search(rf"^vs the CPU, {n} teacher-forced steps: megakernel NMSE mean (\S+) max \S+, argmax agrees (\d+); "
                  rf"graph NMSE mean (\S+) max \S+, argmax agrees (\d+): ok", out, re.M)
    assert m, out[-3000:]
    m = re.search(rf"^teacher-forced {n} steps: NMSE mean \S+ max (\S+); argmax disagreements (\d+)", out, re.M)
    assert m, out[-3000:]
    assert float(m.group(1)) < MAX_NMSE and int(m.group(2)) == 0, m.group(0)
    assert f"free-running greedy {max(n, 16)} tokens: identical" in out, out[-3000:]
    for M in range(2, 9):
        assert f"verify M={M}: 0 of {M} rows differ from one-token decode" in out, out[-3000:]
    assert rc == 0 and "test-mk: passed" in out, out[-3000:]


def test_metal_megakernel_source_is_embedded_whole(tmp_path, metal_emu_build):
    """What a Mac compiles at run time (ggml_metal_mk_source, generated by ggml-metal/mk/mk.cmake) is the file
    metal-emu translated, with every line of the kernel and its headers, in order, and no include left."""
    gen = metal_emu_build / "ggml" / "src" / "ggml-metal" / "mk"
    full, src = gen / "mk-kernel-full.metal", gen / "ggml-metal-mk-source.cpp"
    if not full.is_file() or not src.is_file():
        pytest.fail(f"{gen} lacks the assembled megakernel source (a build without GGML_MEGAKERNEL_DIR?)")
    cxx = shutil.which("clang++-19") or shutil.which("c++")
    if not cxx:
        pytest.skip("no C++ compiler")
    main = tmp_path / "main.cpp"
    main.write_text('#include <cstdio>\nextern "C" const char * ggml_metal_mk_source;\n'
                    "int main() { std::fputs(ggml_metal_mk_source, stdout); return 0; }\n")
    exe = tmp_path / "dump"
    subprocess.run([cxx, "-std=c++17", str(main), str(src), "-o", str(exe)], check=True)
    embedded = subprocess.run([str(exe)], capture_output=True, check=True).stdout.decode()
    assert embedded == full.read_text(), "the embedded source differs from the file metal-emu translated"
    assert '#include "' not in embedded
    # every line of each part (except its own includes of the others), in order
    lines = embedded.splitlines()
    parts = [ROOT / "megakernel" / "ggml-mk.h", ROOT / "ggml-metal" / "mk" / "mk-plan.h", ROOT / "ggml-metal" / "mk" / "mk-deq.h",
             ROOT / "megakernel" / "mk-deq32.h",
             source_tree(metal_emu_build) / "ggml" / "src" / "ggml-common.h",   # the STQ1_0 patterns (mk-deq.h)
             ROOT / "ggml-metal" / "mk" / "grid-barrier.h", ROOT / "ggml-metal" / "mk" / "mk-kernel.metal"]
    for part in parts:
        it = iter(lines)
        for line in part.read_text().splitlines():
            if line.startswith(("#pragma once", '#include "')):
                continue
            assert any(x == line for x in it), f"{part.name}: line missing or out of order in the embedded source: {line!r}"


def _server_setup(metal_emu_build: Path, mk: str | None = "1") -> tuple[Path, dict]:
    """The metal-emu build's bin folder (skip without llama-server) and the servers' environment: one emulated GPU
    core, LLAMA_MEGAKERNEL=mk (None: unset), no planted bug, no residency or threadgroup override."""
    bin_dir = metal_emu_build / "bin"
    if not (bin_dir / "llama-server").is_file():
        pytest.skip(f"{bin_dir} has no llama-server (a build of libllama only)")
    return bin_dir, {"LLAMA_MEGAKERNEL": mk, "GGML_METAL_EMU_GPU_CORES": "1", "LLAMA_MEGAKERNEL_DEBUG": None,
                     "GGML_METAL_EMU_RESIDENCY": None, "GGML_METAL_MK_THREADGROUPS": None}


def test_metal_megakernel_server_speculative_equals_greedy(metal_emu_build, synth_small):
    """llama-server with the megakernel on: speculative decoding (the Q4_0 model drafting for the F16 one: same
    random weights, so most drafts are accepted and some rejected) gives the ids and log-probabilities of plain
    greedy decoding, across the 16-token sliding window; both runs' decode/verify batches go through the kernel."""
    from harness import spec
    bin_dir, env = _server_setup(metal_emu_build, "1")
    target, draft = synth_small["F16"], synth_small["Q4_0"]
    prompts, n = spec.PROMPTS[:2], 24
    base = ["-c", "512", "-ngl", "99", "-fa", "off", "-lv", "4"]  # -lv 4: the llama_mk lines reach the log
    greedy = spec.run(bin_dir, target, prompts, n, args=base, env=env, label="greedy, megakernel", timeout=600)
    got = spec.run(bin_dir, target, prompts, n, env=env, timeout=600, label="draft k=4, megakernel",
                   args=[*base, "-md", str(draft), "-ngld", "99", "--spec-type", "draft-simple", "--spec-draft-n-max", "4",
                         "--spec-draft-n-min", "0"])
    # both servers' logs say the megakernel ran
    logs = [greedy.log, got.log]   # (each server's own log: a parallel test's servers write theirs beside them)
    assert all("llama_mk: megakernel on MTL0" in x for x in logs), "a server ran without the megakernel"
    # ids and log-probabilities (the server merges the probabilities of tokens that end inside a UTF-8 character,
    # frequent with the small vocabulary's byte tokens: compare the lists as the server returns them)
    for g, h in zip(greedy.gens, got.gens):
        assert g.tokens == h.tokens, f"token ids differ from greedy at {spec.first_diff(g.tokens, h.tokens)}"
        assert len(g.tokens) == n and g.logprobs == h.logprobs, \
            f"log-probabilities differ from greedy at {spec.first_diff(g.logprobs, h.logprobs)}"
    print(f"drafts accepted {got.draft_accepted}/{got.draft_n}, {sum(len(g.tokens) for g in got.gens)} tokens and "
          f"{sum(len(g.logprobs) for g in got.gens)} log-probabilities equal")
    assert got.draft_accepted > 0, "no draft accepted: the check proves nothing"
    assert got.draft_accepted < got.draft_n, "no draft rejected: the KV rollback was not exercised"


def test_metal_megakernel_not_on_by_default_on_apple_gpus(metal_emu_build, synth_small):
    """LLAMA_MEGAKERNEL unset: on by default only where a backend measured it faster than its graph (CUDA on
    Hopper); the Metal kernel was never timed on a Mac, so ggml-metal declines and the log says why and how to ask."""
    from harness import spec
    bin_dir, env = _server_setup(metal_emu_build, None)
    got = spec.run(bin_dir, synth_small["F16"], spec.PROMPTS[:1], 4, env=env, timeout=600, label="default, metal-emu",
                   args=["-c", "512", "-ngl", "99", "-fa", "off", "-lv", "4"])
    assert len(got.gens[0].tokens) == 4
    assert got.log, "no server log"
    line = [x for x in got.log.splitlines() if "llama_mk:" in x]
    print("\n".join(line))
    assert any("megakernel off: backend: not yet measured on Apple GPUs" in x and "LLAMA_MEGAKERNEL=1" in x for x in line), line
    assert not any("megakernel on" in x for x in line), line


def test_metal_megakernel_server_two_streams_equal_one_slot(metal_emu_build, synth_small):
    """-np 2 without a unified KV cache (one stream per sequence), flash attention on (V not transposed): two prompts
    sent at once run as megakernel steps over both streams (laid end to end, each token masked to its own stream), and
    each prompt gets the ids and log-probabilities of its one-slot run, across the 16-token window. The prompts are 4
    tokens long, so even two prefills together are one megakernel step (a longer prefill is the graph, whose bits may
    depend on what else the batch holds). With --backend-sampling the two slots' rows of a step are sampled on the
    device, each by its own sequence's chain (the rows stay on the device: llama_mk_logits_dev): the same ids."""
    from harness import spec
    bin_dir, env = _server_setup(metal_emu_build, "1")
    prompts, n = ["It was a", "He was a"], 24
    base = ["-c", "512", "-ngl", "99", "-fa", "on", "-lv", "4"]
    one = spec.run(bin_dir, synth_small["F16"], prompts, n, args=[*base, "-np", "1"], env=env, label="one slot", timeout=600)
    two = spec.run(bin_dir, synth_small["F16"], prompts, n, args=[*base, "-np", "2"], env=env, concurrent=True,
                   label="two slots at once", timeout=600)
    logs = [one.log, two.log]
    assert all("llama_mk: megakernel on MTL0" in x for x in logs), "a server ran without the megakernel"
    assert any("llama_mk: a step over 2 KV streams" in x for x in logs), "the two-slot server never ran both streams in one step"
    assert not any("llama_mk: standard graph for this batch" in x for x in logs), "a batch fell back to the graph"
    for g, h in zip(one.gens, two.gens):
        assert g.tokens == h.tokens, f"token ids differ from the one-slot run at {spec.first_diff(g.tokens, h.tokens)}"
        assert len(g.tokens) == n and g.logprobs == h.logprobs, \
            f"log-probabilities differ from the one-slot run at {spec.first_diff(g.logprobs, h.logprobs)}"

    bs = spec.run(bin_dir, synth_small["F16"], prompts, n, args=[*base, "-np", "2", "--backend-sampling"], env=env,
                  concurrent=True, label="two slots at once, backend sampling", timeout=600, probs=False)
    log = bs.log
    assert "llama_mk: a step over 2 KV streams" in log, "the backend-sampling server never ran both streams in one step"
    assert spec.MK_SAMPLING_LINE in log, "the backend samplers never ran on the megakernel's logits"
    assert spec.MK_FALLBACK_LINE not in log, "a batch fell back to the graph"
    for g, h in zip(one.gens, bs.gens):
        assert len(h.tokens) == n and g.tokens == h.tokens, \
            f"backend sampling, two slots: token ids differ from the one-slot run at {spec.first_diff(g.tokens, h.tokens)}"



@pytest.fixture(scope="module")
def synth_pair_h(gemma_model) -> tuple[Path, Path]:
    """The F16 synthetic pair whose assistant reads the target's hidden state strongly (h_gain), its output_norm
    random: drafts made from a hidden state that is not normed are rejected far more often (measured: 5/40 accepted
    against 19/27 at k = 1). Another token's row hardly changes the drafts (the assistant's token path carries
    them): test-mk's direct comparison of the rows catches that."""
    from harness import synth_gemma4
    p = synth_gemma4.SynthParams(matrix_type="F16", n_vocab=4096, window=16, h_gain=1.0)
    return synth_gemma4.ensure_pair(gemma_model, p=p)


MTP_KS = (1, 2, 3)


def test_metal_megakernel_server_draft_mtp_equals_greedy(metal_emu_build, synth_pair_h):
    """llama-server with the megakernel on and --spec-type draft-mtp (the pair's MTP assistant, which reads the
    target's hidden states rmsnorm(x)*output_norm through llama_get_embeddings_nextn_ith): for k = 1..3 the ids and
    log-probabilities of plain greedy decoding with the megakernel, across the 16-token sliding window; the target's
    decode and verify batches are megakernel steps (no batch falls back to the graph), and the drafts made from the
    megakernel's hidden states (drafted by the Metal fused draft kernel, kernel_mk_draft) are accepted exactly as often
    as those made from the graph's (LLAMA_MEGAKERNEL=0, the assistant's graph drafting):
    the assistant reads h strongly, so a hidden state of the wrong scale shows as other acceptance counts."""
    from harness import spec
    bin_dir, env = _server_setup(metal_emu_build, "1")
    target, assistant = synth_pair_h
    prompts, n = spec.PROMPTS[:2], 24
    base = ["-c", "512", "-ngl", "99", "-fa", "off", "-lv", "4"]  # -lv 4: the llama_mk lines reach the log

    def mtp(k: int, mk: bool) -> tuple[spec.Run, str]:
        r = spec.run(bin_dir, target, prompts, n, env={**env, "LLAMA_MEGAKERNEL": "1" if mk else "0"}, timeout=600,
                     label=f"draft-mtp k={k}, {'megakernel' if mk else 'graph'}",
                     args=[*base, "-md", str(assistant), "-ngld", "99", "--spec-type", "draft-mtp",
                           "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0"])
        return r, r.log

    greedy = spec.run(bin_dir, target, prompts, n, args=base, env=env, label="greedy, megakernel", timeout=600)
    assert "llama_mk: megakernel on MTL0" in greedy.log, "the greedy server ran without the megakernel"
    fails = []
    for k in MTP_KS:
        got, log = mtp(k, True)
        ref, _ = mtp(k, False)
        assert "llama_mk: megakernel on MTL0" in log, f"k={k}: the server ran without the megakernel"
        # the drafts come from the Metal fused draft kernel (kernel_mk_draft, patch 0051's ggml_backend_mk_draft_*)
        assert "llama_mk_draft: the fused MTP draft kernel drafts" in log, f"k={k}: the assistant's graph drafted"
        # every decode/verify batch of the target is a megakernel step: no reason to fall back is ever logged
        fell = [x for x in log.splitlines() if "llama_mk: standard graph for this batch" in x]
        assert not fell, f"k={k}: batches fell back to the graph: {fell}"
        print(f"draft-mtp k={k}: drafts accepted {got.draft_accepted}/{got.draft_n} (graph's hidden states: "
              f"{ref.draft_accepted}/{ref.draft_n})")
        for i, (g, h) in enumerate(zip(greedy.gens, got.gens)):
            if g.tokens != h.tokens:
                fails.append(f"k={k} prompt {i}: token ids differ from greedy at {spec.first_diff(g.tokens, h.tokens)}")
            elif len(g.tokens) != n or g.logprobs != h.logprobs:
                fails.append(f"k={k} prompt {i}: log-probabilities differ from greedy at {spec.first_diff(g.logprobs, h.logprobs)}")
        if (got.draft_accepted, got.draft_n) != (ref.draft_accepted, ref.draft_n):
            fails.append(f"k={k}: drafts from the megakernel's hidden states accepted {got.draft_accepted}/{got.draft_n}, "
                         f"from the graph's {ref.draft_accepted}/{ref.draft_n}")
        assert got.draft_accepted > 0, f"k={k}: no draft accepted: the check proves nothing"
        assert got.draft_accepted < got.draft_n, f"k={k}: no draft rejected: the KV rollback was not exercised"
    assert not fails, "\n".join(fails)


def test_metal_megakernel_server_backend_sampling(metal_emu_build, synth_pair_h):
    """llama-server --backend-sampling with the megakernel on: the request's sampler chain runs as ggml ops on the
    device, over the megakernel's logits in a graph of their own (LLM_GRAPH_TYPE_MK_SAMPLING), instead of the batch
    falling back to the model's graph. Greedy and draft-mtp k = 2 (verify batches of 3 rows: each row sampled by its
    own view) give the ids of the megakernel's greedy run sampled on the host, across the 16-token window; every
    decode/verify batch is a megakernel step and the log says the samplers ran on its logits. (The requests ask for
    no probabilities: a request for them keeps the server from sampling on the backend.)"""
    import re

    from harness import spec
    bin_dir, env = _server_setup(metal_emu_build, "1")
    target, assistant = synth_pair_h
    prompts, n = spec.PROMPTS[:2], 24
    base = ["-c", "512", "-ngl", "99", "-fa", "off", "-lv", "4"]
    env = {**env, "LLAMA_MEGAKERNEL_TIMELINE": "8"}   # a timeline line every 8 points (megakernel/llama-mk.h)

    host = spec.run(bin_dir, target, prompts, n, args=base, env=env, label="greedy, host sampling", timeout=600,
                    probs=False)
    runs = {"greedy": [], "draft-mtp k=2": ["-md", str(assistant), "-ngld", "99", "--spec-type", "draft-mtp",
                                            "--spec-draft-n-max", "2", "--spec-draft-n-min", "0"]}
    for label, extra in runs.items():
        got = spec.run(bin_dir, target, prompts, n, args=[*base, *extra, "--backend-sampling"], env=env, timeout=600,
                       label=f"{label}, backend sampling", probs=False)
        log = got.log
        assert spec.MK_ON_LINE in log, f"{label}: the server ran without the megakernel"
        assert spec.MK_SAMPLING_LINE in log, f"{label}: the backend samplers never ran on the megakernel's logits"
        fell = [x for x in log.splitlines() if spec.MK_FALLBACK_LINE in x]
        assert not fell, f"{label}: batches fell back to the graph: {fell}"
        for i, (g, h) in enumerate(zip(host.gens, got.gens)):
            assert len(h.tokens) == n and g.tokens == h.tokens, \
                f"{label}, prompt {i}: token ids differ from host sampling at {spec.first_diff(g.tokens, h.tokens)}"
        # the timeline's intervals say what the server's steps were: one-token steps (greedy) or verify steps of 3
        # tokens after draft launches of 2, each step (inputs, embedding rows, launch) inside a decode call and
        # followed by its sampling graph
        tl = [x for x in log.splitlines() if "llama_mk timeline:" in x]
        assert tl, f"{label}: no timeline line (LLAMA_MEGAKERNEL_TIMELINE)"
        seen = {a: int(c) for a, c in re.findall(r"; ([a-z.<>0-9]+ \.\. [a-z.<>0-9]+): (\d+) x \d+ us median", tl[-1])}
        m = 3 if extra else 1
        want = [f"decode>{m} .. step>{m}", f"step>{m} .. step.rows>{m}", f"step.rows>{m} .. step.launch>{m}",
                f"step.launch>{m} .. step<{m}",
                f"step<{m} .. sampling>{m}", f"sampling>{m} .. sampling<{m}", f"sampling<{m} .. decode<{m}"]
        want += [f"decode<{m} .. draft>2", "draft>2 .. draft.launch>2", "draft.launch>2 .. draft<2",
                 f"draft<2 .. decode>{m}"] if extra else [f"decode<{m} .. decode>{m}"]
        for w in want:
            assert seen.get(w, 0) > 0, f"{label}: the timeline has no interval {w}: {tl[-1]}"
        assert extra or not any("draft" in w for w in seen), f"{label}: draft launches without drafting: {tl[-1]}"
        if extra:
            print(f"{label}: drafts accepted {got.draft_accepted}/{got.draft_n}")
            assert 0 < got.draft_accepted < got.draft_n, "drafts all accepted or all rejected: the rows' order is untested"
