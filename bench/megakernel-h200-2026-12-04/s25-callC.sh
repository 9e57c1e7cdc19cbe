#!/usr/bin/env bash
# session 25 call C (cold): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# issue 12: GGML_MK_VAR_L2_PREFETCH swept (call B: bulk windows of 16-48 MB cost 0.66-0.78x): bulk windows of 2 / 4 / 8 MB
# and per-line prefetches (bit 27) with windows of 2 / 4 / 8 / 16 MB, each bitwise vs the default and timed AB/BA in one
# process (test-mk --variant, E4B-shaped Q4_0 pair, short context); the best after the ~390-token prompt and its verify
# cost in alternating processes A B B A, if it gained
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench" MK_MODELS="e4b-mtp"
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models
bash megakernel/device.sh build models > "$OUT/s25C-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
grep -E "^== |error" "$OUT/s25C-build.log" | tail -4
[ $rc -eq 0 ] || exit 1
best=""; bestr=0
for v in 0x2000000 0x3000000 0x4000000 0xa000000 0xb000000 0xc000000 0xd000000; do
    [ $((SECONDS - t0)) -gt 440 ] && break
    timeout 60 "$B/test-mk" -m "$M/e4b-mtp.gguf" -n 4 --rounds 4 --bench-n 32 --variant $v \
        --max-nmse 10 --max-disagree 100 > "$OUT/s25C-$v.log" 2>&1
    echo "== $(date -u +%T) variant $v rc=$?: $(grep -E "^variant .* differ" "$OUT/s25C-$v.log" | cut -c1-90)"
    l=$(grep -E "^speed, variant" "$OUT/s25C-$v.log"); echo "   ${l#speed, }"
    r=$(echo "$l" | sed -nE 's/.*ratio ([0-9.]+).*/\1/p')
    [ -n "$r" ] && awk -v a="$r" -v b="$bestr" 'BEGIN{exit !(a > b)}' && { best=$v; bestr=$r; }
done
echo "== best $best ($bestr)"
awk -v a="$bestr" 'BEGIN{exit !(a > 1.005)}' || { echo "== no variant gained; done at $((SECONDS - t0)) s"; exit 0; }
long=$(python3 -c "print(' '.join(['The quick brown fox jumps over the lazy dog near the old river bank.']*24))")
timeout 60 "$B/test-mk" -m "$M/e4b-mtp.gguf" -p "$long" -c 4096 -n 4 --rounds 4 --bench-n 32 --variant $best \
    --max-nmse 10 --max-disagree 100 > "$OUT/s25C-long.log" 2>&1
echo "== $(date -u +%T) $best after the long prompt: $(grep -E "^speed, variant" "$OUT/s25C-long.log" | cut -c1-160)"
for side in A B B A; do
    [ $((SECONDS - t0)) -gt 540 ] && break
    v=""; [ $side = A ] && v=$best
    LLAMA_MEGAKERNEL_VARIANT=$v timeout 40 "$B/test-mk" -m "$M/e4b-mtp.gguf" -n 4 --rounds 2 --bench-n 8 \
        --verify-cost --max-nmse 10 --max-disagree 100 > "$OUT/s25C-vcost-$side.log" 2>&1
    echo "== verify cost $side (${v:-default}): $(grep -E "verify cost \(megakernel\)" "$OUT/s25C-vcost-$side.log" | cut -c1-170)"
done
echo "== done at $((SECONDS - t0)) s"
