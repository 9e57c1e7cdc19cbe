#!/usr/bin/env bash
# Session 39, call G (cold, 521 s; the candidate was DROPPED: its diff is s39/s8-init.patch): a Q4_0 block's integer sum starting from -8*sum of q (the record's third word, written by
# mk_q8_slot) instead of the float correction after it (mk_dot_rec: one FMUL and one FSUB fewer per block and column;
# the same bits: every integer involved is below 2^24). Side a: this tree's megakernel (stage build); side b: the
# megakernel before it (.dev/mk-base = `git archive <base> megakernel`, stage sides: built into the same tree).
# test-mk --verify-cost with the profile in 6 processes a b b a a b on the E4B-shaped Q4_0 target: the kernel's us for
# steps of M = 1..5, verify == decode bitwise in each. Here, first:
#   rm -rf .dev/mk-base && mkdir -p .dev/mk-base && git archive d3a7e89 megakernel | tar -x -C .dev/mk-base
#   run(command="bash bench/megakernel-h200-2026-12-06/s39-callG.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf",
#       ".dev/mk-base"], timeout_s=600)
set -u
[ -f .dev/mk-base/megakernel/cuda/mk-kernel.cuh ] || { echo "no .dev/mk-base/megakernel: see the header"; exit 1; }
MK_TARGETS="llama-bench" MK_MODELS="e4b" MK_AB_BASE="$PWD/.dev/mk-base/megakernel" MK_VCOST_SIDES="a b b a a b" \
    bash megakernel/device.sh build models sides vcost 2>&1 | grep -E "^== |verify ==|NMSE|FAIL|error"
gzip -9 "$OUT"/*.log 2>/dev/null
