#!/usr/bin/env bash
# session 26 call B (cold): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# issue 12/14: GGML_MK_VAR_COL_STAGE (0x800000, mk_stage_cols): a verify batch of 2..4 staged slot by slot over every
# column (each round of loads takes a thread's slot of every column; the columns compile-time indices). E4B-shaped Q4_0
# pair, short context. With the variant on (LLAMA_MEGAKERNEL_VARIANT), test-mk's verify == decode M = 2..8 compares its
# verify rows with the default's one-token decode bitwise; the verify cost (one launch of M = 1..5) variant vs default in
# alternating processes A B B A B A A B; then the per-phase profile of verify steps, variant and default.
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench" MK_MODELS="e4b-mtp"
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models
bash megakernel/device.sh build models > "$OUT/s26B-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
grep -E "^== |error" "$OUT/s26B-build.log" | tail -8
[ $rc -eq 0 ] || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for side in A B B A B A A B; do
    [ $((SECONDS - t0)) -gt 470 ] && break
    v=""; [ $side = A ] && v=0x800000
    echo "== $(date -u +%T) verify cost side $side (variant ${v:-default})"
    LLAMA_MEGAKERNEL_VARIANT=$v timeout 50 "$B/test-mk" -m "$M/e4b-mtp.gguf" -n 4 --rounds 2 --bench-n 8 \
        --verify-cost --max-nmse 10 --max-disagree 100 > "$OUT/s26B-vcost.log" 2>&1
    echo "rc=$?"
    grep -E "verify cost \(megakernel\)|kernel variant|verify == decode|teacher-forced|speed, greedy|verify M=" "$OUT/s26B-vcost.log" | cut -c1-220 | head -14
done
for v in 0x800000 ""; do
    [ $((SECONDS - t0)) -gt 540 ] && break
    echo "== $(date -u +%T) profile of verify steps, variant ${v:-default}"
    LLAMA_MEGAKERNEL_VARIANT=$v LLAMA_MEGAKERNEL_PROFILE=1 timeout 40 "$B/test-mk" -m "$M/e4b-mtp.gguf" -n 4 --rounds 2 --bench-n 8 \
        --verify-cost --max-nmse 10 --max-disagree 100 2>&1 | grep -E "llama_mk profile" | grep -E "steps of|M=[134] .*(staging|gate/up|down|barrier)" | cut -c1-160
done
echo "== done at $((SECONDS - t0)) s"
