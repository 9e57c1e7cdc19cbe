"""The fused MTP draft (issue 14): its backend-neutral plan and float64 reference against llama.cpp, on the CPU.

test-mk-draft (megakernel/tests/test-mk-draft.cpp) loads a synthetic gemma4 target and its gemma4-assistant (the
assistant reads the target's hidden state strongly: h_gain = 1) on the CPU build, decodes greedily across the
16-token sliding window, and at every decode state drafts k tokens twice: with llama.cpp's own assistant graph (as
draft-mtp does: k one-token batches at one position, each fed the previous argmax and h_nextn), and with the float64
reference (tests/mk_hostemu/mk_draft_ref.h) reading the plan megakernel/llama-mk.cpp derives (llama_mk_draft_init,
llama_mk_draft_inputs: weights in their GGUF types, each assistant layer's view of its target cache, llama.cpp's
masks). The draft tokens must be identical (a divergence passes only at a near tie of the reference's logits), the
logits and h_next close (NMSE), and each assistant layer must read the cache llama.cpp's share map gives it; also with
two sequences in their own KV streams (--np 2).
Planted bugs in the reference (h at the wrong scale, no sliding window, h_next before the final norm) must fail.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from stq_helpers import cxx, source_tree

from harness import config

MK = config.MEGAKERNEL_DIR
TEST_MK_DRAFT = MK / "tests" / "test-mk-draft.cpp"
HOSTEMU = Path(__file__).resolve().parent / "mk_hostemu"
REF = HOSTEMU / "mk_draft_ref.h"


@pytest.fixture(scope="module", params=["F16", "Q4_0"])
def synth_pair(request, gemma_model) -> tuple[Path, Path]:
    from harness import synth_gemma4
    p = synth_gemma4.SynthParams(matrix_type=request.param, n_vocab=4096, window=16, h_gain=1.0)
    return synth_gemma4.ensure_pair(gemma_model, p=p)


def _build(tmp_path: Path, build: Path, first_inc: Path | None = None) -> Path:
    src = source_tree(build)
    exe = tmp_path / "test-mk-draft"
    lib = build / "bin"
    inc = ([f"-I{first_inc}"] if first_inc else []) + [f"-I{MK}", f"-I{HOSTEMU}"]
    cmd = [cxx(), "-std=c++17", "-O2", str(TEST_MK_DRAFT), "-o", str(exe), *inc, f"-I{src}/include", f"-I{src}/src",
           f"-I{src}/ggml/include", f"-L{lib}", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"building test-mk-draft failed:\n{' '.join(cmd)}\n{r.stderr[-4000:]}"
    return exe


def _run(exe: Path, pair: tuple[Path, Path], *args: str) -> subprocess.CompletedProcess:
    target, assistant = pair
    return subprocess.run([str(exe), "-m", str(target), "-md", str(assistant), *args], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("k,fa", [(4, 0), (8, 1)])
def test_draft_reference_matches_llama_cpp_assistant(tmp_path, cpu_build, synth_pair, k, fa):
    exe = _build(tmp_path, cpu_build)
    r = _run(exe, synth_pair, "-n", "40", "-k", str(k), "--fa", str(fa))
    print(r.stdout)
    assert r.returncode == 0 and "test-mk-draft: passed" in r.stdout, r.stdout[-4000:] + r.stderr[-2000:]
    # the cache each assistant layer reads (llama.cpp's share map: the target's last sliding-window and global layers)
    assert re.search(r"^OK assistant layer 0 reads target layer 4's cache", r.stdout, re.M), r.stdout
    assert re.search(r"^OK assistant layer 1 reads target layer 5's cache", r.stdout, re.M), r.stdout
    m = re.search(r"^OK draft tokens, 40 states x k=(\d+) .*: (\d+) of (\d+) compared steps identical", r.stdout, re.M)
    assert m and int(m.group(1)) == k, r.stdout
    # every state's k steps compared: no divergence at all on this pair (the reference's margins are large)
    assert int(m.group(2)) == int(m.group(3)) == 40*k, r.stdout
    assert re.search(r"^OK logits and h_next while the tokens agree", r.stdout, re.M), r.stdout


def test_draft_reference_two_sequences(tmp_path, cpu_build, synth_pair):
    """-np 2 without a unified cache: two sequences in their own KV streams, decoded and drafted in turn; the plan's
    views of sequence 1 are its stream's (llama_mk_draft_inputs), the masks its own."""
    exe = _build(tmp_path, cpu_build)
    r = _run(exe, synth_pair, "-n", "40", "-k", "4", "--np", "2")
    print("\n".join(x for x in r.stdout.splitlines() if not x.startswith("state ")))
    assert r.returncode == 0 and "test-mk-draft: passed" in r.stdout, r.stdout[-4000:] + r.stderr[-2000:]
    assert re.search(r"^OK assistant layer 0 reads target layer 4's cache: .* \(sequence 1, stream 1\)", r.stdout, re.M), r.stdout
    m = re.search(r"^OK draft tokens, 40 states x k=4 \(2 sequence\(s\).*: (\d+) of (\d+) compared steps identical", r.stdout, re.M)
    assert m and int(m.group(1)) == int(m.group(2)) == 2*40*4, r.stdout


def _mutated(tmp_path: Path, path: Path, old: str, new: str) -> Path:
    """a folder holding path's file with old replaced by new once (searched first by the compiler)"""
    text = path.read_text()
    assert text.count(old) == 1, f"mutation target not (once) in {path} (update the test): {old}"
    mut = tmp_path / "inc"
    mut.mkdir()
    (mut / path.name).write_text(text.replace(old, new, 1))
    return mut


# planted bugs in the reference: each must fail (FAIL lines, exit 1)
PLANTED = {
    "h_half": ("xh[p.n_embd_bb + i] = h[i];", "xh[p.n_embd_bb + i] = h[i]*0.5;"),
    "no_window": ("const int c = L.is_swa ? 1 : 0;", "const int c = 0;"),
    "h_next_before_norm": ("h_next = W.mv(p.post, n);", "h_next = W.mv(p.post, cur);"),
}


@pytest.mark.parametrize("bug", list(PLANTED))
def test_draft_reference_planted_bug_fails(tmp_path, cpu_build, gemma_model, bug):
    from harness import synth_gemma4
    pair = synth_gemma4.ensure_pair(gemma_model, p=synth_gemma4.SynthParams(matrix_type="F16", n_vocab=4096, window=16,
                                                                           h_gain=1.0))
    exe = _build(tmp_path, cpu_build, first_inc=_mutated(tmp_path, REF, *PLANTED[bug]))
    r = _run(exe, pair, "-n", "40", "-k", "4")
    print("\n".join(x for x in r.stdout.splitlines() if not x.startswith("state ")))
    assert r.returncode == 1 and "test-mk-draft: FAILED" in r.stdout and re.search(r"^FAIL ", r.stdout, re.M), \
        f"planted bug {bug} went unnoticed:\n{r.stdout[-4000:]}"


# --- the fused draft: the CUDA kernel's source on the host ------------------------------------------------------

DRAFT_EMU = HOSTEMU / "mk_draft_emu.cpp"
GGML_MK_H = MK / "ggml-mk.h"
KERNEL = MK / "cuda" / "mk-kernel.cuh"


def _build_draft_emu(tmp_path: Path, cpu_build: Path, first_inc: Path | None = None) -> Path:
    src = source_tree(cpu_build)
    exe = tmp_path / "mk_draft_emu"
    lib = cpu_build / "bin"
    inc = [f"-I{first_inc}"] if first_inc else []
    cmd = [cxx(), "-std=c++17", "-O2", "-Wno-unknown-pragmas", "-ffp-contract=off", "-DMK_SB=3", "-DGGML_MK_DRAFT_KERNEL", *inc,
           f"-I{src}/ggml/include",
           f"-I{src}/ggml/src", f"-I{MK}", f"-I{MK / 'cuda'}", f"-I{HOSTEMU}", str(DRAFT_EMU), "-o", str(exe), f"-L{lib}",
           "-lggml-base", f"-Wl,-rpath,{lib}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"compiling the draft emulation failed:\n{' '.join(cmd)}\n{r.stderr[-4000:]}"
    return exe


@pytest.mark.parametrize("variant", ["", "0x4000", "0x30000", "0x200"])
def test_fused_draft_kernel_on_host_matches_float64_reference(tmp_path, cpu_build, variant):
    """mk-kernel.cuh's draft kernel (mk_draft_kernel: mk_step<true>, the decode step's code with the draft's inputs and
    pick around it): k = 4 chained steps of a random assistant in one launch
    (in-kernel embedding row, pre-projection, the layers reading the target's caches, LM head, post-projection, argmax
    feeding the next step) at four positions across the window: the float64 reference's tokens, logits and h_next.
    0x4000: with the heads phase folded into the attention (GGML_MK_VAR_FOLD_HEADS; the draft's layers compute only Q).
    0x30000: the ways before (GGML_MK_VAR_ROW_TILES: one row per weight tile; GGML_MK_VAR_EMBD_BLOCK0: the embedding row
    decoded by block 0 in global memory), kept for A/B runs. 0x200: the plain mat-vecs (the pre- and post-projections,
    the layers' O and down) staged once for the grid (GGML_MK_VAR_ONCE_ALL)."""
    exe = _build_draft_emu(tmp_path, cpu_build)
    r = subprocess.run([str(exe), *(["--variant", variant] if variant else [])], capture_output=True, text=True, timeout=600)
    print(r.stdout)
    assert r.returncode == 0 and re.search(r"^OK the fused draft .*: 16 of 16 steps", r.stdout, re.M), \
        r.stdout[-3000:] + r.stderr[-2000:]
    # the assistant's Q8_0 LM head and Q4_0 rows go several to a weight tile, except with GGML_MK_VAR_ROW_TILES (0x10000)
    packed = re.search(r"^mat-vecs in tiles of several rows: (\d+)", r.stdout, re.M)
    assert packed and (int(packed.group(1)) == 0) == (variant == "0x30000"), r.stdout
    if variant == "0x4000":
        fold = re.search(r"^heads folded into the attention: (\d+) of", r.stdout, re.M)
        assert fold and int(fold.group(1)) > 0, r.stdout


# planted bugs: grid barriers off; the plan mapping (ggml_mk_draft_model) with Q.K scaled by 1/sqrt(head_dim) (Gemma 3's
# habit); the kernel's embedding row without sqrt(n_embd_bb); the kernel feeding every step the launch's h (not step
# j-1's h_next); the draft reduced from all blocks' partial picks but the last one's (three blocks, uneven slices of the
# vocabulary). (The argmax's tie rule is not planted: random logits have no ties)
EMU_PLANTED = {
    "barriers": None,
    "kq_scale": (GGML_MK_H, "m->kq_scale    = d->kq_scale;", "m->kq_scale    = 1.0f/sqrtf((float) d->layers[0].head_dim);"),
    "embd_scale": (KERNEL, "x[i] = __fmul_rn(w[i], da.embd_scale);", "x[i] = w[i];"),
    "h_not_chained": (KERNEL, "da.xh[nb + i] = j == 0 ? da.h[i] : mk_ldcg(da.h_next + (size_t) (j - 1)*nb + i);",
                      "da.xh[nb + i] = da.h[i];"),
    "pick_misses_a_block": (KERNEL, "for (int b = threadIdx.x; b < (int) gridDim.x; b += MK_THREADS) {",
                            "for (int b = threadIdx.x; b < (int) gridDim.x - 1; b += MK_THREADS) {"),
}


@pytest.mark.parametrize("bug", list(EMU_PLANTED))
def test_fused_draft_kernel_planted_bug_fails(tmp_path, cpu_build, bug):
    mut = None
    args = []
    if EMU_PLANTED[bug] is None:
        args = ["--planted"]   # grid barriers become block barriers
    else:
        mut = _mutated(tmp_path, *EMU_PLANTED[bug])
    exe = _build_draft_emu(tmp_path, cpu_build, first_inc=mut)
    r = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600)
    print(r.stdout[-1500:])
    assert r.returncode == 1 and re.search(r"^FAIL the fused draft", r.stdout, re.M), \
        f"planted bug {bug} went unnoticed:\n{r.stdout[-3000:]}"


def test_fused_draft_kernel_compiles_for_sm90(cpu_build):
    """The draft kernel's module (mk-draft.cu: GGML_MK_DRAFT_KERNEL) compiles for sm_90 with mk_draft_kernel alone; the
    decode module (mk.cu, with the host side of both) has no draft kernel: its decode kernel's code is what it was
    before the draft (a module with both kernels gets other code for the shared phases)."""
    from harness import cuda_toolkit
    src = source_tree(cpu_build)
    inc = [src / "ggml" / "src", src / "ggml" / "include", MK, MK / "cuda"]
    res = cuda_toolkit.compile_check(MK / "cuda" / "mk-draft.cu", inc)
    assert res["ok"], f"{res['cmd']}\n{res['log'][-6000:]}"
    sass = cuda_toolkit.sass_report(res["cubin"])
    for name, f in sass.items():
        if "draft" in name:
            print(f"  {name[:70]:70s} instr {f['instructions']:6d} spills {f['spills']:4d} in loops {f['loop_spills']:4d}")
    assert any("mk_draft_kernel" in k for k in sass), list(sass)
    assert not any("mk_decode_kernel" in k for k in sass), f"the decode kernel in the draft's module: {list(sass)}"
    plain = cuda_toolkit.compile_check(MK / "cuda" / "mk.cu", inc)
    assert plain["ok"], f"{plain['cmd']}\n{plain['log'][-6000:]}"
    names = list(cuda_toolkit.sass_report(plain["cubin"]))
    assert any("mk_decode_kernel" in k for k in names) and not any("draft" in k for k in names), names