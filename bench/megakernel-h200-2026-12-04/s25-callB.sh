#!/usr/bin/env bash
# session 25 call B (cold): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# issue 12: the L2 prefetch window candidate GGML_MK_VAR_L2_PREFETCH (bits 24-25: a window of 16 / 32 / 48 MB of the
# next mat-vecs' weights sent into L2 at each mat-vec's begin): bitwise vs the default and timed AB/BA in one process
# (test-mk --variant), E4B-shaped Q4_0 pair, short context; then 32 MB after the ~390-token prompt; then the verify cost
# of 32 MB vs the default in alternating processes A B B A, as far as the time allows
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench" MK_MODELS="e4b-mtp"
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models
bash megakernel/device.sh build models > "$OUT/s25B-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
grep -E "^== |error" "$OUT/s25B-build.log" | tail -8
[ $rc -eq 0 ] || exit 1
long=$(python3 -c "print(' '.join(['The quick brown fox jumps over the lazy dog near the old river bank.']*24))")
for v in 0x1000000 0x2000000 0x3000000 long; do
    [ $((SECONDS - t0)) -gt 470 ] && break
    if [ $v = long ]; then
        echo "== $(date -u +%T) variant 0x2000000 after the long prompt"
        timeout 100 "$B/test-mk" -m "$M/e4b-mtp.gguf" -p "$long" -c 4096 -n 4 --rounds 4 --bench-n 32 --variant 0x2000000 \
            --max-nmse 10 --max-disagree 100 > "$OUT/s25B-long.log" 2>&1
        grep -E "speed|variant|NMSE|differ|test-mk:" "$OUT/s25B-long.log" | cut -c1-200 | head -12
        continue
    fi
    echo "== $(date -u +%T) variant $v"
    timeout 90 "$B/test-mk" -m "$M/e4b-mtp.gguf" -n 4 --rounds 4 --bench-n 32 --variant $v \
        --max-nmse 10 --max-disagree 100 > "$OUT/s25B-$v.log" 2>&1
    echo "rc=$?"
    grep -E "speed|variant|NMSE|differ|test-mk:" "$OUT/s25B-$v.log" | cut -c1-200 | head -12
done
for side in A B B A; do
    [ $((SECONDS - t0)) -gt 530 ] && break
    v=""; [ $side = A ] && v=0x2000000
    echo "== $(date -u +%T) verify cost side $side (variant ${v:-default})"
    LLAMA_MEGAKERNEL_VARIANT=$v timeout 50 "$B/test-mk" -m "$M/e4b-mtp.gguf" -n 4 --rounds 2 --bench-n 8 \
        --verify-cost --max-nmse 10 --max-disagree 100 > "$OUT/s25B-vcost-$side.log" 2>&1
    grep -E "verify cost \(megakernel\)|kernel variant" "$OUT/s25B-vcost-$side.log" | cut -c1-200 | head -4
done
echo "== done at $((SECONDS - t0)) s"
