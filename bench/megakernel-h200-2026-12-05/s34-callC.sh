#!/usr/bin/env bash
# session 34, call C (cold): main as landed (18fd311: session 34's two new defaults, the candidate VAL_ROUND2 out),
# the figures for the issues' notes:
#   run(command="bash bench/megakernel-h200-2026-12-05/s34-callC.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"],
#       timeout_s=600, kind="nvidia-h100-x1")
# 1. greedy tg32 and 256 after a ~400-token prompt, megakernel vs the graph (test-mk's speed lines, AB/BA);
# 2. the verify kernels M = 1..5 (test-mk --verify-cost with the profile), two processes;
# 3. issue 14 end to end: k = 2 and k = 3 at noise 38, backend sampling, each against its own greedy megakernel.
set -u
t0=$SECONDS
left() { echo $((${MK_CAP:-585} - (SECONDS - t0))); }
export MK_TARGETS="llama-bench llama-server" MK_MODELS="e4b-mtp"
W=/tmp/stq-mk; M=$W/models/e4b-mtp.gguf; B=$W/build/bin
bash megakernel/device.sh build models > "$OUT/s34C-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
[ $rc -eq 0 ] || { grep -E "^== |error" "$OUT/s34C-build.log" | tail -8; exit 1; }
P="$(python3 -c 'print(" ".join(["the quick brown fox jumps over the lazy dog"]*45))')"
timeout -k 5 100 $B/test-mk -m $M -n 16 --rounds 2 --bench-n 32 --max-nmse 10 --max-disagree 1000 > "$OUT/s34C-tg32.log" 2>&1
echo "== tg32 rc=$? at $((SECONDS - t0)) s"; grep -E "^speed|verify ==|greedy|test-mk:" "$OUT/s34C-tg32.log" | cut -c1-200
timeout -k 5 100 $B/test-mk -m $M -p "$P" -n 4 --rounds 2 --bench-n 256 -c 4096 --max-nmse 10 --max-disagree 1000 \
    > "$OUT/s34C-long.log" 2>&1
echo "== after the prompt rc=$? at $((SECONDS - t0)) s"; grep -E "^speed|test-mk:" "$OUT/s34C-long.log" | cut -c1-200
for i in 1 2; do
    [ "$(left)" -gt 150 ] || break
    LLAMA_MEGAKERNEL_PROFILE=1 timeout -k 5 40 $B/test-mk -m $M -n 8 --rounds 2 --bench-n 8 --max-nmse 10 --max-disagree 100 \
        --hidden-batches 0 --verify-cost > "$OUT/s34C-v.log" 2>&1
    echo "== verify-cost process $i rc=$? at $((SECONDS - t0)) s: $(grep -E "steps of [1-5] tok" "$OUT/s34C-v.log" | sed -E 's/.*steps of ([0-9]) tokens?: kernel ([0-9.]+) us.*/M=\1 \2/' | tr '\n' ' ')"
    grep -E "verify ==|test-mk:" "$OUT/s34C-v.log"
    grep -E "llama_mk|verify|test-mk:|FAIL" "$OUT/s34C-v.log" >> "$OUT/s34C-verify.log"
done
rm -f "$OUT/s34C-v.log"
for k in 2 3; do
    cap=$(( $(left) - 5 )); [ $cap -lt 80 ] && break
    echo "== $(date -u +%T) e2e k = $k noise 38, backend sampling, cap $cap s"
    STQ_METAL_CACHE="$W/cache" PYTHONPATH="$W/src/gguf-py:$PWD" timeout -k 5 $cap \
        python3 -m harness.bench_mtp --bin "$B" --target "$M" --assistant "$W/models/e4b-mtp-assistant.gguf" \
        --k $k --rounds 2 -n 128 --noise 38 --no-graph --mk-timeline --backend-sampling --json "$OUT/s34C-e2e-k$k.json" \
        > "$OUT/s34C-e2e-k$k.log" 2>&1
    echo "== e2e rc=$? at $((SECONDS - t0)) s (124/137: timed out)"
    grep -E "^noise" -A4 "$OUT/s34C-e2e-k$k.log" | cut -c1-170
done
gzip -9 "$OUT"/s34C-*.log 2>/dev/null
echo "== done at $((SECONDS - t0)) s"
