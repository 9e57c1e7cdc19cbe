"""The Gemma decode megakernel (issue 12): what CI checks without a GPU, and the checks on a GPU.

Without a GPU (CI):
- the CUDA kernel's own source (megakernel/cuda/mk-kernel.cuh) run on the CPU through a small CUDA
  emulation (tests/mk_hostemu/cuda_emu.h: every GPU thread a fiber, all blocks co-resident) on a tiny
  random Gemma-4-shaped model with all nine weight types, both KV layouts, a shared-KV layer,
  proportional rope and per-layer inputs, against an independent float64 reference; a verify step
  must equal the one-token steps bitwise; the planted barrier bug must fail;
- the kernel's weight decoding (megakernel/mk-deq32.h through cuda/mk-deq.cuh) compiled for the host and compared with
  ggml's dequantizers for every supported type; planted decoding bugs must be caught;
- the CUDA sources compiled for sm_90 with clang-19 and NVIDIA's PyPI headers + ptxas (no GPU
  needed): compile errors and register spills show up on every run;
- the CPU build carries the llama.cpp hook: test-mk (megakernel/tests/test-mk.cpp) links against it,
  the megakernel stays off with one log line naming why, and the CPU graph's verify batches equal
  one-token decoding bit for bit (patch 0040).
With a GPU (env STQ_CUDA_BUILD = a CUDA build of the series with GGML_MEGAKERNEL_DIR): test-mk on a
synthetic Gemma 4 with F16 matrices: logits vs the standard graph, greedy agreement, verify == decode
for M = 2..8; the planted bug (grid barriers off) must fail. megakernel/device.sh runs the same on the
lent H200, with the E4B-shaped model and the speed comparison.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stq_helpers import cxx, source_tree

from harness import config, cuda_toolkit

MK = config.MEGAKERNEL_DIR
DEQ = MK / "mk-deq32.h"               # the decoding (shared with the Metal kernel)
DEQ_CUDA = MK / "cuda" / "mk-deq.cuh"  # its CUDA side, which the host emulation includes
EMU = Path(__file__).resolve().parent / "mk_hostemu" / "mk_deq_emu.cpp"
TEST_MK = MK / "tests" / "test-mk.cpp"




def _run_deq_emu(tmp_path: Path, cpu_build: Path, first_inc: Path | None = None) -> subprocess.CompletedProcess:
    """the CUDA side of the decoding compiled for the host; first_inc: a directory searched first for mk-deq32.h
    (a mutated copy)"""
    src = source_tree(cpu_build)
    exe = tmp_path / "mk_deq_emu"
    lib = cpu_build / "bin"
    inc = ([f"-I{first_inc}"] if first_inc else []) + [f"-I{MK}"]
    cmd = [cxx(), "-std=c++17", "-O1", f'-DMK_DEQ_PATH="{DEQ_CUDA}"', *inc, f"-I{src}/ggml/include", f"-I{src}/ggml/src",
           str(EMU), "-o", str(exe), f"-L{lib}", "-lggml-base", f"-Wl,-rpath,{lib}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"compiling the host emulation failed:\n{' '.join(cmd)}\n{r.stderr[-4000:]}"
    return subprocess.run([str(exe), "48"], capture_output=True, text=True, timeout=300)


def test_weight_decoding_matches_ggml(tmp_path, cpu_build):
    r = _run_deq_emu(tmp_path, cpu_build)
    print(r.stdout)
    ok = re.findall(r"^OK (\S+)", r.stdout, re.M)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(ok) == sorted(["f32", "f16", "bf16", "q4_0", "q5_0", "q8_0", "q4_K", "q6_K", "stq1_0"]), r.stdout


@pytest.mark.parametrize("old,new,type_name", [
    ("w[j + 16] = d*(float) ((q >>  4) - 8);", "w[j + 16] = d*(float) ((q & 0xF) - 8);", "q4_0"),
    ("const int h1 = (int) ((qh >> (j + 16)) & 1);", "const int h1 = (int) ((qh >> (j + 12)) & 1);", "q5_0"),
    ("((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)) << 8;", "((sc[j + 4] >> 4) | ((sc[j - 4] >> 6) << 4)) << 8;", "q4_K"),
    ("const int lsh = (qd >> 1)*4;", "const int lsh = (qd & 1)*4;", "q6_K"),
    ("w[gi + 16] = d*(float) (((pat >> (2*p0 + 2)) & 3) - 1);", "w[gi + 16] = d*(float) (((pat >> (2*p0 + 1)) & 3) - 1);", "stq1_0"),
    ("for (int j = 0; j < 32; ++j) w[j] = j < lim ? r[j] : 0.0f;", "for (int j = 0; j < 32; ++j) w[j] = r[j];", "f32"),
])
def test_weight_decoding_emulation_can_fail(tmp_path, cpu_build, old, new, type_name):
    text = DEQ.read_text()
    assert old in text, f"mutation target not in {DEQ} (update the test): {old}"
    mut = tmp_path / "inc"
    mut.mkdir()
    (mut / DEQ.name).write_text(text.replace(old, new, 1))
    r = _run_deq_emu(tmp_path, cpu_build, first_inc=mut)
    assert r.returncode != 0 and re.search(rf"^FAIL {re.escape(type_name)}\b", r.stdout, re.M), \
        f"planted bug in {type_name} was not detected:\n{r.stdout}"


KERNEL_EMU = Path(__file__).resolve().parent / "mk_hostemu" / "mk_kernel_emu.cpp"
STAGE_EMU = KERNEL_EMU.parent / "mk_stage_emu.cpp"
ONCE_EMU = KERNEL_EMU.parent / "mk_once_emu.cpp"
KQ_EMU = KERNEL_EMU.parent / "mk_kq_emu.cpp"


def _build_kernel_emu(exe: Path, cpu_build: Path, first_inc: Path | None = None, source: Path = KERNEL_EMU,
                      sb: int = 3, defines: tuple[str, ...] = ()) -> Path:
    """the kernel emulation (or source: another program on the kernel's source); first_inc: a directory searched first
    for mk-kernel.cuh (a mutated copy); sb: MK_SB, the staging's load batch (the GPU's is 2: the emulation's 3 by default,
    so that its batches differ from the code made for up to 4 columns); defines: more -D macros (MK_ATT_HD4_64)"""
    src = source_tree(cpu_build)
    lib = cpu_build / "bin"
    inc = [f"-I{first_inc}"] if first_inc else []
    cmd = [cxx(), "-std=c++17", "-O2", "-Wno-unknown-pragmas", "-ffp-contract=off", f"-DMK_SB={sb}", *defines, *inc,
           f"-I{src}/ggml/include",
           f"-I{src}/ggml/src", f"-I{MK}", f"-I{MK / 'cuda'}", f"-I{KERNEL_EMU.parent}", str(source), "-o", str(exe),
           f"-L{lib}", "-lggml-base", f"-Wl,-rpath,{lib}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"compiling the kernel emulation failed:\n{' '.join(cmd)}\n{r.stderr[-4000:]}"
    return exe


def _planted_bug_fails(tmp_path: Path, cpu_build: Path, old: str, new: str, source: Path, fail: str, what: str) -> None:
    """a program on the kernel's source (source), built with a planted bug (old -> new), must exit non-zero printing a
    line that matches fail"""
    exe = _mutated_kernel_emu(tmp_path, cpu_build, old, new, source=source)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and re.search(fail, r.stdout, re.M), f"{what} went unnoticed:\n{r.stdout[-3000:]}"


def _mutated_kernel_emu(tmp_path: Path, cpu_build: Path, old: str, new: str, source: Path = KERNEL_EMU,
                        defines: tuple[str, ...] = ()) -> Path:
    """the kernel emulation built with a planted bug: mk-kernel.cuh with old (present exactly once) replaced by new"""
    kernel = MK / "cuda" / "mk-kernel.cuh"
    text = kernel.read_text()
    assert text.count(old) == 1, f"mutation target not (once) in {kernel} (update the test): {old}"
    mut = tmp_path / "inc"
    mut.mkdir()
    (mut / kernel.name).write_text(text.replace(old, new, 1))
    return _build_kernel_emu(tmp_path / source.stem, cpu_build, first_inc=mut, source=source, defines=defines)


@pytest.fixture(scope="module")
def kernel_emu(tmp_path_factory, cpu_build) -> Path:
    return _build_kernel_emu(tmp_path_factory.mktemp("mk_kernel_emu") / "mk_kernel_emu", cpu_build)


# the emulation's heads are 64 and 128 dims, which take the attention's NP = 4 code (8 cells a step); built with
# MK_ATT_HD4=64 its 128-dim global layer takes the code of heads over 256 dims (NP = 8, 2 cells a step: E4B's 512-dim
# global layers) instead
MK_ATT_HD4_64 = ("-DMK_ATT_HD4=64",)


@pytest.fixture(scope="module")
def kernel_emu_np8(tmp_path_factory, cpu_build) -> Path:
    return _build_kernel_emu(tmp_path_factory.mktemp("mk_kernel_emu_np8") / "mk_kernel_emu", cpu_build, defines=MK_ATT_HD4_64)


# default: little shared memory (verify mat-vecs in passes of 2 columns, 3 weight stages per warp); big: an H200's
# with up to 8 stages (one pass, 6 weight stages per warp fit; attention one block per (token, head) throughout);
# the weight tiles come by bulk copies (they land only at their mbarrier wait in the emulation) except in the 0x3400
# run: GGML_MK_VAR_CP_ASYNC (the path of sm_80..89 devices) | GGML_MK_VAR_DEVICE_ATT | GGML_MK_VAR_GENERIC_M (in the
# default run the attention's partial results fit in shared memory for some steps and not for others: both ways)
# (every run's verify step of M = 4 runs the mat-vec and staging code made for up to 4 columns, the 0x400000 run's the
# any-batch code, 0x3400's one-token steps the any-batch code too: a one-token step through the typed pair loop, two rows
# at a time, and the one-round staging must give the same bits)
# 0x4000: GGML_MK_VAR_FOLD_HEADS (no heads phase: the attention computes Q and the step's K/V rows itself), every step also
# run by the default kernel on a second cache (--vs-default: logits, hidden rows and caches bitwise equal); with the little
# shared memory the fold fits some layer steps and not others (both ways in one run), with an H200's every one; the gemma3
# plan adds Q scaled after rope, V = K without V norm
# 0x8000: GGML_MK_VAR_LATE_BEGIN (a mat-vec's first weight tiles issued after its staging, also in the passes of a verify
# step whose columns do not fit at once), against the default kernel bitwise
# 0x10000: GGML_MK_VAR_ROW_TILES (one row per weight tile): the default packs the model's short Q4_0/Q8_0 rows several
# to a tile (the LM head's 300 rows end in a part-filled tile), each row's sum must keep its bits
# 0x1000: GGML_MK_VAR_DEVICE_ATT against the default bitwise: the device-wide way's combine per group, then across groups
# (group results written over chunk slots already read), must round as the block-per-(token, head, group) way's
# 0x40000: GGML_MK_VAR_ONE_GROUP (the attention before its groups: one block per (token, head), all chunks in one combine):
# lossless on its own, and other bits than the default's (test_attention_groups_change_the_arithmetic)
# 0x80000: GGML_MK_VAR_WARP_COMBINE (a group's chunks and a (token, head)'s groups combined by one warp) against the
# default's block-wide combine (a thread per dimension) bitwise, both the in-block and the across-groups (L2) combine
# 0x100000: GGML_MK_VAR_HALF_GROUPS (groups of MK_ATT_GROUP/2 chunks, 1 in the emulation: up to 5 groups a step, every
# chunk's result through the across-groups combine): lossless on its own
# 0x200000: GGML_MK_VAR_BLOCK_UNITS (a mat-vec's units dealt warp by warp within a block, the order before the default's
# block by block): each row is still one warp's, so the bits must not change; with the emulation's 2 blocks the two
# orders hand every mat-vec's rows (and the packed tiles, the gate/up pairs, the q/k/v job boundaries) to other warps
# 0x400000: GGML_MK_VAR_WIDE_M (verify batches of 2..4 tokens through the any-batch code, MK_M columns, before the code
# made for at most MK_MC_SMALL = 4): bitwise the default's; the emulation's verify M=4 takes the small code by default
# 0x800000: GGML_MK_VAR_ITEM_STAGE (before: a small verify batch staged item by item, mk_stage, not slot by slot over every
# column, mk_stage_cols): bitwise the default's (the model's K <= 512 gives one slot per thread:
# test_cuda_staging_slot_by_slot_equals_the_default_at_e4b_widths takes the wider rows)
# wide-verify(-big): verify steps of 2, 3, 5 and 8 tokens, the default against 0x800000 (item by item up to 4) bitwise, with
# passes of 2 columns (little shared memory) and with every column in one pass
# slow: 3 blocks, block 1 running only every 8th pass of the emulation's scheduler (the others run ahead of it to the
# next barrier they share: a phase that reads what another block has not written yet shows)
# 0x1000000: GGML_MK_VAR_KQ_FLOAT (before: Q4_K / Q6_K weights meet the float inputs, not the 8-bit records): other
# arithmetic, so no bitwise comparison; the reference then rounds only the Q4_0 / Q8_0 inputs (mk_ref.h MK_REF_Q8)
# 0x6000000: GGML_MK_VAR_PAIR_TAIL | GGML_MK_VAR_KQ_TILES (before: a tile's last Q4_0 pairs as pairs, K-quant tiles of equal
# size): bitwise the default's here, where no row has more than 32 pairs or a second K-quant tile (they change only such
# rows' bits, which test_cuda_kquant_dot_products_at_e4b_widths checks at E4B's widths)
# 0x8000000: GGML_MK_VAR_FLOAT_GROUPS (before: F32 / F16 / BF16 weights a 32-value group per lane): a lane's sums in
# another order, so no bitwise comparison with the default
EMU_RUNS = {"default": [], "big": ["--smem", "227000", "--stages", "8"], "0x3400": ["--variant", "0x3400"],
            "0x4000": ["--variant", "0x4000", "--vs-default"], "0x8000": ["--variant", "0x8000", "--vs-default"],
            "0x10000": ["--variant", "0x10000", "--vs-default"],
            "0x4000-gemma3-big": ["--gemma3", "--variant", "0x4000", "--vs-default", "--smem", "227000", "--stages", "8"],
            "0x1000": ["--variant", "0x1000", "--vs-default"], "0x40000": ["--variant", "0x40000"],
            "0x80000": ["--variant", "0x80000", "--vs-default"], "0x100000": ["--variant", "0x100000"],
            "0x200000": ["--variant", "0x200000", "--vs-default"],
            "0x400000": ["--variant", "0x400000", "--vs-default"], "0x800000": ["--variant", "0x800000", "--vs-default"],
            "slow": ["--blocks", "3", "--slow-block", "1"], "0x1000000": ["--variant", "0x1000000"],
            "0x6000000": ["--variant", "0x6000000", "--vs-default"], "0x8000000": ["--variant", "0x8000000"],
            "wide-verify": ["--verify", "2,3,5,8", "--variant", "0x800000", "--vs-default"],
            "wide-verify-big": ["--verify", "2,3,5,8", "--variant", "0x800000", "--vs-default", "--smem", "227000", "--stages", "8"],
            # 0x10000000 (GGML_MK_VAR_NO_CLUSTER_STAGE, before): verify batches of 2..8 tokens staged whole in every block
            # against the default's, staged over clusters of 2 blocks on an even grid (the default runs do so too: 2
            # blocks); two clusters with a slow block
            "0x10000000": ["--verify", "2,3,4,5,8", "--variant", "0x10000000", "--vs-default"],
            "clusters-slow": ["--blocks", "4", "--slow-block", "1", "--verify", "2,3,4,5"],
            # 0x20000000 (GGML_MK_VAR_NO_FLOAT_PACK, before): short float rows one to a tile, bitwise the default's (packed
            # several to a tile), one-token and verify steps (the code for up to 4 columns and for any batch)
            "0x20000000": ["--verify", "2,3,4,5,8", "--variant", "0x20000000", "--vs-default"],
            # 0x200 (GGML_MK_VAR_ONCE_ALL): every plain mat-vec of Q4_0/Q8_0 jobs (O, down, the per-layer projection) staged
            # once for the grid (mk_stage_once: each block rounds its slice to records in global memory, a grid barrier,
            # every block copies them), bitwise the default's, which stages them in every block on this model (its
            # widths stay below mk_once_on's bound), in one-token steps and verify batches in passes of 2 columns
            "0x200": ["--verify", "2,3,4,5,8", "--variant", "0x200", "--vs-default"],
            # 0x80000000 (GGML_MK_VAR_CHUNK4): the attention's chunks taken 4 cells a step. The emulation's chunks are
            # 4 cells already (mk_ref.h), so the code made for 4 cells a step must give the bits of the default's 8 (the
            # same cells, in the same order); on a GPU the variant also halves the chunk (ggml_mk_att_chunk): other bits
            "0x80000000": ["--verify", "2,3,4,5,8", "--variant", "0x80000000", "--vs-default"],
            # 0x80 (GGML_MK_VAR_TWO_UNITS): the block way's attention two units a round where a step has more units than
            # blocks (mk_att_two: with the large shared memory two groups' slots fit), bitwise the default's one unit a
            # round; also on a schedule with a slow block (the groups' last arrival: either unit of a round)
            "0x80-big": ["--smem", "227000", "--stages", "8", "--verify", "2,3,5,8", "--variant", "0x80", "--vs-default"],
            "0x80-slow": ["--smem", "227000", "--stages", "8", "--blocks", "3", "--slow-block", "1", "--verify", "2,3,5,8",
                          "--variant", "0x80", "--vs-default"],
            # chunks of 8 cells, a GPU's (ggml_mk_att_chunk up to 8192 cells; the emulation's model takes 4): every
            # chunk's transposed V rows of the global layer in 16-byte loads of 8 cells (with 4, every other chunk)
            "chunk8": ["--chunk", "8", "--verify", "2,3,5,8"],
            "0x80-chunk8-big": ["--chunk", "8", "--smem", "227000", "--stages", "8", "--verify", "2,3,5,8", "--variant", "0x80",
                                "--vs-default"]}


@pytest.mark.parametrize("variant", list(EMU_RUNS))
def test_cuda_kernel_on_host_matches_float64_reference(kernel_emu, variant):
    _check_emu_run(kernel_emu, variant, EMU_RUNS[variant])


# the NP = 8 attention code (MK_ATT_HD4=64: the emulation's global layer through the code of E4B's 512-dim heads): the
# default, and 0x800 (GGML_MK_VAR_LOAD_PAIRS: two steps' cells a load round trip, the transposed V rows' 4 cells in one
# 8-byte load, the unit's Q in shared memory) bitwise against it, alone, with an H200's shared memory and verify batches,
# and with 0x80's two units a round and chunks of 8 (a GPU's)
EMU_RUNS_NP8 = {"default": ["--verify", "2,3,5,8"],
                "0x800": ["--variant", "0x800", "--vs-default"],
                "0x800-big": ["--smem", "227000", "--stages", "8", "--verify", "2,3,5,8", "--variant", "0x800", "--vs-default"],
                "0x880-chunk8-big": ["--chunk", "8", "--smem", "227000", "--stages", "8", "--verify", "2,3,5,8",
                                     "--variant", "0x880", "--vs-default"]}


@pytest.mark.parametrize("variant", list(EMU_RUNS_NP8))
def test_cuda_kernel_on_host_np8_attention_matches_float64_reference(kernel_emu_np8, variant):
    _check_emu_run(kernel_emu_np8, variant, EMU_RUNS_NP8[variant])


LOAD_PAIRS_BUGS = {
    # the 8-byte loads of transposed V (4 cells of a dimension): dimension d + 1's two words swapped
    "v-words": ("vr[(CL/2) % CL][i] = x1.x; vr[(CL/2 + 1) % CL][i] = x1.y;",
                "vr[(CL/2) % CL][i] = x1.y; vr[(CL/2 + 1) % CL][i] = x1.x;"),
    # the unit's Q in shared memory: each lane's first value of a pair read one float off
    "q-shared": ("qa = i < np ? qs[2*lane + 64*i]     : 0.0f;", "qa = i < np ? qs[2*lane + 64*i + 1] : 0.0f;"),
}


@pytest.mark.parametrize("bug", list(LOAD_PAIRS_BUGS))
def test_cuda_kernel_on_host_load_pairs_planted_bug_fails(tmp_path, cpu_build, bug):
    """variant 0x800's own code (the NP = 8 attention, MK_ATT_HD4=64): a planted bug in its V loads or its Q in shared
    memory must fail the variant's run (against the float64 reference and the default bitwise) and leave the default's
    run as it was (it never takes that code)"""
    exe = _mutated_kernel_emu(tmp_path, cpu_build, *LOAD_PAIRS_BUGS[bug], defines=MK_ATT_HD4_64)
    r = subprocess.run([str(exe), *EMU_RUNS_NP8["0x800"]], capture_output=True, text=True, timeout=900)
    assert r.returncode != 0 and re.search(r"^FAIL variant 0x800: step", r.stdout, re.M), \
        f"planted bug {bug} went unnoticed (does 0x800 still take that code?):\n{r.stdout[-3000:]}"
    r = subprocess.run([str(exe), *EMU_RUNS_NP8["default"]], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "OK verify M=8: 0 of 8 rows differ" in r.stdout, \
        f"the planted bug reached the default's loads:\n{r.stdout[-3000:]}"


def _check_emu_run(kernel_emu: Path, variant: str, args: list[str]) -> None:
    """one run of a kernel emulation: its checks against the float64 reference, verify == one-token steps, the variant
    == the default kernel (--vs-default), and the ways its steps took"""
    r = subprocess.run([str(kernel_emu), *args], capture_output=True, text=True, timeout=900)
    print(r.stdout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert re.search(r"^OK one-token steps .*worst NMSE vs float64 reference", r.stdout, re.M), r.stdout
    verify_m = [int(m) for m in args[args.index("--verify") + 1].split(",")] if "--verify" in args else [4]
    for m in verify_m:
        assert f"OK verify M={m}: 0 of {m} rows differ" in r.stdout, r.stdout
        assert f"OK verify M={m}: 0 of {m} hidden rows differ" in r.stdout, r.stdout
    # the hidden rows an MTP draft reads (mk_args.h_out, written while the LM head's inputs are staged)
    assert re.search(r"^OK hidden rows .*worst NMSE vs float64 reference", r.stdout, re.M), r.stdout
    if "--vs-default" in args:
        n_steps = 18 + len(verify_m)   # (18 one-token steps, then the verify steps)
        assert re.search(rf"^OK variant 0x\w+ == default kernel bitwise .*: 0 of {n_steps} steps differ", r.stdout, re.M), r.stdout
    # the verify steps ran as clusters of 2 blocks wherever they should (mk_step_cl: not 0x10000000, an even grid, a staging
    # that splits: not steps of 2..4 tokens under 0x800000 without 0x400000), and no other step did
    blocks = int(args[args.index("--blocks") + 1]) if "--blocks" in args else 2
    var = int(args[args.index("--variant") + 1], 0) if "--variant" in args else 0
    item = bool(var & 0x800000) and not var & 0x400000
    want = sum(m >= 2 and not (m <= 4 and item) for m in verify_m) if blocks % 2 == 0 and not var & 0x10000000 else 0
    n_cl = re.search(r"^steps staged over clusters of 2 blocks \(mk_step_cl\): (\d+)", r.stdout, re.M)
    assert n_cl and int(n_cl.group(1)) == want, r.stdout
    packed = re.search(r"^kernel: (\d+) of (\d+) mat-vec jobs in tiles of several rows \(up to (\d+)\)", r.stdout, re.M)
    assert packed, r.stdout
    if variant == "0x10000":
        assert packed.group(1) == "0", f"GGML_MK_VAR_ROW_TILES still packs rows: {packed.group(0)}"
        assert re.search(r"^default kernel: [1-9]\d* of \d+ mat-vec jobs in tiles of several rows \(up to ([2-9]|\d\d)\)", r.stdout, re.M), \
            "the default kernel packed no rows: the bitwise comparison tests nothing\n" + r.stdout
    two = re.search(r"^attention two units a round \(more units than blocks\): (\d+) of (\d+) layer steps"
                    r"(?: \(the default kernel: (\d+)\))?$", r.stdout, re.M)
    assert two, r.stdout
    if var & 0x80:   # the variant took two units a round in some steps (a context of several groups on 2-3 blocks; its
        # runs have the large shared memory), the default it equals bitwise in none
        assert 0 < int(two.group(1)) < int(two.group(2)) and two.group(3) == "0", two.group(0)
    else:   # only the variant takes two
        assert two.group(1) == "0", two.group(0)
    if variant.split("-")[0] == "0x4000":   # GGML_MK_VAR_FOLD_HEADS runs (not 0x40000, 0x400000)
        fold = re.search(r"^heads folded into the attention: (\d+) of (\d+) layer steps", r.stdout, re.M)
        assert fold, r.stdout
        n, of = int(fold.group(1)), int(fold.group(2))
        assert (0 < n < of) if "--smem" not in args else n == of, f"the fold ran in {n} of {of} layer steps"


def _emu_digest(kernel_emu, *args) -> tuple[str, str]:
    r = subprocess.run([str(kernel_emu), *args], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    m = re.search(r"^digest of every step's logits and hidden rows: (\w+)", r.stdout, re.M)
    assert m, r.stdout
    return m.group(1), r.stdout


# the attention's groups (MK_ATT_GROUP, 3 chunks in the emulation) are at work: a step's list spans two of them, and
# combining per group then across groups rounds otherwise than one combine over all chunks (GGML_MK_VAR_ONE_GROUP);
# with a group as large as the whole list the two would be the same bits, and the runs above could not tell
def test_attention_groups_change_the_arithmetic(kernel_emu):
    d_groups, out = _emu_digest(kernel_emu)
    g = re.search(r"^attention groups \((\d+) chunks of (\d+) cells each\) in a step's list: up to (\d+)", out, re.M)
    assert g and int(g.group(3)) >= 2, "the emulation's steps never spanned several attention groups:\n" + out
    d_one, _ = _emu_digest(kernel_emu, "--variant", "0x40000")
    assert d_groups != d_one, f"groups and one group gave the same bits (digest {d_groups}): the groups' combine did not run"


def test_cuda_kernel_on_host_without_grid_barriers_fails(kernel_emu):
    r = subprocess.run([str(kernel_emu), "--planted"], capture_output=True, text=True, timeout=900)
    assert r.returncode != 0 and "FAIL" in r.stdout, "grid barriers off went unnoticed:\n" + r.stdout[-3000:]


def test_cuda_kernel_on_host_one_missing_grid_barrier_fails_on_the_slow_schedule(tmp_path, cpu_build):
    """the "slow" run's schedule (3 blocks, block 1 running every 8th pass) must catch one grid barrier left out: the
    one between the q/k/v mat-vec and the heads phase (the heads read every block's q/k/v rows)"""
    exe = _mutated_kernel_emu(tmp_path, cpu_build, "mk_grid_sync(a, MK_PH_QKV);", "/* planted: no barrier */")
    r = subprocess.run([str(exe), *EMU_RUNS["slow"]], capture_output=True, text=True, timeout=900)
    assert r.returncode != 0 and re.search(r"^FAIL ", r.stdout, re.M), \
        f"a missing grid barrier went unnoticed on the slow schedule:\n{r.stdout[-3000:]}"


def test_cuda_kernel_on_host_small_batch_code_planted_bug_fails(tmp_path, cpu_build):
    """the verify step of M = 4 must take the code made for up to MK_MC_SMALL columns by default (mk_mv_run<4> with the
    staging slot by slot over every column, mk_stage_cols), and variants 0x400000 (the any-batch code) and 0x800000 (the
    item-by-item staging, mk_stage) must not, else their bitwise comparisons compare the default with itself: a planted
    bug in mk_stage_cols (column 1's values not scaled by the norm vector) fails the default run and passes theirs"""
    old = "mk_stage_put(x, mk_stage_val(x, va[m], vb[m], vw, res && !gl ? rh[m] : 0.0f), vn, ss[m], m0, m, f,"
    new = "mk_stage_put(x, mk_stage_val(x, va[m], vb[m], vw, res && !gl ? rh[m] : 0.0f), m == 1 ? mk_f4(1, 1, 1, 1) : vn, ss[m], m0, m, f,"
    exe = _mutated_kernel_emu(tmp_path, cpu_build, old, new)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=900)
    assert r.returncode != 0 and re.search(r"^FAIL verify M=4", r.stdout, re.M), \
        f"a bug in the small-batch code went unnoticed (does verify M=4 still take it?):\n{r.stdout[-3000:]}"
    for variant in ("0x400000", "0x800000"):
        r = subprocess.run([str(exe), "--variant", variant], capture_output=True, text=True, timeout=900)
        assert r.returncode == 0 and "OK verify M=4: 0 of 4 rows differ" in r.stdout, \
            f"variant {variant} still runs mk_stage_cols:\n{r.stdout[-3000:]}"


def test_cuda_kernel_on_host_two_units_planted_bug_fails(tmp_path, cpu_build):
    """variant 0x80's two units a round (mk_att_two: a step with more units than blocks, the emulation's large shared
    memory): a planted bug, the second unit's combine reading the first unit's chunk slots, must fail the variant's run
    (against the float64 reference and bitwise against the default's one unit a round), and leave the default's own
    run, which never takes two units, as it was"""
    exe = _mutated_kernel_emu(tmp_path, cpu_build, "combine_blk(slots + (size_t) k*MK_ATT_GROUP*PS,", "combine_blk(slots,")
    r = subprocess.run([str(exe), *EMU_RUNS["0x80-big"]], capture_output=True, text=True, timeout=900)
    assert r.returncode != 0 and re.search(r"^FAIL ", r.stdout, re.M), \
        f"a wrong second unit went unnoticed (does 0x80-big still take two units a round?):\n{r.stdout[-3000:]}"
    r = subprocess.run([str(exe), *EMU_RUNS["big"], "--verify", "2,3,5,8"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "OK verify M=8: 0 of 8 rows differ" in r.stdout, \
        f"the planted bug reached the one-unit way:\n{r.stdout[-3000:]}"


def test_cuda_kernel_on_host_item_staging_planted_bug_fails(tmp_path, cpu_build):
    """variant 0x800000 (GGML_MK_VAR_ITEM_STAGE) must take the item-by-item staging (mk_stage<MK_MC_SMALL>, its columns
    selected from registers at run time) in the verify step of M = 4, else its bitwise comparison with the default
    compares the default with itself: a planted bug in that selection (every column reads column 0's sum of squares /
    1/rms) passes the default run, which no longer selects, and fails the variant's"""
    exe = _mutated_kernel_emu(tmp_path, cpu_build, "r = c == m ? v[c] : r;", "r = v[0];")
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "OK verify M=4: 0 of 4 rows differ" in r.stdout, \
        f"the planted bug reached the default kernel (does it still select columns at run time?):\n{r.stdout[-3000:]}"
    r = subprocess.run([str(exe), "--variant", "0x800000", "--vs-default"], capture_output=True, text=True, timeout=900)
    assert r.returncode != 0 and re.search(r"^FAIL (verify M=4|variant 0x800000)", r.stdout, re.M), \
        f"a bug in the item-by-item staging went unnoticed (does verify M=4 still take it under 0x800000?):\n{r.stdout[-3000:]}"


def test_cuda_kernel_on_host_once_barrier_planted_bug_fails(tmp_path, cpu_build):
    """inputs staged once for the grid (variant 0x200 here): without the grid barrier between the blocks' slices of
    records and their copies, a block copies records that other blocks have not written yet (the last mat-vec's, or
    zeros); both the bitwise comparison with the default and the slow-block schedule must catch it"""
    exe = _mutated_kernel_emu(tmp_path, cpu_build, "    mk_grid_sync(a, MK_PH_ONCE);", "    __syncthreads();")
    for args in (["--variant", "0x200", "--vs-default"], ["--variant", "0x200", "--blocks", "3", "--slow-block", "1"]):
        r = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=900)
        assert r.returncode != 0 and re.search(r"^FAIL (step|variant|verify)", r.stdout, re.M), \
            f"a missing barrier after the slices staged once went unnoticed ({' '.join(args)}):\n{r.stdout[-3000:]}"


def test_cuda_kernel_on_host_cluster_pass_barrier_planted_bug_fails(tmp_path, cpu_build):
    """a verify step whose mat-vecs run in passes of 2 columns (the emulation's small shared memory) as clusters of 2
    blocks: without the cluster barrier at a later pass's staging, a block writes the next pass's inputs into its
    partner's shared memory while the partner still reads the pass before; the "clusters-slow" schedule must catch it"""
    exe = _mutated_kernel_emu(tmp_path, cpu_build, "    if (pair && m0 > 0) {\n        mk_cluster_sync();",
                              "    if (false) {\n        mk_cluster_sync();")
    r = subprocess.run([str(exe), *EMU_RUNS["clusters-slow"]], capture_output=True, text=True, timeout=900)
    assert r.returncode != 0 and re.search(r"^FAIL verify M=[345]", r.stdout, re.M), \
        f"a missing cluster barrier between passes went unnoticed:\n{r.stdout[-3000:]}"


@pytest.mark.parametrize("sb", [2, 3])
def test_cuda_staging_slot_by_slot_equals_the_default_at_e4b_widths(tmp_path, cpu_build, sb):
    """mk_stage_cols (the default for 2..4 columns), in one block and split over a cluster of 2 blocks, and the any-batch
    mk_stage<MK_M> split over a cluster of 2 blocks, and mk_stage_cols with its rms round 2 slots a round
    (the default; 1 under GGML_MK_VAR_STAGE_ROUND1) in one block and over a cluster of 2, against mk_stage
    (GGML_MK_VAR_ITEM_STAGE) at K = 2560, 4096, 10240 (several slots per thread: the separate rms round, rounds of several
    slots), 256 and 2304 (threads without a slot), every staging mode, 1..4 columns; MK_SB 2 (the GPU's) and 3: every
    staged byte (in both blocks of the cluster) and row equal"""
    exe = _build_kernel_emu(tmp_path / "mk_stage_emu", cpu_build, source=STAGE_EMU, sb=sb)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    print(r.stdout[-2000:])
    assert r.returncode == 0 and re.search(r"^OK staging slot by slot \(mk_stage_cols, one block and a cluster of 2, its rms "
                                           r"round 1 and 2 slots a round\) and the any-batch "
                                           r"staging over a cluster of 2 == mk_stage bitwise: 0 of 120 cases differ", r.stdout, re.M), \
        r.stdout[-3000:] + r.stderr[-2000:]


# planted bugs the widths test above must catch and the kernel emulation (K <= 512) cannot: (old, new, the FAIL line
# expected). rms_slots: the separate rms round of mk_stage_cols taking only each thread's first slot (a row of K <= 2048
# has one); record_places: the rounding after the norm writing group g's 8-bit record to slot g, not mk_rec_slot(g) where
# the mat-vecs read it (the emulation's rows, at most 8 groups, never reach a swapped slot; the widths test checks every
# record's d against its group's staged values)
STAGE_PLANTED = {
    "rms_slots": ("v[b][m] = on(m) && f < F4 && b < RB && j < NJ ? mk_ldcg4((const float4 *) (x.res_h",
                  "v[b][m] = on(m) && f < F4 && b < RB && j == 0 ? mk_ldcg4((const float4 *) (x.res_h",
                  r"^FAIL K=(2560|4096|10240|2304) residual"),
    "record_places": ("if (q8) {\n        uint8_t * rec = xq + (size_t) (m*KG + mk_rec_slot(f/8))*MK_XQ_REC;",
                      "if (q8) {\n        uint8_t * rec = xq + (size_t) (m*KG + f/8)*MK_XQ_REC;",
                      r"^FAIL K=\d+ .* where the mat-vec does not look for it"),
    # the staging split over a cluster of 2 blocks (mk_stage_cols in a launch clustered by 2, session 30): the partner's copy of the
    # 8-bit records' quants not written; of the norm-scaled values not written; the cluster barrier at the end a block
    # barrier only (the partner's stores may not have landed when the mat-vec reads them); the rows for the host and the
    # next residual step (res_out, nw_out) written by block 0 only (the odd columns, staged by block 1, never)
    "cluster_records": ("mk_cluster_st((unsigned *) rec + f % 8, mk_cluster_rank() ^ 1, w);", "(void) w;",
                        r"^FAIL K=\d+ .* over a cluster of 2 blocks"),
    "cluster_values": ("            if (pair) {\n                mk_cluster_st(p, mk_cluster_rank() ^ 1, v);\n            }\n        }\n        if (x.nw_out",
                       "        }\n        if (x.nw_out", r"^FAIL K=\d+ .* over a cluster of 2 blocks"),
    "cluster_barrier": ("        mk_cluster_sync();   // (also the block's barrier)", "        __syncthreads();",
                        r"^FAIL K=\d+ .* over a cluster of 2 blocks"),
    "cluster_rows": ("F4, F, KG,\n                             direct, xs, xq, (int) blockIdx.x == mk_stage_owner(pair, m), pair);",
                     "F4, F, KG,\n                             direct, xs, xq, blockIdx.x == 0, pair);",
                     r"^FAIL K=\d+ .* over a cluster of 2 blocks"),
    # the any-batch staging (mk_stage<MK_M>) over a pair: the partner not given the values / records its put makes; both
    # blocks taking the even columns (the odd ones staged by neither)
    "any_batch_partner": ("fb[b], F4, F, KG, direct, xs, xq, (int) blockIdx.x == mk_stage_owner(pair, m), pair);",
                          "fb[b], F4, F, KG, direct, xs, xq, (int) blockIdx.x == mk_stage_owner(pair, m), false);",
                          r"^FAIL K=\d+ .* over a cluster of 2 blocks"),
    "any_batch_columns": ("const int  c0   = pair ? mk_cluster_rank() : 0;", "const int  c0   = 0;",
                          r"^FAIL K=\d+ .* over a cluster of 2 blocks"),
    # mk_stage_cols's rms round with 2 slots a round (the default): only each round's first slot summed
    "rms_round_of_2": ("                if (b < RB && j0 + b < NJ) {\n                    MK_UNROLL\n                    for (int m = 0; m < MC; ++m) {\n                        ss[m] = mk_sq4(v[b][m], ss[m]);",
                       "                if (b == 0 && j0 + b < NJ) {\n                    MK_UNROLL\n                    for (int m = 0; m < MC; ++m) {\n                        ss[m] = mk_sq4(v[b][m], ss[m]);",
                       r"^FAIL K=(2560|4096|10240|2304) residual.* 2 slots a round"),
}


@pytest.mark.parametrize("bug", list(STAGE_PLANTED))
def test_cuda_staging_planted_bug_fails(tmp_path, cpu_build, bug):
    old, new, fail = STAGE_PLANTED[bug]
    _planted_bug_fails(tmp_path, cpu_build, old, new, STAGE_EMU, fail, f"planted bug {bug} in the staging (widths test)")


def test_cuda_staging_once_for_the_grid_equals_every_block_at_production_widths(tmp_path, cpu_build):
    """plain inputs staged once for the grid (mk_stage_once in every block of a grid of 3, 7, 17 or 132, then one block's
    mk_stage_copy of a pass) against one block's own staging (mk_stage, direct) at K = 10240, 2048, 4096, 6144, 5120, 256
    (GEGLU inputs; more blocks than groups) and 2080 (slices of unequal size), 1, 2, 3, 5 and 8 columns, a first and a
    later pass: every record byte for byte; the host's check of widths whose last record would leave its column
    (mk_rec_fits); and where the default takes this way (mk_once_on's bound at E4B's shapes)"""
    exe = _build_kernel_emu(tmp_path / "mk_once_emu", cpu_build, source=ONCE_EMU, sb=2)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    print(r.stdout[-2000:])
    assert r.returncode == 0 and re.search(r"^OK inputs staged once for the grid .*: 0 of 218 cases differ", r.stdout, re.M), \
        r.stdout[-3000:] + r.stderr[-2000:]


# planted bugs the once-for-the-grid test must catch: block 1's slice one group short (a group nobody rounds); the records
# of a slice put in the order of the groups, not where the mat-vecs read them (mk_rec_slot); the default's bound halved
# (O's inputs staged once at 2 and 3 tokens too)
ONCE_RECORD = r"^FAIL K=\d+ grid=\d+ M=\d+ pass m0=\d+: record \d+"
ONCE_PLANTED = {
    "slice_end": ("const int g1 = (int) ((long long) KG*(blockIdx.x + 1)/gridDim.x);",
                  "const int g1 = (int) ((long long) KG*(blockIdx.x + 1)/gridDim.x) - (blockIdx.x == 1);", ONCE_RECORD),
    "slice_places": ("f, ok, rec + ((size_t) m*KG + mk_rec_slot(f/8))*MK_XQ_REC);\n    }\n}",
                     "f, ok, rec + ((size_t) m*KG + f/8)*MK_XQ_REC);\n    }\n}", ONCE_RECORD),
    "bound": ("#define MK_ONCE_MIN 8192", "#define MK_ONCE_MIN 4096", r"^FAIL mk_once_on: type 2 K=2048 M=3"),
}


@pytest.mark.parametrize("bug", list(ONCE_PLANTED))
def test_cuda_staging_once_planted_bug_fails(tmp_path, cpu_build, bug):
    old, new, fail = ONCE_PLANTED[bug]
    _planted_bug_fails(tmp_path, cpu_build, old, new, ONCE_EMU, fail, f"planted bug {bug} in the staging once for the grid")


def test_cuda_kquant_dot_products_at_e4b_widths(tmp_path, cpu_build):
    """the integer dot products on 8-bit inputs at production widths, K = 2560, 10240 (rows of several weight tiles), 256,
    1536, 1024, 2048 and 640 (E4B, E2B, the real Gemma 3 270M), three rows (Q6_K rows 2 bytes off a word), four columns:
    Q4_K / Q6_K (mk_kq_groups) and Q4_0 / Q8_0 (mk_pairs), each row within 1e-6 of a float64 dot product of ggml's
    dequantized weights, and the code made for 4 and for 8 columns, and rows taken in pairs, equal to the one-column code
    bit for bit; also in the forms before session 28 (GGML_MK_VAR_PAIR_TAIL, GGML_MK_VAR_KQ_TILES). The default's new
    forms must have run where they apply: a Q4_0 row of 2560 values (40 pairs: a tail of 16 blocks) and a Q6_K row of 2560
    (tiles of 32 + 48 groups, not 40 + 40) get other bits than the old forms, rows without a tail or a second tile the
    same"""
    exe = _build_kernel_emu(tmp_path / "mk_kq_emu", cpu_build, source=KQ_EMU)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    print(r.stdout[-3000:])
    assert r.returncode == 0 and "OK integer dot products: 0 of 52 cases failed" in r.stdout, \
        r.stdout[-3000:] + r.stderr[-2000:]
    changed = {(t, int(k)): int(n) for t, k, n in
               re.findall(r"^(\w+) K=(\d+): (?:tail|32-group tiles) changed the bits of (\d+) of 12 outputs", r.stdout, re.M)}
    assert len(changed) == 26, r.stdout[-3000:]
    assert changed[("q4_0", 2560)] > 0 and changed[("q4_0", 10240)] > 0 and changed[("q6_K", 2560)] > 0, changed
    # (no tail: 32 pairs or fewer, or more than half a round past the last full one; Q8_0 never; one-tile K-quant rows)
    for key in [("q4_0", 2048), ("q4_0", 256), ("q4_0", 1536), ("q4_0", 640), ("q8_0", 2560), ("q8_0", 10240),
                ("q4_K", 2560), ("q6_K", 1536), ("q6_K", 10240)]:
        assert changed[key] == 0, (key, changed)


# planted bugs in the integer dot products, each must fail the widths test above: Q6_K's q - 32 right in only three bytes of
# a word, Q6_K's d not divided by 4 (its words hold 4*(q - 32)), Q4_K's min taken from the scale's bits, a Q6_K group
# taking the other half's scale, a Q4_K row pair's second row computed with the first row's weights (the scale packing
# itself, mk-deq32.h's mk_q4k_scale_min, is shared with the float decoding that tests/mk_hostemu/mk_deq_emu.cpp checks
# against ggml's dequantizer); a Q4_0 tail block with its pair's first block's record, every tail block decoded as its
# pair's first, one lane too many taking a tail block
KQ_PLANTED = {
    "q6k_offset": ("(h[k] << hsh) & 0xC0C0C0C0)) ^ 0x80808080;", "(h[k] << hsh) & 0xC0C0C0C0)) ^ 0x00808080;"),
    "q6k_quarter": ("(blk + 208)), 0.25f);", "(blk + 208)), 0.5f);"),
    "tail_record": ("const int ob = hb == 0 ? os : MK_XQ_REC - os;", "const int ob = h == 0 ? os : MK_XQ_REC - os;"),
    # the records' places (mk_rec_slot): a lane's pairs, the tail's pair, a K-quant lane's group
    "rec_swap_pairs": ("int os = MK_XQ_REC*mk_rec_swap(2*p0, g0);", "int os = 0;"),
    "rec_swap_tail": ("os   = MK_XQ_REC*mk_rec_swap(2*p, g0);", "os   = os;"),
    "rec_swap_kq": ("mk_rec_at(xq + m*cs + (size_t) (g ^ mk_rec_swap(g, g0))*MK_XQ_REC);", "mk_rec_at(xq + m*cs + (size_t) g*MK_XQ_REC);"),
    "tail_half": ("h0   = p0 % 2;", "h0   = 0;"),
    "tail_lanes": ("if (p0 >= nt) {", "if (p0 > nt) {"),
    "q4k_min": ("b = __fmul_rn(mk_f16((uint16_t) (w[0] >> 16)), (float) (sm >> 8));",
                "b = __fmul_rn(mk_f16((uint16_t) (w[0] >> 16)), (float) (sm & 0xff));"),
    "q6k_half_scale": ("sc1 = (int) (int8_t) (sc >> 8);", "sc1 = sc0;"),
    "q4k_pair_row": ("acc.v[(TWO ? MC : 0) + m] = mk_q4k_dot(wq1,", "acc.v[(TWO ? MC : 0) + m] = mk_q4k_dot(wq0,"),
}


@pytest.mark.parametrize("bug", list(KQ_PLANTED))
def test_cuda_kquant_dot_products_planted_bug_fails(tmp_path, cpu_build, bug):
    old, new = KQ_PLANTED[bug]
    _planted_bug_fails(tmp_path, cpu_build, old, new, KQ_EMU, r"^FAIL q[468]_[0K] K=",
                       f"planted bug {bug} in the integer dot products")


# planted bugs in a default path that a before-variant replaces: each must fail the kernel emulation's default run against
# the float64 reference and must not run under the variant (old, new, variant). The model has Q4_K and Q6_K jobs (q/k
# projections, gate/up, down, per-layer gate) and F32 / F16 / BF16 jobs. q4k_nibbles: Q4_K's nibbles swapped in the
# integer dot products (low for odd groups; 0x1000000 GGML_MK_VAR_KQ_FLOAT: the float path); bf16_halves, f16_halves,
# input_offset: the float weights' path of 4 values per lane, a pair's halves swapped or an F32 lane's inputs from the
# next 4 values (0x8000000 GGML_MK_VAR_FLOAT_GROUPS: a group per lane, mk_deq32)
VARIANT_PLANTED = {
    "q4k_nibbles": ("const int sh = 4*(j % 2);", "const int sh = 4*((j + 1) % 2);", "0x1000000"),
    "bf16_halves": ("mk_bf16((uint16_t) (h.x >> 16)),", "mk_bf16((uint16_t) (h.x & 0xffff)),", "0x8000000"),
    "f16_halves": ("mk_f16((uint16_t) (h.y >> 16)));", "mk_f16((uint16_t) (h.y & 0xffff)));", "0x8000000"),
    "input_offset": ("const int    f = 8*g0 + v/4;", "const int    f = 8*g0 + (v/4 + 1)%8 + v/32*8;", "0x8000000"),
}


@pytest.mark.parametrize("bug", list(VARIANT_PLANTED))
def test_cuda_kernel_on_host_default_path_planted_bug_fails(tmp_path, cpu_build, bug):
    old, new, variant = VARIANT_PLANTED[bug]
    exe = _mutated_kernel_emu(tmp_path, cpu_build, old, new)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=900)
    assert r.returncode != 0 and re.search(r"^FAIL .*NMSE vs float64 reference", r.stdout, re.M), \
        f"planted bug {bug} went unnoticed by the kernel emulation:\n{r.stdout[-3000:]}"
    r = subprocess.run([str(exe), "--variant", variant], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"variant {variant} still runs the code of planted bug {bug}:\n{r.stdout[-3000:]}"


def test_cuda_kernel_on_host_float_pack_planted_bug_fails(tmp_path, cpu_build):
    """short float rows packed several to a tile (the default since session 34; 0x20000000, GGML_MK_VAR_NO_FLOAT_PACK,
    turns it off): the emulation's model has short F32 / F16 / BF16 rows, and the default packs more of its mat-vec jobs
    than the variant does; every row of a packed float tile read from the tile's first must fail the default run against
    the float64 reference and leave the variant's run (no float packing) passing"""
    old = "mk_f4_row<MC>(base + (size_t) r*MK_J(R, it.job, nb1),"
    exe = _mutated_kernel_emu(tmp_path, cpu_build, old, "mk_f4_row<MC>(base,")
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=900)
    assert r.returncode != 0 and re.search(r"^FAIL .*NMSE vs float64 reference", r.stdout, re.M), \
        f"packed float rows all read from the tile's first went unnoticed:\n{r.stdout[-3000:]}"
    r = subprocess.run([str(exe), "--variant", "0x20000000"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"variant 0x20000000 (no float packing) packs float rows:\n{r.stdout[-3000:]}"


def test_cuda_kernel_on_host_float_pack_packs_more_jobs(kernel_emu):
    """the default run really packs float rows: it reports more mat-vec jobs in tiles of several rows than variant
    0x20000000 (GGML_MK_VAR_NO_FLOAT_PACK)"""
    r = subprocess.run([str(kernel_emu), "--variant", "0x20000000", "--vs-default"], capture_output=True, text=True,
                       timeout=900)
    packed = {who: int(n) for who, n in re.findall(r"^(kernel|default kernel): (\d+) of \d+ mat-vec jobs in tiles of several",
                                                   r.stdout, re.M)}
    assert r.returncode == 0 and packed.get("default kernel", 0) > packed.get("kernel", 1 << 30), r.stdout[-3000:]


def test_cuda_kernel_on_host_kquant_row_pairs_planted_bug_fails(tmp_path, cpu_build):
    """the mat-vec may take K-quant rows in pairs only where mk_kq_tile computes the second row (Q4_K, code for up to 4
    columns): letting Q6_K rows pair too (session 27's first try: the second row came back as 0) must fail the kernel
    emulation, whose model has one-tile Q6_K rows (K = 256)"""
    old = "(!kq || (type == GGML_TYPE_Q4_K && MK_KQ_ROWS(MC) == 2))"
    exe = _mutated_kernel_emu(tmp_path, cpu_build, old, "true")
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=900)
    assert r.returncode != 0 and re.search(r"^FAIL .*NMSE vs float64 reference", r.stdout, re.M), \
        f"Q6_K rows paired without a second row went unnoticed:\n{r.stdout[-3000:]}"


# planted bugs in the heads fold (GGML_MK_VAR_FOLD_HEADS), run where every layer step folds: the step's new K/V rows not
# written to the cache; no block barrier between a block's cache writes and its chunks reading them back; every token's
# rows written to the first token's cell (the verify step's mapping)
FOLD_PLANTED = {
    "no_cache_write": ("mk_kv_put(kv, 1 + (v & 1), st.kv_idx[cache][v/2], hkv, e - v*hd, __float2half(hv[hd + e]));",
                       "(void) v;"),
    "no_block_barrier": ("__syncthreads();   // (the block's cache writes before its chunks read them back", "//"),
    "rows_to_first_cell": ("mk_kv_put(kv, 1 + (v & 1), st.kv_idx[cache][v/2],", "mk_kv_put(kv, 1 + (v & 1), st.kv_idx[cache][0],"),
}


@pytest.mark.parametrize("bug", list(FOLD_PLANTED))
def test_cuda_kernel_on_host_heads_fold_planted_bug_fails(tmp_path, cpu_build, bug):
    exe = _mutated_kernel_emu(tmp_path, cpu_build, *FOLD_PLANTED[bug])
    r = subprocess.run([str(exe), "--variant", "0x4000", "--vs-default", "--smem", "227000", "--stages", "8"],
                       capture_output=True, text=True, timeout=900)
    print(r.stdout[-2000:])
    assert r.returncode != 0 and re.search(r"^FAIL ", r.stdout, re.M), f"planted bug {bug} went unnoticed:\n{r.stdout[-3000:]}"


def test_cuda_kernel_on_host_chunk4_variant_runs_its_own_attention(tmp_path, cpu_build):
    """GGML_MK_VAR_CHUNK4 takes its own instantiation (mk_attention_c4): with that function emptied (no attention
    written), the variant's run must fail, so the bitwise agreement of EMU_RUNS["0x80000000"] is not the default code's
    agreement with itself"""
    exe = _mutated_kernel_emu(tmp_path, cpu_build, "return mk_attention<4, true, false, 4>(a, il, M, sm);",
                              "return true;   /* planted: nothing done */")
    r = subprocess.run([str(exe), "--variant", "0x80000000", "--vs-default"], capture_output=True, text=True, timeout=900)
    print(r.stdout[-2000:])
    assert r.returncode != 0 and re.search(r"^FAIL ", r.stdout, re.M), f"the emptied chunk-4 attention went unnoticed:\n{r.stdout[-3000:]}"


def test_att_chunk_of_the_chunk4_variant(tmp_path):
    """ggml_mk_att_chunk (ggml-mk.h, compiled here): 8 cells, 4 with GGML_MK_VAR_CHUNK4, doubled until at most 1024
    chunks cover the context, so every context keeps within MK_CH_MAX = 1024 chunks"""
    prog = """#include <cstdio>
#include <cstdint>
#include "ggml-mk.h"
int main() {
    const int32_t ctx[] = {256, 4096, 4097, 8192, 32768, 131072};
    for (int32_t n : ctx) {
        printf("%d %d %d\\n", n, ggml_mk_att_chunk(n, 0), ggml_mk_att_chunk(n, GGML_MK_VAR_CHUNK4));
    }
    printf("%d %d %d\\n", (int) (GGML_MK_VAR_CHUNK4 & ~GGML_MK_DEBUG_MASK) == (int) GGML_MK_VAR_CHUNK4,
           (GGML_MK_VAR_TWO_UNITS & ~GGML_MK_DEBUG_MASK) == GGML_MK_VAR_TWO_UNITS,
           (GGML_MK_DEBUG_NO_GRID_BARRIER & ~GGML_MK_DEBUG_MASK) == 0);
}
"""
    src = tmp_path / "c.cpp"
    src.write_text(prog)
    exe = tmp_path / "c"
    r = subprocess.run([cxx(), "-std=c++17", f"-I{MK}", str(src), "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    rows = {int(a): (int(b), int(c)) for a, b, c in (line.split() for line in out[:6])}
    for n, (c8, c4) in rows.items():
        for c, first in ((c8, 8), (c4, 4)):
            assert c >= first and c*1024 >= n and (c == first or (c//2)*1024 < n), (n, c8, c4)
    assert rows[256] == (8, 4) and rows[4096] == (8, 4) and rows[4097] == (8, 8) and rows[131072] == (128, 128)
    # the variants' bits (0x80000000, 0x80) survive llama_mk_env_flags's mask of LLAMA_MEGAKERNEL_VARIANT
    # (& ~GGML_MK_DEBUG_MASK), the planted bug's does not
    assert out[6] == "1 1 1"


def test_cuda_sources_compile_for_sm90(cpu_build):
    src = source_tree(cpu_build)
    res = cuda_toolkit.compile_check(MK / "cuda" / "mk.cu", [src / "ggml" / "src", src / "ggml" / "include", MK, MK / "cuda"])
    print(f"mk.cu for sm_90: registers {res.get('registers')}, spill stores {res.get('spill_stores')} B, "
          f"spill loads {res.get('spill_loads')} B")
    assert res["ok"], f"{res['cmd']}\n{res['log'][-6000:]}"
    # register pressure in the hottest code: the one-token mat-vec's tile loop and the weight prefetch must not
    # spill inside loops (session 7: spills there made every phase 30-60 % slower on the H200; ptxas -v only gives
    # byte totals per function, including the cheap saves at entry and exit, so the SASS is read)
    sass = cuda_toolkit.sass_report(res["cubin"])
    for name, f in sass.items():
        print(f"  {name[:70]:70s} instr {f['instructions']:6d} spills {f['spills']:4d} in loops {f['loop_spills']:4d}")
    hot = {k: f for k, f in sass.items() if "mk_mv_runILi1E" in k or "mk_mv_begin" in k}
    assert len(hot) == 2, f"mk_mv_run<1> / mk_mv_begin not found as functions in the SASS: {list(sass)}"
    spilling = {k: f["loop_spills"] for k, f in hot.items() if f["loop_spills"]}
    assert not spilling, f"spill loads/stores inside loops of the hot mat-vec code: {spilling}"


def test_cuda_mat_vec_code_from_nvcc_reads_stages_with_shared_loads(cpu_build):
    """the SASS that nvcc 13.0 (the lent H200's compiler, from PyPI; ggml-cuda's flags) makes of mk.cu: the mat-vec code
    (every mk_mv_run instance, mk_mv_begin, mk_kq_groups) has no spill loads/stores inside loops, and reads the weight
    stages with shared loads. clang's code (the test above) is a proxy with other spills; and nvcc emits generic 64-bit
    loads (LD.E, each with its own address setup) where a stage address went through an integer: session 28 found 18 of
    them per Q6_K group in mk_kq_groups (mk_words8_2a's aligned words), which this test fails on"""
    src = source_tree(cpu_build)
    res = cuda_toolkit.compile_check(MK / "cuda" / "mk.cu", [src / "ggml" / "src", src / "ggml" / "include", MK, MK / "cuda"],
                                     nvcc=True)
    assert res["ok"], f"{res['cmd']}\n{res['log'][-6000:]}"
    sass = cuda_toolkit.sass_report(res["cubin"])
    mv = {k: f for k, f in sass.items() if re.search(r"mk_mv_run|mk_mv_begin|mk_kq_groups", k)}
    for name, f in mv.items():
        print(f"  {cuda_toolkit.short_name(name)[:70]:70s} instr {f['instructions']:6d} spills {f['spills']:4d} "
              f"in loops {f['loop_spills']:4d} LDS {f['opcodes']['LDS']:4d} LD {f['opcodes']['LD']:3d}")
    assert len([k for k in mv if "mk_mv_run" in k]) == 4 and len([k for k in mv if "mk_kq_groups" in k]) == 3, list(mv)
    # (the report's names without nvcc's prefix for file-local functions: the function's own name first)
    assert all(cuda_toolkit.short_name(k).startswith(("mk_mv_run", "mk_mv_begin", "mk_kq_groups")) for k in mv), list(mv)
    spilling = {k: f["loop_spills"] for k, f in mv.items() if f["loop_spills"]}
    assert not spilling, f"spill loads/stores inside loops of the mat-vec code (nvcc): {spilling}"
    # (mk_mv_run's one generic load: the profile's clock pointer, global memory, only with LLAMA_MEGAKERNEL_PROFILE)
    generic = {k: f["opcodes"]["LD"] for k, f in mv.items() if f["opcodes"]["LD"] > (1 if "mk_mv_run" in k else 0)}
    assert not generic, f"generic loads in the mat-vec code where shared loads should read the weight stages: {generic}"


FLOOR = config.REPO_ROOT / "bench" / "megakernel-floor"


@pytest.mark.parametrize("source", ["floor.cu", "mv_mma.cu"])
def test_bench_cuda_sources_compile_with_nvcc(cpu_build, source):
    """the device benches beside the kernel (floor.cu: its floor; mv_mma.cu: the int8 MMA lever, whose mma-x and mma-q
    ways sum in mk_pairs' order) include mk-kernel.cuh and call its functions (mk_pairs, mk_q8_slot, mk_rec_slot, the
    bulk copies): a change to the kernel must not leave their device code uncompilable until the next device session
    finds out (~40 s each with nvcc; their host code, CUDA runtime calls only, is compiled on the device by its scripts)"""
    src = source_tree(cpu_build)
    res = cuda_toolkit.compile_check(FLOOR / source, [src / "ggml" / "src", src / "ggml" / "include", MK, MK / "cuda"],
                                     nvcc=True)
    assert res["ok"], f"{res['cmd']}\n{res['log'][-6000:]}"
    kernels = {cuda_toolkit.short_name(k) for k in cuda_toolkit.sass_report(res["cubin"])}
    want = {"floor.cu": ["floor_"], "mv_mma.cu": ["mv_dp4a", "mv_mma_s", "mv_mma_ring"]}[source]
    missing = [w for w in want if not any(w in k for k in kernels)]
    assert not missing, f"{source}: kernels {missing} not in its SASS ({sorted(kernels)[:20]})"


def _build_test_mk(tmp_path: Path, build: Path) -> Path:
    src = source_tree(build)
    exe = tmp_path / "test-mk"
    lib = build / "bin"
    cmd = [cxx(), "-std=c++17", "-O2", str(TEST_MK), "-o", str(exe), f"-I{src}/include", f"-I{src}/src", f"-I{src}/ggml/include",
           f"-L{lib}", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"building test-mk failed:\n{' '.join(cmd)}\n{r.stderr[-4000:]}"
    return exe


def test_cpu_build_keeps_the_graph_and_verify_equals_decode(tmp_path, cpu_build, gemma_model):
    exe = _build_test_mk(tmp_path, cpu_build)
    env = dict(os.environ, GGML_CPU_BATCH_INVARIANT="32")
    # --cpu-ref: the CPU reference context's code path (here all three contexts are the CPU's graph: NMSE 0)
    r = subprocess.run([str(exe), "-m", str(gemma_model), "-n", "6", "--rounds", "0", "-c", "512", "--cpu-ref"],
                       capture_output=True, text=True, timeout=600, env=env)
    out = r.stdout + r.stderr
    print("\n".join(line for line in out.splitlines() if "llama_mk" in line or line.startswith(("verify", "teacher", "free", "test-mk", "vs the CPU"))))
    assert re.search(r"llama_mk: megakernel off: .*host memory", out), "no log line saying why the megakernel is off"
    assert re.search(r"vs the CPU, 6 teacher-forced steps: megakernel NMSE mean 0 max 0, argmax agrees 6; graph NMSE mean 0 "
                     r"max 0, argmax agrees 6: ok", out), out[-3000:]
    assert "verify == decode (bitwise), M = 2..8: ok" in out, out[-3000:]
    assert r.returncode == 0 and "test-mk: passed" in out, out[-3000:]


def test_test_mk_short_checks_for_the_sanitizer(tmp_path, cpu_build, gemma_model):
    """--verify-max V and --hidden-batches N (device.sh's racecheck: every launch under the tool takes seconds): the
    verify check runs M = 2..V only, the hidden-state check not at all; a V outside 2..8 is refused by name."""
    exe = _build_test_mk(tmp_path, cpu_build)
    env = dict(os.environ, GGML_CPU_BATCH_INVARIANT="32")
    r = subprocess.run([str(exe), "-m", str(gemma_model), "-n", "1", "--rounds", "0", "-c", "256", "--verify-max", "3",
                        "--hidden-batches", "0"], capture_output=True, text=True, timeout=600, env=env)
    out = r.stdout + r.stderr
    assert "verify == decode (bitwise), M = 2..3: ok" in out, out[-3000:]
    assert re.findall(r"^verify M=(\d+):", out, re.M) == ["2", "3"], out[-3000:]
    assert "free-running greedy 6 tokens" in out, out[-3000:]
    assert r.returncode == 0 and "test-mk: passed" in out, out[-3000:]
    bad = subprocess.run([str(exe), "-m", str(gemma_model), "--verify-max", "9"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--verify-max 9" in bad.stderr, bad.stderr


def test_test_mk_takes_a_prompt_longer_than_a_batch(tmp_path, cpu_build, gemma_model):
    """device.sh stage deep gives test-mk prompts of thousands of tokens: they are decoded in pieces of the context's
    n_batch (512), not refused by llama_decode, and the checks run after them (here 601 tokens)"""
    exe = _build_test_mk(tmp_path, cpu_build)
    env = dict(os.environ, GGML_CPU_BATCH_INVARIANT="32")
    prompt = " ".join(["The quick brown fox jumps over the lazy dog near the old river bank."]*40)
    r = subprocess.run([str(exe), "-m", str(gemma_model), "-p", prompt, "-n", "1", "--rounds", "0", "-c", "1024",
                        "--verify-max", "2", "--hidden-batches", "0"], capture_output=True, text=True, timeout=900, env=env)
    out = r.stdout + r.stderr
    assert "llama_decode failed" not in out, out[-3000:]
    # (15 tokens a sentence and BOS: the count device.sh stage deep sizes its prompts by)
    assert "test-mk: prompt of 601 tokens, context of 1024 cells" in out, out[-3000:]
    assert "verify == decode (bitwise), M = 2..2: ok" in out and r.returncode == 0 and "test-mk: passed" in out, out[-3000:]
    # a prompt the context cannot hold: refused by name, not a decode error
    r = subprocess.run([str(exe), "-m", str(gemma_model), "-p", prompt, "-c", "512"], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 2 and "the prompt (601 tokens) does not fit the context: -c 512" in r.stderr, r.stdout + r.stderr


def test_test_mk_variant_other_bits_is_judged_by_closeness(tmp_path, cpu_build, gemma_model):
    """--variant BITS --variant-other-bits (device.sh bench with MK_VARIANT_OTHER_BITS=1): a variant whose bits differ by
    design (GGML_MK_VAR_CHUNK4) is held within NMSE 1e-3 of the default and to its argmax, not bit for bit, and says so.
    On the CPU build the megakernel is off in every context, so the variant's logits are the default's: 0 differ, ok;
    without the option the same run prints the bitwise line."""
    exe = _build_test_mk(tmp_path, cpu_build)
    env = dict(os.environ, GGML_CPU_BATCH_INVARIANT="32")
    base = [str(exe), "-m", str(gemma_model), "-n", "3", "--rounds", "0", "-c", "256", "--verify-max", "2",
            "--hidden-batches", "0", "--variant", "0x80000000"]
    r = subprocess.run(base + ["--variant-other-bits"], capture_output=True, text=True, timeout=600, env=env)
    out = r.stdout + r.stderr
    assert re.search(r"^variant 0x80000000 ~ default megakernel \(other bits by design\), 3 teacher-forced steps: 0 differ, "
                     r"NMSE max 0, argmax disagreements 0 \(0 at a top-2 margin >= 0.001\): ok$", out, re.M), out[-3000:]
    assert "== default megakernel (bitwise)" not in out, out[-3000:]
    assert r.returncode == 0 and "test-mk: passed" in out, out[-3000:]
    r = subprocess.run(base, capture_output=True, text=True, timeout=600, env=env)
    out = r.stdout + r.stderr
    assert re.search(r"^variant 0x80000000 == default megakernel \(bitwise\), 3 teacher-forced steps: 0 differ: ok$", out,
                     re.M), out[-3000:]
    assert r.returncode == 0, out[-3000:]


# --- on a GPU ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cuda_build() -> Path:
    env = os.environ.get("STQ_CUDA_BUILD")
    if not env:
        pytest.skip("no GPU run: set STQ_CUDA_BUILD to a CUDA build of the series (megakernel/device.sh does "
                    "this on the lent H200)")
    if not shutil.which("nvidia-smi") or subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode != 0:
        pytest.skip("STQ_CUDA_BUILD is set but no NVIDIA GPU is visible (nvidia-smi -L)")
    return Path(env)


@pytest.fixture(scope="module")
def synth_f16_target(tmp_path_factory, gemma_model) -> Path:
    from harness import synth_gemma4
    p = synth_gemma4.SynthParams(matrix_type="F16")
    target, _ = synth_gemma4.ensure_pair(gemma_model, p=p)
    return target


def test_cuda_megakernel_matches_graph(tmp_path, cuda_build, synth_f16_target):
    exe = _build_test_mk(tmp_path, cuda_build)
    r = subprocess.run([str(exe), "-m", str(synth_f16_target), "-n", "160", "--rounds", "0"],
                       capture_output=True, text=True, timeout=900)
    out = r.stdout + r.stderr
    print("\n".join(line for line in out.splitlines() if "llama_mk" in line or line.startswith(("verify", "teacher", "free", "test-mk"))))
    assert "llama_mk: megakernel on" in out
    assert r.returncode == 0 and "test-mk: passed" in out, out[-3000:]


def test_cuda_megakernel_real_gemma3_against_graph_and_cpu(tmp_path, cuda_build, gemma_model):
    """The real Gemma 3 270M (Q4_K_M: Q4_K, Q5_0, Q6_K, Q8_0 weights) over 128 teacher-forced steps: the megakernel
    must be at least as close to the CPU's logits as the CUDA graph is (test-mk --cpu-ref), and verify == decode."""
    exe = _build_test_mk(tmp_path, cuda_build)
    r = subprocess.run([str(exe), "-m", str(gemma_model), "-n", "128", "--rounds", "0", "--cpu-ref",
                        "--max-nmse", "10", "--max-disagree", "1000"], capture_output=True, text=True, timeout=900)
    out = r.stdout + r.stderr
    print("\n".join(line for line in out.splitlines() if line.startswith(("vs the CPU", "verify ==", "teacher", "free", "test-mk"))))
    assert "llama_mk: megakernel on" in out
    assert re.search(r"vs the CPU, 128 teacher-forced steps: .*: ok", out), out[-3000:]
    assert r.returncode == 0 and "test-mk: passed" in out, out[-3000:]


def test_cuda_megakernel_planted_barrier_bug_fails(tmp_path, cuda_build, synth_f16_target):
    exe = _build_test_mk(tmp_path, cuda_build)
    env = dict(os.environ, LLAMA_MEGAKERNEL_DEBUG="1")
    r = subprocess.run([str(exe), "-m", str(synth_f16_target), "-n", "16", "--rounds", "0"],
                       capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode != 0 and "test-mk: FAILED" in r.stdout, "grid barriers off went unnoticed:\n" + r.stdout[-3000:]


def test_bench_megakernel_runs_end_to_end_on_the_cpu_build(tmp_path, cpu_build, gemma_model, capsys):
    """The bench's plumbing (build test-mk, AB/BA rounds, verify cost, its profile run, JSON) on the CPU build, where
    both contexts run the graph: the ratio is ~1, the megakernel reports itself off and has no profile to report."""
    import json
    from harness import bench_megakernel
    out = tmp_path / "bench.json"
    rc = bench_megakernel.main(["--build", str(cpu_build), "--model", str(gemma_model), "--rounds", "2", "--tg", "4",
                                "--verify-cost", "--peak-gbs", "50", "--json", str(out)])
    res = json.loads(out.read_text())
    assert rc == 0 and res["megakernel"].startswith("off"), res
    assert res["megakernel_tok_s"] > 0 and res["graph_tok_s"] > 0 and 0.2 < res["ratio"] < 5, res
    # the roofline at the given peak, from this run's own tok/s; the graph's one-token size from llama.cpp's log
    wb = res["weight_bytes_per_token"]
    assert res["peak_gbs"] == 50 and abs(res["roofline_tok_s"] - 50e9/wb) < 1e-6, res
    assert abs(res["graph_roofline_pct"] - 100*res["graph_tok_s"]*wb/50e9) < 1e-6, res
    assert res["device"] is None and res["launches_per_token"]["megakernel"] is None, res
    assert 100 < res["launches_per_token"]["graph_nodes_max"] < 5000, res
    printed = capsys.readouterr().out
    assert "running: LLAMA_MEGAKERNEL_PROFILE=1" in printed and "kernel_us" not in res, printed[-2000:]
    assert "the kernel alone): no megakernel profile (the megakernel is off)" in printed, printed[-2000:]
    assert sorted(res["verify_megakernel"]) == ["1", "2", "3", "4", "5"], res
    parts = res["verify_megakernel_parts_us"]
    assert sorted(parts) == ["1", "2", "3", "4", "5"] and all(len(v) == 3 and v[0] > 0 for v in parts.values()), res


def test_device_script_makes_the_q4km_models_with_llama_quantize(tmp_path):
    """megakernel/device.sh's stage models for e4b-q4km (the CUDA half runs on the lent H200 only; this is its CPU-side
    logic): the base target made or found first, then llama-quantize --allow-requantize BASE OUT.part Q4_K_M with the
    finished file moved into place only after it succeeds, and a failing quantize leaves no model behind"""
    work = tmp_path / "work"
    (work / "build" / "bin").mkdir(parents=True)
    (work / "models").mkdir()
    for name in ("e4b.gguf", "e4b-assistant.gguf"):   # (present: stage models skips the GPU generator)
        (work / "models" / name).write_bytes(b"base")
    fake = work / "build" / "bin" / "llama-quantize"
    fake.write_text("#!/bin/bash\necho \"args: $*\"\necho '[1/2] a - type = q4_0, converting to q4_K ..'\n"
                    "echo '[2/2] b - type = q4_0, converting to q6_K ..'\necho partial > \"$3\"\n"
                    "[ -n \"$FAIL_Q\" ] && exit 3\necho q4km > \"$3\"\n")
    fake.chmod(0o755)
    script = (MK / "device.sh").read_text()
    body = script[script.index("set -uo pipefail"):script.index("stage_receive() {")]
    driver = tmp_path / "drive.sh"
    driver.write_text(body + "\nstage_models\n")
    env = {**os.environ, "MK_WORK": str(work), "OUT": str(tmp_path / "out"), "MK_MODELS": "e4b-q4km", "MK_JOBS": "2"}
    r = subprocess.run(["bash", str(driver)], capture_output=True, text=True, env={**env, "FAIL_Q": "1"}, timeout=60)
    assert r.returncode != 0 and not (work / "models" / "e4b-q4km.gguf").exists(), r.stdout + r.stderr
    assert not (work / "models" / "e4b-q4km.gguf.part").exists(), "a failed quantize left its partial file behind"
    r = subprocess.run(["bash", str(driver)], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (work / "models" / "e4b-q4km.gguf").read_text() == "q4km\n"
    assert not (work / "models" / "e4b-q4km.gguf.part").exists()
    log = (tmp_path / "out" / "quantize-e4b-q4km.log").read_text()
    assert f"args: --allow-requantize {work}/models/e4b.gguf {work}/models/e4b-q4km.gguf.part Q4_K_M 2" in log, log
    assert re.search(r"1 converting to q4_K\s+1 converting to q6_K", r.stdout), r.stdout


def _ncu_page(path: Path, kernel: str, rows: list[tuple[int, str, int, int, int, int]]) -> Path:
    """an ncu source page CSV as ncu writes it: the kernel's row, the header, then (address offset, SASS, samples,
    instructions executed, stall_wait, stall_barrier) per instruction, at an arbitrary load address"""
    import csv as _csv
    import gzip as _gzip
    head = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_wait",
            "stall_barrier", "stall_wait (Not Issued)", "L1 Wavefronts Shared Excessive", "L1 Wavefronts Shared"]
    with _gzip.open(path, "wt", newline="") as fh:
        w = _csv.writer(fh, quoting=_csv.QUOTE_ALL)
        w.writerow(["Kernel Name", f"{kernel}(args)", ""])
        w.writerow(head)
        for off, text, smp, ins, wt, bar in rows:
            w.writerow([f"{0x7f0000000000 + off:#x}", text, f"{smp:,}", f"{ins:,}", wt, bar, 99, 7, 9])
    return path


def test_cuda_toolkit_ncu_samples_per_function(tmp_path):
    """cuda_toolkit.ncu_by_function: each sample goes to the function whose SASS offsets hold it (the kernel's own code
    from 0, a device function after it), shares of all samples, the stall columns summed (not the 'Not Issued' ones);
    another build's page (its code longer or shorter than the SASS) and another kernel's are refused by name"""
    report = {"_Z4kernv": {"kernel": "_Z4kernv", "start": 0x0, "end": 0x30},
              "_Z3devv": {"kernel": "_Z4kernv", "start": 0x40, "end": 0x70},
              "_Z5otherv": {"kernel": "_Z5otherv", "start": 0x0, "end": 0x1000}}
    rows = [(0x00, "IMAD R1", 10, 100, 4, 6), (0x10, "BAR.SYNC", 30, 100, 0, 30), (0x20, "CALL", 0, 100, 0, 0),
            (0x30, "EXIT", 0, 100, 0, 0), (0x40, "LDS R2", 45, 400, 40, 0), (0x50, "IDP R3", 15, 400, 15, 0),
            (0x60, "RET", 0, 100, 0, 0), (0x70, "BRA", 0, 0, 0, 0)]
    res = cuda_toolkit.ncu_by_function(_ncu_page(tmp_path / "p.csv.gz", "kern", rows), report)
    assert [a["function"] for a in res] == ["_Z3devv", "_Z4kernv"]
    dev, ker = res
    assert dev["samples"] == 60 and abs(dev["share"] - 0.6) < 1e-9 and dev["instructions"] == 900
    assert ker["samples"] == 40 and ker["instructions"] == 400 and ker["stalls"]["barrier"] == 36
    assert dev["stalls"]["wait"] == 55 and "wait (Not Issued)" not in dev["stalls"] and dev["excess_wavefronts"] == 28 and dev["wavefronts"] == 36
    with pytest.raises(cuda_toolkit.HarnessError, match="not the same build"):
        cuda_toolkit.ncu_by_function(_ncu_page(tmp_path / "q.csv.gz", "kern", rows + [(0x200, "NOP", 0, 0, 0, 0)]), report)
    with pytest.raises(cuda_toolkit.HarnessError, match="not the same build"):
        cuda_toolkit.ncu_by_function(_ncu_page(tmp_path / "r.csv.gz", "kern", rows[:3]), report)
    with pytest.raises(cuda_toolkit.HarnessError, match="kernel nokern is not in this SASS"):
        cuda_toolkit.ncu_by_function(_ncu_page(tmp_path / "s.csv.gz", "nokern", rows), report)


def test_cuda_toolkit_sass_report_keeps_nvcc_helpers_in_their_kernel(tmp_path, monkeypatch):
    """sass_report: a helper nvcc puts into a kernel's text section (`$__internal_0_$__cuda_sm20_div_s64`, from a 64-bit
    division) belongs to that kernel, as the section says, not to a kernel named after the label's first part. Else
    ncu_by_function took a page of the same build, whose code runs on into the helper, for another build's (session 41:
    the real Gemma 3 270M's page, 1408 bytes of the helper past the last device function)"""
    listing = "\n".join([
        "\t.section\t.text._Z4kernv,\"ax\",@progbits",
        "_Z4kernv:",
        ".text._Z4kernv:",
        "        /*0000*/                   IMAD R1, R2, R3, RZ ;",
        "        /*0010*/                   CALL.REL.NOINC `($_Z4kernv$_Z3devv) ;",
        "        /*0020*/                   EXIT ;",
        "$_Z4kernv$_Z3devv:",
        "        /*0030*/                   CALL.REL.NOINC `($__internal_0_$__cuda_sm20_div_s64) ;",
        "        /*0040*/                   RET.REL.NODEC R20 `(_Z4kernv) ;",
        "$__internal_0_$__cuda_sm20_div_s64:",
        "        /*0050*/                   IMAD.HI.U32 R5, R5, R10, RZ ;",
        "        /*0060*/                   RET.REL.NODEC R4 `(_Z4kernv) ;",
        ""])

    class Done:
        returncode, stdout, stderr = 0, listing, ""
    monkeypatch.setattr(cuda_toolkit, "ensure_nvdisasm", lambda: Path("nvdisasm"))
    monkeypatch.setattr(cuda_toolkit.subprocess, "run", lambda *a, **k: Done())
    report = cuda_toolkit.sass_report(tmp_path / "k.cubin")
    assert {n: (f["kernel"], f["start"], f["end"]) for n, f in report.items()} == {
        "_Z4kernv": ("_Z4kernv", 0x0, 0x20), "_Z3devv": ("_Z4kernv", 0x30, 0x40),
        "__cuda_sm20_div_s64": ("_Z4kernv", 0x50, 0x60)}
    rows = [(0x00, "IMAD R1", 5, 10, 0, 5), (0x10, "CALL", 0, 10, 0, 0), (0x20, "EXIT", 0, 10, 0, 0),
            (0x30, "CALL", 1, 10, 1, 0), (0x40, "RET", 0, 10, 0, 0), (0x50, "IMAD.HI", 4, 10, 4, 0), (0x60, "RET", 0, 10, 0, 0)]
    res = cuda_toolkit.ncu_by_function(_ncu_page(tmp_path / "p.csv.gz", "kern", rows), report)
    assert {a["function"]: a["samples"] for a in res} == {"_Z4kernv": 5, "_Z3devv": 1, "__cuda_sm20_div_s64": 4}


def test_bench_megakernel_weight_bytes_agree_with_gguf_py(cpu_build, gemma_model, synth_f16_target):
    """The roofline's bytes a token (decode_phases over the layout reader and the build's type traits) against an
    independent count with gguf-py's reader: every matrix of the file except the embedding tables a step only looks
    rows up in (per_layer_token_embd; token_embd unless the LM head is tied to it, as in Gemma 3)"""
    from gguf import GGUFReader
    from harness.bench_megakernel import weight_bytes_per_token
    for model in (gemma_model, synth_f16_target):
        ts = {t.name: (int(t.n_bytes), sum(1 for d in t.shape if d > 1)) for t in GGUFReader(model).tensors}
        want = sum(n for name, (n, nd) in ts.items() if nd >= 2 and name != "per_layer_token_embd.weight"
                   and not (name == "token_embd.weight" and "output.weight" in ts))
        assert weight_bytes_per_token(model, cpu_build) == want, model
    # Gemma 3 270M's LM head is its 262144 x 640 embedding table: most of its bytes
    assert weight_bytes_per_token(gemma_model, cpu_build) > 262144*640*0.5


def test_bench_megakernel_reads_device_and_graph_size_from_the_logs():
    """The device name and the one-token graph's size as the pinned llama.cpp logs them (ggml-cuda's device list,
    ggml-metal's GPU name, llama_context's sched_reserve line in both of its forms); the roofline's arithmetic"""
    from harness import bench_megakernel as bm
    cuda = ("ggml_cuda_init: found 1 CUDA devices (Total VRAM: 143155 MiB):\n"
            "  Device 0: NVIDIA H200, compute capability 9.0, VMM: yes, VRAM: 143155 MiB\n")
    assert bm.device_name(cuda) == "NVIDIA H200" and bm.PEAK_GBS[bm.device_name(cuda)] == 4800.0
    assert bm.device_name("ggml_metal_device_init: GPU name:   MTL0 (Apple M2 Max)\n") == "Apple M2 Max"
    assert bm.device_name("ggml_metal_device_init: GPU name:   MTL1 (Apple M2 Ultra (dev p1/v1))\n") == "Apple M2 Ultra"
    assert bm.device_name("load_backend: loaded CPU backend\n") is None
    assert bm.graph_nodes_tg("sched_reserve: graph (pp bs=512, tg bs=1): nodes = 1796 / 1702, splits = 1 / 1, "
                             "input objects = 9 / 9, input tensors = 9 / 9\n") == 1702
    assert bm.graph_nodes_tg("sched_reserve: graph: nodes = 733, splits = 1, input objects = 4, input tensors = 4\n") == 733
    assert bm.graph_nodes_tg("nothing here") is None
    r = bm.roofline({"megakernel_tok_s": 200.0, "graph_tok_s": 100.0}, 3_000_000_000, 4800.0)
    assert r["roofline_tok_s"] == 1600.0 and r["megakernel_roofline_pct"] == 12.5 and r["graph_roofline_pct"] == 6.25
    assert "roofline_tok_s" not in bm.roofline({"megakernel_tok_s": 1.0, "graph_tok_s": 1.0}, 10, None)


def test_bench_megakernel_reads_a_device_run_log(tmp_path, cpu_build, gemma_model):
    """bench megakernel --log on a real H200 run's test-mk output (session 36's call A, side a; LLAMA_MEGAKERNEL_PROFILE=1):
    the speed line, the device, the one-token graph's nodes and the kernel's own time per verify size, as that log
    printed them; the report runs on it (the roofline's bytes here from the 270M model, only to exercise the path)"""
    import gzip
    import json
    from harness import bench_megakernel as bm
    text = gzip.open(config.REPO_ROOT / "bench" / "megakernel-h200-2026-12-06" / "s36" / "s36A-vcost.log.gz", "rt").read()
    side_a = text.split("#### side ")[1]
    res = bm.parse(side_a)
    assert res["megakernel"].startswith("on CUDA0") and res["tg"] == 8 and res["megakernel_tok_s"] == 227.8, res
    assert bm.device_name(side_a) == "NVIDIA H200" and bm.graph_nodes_tg(side_a) == 2057
    assert res["kernel_us"] == {1: 4035.9, 2: 5546.4, 3: 6063.1, 4: 6498.8, 5: 7748.3, 6: 8207.6, 7: 8894.2, 8: 9376.2}
    log = tmp_path / "bench.log"
    log.write_text(side_a)
    out = tmp_path / "r.json"
    assert bm.main(["--build", str(cpu_build), "--model", str(gemma_model), "--log", str(log), "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["peak_gbs"] == 4800.0 and abs(r["megakernel_roofline_pct"] - 100*227.8*r["weight_bytes_per_token"]/4.8e12) < 1e-9
    assert r["launches_per_token"] == {"megakernel": 1, "graph_nodes_max": 2057}
    with pytest.raises(Exception, match="does not exist"):
        bm.main(["--build", str(cpu_build), "--model", str(gemma_model), "--log", str(tmp_path / "none.log")])


def test_bench_megakernel_names_the_tensor_it_cannot_size(tmp_path, cpu_build):
    """A matrix whose rows are not whole blocks of its type: the roofline's byte count stops with the file and the
    tensor's name, not the type traits' bare message"""
    from harness.bench_megakernel import weight_bytes_per_token
    from harness.gguf_layout import RawTensor, write_gguf
    from harness.util import HarnessError
    bad = tmp_path / "bad.gguf"
    write_gguf(bad, {"general.architecture": "gemma3"},
               [RawTensor("blk.0.attn_q.weight", (33, 2), 2, bytes(64)),      # Q4_0 (type 2): 32-value blocks
                RawTensor("token_embd.weight", (32, 4), 0, bytes(512))])
    with pytest.raises(HarnessError, match=r"bad\.gguf: tensor blk\.0\.attn_q\.weight \(type 2, ne \[33, 2\]\)"):
        weight_bytes_per_token(bad, cpu_build)


def test_device_preflight_names_the_missing_tokenizer_before_the_build(tmp_path):
    """megakernel/device.sh: a call whose stage models would make a synthetic model from .dev/mk/tokenizer.gguf, with
    that file not carried, stops before its first stage (the build: minutes of device time) with a message naming the
    file, the command that makes it and the carry list; with the file there (or the model already made) it goes on."""
    repo = tmp_path / "repo"   # device.sh alone: no .dev/ (nothing to unpack), no cmake tree to build
    (repo / "megakernel").mkdir(parents=True)
    shutil.copy(config.REPO_ROOT / "megakernel" / "device.sh", repo / "megakernel" / "device.sh")
    work, out = tmp_path / "w", tmp_path / "out"
    env = dict(os.environ, MK_WORK=str(work), OUT=str(out))

    def call(models: str, *stages: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(repo / "megakernel" / "device.sh"), *stages], env=dict(env, MK_MODELS=models),
                              capture_output=True, text=True, timeout=120)

    for models in ("e4b", "small", "gemma3 e2b-mtp", "e4b-q4km"):
        r = call(models, "build", "models")
        assert r.returncode == 1, (models, r.stdout, r.stderr)
        tok = str(repo / ".dev" / "mk" / "tokenizer.gguf")
        assert f"is made from {tok}, which is missing" in r.stdout, (models, r.stdout)
        assert "--tokenizer-only .dev/mk/tokenizer.gguf" in r.stdout and '".dev/mk/tokenizer.gguf"]' in r.stdout
        assert "Nothing was run" in r.stdout
        assert not (out / "configure.log").exists(), "the build started before the check"
    # a model already made needs no tokenizer: the stages run (here: stage models has nothing to do)
    (work / "models").mkdir(parents=True, exist_ok=True)
    for f in ("e4b.gguf", "e4b-assistant.gguf"):
        (work / "models" / f).write_bytes(b"")
    r = call("e4b", "models")
    assert r.returncode == 0 and "missing" not in r.stdout, r.stdout + r.stderr
    # stages without models never ask for it
    r = call("e4b", "receive")
    assert "tokenizer" not in r.stdout
    # the tokenizer there: past the check (stage models then fails on its own: no generator in this bare copy)
    (repo / ".dev" / "mk").mkdir(parents=True)
    (repo / ".dev" / "mk" / "tokenizer.gguf").write_bytes(b"")
    r = call("small", "models")
    assert "Nothing was run" not in r.stdout and "stage models failed" in r.stdout, r.stdout + r.stderr


def _receive(repo: Path, work: Path, piece: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, MK_WORK=str(work), OUT=str(work / "out"), MK_PIECE=str(piece))
    return subprocess.run(["bash", str(repo / "megakernel" / "device.sh"), "receive"], env=env, capture_output=True,
                          text=True, timeout=300)


def test_device_receive_assembles_the_model_and_refuses_bad_pieces_by_name(tmp_path, gemma_model):
    """megakernel/device.sh's stage receive (the real Gemma 3 270M carried to the GPU machine in pieces): the pieces in
    order make the model (its size and sha256 from harness/config.py); a piece sent twice, or pieces out of order, fail
    with a message that says so, and the partial file is removed so that the next try starts clean."""
    repo = tmp_path / "repo"   # device.sh and the harness alone: no .dev/ (nothing to unpack)
    (repo / "megakernel").mkdir(parents=True)
    shutil.copy(config.REPO_ROOT / "megakernel" / "device.sh", repo / "megakernel" / "device.sh")
    shutil.copytree(config.REPO_ROOT / "harness", repo / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    data = gemma_model.read_bytes()
    half = len(data)//2 - 7   # (pieces of unequal size; twice the first is still short of the model)
    p0, p1 = tmp_path / "g3.00", tmp_path / "g3.01"
    p0.write_bytes(data[:half])
    p1.write_bytes(data[half:])
    del data

    def assembled(work: Path) -> Path:
        return work / "models" / "gemma3.gguf"

    def partial(work: Path) -> Path:
        return work / "models" / "gemma3.gguf.part"

    # in order: complete
    w = tmp_path / "ok"
    r = _receive(repo, w, p0)
    assert r.returncode == 0 and f"{half} of {config.GEMMA_SIZE} bytes" in r.stdout, r.stdout + r.stderr
    assert not assembled(w).exists()
    r = _receive(repo, w, p1)
    assert r.returncode == 0 and "gemma3 complete, sha256 ok" in r.stdout, r.stdout + r.stderr
    assert assembled(w).stat().st_size == config.GEMMA_SIZE and not partial(w).exists()
    # once there, a further piece changes nothing
    r = _receive(repo, w, p0)
    assert r.returncode == 0 and "already received" in r.stdout
    assert assembled(w).stat().st_size == config.GEMMA_SIZE

    # out of order: the right size, the wrong sha256
    w = tmp_path / "swapped"
    assert _receive(repo, w, p1).returncode == 0
    r = _receive(repo, w, p0)
    assert r.returncode != 0 and "sha256" in r.stdout and "out of order" in r.stdout, r.stdout + r.stderr
    assert not assembled(w).exists() and not partial(w).exists()

    # a piece twice: too many bytes
    w = tmp_path / "twice"
    assert _receive(repo, w, p0).returncode == 0
    assert _receive(repo, w, p0).returncode == 0   # (2*half bytes: not yet past the model's size)
    r = _receive(repo, w, p1)
    assert r.returncode != 0 and "more than the model's" in r.stdout and "sent twice" in r.stdout, r.stdout + r.stderr
    assert not assembled(w).exists() and not partial(w).exists()

    # no piece where MK_PIECE points: named
    r = _receive(repo, tmp_path / "none", tmp_path / "missing.00")
    assert r.returncode != 0 and "missing.00" in r.stdout


def test_ncu_rows_groups_a_function_by_execution_count(tmp_path):
    """bench/megakernel-sass/ncu-rows.py --by-count A-B: rows A..B of an ncu source page grouped by how often each ran
    (a prologue every warp runs apart from a body only the working warps run), each group's samples, samples an
    execution and its stall reasons in shares of its samples (the 'Not Issued' columns left out); rows outside A..B
    count nowhere"""
    import csv as _csv
    import gzip as _gzip
    head = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_long_sb",
            "stall_wait", "stall_long_sb (Not Issued)"]
    rows = [("0x10", "LDG", 60, 1000, 45, 15, 7), ("0x20", "ISETP", 20, 1000, 20, 0, 7), ("0x30", "FFMA", 9, 30, 0, 9, 7),
            ("0x40", "FFMA", 3, 30, 0, 3, 7), ("0x50", "EXIT", 500, 30, 0, 500, 7)]
    page = tmp_path / "p.csv.gz"
    with _gzip.open(page, "wt", newline="") as fh:
        w = _csv.writer(fh, quoting=_csv.QUOTE_ALL)
        w.writerow(["Kernel Name", "kern(args)", ""])
        w.writerow(head)
        for r in rows:
            w.writerow([f"{r[0]}", r[1], f"{r[2]:,}", f"{r[3]:,}", *r[4:]])
    script = Path(__file__).resolve().parents[1] / "bench" / "megakernel-sass" / "ncu-rows.py"
    r = subprocess.run([sys.executable, str(script), str(page), "--top", "0", "--by-count", "0-3"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = [line.strip() for line in r.stdout.splitlines() if line.strip().startswith("executed")]
    assert lines == ["executed     1000 times:     2 rows,     80 samples, 0.080 an execution; long_sb 81 %, wait 19 %",
                     "executed       30 times:     2 rows,     12 samples, 0.400 an execution; wait 100 %, long_sb 0 %"], r.stdout
