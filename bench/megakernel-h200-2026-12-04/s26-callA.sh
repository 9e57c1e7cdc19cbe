#!/usr/bin/env bash
# session 26 call A (cold): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# (the variant's code: commit 3d723d3, removed again after this call: no gain, NOTES.md session 26)
# issue 12/14: GGML_MK_VAR_CLUSTER_STAGE (0x1000000): the kernel launched in clusters of 2 (or 4) blocks that share a verify
# step's staging (block r stages columns r, r + c, ... into every block of its cluster through distributed shared memory).
# test-mk --variant: bitwise vs the default (4 teacher-forced one-token steps), then greedy tg32 AB/BA in
# one process; then the verify cost (one launch of M = 1..5; side A also checks the variant's verify == decode M = 2..8) A B B A; then
# clusters of 4 the same way, as far as the time allows. E4B-shaped Q4_0 pair, short context.
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench" MK_MODELS="e4b-mtp"
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models
bash megakernel/device.sh build models > "$OUT/s26A-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
grep -E "^== |error" "$OUT/s26A-build.log" | tail -8
[ $rc -eq 0 ] || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for cl in 2 4; do
    [ $((SECONDS - t0)) -gt 480 ] && break
    echo "== $(date -u +%T) variant 0x1000000, clusters of $cl"
    LLAMA_MEGAKERNEL_CLUSTER=$cl timeout 90 "$B/test-mk" -m "$M/e4b-mtp.gguf" -n 4 --rounds 4 --bench-n 32 --variant 0x1000000 \
        --max-nmse 10 --max-disagree 100 > "$OUT/s26A-var-c$cl.log" 2>&1
    echo "rc=$?"
    grep -E "llama_mk: the kernel in clusters|speed|variant|NMSE|differ|test-mk:|error|fail" "$OUT/s26A-var-c$cl.log" | cut -c1-220 | head -14
    sides="A B B A"; [ $cl = 4 ] && sides="A B"
    for side in $sides; do
        [ $((SECONDS - t0)) -gt 540 ] && break
        v=""; [ $side = A ] && v=0x1000000
        echo "== $(date -u +%T) verify cost side $side (variant ${v:-default}, clusters of $cl)"
        LLAMA_MEGAKERNEL_CLUSTER=$cl LLAMA_MEGAKERNEL_VARIANT=$v timeout 50 "$B/test-mk" -m "$M/e4b-mtp.gguf" -n 4 --rounds 2 --bench-n 8 \
            --verify-cost --max-nmse 10 --max-disagree 100 > "$OUT/s26A-vcost-c$cl-$side.log" 2>&1
        grep -E "verify cost \(megakernel\)|kernel variant|clusters|verify == decode|teacher-forced" "$OUT/s26A-vcost-c$cl-$side.log" | cut -c1-220 | head -8
    done
done
echo "== done at $((SECONDS - t0)) s"
