#!/usr/bin/env bash
# session 27 call B (cold): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# issue 12: Q4_K / Q6_K mat-vecs with integer dot products on the 8-bit inputs (mk_kq_groups; GGML_MK_VAR_KQ_FLOAT =
# the float path of call A). The E4B-shaped Q4_K_M-like mix as in call A (e4b requantized by llama-quantize): checks and
# speed vs the graph, verify cost, profile; then the Q4_0 target's speed and verify cost (its code paths: only the
# register allocation around the new call site changed); then, if time is left, the new path vs the float path in
# one process (test-mk --variant 0x1000000: its bitwise check FAILS by design, other arithmetic; the speed line counts)
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench llama-quantize" MK_MODELS="e4b"
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models
bash megakernel/device.sh build models > "$OUT/s27B-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
grep -E "^== |error" "$OUT/s27B-build.log" | tail -6
[ $rc -eq 0 ] || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
t1=$SECONDS
[ -f "$M/e4b-q4km.gguf" ] || "$B/llama-quantize" --allow-requantize "$M/e4b.gguf" "$M/e4b-q4km.gguf" Q4_K_M 16 > "$OUT/s27B-quantize.log" 2>&1
echo "== quantize rc=$? in $((SECONDS - t1)) s"
echo "== $(date -u +%T) test-mk on e4b-q4km: checks vs the graph, speed AB/BA, verify cost at $((SECONDS - t0)) s"
timeout 150 "$B/test-mk" -m "$M/e4b-q4km.gguf" -n 16 --rounds 4 --bench-n 64 --max-nmse 10 --max-disagree 100 --verify-cost \
    > "$OUT/s27B-q4km-bench.log" 2>&1
echo "rc=$?"
grep -E "NMSE|greedy|verify ==|speed|verify cost|test-mk:|hidden" "$OUT/s27B-q4km-bench.log" | cut -c1-230 | tail -14
echo "== $(date -u +%T) per-phase profile on e4b-q4km at $((SECONDS - t0)) s"
LLAMA_MEGAKERNEL_PROFILE=1 timeout 60 "$B/test-mk" -m "$M/e4b-q4km.gguf" -n 48 --rounds 0 --max-nmse 10 --max-disagree 100 \
    > "$OUT/s27B-q4km-profile.log" 2>&1
grep -E "llama_mk profile" "$OUT/s27B-q4km-profile.log" | grep "M=1" | cut -c1-120 | head -22
echo "== $(date -u +%T) e4b (Q4_0): speed vs the graph, verify cost at $((SECONDS - t0)) s"
timeout $((585 - (SECONDS - t0))) "$B/test-mk" -m "$M/e4b.gguf" -n 8 --rounds 2 --bench-n 64 --max-nmse 10 --max-disagree 100 \
    --verify-cost > "$OUT/s27B-q40-bench.log" 2>&1
grep -E "verify ==|speed|verify cost|test-mk:" "$OUT/s27B-q40-bench.log" | cut -c1-230 | tail -6
[ $((SECONDS - t0)) -gt 520 ] && { echo "== done at $((SECONDS - t0)) s"; exit 0; }
echo "== $(date -u +%T) e4b-q4km: new path vs the float path (variant 0x1000000) at $((SECONDS - t0)) s"
timeout $((590 - (SECONDS - t0))) "$B/test-mk" -m "$M/e4b-q4km.gguf" -n 4 --rounds 2 --bench-n 64 --max-nmse 10 --max-disagree 100 \
    --variant 0x1000000 > "$OUT/s27B-q4km-var.log" 2>&1
grep -E "variant|speed" "$OUT/s27B-q4km-var.log" | cut -c1-230 | tail -4
echo "== done at $((SECONDS - t0)) s"
