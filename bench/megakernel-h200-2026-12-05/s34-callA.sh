#!/usr/bin/env bash
# session 34, call A (cold):
#   run(command="bash bench/megakernel-h200-2026-12-05/s34-callA.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"],
#       timeout_s=600, kind="nvidia-h100-x1")
# 1. Issue 12: the candidate GGML_MK_VAR_VAL_ROUND2 (0x80000000: a verify staging over a pair of blocks loads the values
#    2 slots a thread per round for the block's own columns; E4B's rows of 2560 one round trip, not 2; of 10240 3, not 5)
#    against the default, test-mk --verify-cost with the kernel's profile (verify == decode bitwise M = 2..8 in each),
#    processes 0, v, v, 0, v, 0. Session 34's new defaults (float rows packed, the rms round 2 slots a round) are in.
# 2. Issue 14: end to end, k = 2 at noise 38, backend sampling, the host timeline: default, then the candidate
#    (LLAMA_MEGAKERNEL_VARIANT inherited by the servers), each against its own greedy megakernel.
set -u
t0=$SECONDS
left() { echo $((585 - (SECONDS - t0))); }
export MK_TARGETS="llama-bench llama-server" MK_MODELS="e4b-mtp"
W=/tmp/stq-mk; M=$W/models/e4b-mtp.gguf; B=$W/build/bin
bash megakernel/device.sh build models > "$OUT/s34A-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
[ $rc -eq 0 ] || { grep -E "^== |error" "$OUT/s34A-build.log" | tail -8; exit 1; }
i=0
for v in 0 0x80000000 0x80000000 0 0x80000000 0; do
    i=$((i + 1))
    [ "$(left)" -gt 240 ] || break
    echo "#### process $i variant $v" >> "$OUT/s34A-verify.log"
    LLAMA_MEGAKERNEL_VARIANT=$v LLAMA_MEGAKERNEL_PROFILE=1 timeout -k 5 60 $B/test-mk -m $M -n 8 --rounds 2 \
        --bench-n 8 --max-nmse 10 --max-disagree 100 --hidden-batches 0 --verify-cost > "$OUT/s34A-v.log" 2>&1
    echo "== verify-cost process $i (variant $v) rc=$? at $((SECONDS - t0)) s"
    grep -E "llama_mk|verify|test-mk:|FAIL" "$OUT/s34A-v.log" >> "$OUT/s34A-verify.log"
    grep -E "verify ==|verify cost \(megakernel\), whole|test-mk:|steps of [1-5] tok" "$OUT/s34A-v.log" | cut -c1-110
    grep -E "M=3 \(staging" "$OUT/s34A-v.log" | cut -c1-80
done
rm -f "$OUT/s34A-v.log"
for v in 0 0x80000000; do
    cap=$(( $(left) - 5 )); [ $cap -lt 80 ] && break
    echo "== $(date -u +%T) e2e k = 2 noise 38, backend sampling, variant $v, cap $cap s"
    LLAMA_MEGAKERNEL_VARIANT=$v STQ_METAL_CACHE="$W/cache" PYTHONPATH="$W/src/gguf-py:$PWD" timeout -k 5 $cap \
        python3 -m harness.bench_mtp --bin "$B" --target "$M" --assistant "$W/models/e4b-mtp-assistant.gguf" \
        --k 2 --rounds 2 -n 128 --noise 38 --no-graph --mk-timeline --backend-sampling --json "$OUT/s34A-e2e-$v.json" \
        > "$OUT/s34A-e2e-$v.log" 2>&1
    echo "== e2e rc=$? at $((SECONDS - t0)) s (124/137: timed out)"
    grep -E "^noise" -A4 "$OUT/s34A-e2e-$v.log" | cut -c1-170
done
gzip -9 "$OUT"/s34A-*.log 2>/dev/null
echo "== done at $((SECONDS - t0)) s"
