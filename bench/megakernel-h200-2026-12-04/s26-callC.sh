#!/usr/bin/env bash
# session 26 call C (cold): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# issue 12/14: the staging slot by slot now also two slots a round for up to 2 columns and in groups of 4 columns for
# verify steps of 5..8 (the default), against 0x800000 (GGML_MK_VAR_ITEM_STAGE, item by item, every M): verify cost (one
# launch of M = 1..5) in alternating processes A B B A B A A B, each log kept; then issue 14's end to end with the new
# default (E4B-shaped pair, noise 38, k = 3 and 4, --backend-sampling), as far as the time allows
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench llama-server" MK_MODELS="e4b-mtp"
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models
bash megakernel/device.sh build models > "$OUT/s26C-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
grep -E "^== |error" "$OUT/s26C-build.log" | tail -8
[ $rc -eq 0 ] || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
i=0
for side in A B B A B A A B; do
    i=$((i + 1))
    [ $((SECONDS - t0)) -gt 330 ] && break
    v=""; [ $side = B ] && v=0x800000
    echo "== $(date -u +%T) verify cost $i side $side (variant ${v:-default})"
    LLAMA_MEGAKERNEL_VARIANT=$v timeout 50 "$B/test-mk" -m "$M/e4b-mtp.gguf" -n 4 --rounds 2 --bench-n 8 \
        --verify-cost --max-nmse 10 --max-disagree 100 2>&1 | grep -E "verify cost \(megakernel\)|kernel variant|verify == decode|test-mk:" \
        | cut -c1-220 | tee -a "$OUT/s26C-vcost.log"
done
cap=$((570 - (SECONDS - t0))); [ $cap -lt 60 ] && exit 0
echo "== $(date -u +%T) e2e --backend-sampling noise 38 k 3,4, cap $cap s"
MK_E2E_ARGS="--k 3,4 --rounds 2 -n 128 --noise 38 --backend-sampling" \
    timeout -k 5 $cap bash megakernel/device.sh e2e > "$OUT/s26C-e2e.log" 2>&1
echo "== e2e rc=$? at $((SECONDS - t0)) s (124/137: timed out)"
grep -E "^noise" -A9 "$OUT/s26C-e2e.log" | grep -v "^  \[" | cut -c1-170
echo "== done at $((SECONDS - t0)) s"
