#!/usr/bin/env bash
# session 22 call D (cold): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# issue 14: calls B/C at the noise levels below 40 (higher acceptance): --backend-sampling at noise 32 and 36, then the
# host-sampling baseline at 36, capped by the time left
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench llama-server" MK_MODELS="e4b-mtp"
bash megakernel/device.sh build models > "$OUT/callD-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
[ $rc -eq 0 ] || { grep -E "^== |error" "$OUT/callD-build.log" | tail -8; exit 1; }
cap=$((${MK_CAP:-500} - (SECONDS - t0))); [ $cap -lt 30 ] && exit 0
echo "== $(date -u +%T) e2e --backend-sampling noise 32,36, cap $cap s"
MK_E2E_ARGS="--k 2,3 --rounds 2 -n 128 --noise 32,36 --backend-sampling" timeout -k 5 $cap bash megakernel/device.sh e2e \
    > "$OUT/callD-e2e-bs.log" 2>&1
echo "== e2e rc=$? at $((SECONDS - t0)) s (124/137: timed out)"
grep -A9 "^noise" "$OUT/callD-e2e-bs.log" | cut -c1-160
cap=$((${MK_CAP:-500} - (SECONDS - t0))); [ $cap -lt 60 ] && exit 0
echo "== $(date -u +%T) e2e host sampling noise 36, cap $cap s"
MK_E2E_ARGS="--k 2,3 --rounds 2 -n 128 --noise 36" timeout -k 5 $cap bash megakernel/device.sh e2e > "$OUT/callD-e2e-host.log" 2>&1
echo "== e2e rc=$? at $((SECONDS - t0)) s (124/137: timed out)"
grep -A9 "^noise" "$OUT/callD-e2e-host.log" | cut -c1-160
