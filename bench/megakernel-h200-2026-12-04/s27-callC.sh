#!/usr/bin/env bash
# session 27 call C (cold): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# issue 12: the final K-quant code (mk_kq_groups out of line with one call site and no stack argument; Q4_K row pairs,
# each record loaded once for both rows, in the code for up to 4 columns). E4B-shaped Q4_K_M-like mix (e4b requantized
# by llama-quantize as in calls A/B): checks and speed vs the graph, verify cost; the new path vs the float path in one
# process (--variant 0x1000000: its bitwise check FAILS by design); per-phase profile; then the Q4_0 target (speed vs the
# graph, verify cost: its code paths unchanged but for the register allocation around the new call site)
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench llama-quantize" MK_MODELS="e4b"
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models
bash megakernel/device.sh build models > "$OUT/s27C-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
grep -E "^== |error" "$OUT/s27C-build.log" | tail -6
[ $rc -eq 0 ] || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
t1=$SECONDS
[ -f "$M/e4b-q4km.gguf" ] || "$B/llama-quantize" --allow-requantize "$M/e4b.gguf" "$M/e4b-q4km.gguf" Q4_K_M 16 > "$OUT/s27C-quantize.log" 2>&1
echo "== quantize rc=$? in $((SECONDS - t1)) s"
echo "== $(date -u +%T) test-mk on e4b-q4km: checks vs the graph, speed AB/BA, verify cost at $((SECONDS - t0)) s"
timeout 100 "$B/test-mk" -m "$M/e4b-q4km.gguf" -n 16 --rounds 6 --bench-n 64 --max-nmse 10 --max-disagree 100 --verify-cost \
    > "$OUT/s27C-q4km-bench.log" 2>&1
echo "rc=$?"
grep -E "NMSE|greedy|verify ==|speed|verify cost|test-mk:|hidden" "$OUT/s27C-q4km-bench.log" | cut -c1-230 | tail -14
echo "== $(date -u +%T) e4b-q4km: new path vs the float path (variant 0x1000000) at $((SECONDS - t0)) s"
timeout 60 "$B/test-mk" -m "$M/e4b-q4km.gguf" -n 4 --rounds 4 --bench-n 64 --max-nmse 10 --max-disagree 100 \
    --variant 0x1000000 > "$OUT/s27C-q4km-var.log" 2>&1
grep -E "variant|speed" "$OUT/s27C-q4km-var.log" | cut -c1-230 | tail -4
echo "== $(date -u +%T) per-phase profile on e4b-q4km at $((SECONDS - t0)) s"
LLAMA_MEGAKERNEL_PROFILE=1 timeout 40 "$B/test-mk" -m "$M/e4b-q4km.gguf" -n 48 --rounds 0 --max-nmse 10 --max-disagree 100 \
    > "$OUT/s27C-q4km-profile.log" 2>&1
grep -E "llama_mk profile" "$OUT/s27C-q4km-profile.log" | grep "M=1" | cut -c1-120 | head -22
for i in 1 2; do
    [ $((SECONDS - t0)) -gt 560 ] && break
    echo "== $(date -u +%T) e4b (Q4_0) $i: speed vs the graph, verify cost at $((SECONDS - t0)) s"
    timeout $((590 - (SECONDS - t0))) "$B/test-mk" -m "$M/e4b.gguf" -n 8 --rounds 2 --bench-n 64 --max-nmse 10 --max-disagree 100 \
        --verify-cost > "$OUT/s27C-q40-bench-$i.log" 2>&1
    grep -E "verify ==|speed|verify cost|test-mk:" "$OUT/s27C-q40-bench-$i.log" | cut -c1-230 | tail -6
done
echo "== done at $((SECONDS - t0)) s"
