#!/usr/bin/env bash
# session 22 call A (cold): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# 1. build + model e4b-mtp
# 2. issue 12: the deep-staging candidate GGML_MK_VAR_DEEP_STAGE (0x800000): bitwise vs the default and timed AB/BA in
#    one process (device.sh bench with MK_VARIANT), then the verify cost of each side in alternating processes A B B A
# 3. issue 12 item 4: racecheck of the megakernel on one block of tiny-f16, capped by the time left
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench llama-server" MK_MODELS="e4b-mtp"
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models
bash megakernel/device.sh build models > "$OUT/callA-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
grep -E "^== |error" "$OUT/callA-build.log" | tail -8
[ $rc -eq 0 ] || exit 1
echo "== $(date -u +%T) bench with MK_VARIANT=0x800000"
MK_ROUNDS=4 MK_BENCH_N=32 MK_VARIANT=0x800000 timeout 150 bash megakernel/device.sh bench > "$OUT/callA-bench.log" 2>&1
echo "== bench rc=$? at $((SECONDS - t0)) s"
grep -E "speed|verify|variant|NMSE|greedy|differ|test-mk:" "$OUT/callA-bench.log" | cut -c1-200 | head -40
for side in A B B A; do
    [ $((SECONDS - t0)) -gt 420 ] && break
    v=""; [ $side = A ] && v=0x800000
    echo "== $(date -u +%T) verify cost side $side (variant ${v:-default})"
    LLAMA_MEGAKERNEL_VARIANT=$v timeout 60 "$B/test-mk" -m "$M/e4b-mtp.gguf" -n 4 --rounds 2 --bench-n 8 \
        --verify-cost --max-nmse 10 --max-disagree 100 > "$OUT/callA-vcost-$side.log" 2>&1
    cat "$OUT/callA-vcost-$side.log" >> "$OUT/callA-vcost.log"
    grep -E "verify cost|variant|M=" "$OUT/callA-vcost-$side.log" | cut -c1-200 | head -14
done
cap=$((585 - (SECONDS - t0))); [ $cap -lt 20 ] && exit 0
echo "== $(date -u +%T) racecheck, cap $cap s"
MK_SAN_TOOLS=racecheck MK_SAN_CAP=$((cap - 25)) bash megakernel/device.sh sanitize 2>&1 | tail -14
echo "== racecheck stage rc=${PIPESTATUS[0]} at $((SECONDS - t0)) s"
