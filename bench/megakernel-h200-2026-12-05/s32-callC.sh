#!/usr/bin/env bash
# session 32, call C (cold): run(command="bash bench/megakernel-h200-2026-12-05/s32-callC.sh",
#   carry=[".dev/cuda", ".dev/mk/tokenizer.gguf", ".dev/mk-base"], timeout_s=600)
# Issue 12: each block copies the layer's plan (ggml_mk_layer) and K/V view into its shared memory by cp.async while
# the layer's Q/K/V mat-vec runs (mk_lay_fetch), and the heads phase, the attention and the kernel body read them there,
# not from global memory after the barrier (every warp of every block asking for the same lines at the same moment).
# And the residual stream's bookkeeping (xc, xn, the pending step's norm and scale) in thread 0's shared struct, not in
# every thread's registers through the layers (decode body spills 110 -> 83). Same bits. Side A = this tree, side B = .dev/mk-base = git archive of fba22dc (call A's candidate, the flags in the
# shared arguments). device.sh's ab stage as in call A.
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
