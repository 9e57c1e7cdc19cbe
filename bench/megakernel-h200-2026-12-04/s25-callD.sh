#!/usr/bin/env bash
# session 25 call D (cold): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# issue 12: GGML_MK_VAR_L2_PREFETCH again, now planned by the host (the ranges in the mat-vec table; calls B/C walked
# the table in the kernel, whose global loads cost more than the prefetch could give): bulk windows of 1 / 2 / 4 / 8 /
# 16 MB and per-line ones of 1 / 4 MB, each bitwise vs the default and timed AB/BA in one process (test-mk --variant,
# E4B-shaped Q4_0 pair, short context); the best after the ~390-token prompt and its verify cost A B B A if it gained;
# then ncu over one verify launch of 4 tokens (device.sh ncuv: the verify's stall reasons and per-SASS samples),
# capped by the time left
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench" MK_MODELS="e4b-mtp"
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models
bash megakernel/device.sh build models > "$OUT/s25D-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
grep -E "^== |error" "$OUT/s25D-build.log" | tail -4
[ $rc -eq 0 ] || exit 1
best=""; bestr=0
for v in 0x1000000 0x2000000 0x3000000 0x4000000 0x5000000 0x9000000 0xb000000; do
    [ $((SECONDS - t0)) -gt 380 ] && break
    timeout 60 "$B/test-mk" -m "$M/e4b-mtp.gguf" -n 4 --rounds 4 --bench-n 32 --variant $v \
        --max-nmse 10 --max-disagree 100 > "$W/v.log" 2>&1
    echo "== $(date -u +%T) variant $v rc=$?: $(grep -E "^variant .* differ" "$W/v.log" | cut -c1-90)"
    grep -vE "^llama_kv_cache: the V embeddings" "$W/v.log" >> "$OUT/s25D-variants.log"
    l=$(grep -E "^speed, variant" "$W/v.log"); echo "   ${l#speed, }"
    r=$(echo "$l" | sed -nE 's/.*ratio ([0-9.]+).*/\1/p')
    [ -n "$r" ] && awk -v a="$r" -v b="$bestr" 'BEGIN{exit !(a > b)}' && { best=$v; bestr=$r; }
done
echo "== best $best ($bestr)"
if awk -v a="$bestr" 'BEGIN{exit !(a > 1.005)}'; then
    long=$(python3 -c "print(' '.join(['The quick brown fox jumps over the lazy dog near the old river bank.']*24))")
    timeout 60 "$B/test-mk" -m "$M/e4b-mtp.gguf" -p "$long" -c 4096 -n 4 --rounds 4 --bench-n 32 --variant $best \
        --max-nmse 10 --max-disagree 100 > "$W/l.log" 2>&1
    grep -vE "^llama_kv_cache: the V embeddings" "$W/l.log" >> "$OUT/s25D-variants.log"
    echo "== $(date -u +%T) $best after the long prompt: $(grep -E "^speed, variant" "$W/l.log" | cut -c1-160)"
    for side in A B B A; do
        [ $((SECONDS - t0)) -gt 440 ] && break
        v=""; [ $side = A ] && v=$best
        LLAMA_MEGAKERNEL_VARIANT=$v timeout 40 "$B/test-mk" -m "$M/e4b-mtp.gguf" -n 4 --rounds 2 --bench-n 8 \
            --verify-cost --max-nmse 10 --max-disagree 100 > "$W/c.log" 2>&1
        echo "== verify cost $side (${v:-default}): $(grep -E "verify cost \(megakernel\)" "$W/c.log" | cut -c1-170)"
    done
else
    echo "== no variant gained"
fi
cap=$((560 - (SECONDS - t0)))
if [ $cap -gt 60 ]; then
    echo "== $(date -u +%T) ncuv (verify launch of 4 tokens), cap $cap s"
    timeout -k 5 $cap bash megakernel/device.sh ncuv > "$W/ncuv-stage.log" 2>&1
    echo "== ncuv rc=$? at $((SECONDS - t0)) s"
    tail -25 "$W/ncuv-stage.log" | cut -c1-200
    [ -f "$OUT/ncuv-sass.csv" ] && gzip -f "$OUT/ncuv-sass.csv"
    [ -f "$OUT/ncuv-run.log" ] && gzip -f "$OUT/ncuv-run.log"
fi
echo "== done at $((SECONDS - t0)) s"
