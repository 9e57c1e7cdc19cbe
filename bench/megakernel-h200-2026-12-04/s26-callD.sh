#!/usr/bin/env bash
# session 26 call D (cold): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# issue 12/14: the final code of the session (the staging slot by slot for 2..4 columns only; call C's two slots a round
# and groups of 4 columns removed), against 0x800000 (GGML_MK_VAR_ITEM_STAGE, item by item): verify cost (one
# launch of M = 1..5) in alternating processes A B B A B A, each log kept; then issue 14's end to end with the
# default (E4B-shaped pair, noise 38, k = 3 and 4, --backend-sampling), as far as the time allows
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench llama-server" MK_MODELS="e4b-mtp"
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models
bash megakernel/device.sh build models > "$OUT/s26D-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
grep -E "^== |error" "$OUT/s26D-build.log" | tail -8
[ $rc -eq 0 ] || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
i=0
for side in A B B A B A; do
    i=$((i + 1))
    [ $((SECONDS - t0)) -gt 330 ] && break
    v=""; [ $side = B ] && v=0x800000
    echo "== $(date -u +%T) verify cost $i side $side (variant ${v:-default})"
    LLAMA_MEGAKERNEL_VARIANT=$v timeout 50 "$B/test-mk" -m "$M/e4b-mtp.gguf" -n 4 --rounds 2 --bench-n 8 \
        --verify-cost --max-nmse 10 --max-disagree 100 2>&1 | grep -E "verify cost \(megakernel\)|kernel variant|verify == decode|test-mk:" \
        | cut -c1-220 | tee -a "$OUT/s26D-vcost.log"
done
cap=$((570 - (SECONDS - t0))); [ $cap -lt 60 ] && exit 0
echo "== $(date -u +%T) e2e --backend-sampling noise 38 k 3,4, cap $cap s"
MK_E2E_ARGS="--k 3,4 --rounds 2 -n 128 --noise 38 --backend-sampling" \
    timeout -k 5 $cap bash megakernel/device.sh e2e > "$OUT/s26D-e2e.log" 2>&1
echo "== e2e rc=$? at $((SECONDS - t0)) s (124/137: timed out)"
grep -E "^noise" -A9 "$OUT/s26D-e2e.log" | grep -v "^  \[" | cut -c1-170
echo "== done at $((SECONDS - t0)) s"
