#!/usr/bin/env bash
# session 24 call B: run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# issue 12: (1) the design's latency floor on the E4B and E2B shapes: bench/megakernel-floor/floor.cu (the megakernel's
# own grid barrier and block sums, its phase list with the pairs' weight bytes, no arithmetic); issue 14: (2) the build,
# then MTP end to end on the E2B-shaped pair near 0.75 accepted per draft (call A's probe: noise 32 gave 0.18), capped
# by the time left (the racecheck: call C, warm, right after)
set -u
t0=$SECONDS
W=/tmp/stq-mk
export MK_TARGETS="llama-bench llama-server" MK_MODELS="e4b-mtp e2b-mtp"
bash megakernel/device.sh models > "$OUT/callB-models.log" 2>&1
echo "== models rc=$? at $((SECONDS - t0)) s"; tail -2 "$OUT/callB-models.log"
PYTHONPATH=$W/src/gguf-py python3 bench/megakernel-floor/phases.py $W/models/e4b-mtp.gguf > "$OUT/phases-e4b.txt"
PYTHONPATH=$W/src/gguf-py python3 bench/megakernel-floor/phases.py $W/models/e2b-mtp.gguf > "$OUT/phases-e2b.txt"
nvcc -std=c++17 -O3 -arch=sm_90 -I$W/src/ggml/src -I$W/src/ggml/include -Imegakernel -Imegakernel/cuda \
    bench/megakernel-floor/floor.cu -o $W/floor > "$OUT/floor-build.log" 2>&1
echo "== floor built rc=$? at $((SECONDS - t0)) s"; grep -E "error" "$OUT/floor-build.log" | head -5
for s in e4b e2b; do
    [ -s "$OUT/phases-$s.txt" ] || continue
    echo "== $(date -u +%T) floor, $s phases"
    timeout 60 $W/floor --phases "$OUT/phases-$s.txt" --reps 20 --k $([ $s = e4b ] && echo 2560 || echo 1536) 2>&1 | tee "$OUT/floor-$s.log"
done
bash megakernel/device.sh build > "$OUT/callB-build.log" 2>&1
rc=$?
echo "== build rc=$rc at $((SECONDS - t0)) s"
[ $rc -eq 0 ] || { grep -E "^== |error" "$OUT/callB-build.log" | tail -8; exit 1; }
cap=$((${MK_CAP:-585} - (SECONDS - t0))); [ $cap -lt 30 ] && exit 0
echo "== $(date -u +%T) e2e e2b-mtp, --accept 0.75 over noise 20,23,26, k 2,3, --backend-sampling --mk-timeline, cap $cap s"
MK_E2E_MODEL=e2b-mtp MK_E2E_ARGS="--k 2,3 --rounds 2 -n 128 --accept 0.75 --noise-grid 20,23,26 --backend-sampling --mk-timeline" \
    timeout -k 5 $cap bash megakernel/device.sh e2e > "$OUT/callB-e2e.log" 2>&1
echo "== e2e rc=$? at $((SECONDS - t0)) s (124/137: timed out)"
grep -vE "^\[stq-metal\]|^llama_|^load|^print_info|^  \[" "$OUT/callB-e2e.log" | tail -30 | cut -c1-200
