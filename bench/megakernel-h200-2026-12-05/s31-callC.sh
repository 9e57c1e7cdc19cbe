#!/usr/bin/env bash
# session 31, call C (RAN 10:13 UTC on an H100: NOTES.md "Session 31", s31/s31C-ab.log): warm, after s31-callA.sh (its build = the working tree with session 31's attention
# change, commit 0c52c4d: the chunk's K/V rows through running pointers, the same bits). Side A = that build, side B =
# 7cc176d's megakernel (the attention before), built into the same tree by device.sh's ab stage; tg32 and 256 tokens
# after the long prompt (where the attention grows), processes a b b a, then block 0's per-phase profile of each side.
#   here first: rm -rf .dev/mk-base && mkdir -p .dev/mk-base && git archive 7cc176d megakernel | tar -x -C .dev/mk-base
#   run(command="bash bench/megakernel-h200-2026-12-05/s31-callC.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf", ".dev/mk-base"])
# Side A also splits the attention into "(attention: chunks)", "(attention: combine)", "(attention: groups)" (block 0's
# profile, commit d7f96a9), so the profile says where the rest of the phase goes.
# Expected: the attention phases ("attention", "attention (global)") shorter on side A, the bits equal (both sides'
# greedy and verify lines as before); the nvcc SASS said E4B's chunk loop 1200 -> 937 instructions (sliding, head dim
# 256) and 604 -> 396 (global, 512), with 11 more spill instructions per sliding chunk (NOTES.md session 31)
set -u
t0=$SECONDS
W=/tmp/stq-mk
[ -x "$W/build/bin/test-mk" ] || { echo "no build: the machine is not call A's"; exit 1; }
[ -f .dev/mk-base/megakernel/cuda/mk-kernel.cuh ] || { echo "no .dev/mk-base: see the header"; exit 1; }
MK_MODELS=e4b-mtp MK_AB_BASE=.dev/mk-base/megakernel MK_AB_ROUNDS=1 timeout -k 5 570 bash megakernel/device.sh ab \
    > "$OUT/s31C-ab.log" 2>&1
echo "== ab rc=$? at $((SECONDS - t0)) s (124/137: timed out)"
grep -E "^== |^speed|greedy|verify ==|M=1 .*attention|kernel" "$OUT/s31C-ab.log" | cut -c1-200 | tail -40
