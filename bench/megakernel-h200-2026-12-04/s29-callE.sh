#!/usr/bin/env bash
# session 29's plan for the next session's first call (cold). NOT RUN in session 29 (its device time was spent):
#   run(command="bash bench/megakernel-h200-2026-12-04/s29-callE.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# The E4B-shaped Q4_K_M-like mix with session 29's float path (F32 / F16 / BF16 weights 4 values per lane; the mix keeps
# the synthetic target's F32 per-layer projections): against its before-variant 0x8000000 in one process, then the checks
# and speed against the graph, the verify cost and the per-phase profile (call B of session 29, before the change: 0.98x
# the graph; per-layer proj 136 us, proj+ 175 us a step)
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench llama-quantize" MK_MODELS="e4b"
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models
bash megakernel/device.sh build models > "$OUT/s30A-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
grep -E "^== |error" "$OUT/s30A-build.log" | tail -4
[ $rc -eq 0 ] || exit 1
[ -f "$M/e4b-q4km.gguf" ] || "$B/llama-quantize" --allow-requantize "$M/e4b.gguf" "$M/e4b-q4km.gguf" Q4_K_M 16 > "$OUT/s30A-quantize.log" 2>&1
echo "== quantize rc=$? at $((SECONDS - t0)) s"
timeout 60 "$B/test-mk" -m "$M/e4b-q4km.gguf" -n 4 --rounds 6 --bench-n 64 --max-nmse 10 --max-disagree 100 --variant 0x8000000 > "$OUT/s30A-var.log" 2>&1
grep -E "variant|speed" "$OUT/s30A-var.log" | cut -c1-200 | tail -3
timeout 90 "$B/test-mk" -m "$M/e4b-q4km.gguf" -n 16 --rounds 4 --bench-n 64 --max-nmse 10 --max-disagree 100 --verify-cost > "$OUT/s30A-bench.log" 2>&1
echo "rc=$?"; grep -E "NMSE|greedy|verify ==|speed|verify cost|test-mk:" "$OUT/s30A-bench.log" | cut -c1-230 | tail -8
LLAMA_MEGAKERNEL_PROFILE=1 timeout 40 "$B/test-mk" -m "$M/e4b-q4km.gguf" -n 48 --rounds 0 --max-nmse 10 --max-disagree 100 > "$OUT/s30A-profile.log" 2>&1
grep -E "llama_mk profile" "$OUT/s30A-profile.log" | grep -E "M=1|steps of 1" | cut -c1-110 | head -22
echo "== done at $((SECONDS - t0)) s"
