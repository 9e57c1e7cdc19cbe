#!/usr/bin/env bash
# session 28's device plan, call B (warm, right after call A: the machine keeps /tmp only while warm). NOT RUN in session 28.
#   run(command="bash bench/megakernel-h200-2026-12-04/s28-callB.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# the two bit-changing changes each against its "(before)" variant in one process (test-mk --variant: its bitwise check
# says "differ" by design; the speed line is AB/BA), the Q4_0 target's checks / speed vs the graph / verify cost, and the
# per-phase profiles (session 27 call C, us per step on the mix: gate/up 762, down 657, lm head 506, q/k/v 236, o 245)
set -u
t0=$SECONDS
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models
[ -x "$B/test-mk" ] || { echo "no build: the machine is not call A's"; exit 1; }
echo "== $(date -u +%T) e4b-q4km: 32-group K-quant tiles vs equal tiles (variant 0x4000000 = before)"
timeout 90 "$B/test-mk" -m "$M/e4b-q4km.gguf" -n 4 --rounds 6 --bench-n 64 --max-nmse 10 --max-disagree 100 \
    --variant 0x4000000 > "$OUT/s28B-q4km-var.log" 2>&1
grep -E "variant|speed" "$OUT/s28B-q4km-var.log" | cut -c1-230 | tail -4
echo "== $(date -u +%T) e4b (Q4_0): the pair tail vs pairs only (variant 0x2000000 = before)"
timeout 90 "$B/test-mk" -m "$M/e4b.gguf" -n 4 --rounds 6 --bench-n 64 --max-nmse 10 --max-disagree 100 \
    --variant 0x2000000 > "$OUT/s28B-q40-var.log" 2>&1
grep -E "variant|speed" "$OUT/s28B-q40-var.log" | cut -c1-230 | tail -4
echo "== $(date -u +%T) e4b (Q4_0): checks, speed vs the graph, verify cost at $((SECONDS - t0)) s"
timeout 150 "$B/test-mk" -m "$M/e4b.gguf" -n 16 --rounds 4 --bench-n 64 --max-nmse 10 --max-disagree 100 --verify-cost \
    > "$OUT/s28B-q40-bench.log" 2>&1
echo "rc=$?"
grep -E "NMSE|greedy|verify ==|speed|verify cost|test-mk:|hidden" "$OUT/s28B-q40-bench.log" | cut -c1-230 | tail -14
for mdl in e4b-q4km e4b; do
    echo "== $(date -u +%T) per-phase profile on $mdl at $((SECONDS - t0)) s"
    LLAMA_MEGAKERNEL_PROFILE=1 timeout 40 "$B/test-mk" -m "$M/$mdl.gguf" -n 48 --rounds 0 --max-nmse 10 --max-disagree 100 \
        > "$OUT/s28B-$mdl-profile.log" 2>&1
    grep -E "llama_mk profile" "$OUT/s28B-$mdl-profile.log" | grep "M=1" | cut -c1-120 | head -24
done
echo "== done at $((SECONDS - t0)) s"
