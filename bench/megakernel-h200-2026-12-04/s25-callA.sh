#!/usr/bin/env bash
# session 25 call A (cold): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# issue 14: session 23 call C's end to end again (E4B-shaped pair, noise 38 and 39, k = 3 and 4, --backend-sampling,
# the megakernel servers' timeline), now with patch 0066 (llama-server no longer clones the sampler before a verify);
# capped by the time left
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench llama-server" MK_MODELS="e4b-mtp"
bash megakernel/device.sh build models > "$OUT/s25A-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
[ $rc -eq 0 ] || { grep -E "^== |error" "$OUT/s25A-build.log" | tail -8; exit 1; }
cap=$((${MK_CAP:-570} - (SECONDS - t0))); [ $cap -lt 30 ] && exit 0
echo "== $(date -u +%T) e2e --backend-sampling --mk-timeline noise 38,39 k 3,4, cap $cap s"
MK_E2E_ARGS="--k 3,4 --rounds 2 -n 128 --noise 38,39 --backend-sampling --mk-timeline" \
    timeout -k 5 $cap bash megakernel/device.sh e2e > "$OUT/s25A-e2e.log" 2>&1
echo "== e2e rc=$? at $((SECONDS - t0)) s (124/137: timed out)"
grep -E "^noise" -A9 "$OUT/s25A-e2e.log" | grep -v "^  \[" | cut -c1-170
grep -E "timeline" "$OUT/s25A-e2e.log" | grep -E "mtp-k4-mk|mtp-k3-mk|greedy-mk" | tail -3 | cut -c1-1500
