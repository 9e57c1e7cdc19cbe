#!/usr/bin/env bash
# session 28's device plan, call A (cold). NOT RUN in session 28 (no device was lent); for the next session with one:
#   run(command="bash bench/megakernel-h200-2026-12-04/s28-callA.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
#   (.dev/cuda: `bash harness/cuda_device.sh pack` of the applied tree)
# issue 12, session 28's mat-vec changes (all host-checked, none timed yet):
#   1. Q6_K words as 4*(q - 32) (no sign extension; bitwise the old results)
#   2. Q4_K quants in two 16-byte loads (bitwise the old results; rows must be 16-byte aligned)
#   3. K-quant tiles in multiples of 32 groups (Q6_K rows of 2560: 3 lane rounds, not 4; variant 0x4000000 = before)
#   4. a tile's last Q4_0 pairs one block per lane (rows of 2560: 1.5 rounds, not 2; variant 0x2000000 = before)
#   5. Q6_K stages read with shared loads (nvcc had emitted 18 generic loads per group; bitwise the old results)
# This call: build, the E4B-shaped Q4_0 target and its Q4_K_M requantization, then on the mix: checks, speed vs the
# graph, verify cost (session 27's final code: 184.1 vs 193.7 tok/s = 0.950x; verify M/1 1.30 / 1.43 / 1.57 / 2.01)
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench llama-quantize" MK_MODELS="e4b"
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models
bash megakernel/device.sh build models > "$OUT/s28A-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
grep -E "^== |error" "$OUT/s28A-build.log" | tail -6
[ $rc -eq 0 ] || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
t1=$SECONDS
[ -f "$M/e4b-q4km.gguf" ] || "$B/llama-quantize" --allow-requantize "$M/e4b.gguf" "$M/e4b-q4km.gguf" Q4_K_M 16 > "$OUT/s28A-quantize.log" 2>&1
echo "== quantize rc=$? in $((SECONDS - t1)) s"
echo "== $(date -u +%T) test-mk on e4b-q4km: checks vs the graph, speed AB/BA, verify cost at $((SECONDS - t0)) s"
timeout $((590 - (SECONDS - t0))) "$B/test-mk" -m "$M/e4b-q4km.gguf" -n 16 --rounds 4 --bench-n 64 --max-nmse 10 --max-disagree 100 --verify-cost \
    > "$OUT/s28A-q4km-bench.log" 2>&1
echo "rc=$?"
grep -E "NMSE|greedy|verify ==|speed|verify cost|test-mk:|hidden" "$OUT/s28A-q4km-bench.log" | cut -c1-230 | tail -14
echo "== done at $((SECONDS - t0)) s"
