#!/usr/bin/env bash
# session 23 call A (cold): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# issue 14: end to end with --backend-sampling at the noise whose acceptance is nearest 0.75 (probed over 37..39), with
# the megakernel servers' timeline (LLAMA_MEGAKERNEL_TIMELINE: steps, sampling graphs, draft launches, host gaps)
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench llama-server" MK_MODELS="e4b-mtp"
bash megakernel/device.sh build models > "$OUT/callA-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
[ $rc -eq 0 ] || { grep -E "^== |error" "$OUT/callA-build.log" | tail -8; exit 1; }
cap=$((${MK_CAP:-560} - (SECONDS - t0))); [ $cap -lt 30 ] && exit 0
echo "== $(date -u +%T) e2e --backend-sampling --mk-timeline --accept 0.75 over 37,38,39, cap $cap s"
MK_E2E_ARGS="--k 2,3 --rounds 2 -n 128 --accept 0.75 --noise-grid 37,38,39 --backend-sampling --mk-timeline" \
    timeout -k 5 $cap bash megakernel/device.sh e2e > "$OUT/callA-e2e.log" 2>&1
echo "== e2e rc=$? at $((SECONDS - t0)) s (124/137: timed out)"
grep -E "^probe|^noise" -A9 "$OUT/callA-e2e.log" | cut -c1-170
grep -E "timeline" "$OUT/callA-e2e.log" | cut -c1-900
