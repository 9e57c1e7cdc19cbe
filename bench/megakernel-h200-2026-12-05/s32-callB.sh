#!/usr/bin/env bash
# session 32, call B (warm, right after s32-callA.sh, whose ab stage left side A's binaries in /tmp/stq-mk/bin-a):
#   run(command="bash bench/megakernel-h200-2026-12-05/s32-callB.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"],
#       timeout_s=600)
# Issue 14: where a k = 2 speculative step's time goes end to end. Session 31's e2e (host sampling): 262.4 tok/s at
# 0.752 accepted = ~9.6 ms a step of ~2.5 tokens, against 5.0 ms a greedy token; the kernels (a verify of 3 ~1.27x a
# one-token launch, the draft ~0.58 ms) explain ~6.3 ms of it. The host timeline (--mk-timeline) of k = 2 runs, with
# host sampling and with --backend-sampling, splits the rest. Then the per-phase profile of verify steps M = 1..5.
set -u
t0=$SECONDS
left() { echo $((${MK_CAP:-585} - (SECONDS - t0))); }
W=/tmp/stq-mk; A=$W/bin-a
[ -x "$A/llama-server" ] || { echo "no $A/llama-server: the machine is not call A's"; exit 1; }
for bs in host backend; do
    cap=$(( $(left) - 70 )); [ $cap -lt 60 ] && break
    extra=""; [ $bs = backend ] && extra="--backend-sampling"
    echo "== $(date -u +%T) e2e k = 2 noise 38, $bs sampling, timeline, cap $cap s"
    # shellcheck disable=SC2086
    LD_LIBRARY_PATH="$A" STQ_METAL_CACHE="$W/cache" PYTHONPATH="$W/src/gguf-py:$PWD" timeout -k 5 $cap \
        python3 -m harness.bench_mtp --bin "$A" --target "$W/models/e4b-mtp.gguf" --assistant "$W/models/e4b-mtp-assistant.gguf" \
        --k 2 --rounds 2 -n 128 --noise 38 --no-graph --mk-timeline $extra --json "$OUT/s32B-e2e-$bs.json" \
        > "$OUT/s32B-e2e-$bs.log" 2>&1
    echo "== e2e rc=$? at $((SECONDS - t0)) s (124/137: timed out)"
    grep -E "^noise" -A4 "$OUT/s32B-e2e-$bs.log" | cut -c1-170
    grep -E "timeline" "$OUT/s32B-e2e-$bs.log" | tail -2 | cut -c1-3000
done
cap=$(( $(left) - 5 ))
if [ $cap -gt 40 ]; then
    echo "== $(date -u +%T) per-phase profile, verify steps M = 1..5, cap $cap s"
    LD_LIBRARY_PATH="$A" LLAMA_MEGAKERNEL_PROFILE=1 timeout -k 5 $cap "$A/test-mk" -m "$W/models/e4b-mtp.gguf" -n 48 \
        --max-nmse 10 --max-disagree 100 --rounds 1 --bench-n 8 --verify-cost > "$OUT/s32B-profile.log" 2>&1
    echo "== profile rc=$? at $((SECONDS - t0)) s"
    grep -E "llama_mk profile" "$OUT/s32B-profile.log" | grep -E "steps of|M=[13] " | cut -c1-120 | head -60
fi
gzip -9 "$OUT"/s32B-e2e-*.log "$OUT/s32B-profile.log" 2>/dev/null
echo "== done at $((SECONDS - t0)) s"
