#!/usr/bin/env bash
# session 27 call A (cold): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# issue 12 item 5, never measured before: the E4B-shaped Q4_K_M-like mix. The E4B-shaped Q4_0 target (synth_gpu.py on
# the GPU) requantized by the series' llama-quantize to Q4_K_M (llama.cpp's own per-tensor choices: Q4_K, Q6_K for
# attn_v / ffn_down in its use_more_bits layers and for the output), then test-mk: checks against the graph, greedy
# tok/s megakernel vs graph (AB/BA in one process), verify cost, and the per-phase profile; the Q4_0 target's speed
# in the same call for reference
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench llama-quantize" MK_MODELS="e4b"
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models
bash megakernel/device.sh build models > "$OUT/s27A-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
grep -E "^== |error" "$OUT/s27A-build.log" | tail -8
[ $rc -eq 0 ] || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
echo "== $(date -u +%T) llama-quantize e4b.gguf -> e4b-q4km.gguf Q4_K_M"
t1=$SECONDS
"$B/llama-quantize" --allow-requantize "$M/e4b.gguf" "$M/e4b-q4km.gguf" Q4_K_M 16 > "$OUT/s27A-quantize.log" 2>&1
echo "== quantize rc=$? in $((SECONDS - t1)) s"
grep -E "model size|quant size|converting to|^llama_model_quantize_impl" "$OUT/s27A-quantize.log" | tail -4
grep -oE "converting to [A-Za-z0-9_]+" "$OUT/s27A-quantize.log" | sort | uniq -c
grep -E "size = .*->" "$OUT/s27A-quantize.log" | sed -E 's/.*\[ *[0-9]+\/ *[0-9]+\] *//' | awk '{print $1, $0}' | grep -E "blk\.(0|4|5|41)\.|output|token_embd|per_layer" | cut -c1-150 | head -40
ls -la "$M"/*.gguf
echo "== $(date -u +%T) test-mk on e4b-q4km: checks vs the graph, speed AB/BA, verify cost"
timeout 200 "$B/test-mk" -m "$M/e4b-q4km.gguf" -n 16 --rounds 4 --bench-n 64 --max-nmse 10 --max-disagree 100 --verify-cost \
    > "$OUT/s27A-q4km-bench.log" 2>&1
echo "rc=$?"
grep -E "llama_mk|NMSE|greedy|verify ==|speed|verify cost|test-mk:|model size" "$OUT/s27A-q4km-bench.log" | grep -v "profile" | cut -c1-230 | tail -24
echo "== $(date -u +%T) per-phase profile on e4b-q4km at $((SECONDS - t0)) s"
LLAMA_MEGAKERNEL_PROFILE=1 timeout 120 "$B/test-mk" -m "$M/e4b-q4km.gguf" -n 48 --rounds 0 --max-nmse 10 --max-disagree 100 \
    > "$OUT/s27A-q4km-profile.log" 2>&1
grep -E "llama_mk profile" "$OUT/s27A-q4km-profile.log" | grep "M=1" | cut -c1-120 | head -30
[ $((SECONDS - t0)) -gt 500 ] && exit 0
echo "== $(date -u +%T) speed on e4b (Q4_0) for reference at $((SECONDS - t0)) s"
timeout $((580 - (SECONDS - t0))) "$B/test-mk" -m "$M/e4b.gguf" -n 8 --rounds 2 --bench-n 64 --max-nmse 10 --max-disagree 100 \
    > "$OUT/s27A-q40-bench.log" 2>&1
grep -E "speed|test-mk:" "$OUT/s27A-q40-bench.log" | cut -c1-200 | tail -6
echo "== done at $((SECONDS - t0)) s"
