#!/usr/bin/env bash
# session 24 call A (cold): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# issue 14, owed: MTP end to end on the E2B-shaped pair (e2b-mtp; every e2e figure so far is E4B-shaped): probe the noise
# for ~0.75 accepted per draft, then k = 2, 3 with --backend-sampling and the megakernel servers' timeline (the k = 2
# step's cost against a greedy step); capped by the time left
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench llama-server" MK_MODELS="e2b-mtp"
bash megakernel/device.sh build models > "$OUT/callA-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
grep -E "^== |error" "$OUT/callA-build.log" | tail -8
[ $rc -eq 0 ] || exit 1
cap=$((${MK_CAP:-575} - (SECONDS - t0))); [ $cap -lt 30 ] && exit 0
echo "== $(date -u +%T) e2e e2b-mtp, --accept 0.75 over noise 32..52, k 2,3, --backend-sampling --mk-timeline, cap $cap s"
MK_E2E_MODEL=e2b-mtp MK_E2E_ARGS="--k 2,3 --rounds 2 -n 128 --accept 0.75 --noise-grid 32,38,44,50 --backend-sampling --mk-timeline" \
    timeout -k 5 $cap bash megakernel/device.sh e2e > "$OUT/callA-e2e.log" 2>&1
echo "== e2e rc=$? at $((SECONDS - t0)) s (124/137: timed out)"
grep -vE "^\[stq-metal\]|^llama_|^load|^print_info|^  \[" "$OUT/callA-e2e.log" | tail -40 | cut -c1-200
grep -E "timeline" "$OUT/callA-e2e.log" | grep -E "mtp-k2-mk|greedy-mk" | tail -2 | cut -c1-1500
