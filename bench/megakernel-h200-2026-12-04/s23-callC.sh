#!/usr/bin/env bash
# session 23 call C (cold): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# issue 14: end to end with the device handoff (call B) around 0.75 accepted per draft: noise 38, 39, 40, k = 3 and 4
# (a verify of 5 tokens), --backend-sampling, the megakernel servers' timeline; capped by the time left
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench llama-server" MK_MODELS="e4b-mtp"
bash megakernel/device.sh build models > "$OUT/callC-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
[ $rc -eq 0 ] || { grep -E "^== |error" "$OUT/callC-build.log" | tail -8; exit 1; }
cap=$((${MK_CAP:-565} - (SECONDS - t0))); [ $cap -lt 30 ] && exit 0
echo "== $(date -u +%T) e2e --backend-sampling --mk-timeline noise 38,39,40 k 3,4, cap $cap s"
MK_E2E_ARGS="--k 3,4 --rounds 2 -n 128 --noise 38,39,40 --backend-sampling --mk-timeline" \
    timeout -k 5 $cap bash megakernel/device.sh e2e > "$OUT/callC-e2e.log" 2>&1
echo "== e2e rc=$? at $((SECONDS - t0)) s (124/137: timed out)"
grep -E "^noise" -A9 "$OUT/callC-e2e.log" | grep -v "^  \[" | cut -c1-170
grep -E "timeline" "$OUT/callC-e2e.log" | grep -E "mtp-k4-mk|mtp-k3-mk" | tail -2 | cut -c1-1500
