#!/usr/bin/env bash
# For session 35 (cold): the candidate of branch `valround` (s34/valround-pair.patch: mk_stage_cols<MC, PAIR>, over a
# pair of blocks the verify staging's values 2 slots a round for the block's own columns, where no norm vector is read;
# untimed) against main, two builds in one tree (device.sh stages sides and vcost). Here, first:
#   rm -rf .dev/mk-cand && mkdir -p .dev/mk-cand && git archive valround megakernel | tar -x -C .dev/mk-cand
#   (without the branch: a worktree of main with s34/valround-pair.patch applied, its megakernel folder archived likewise)
#   run(command="bash bench/megakernel-h200-2026-12-05/s34-next.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf",
#       ".dev/mk-cand"], timeout_s=600, kind="nvidia-h100-x1")
# Side a: main (stage build); side b: the candidate. Verify kernels of M = 2..4 are the steps it changes (session 34,
# main: 5693 / 6272 / 6702 us); verify == decode bitwise M = 2..8 in each process.
set -u
[ -f .dev/mk-cand/megakernel/cuda/mk-kernel.cuh ] || { echo "no .dev/mk-cand/megakernel: see the header"; exit 1; }
MK_TARGETS="llama-bench" MK_MODELS="e4b-mtp" MK_AB_BASE="$PWD/.dev/mk-cand/megakernel" MK_VCOST_SIDES="a b b a a b" \
    bash megakernel/device.sh build models sides vcost 2>&1 | grep -E "^== |verify ==|FAIL|error"
gzip -9 "$OUT"/*.log 2>/dev/null
