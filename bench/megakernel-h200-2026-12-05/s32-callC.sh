#!/usr/bin/env bash
# session 32, call C (cold): run(command="bash bench/megakernel-h200-2026-12-05/s32-callC.sh",
#   carry=[".dev/cuda", ".dev/mk/tokenizer.gguf", ".dev/mk-base"], timeout_s=600)
# (Ran in session 32 with changes 2 and 3 on side A; its device time ran out during the base build: no result. Change 2
# was then taken out of the default kernel, untimed: see NOTES.md "Session 32".) As it stands, for the next session:
# Issue 12: the residual stream's bookkeeping (xc, xn, the pending step's norm and scale) in thread 0's shared struct
# (mk_res, commit 91ae3cb), not in every thread's registers through the layers (nvcc: decode body spills 115 -> 85).
# Same bits. Side A = this tree, side B = .dev/mk-base = `git archive fba22dc megakernel` (change 1 only). For change 2
# (each block's copy of the layer's plan in shared memory by cp.async, b7b0c06, reverted): A/B a tree with the revert
# reverted against this one. device.sh's ab stage as in call A; cold: ~320 s of build and models, ~265 s of ab.
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench" MK_MODELS="e4b-mtp"
bash megakernel/device.sh build models > "$OUT/s32C-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
[ $rc -eq 0 ] || { grep -E "^== |error" "$OUT/s32C-build.log" | tail -8; exit 1; }
MK_AB_BASE=.dev/mk-base/megakernel MK_AB_ROUNDS=1 timeout -k 5 $((590 - (SECONDS - t0))) \
    bash megakernel/device.sh ab > "$OUT/s32C-ab.log" 2>&1
echo "== ab rc=$? at $((SECONDS - t0)) s"
grep -E "^== |^speed|^side|teacher|greedy|verify ==|kernel|M=1 " "$OUT/s32C-ab.log" | grep -v "libggml\|libllama" | cut -c1-160
