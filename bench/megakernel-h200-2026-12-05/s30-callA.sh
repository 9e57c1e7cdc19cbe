#!/usr/bin/env bash
# session 30, call A (cold): run(command="bash bench/megakernel-h200-2026-12-05/s30-callA.sh",
#   carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# 1. cluster_probe.cu: can the persistent grid run as clusters of 2 / 4 (co-resident, cooperative attribute accepted),
#    and what a cluster barrier costs (the plan: a verify batch's staging split over a cluster's blocks)
# 2. session 29's plan (s29-callE.sh, folded in here and removed): the E4B-shaped Q4_K_M-like mix with the float path (4 values per lane) against its
#    before-variant 0x8000000, then checks + speed against the graph + verify cost
# 3. the heads fold (variant 0x4000) on the Q4_0 target again, on today's kernel (session 12: 0.973x)
# 4. the mix's per-phase profile, if time is left
set -u
t0=$SECONDS
H=bench/megakernel-h200-2026-12-05
nvcc -std=c++17 -arch=sm_90 -o /tmp/cluster_probe $H/cluster_probe.cu > "$OUT/s30A-probe.log" 2>&1 && timeout 60 /tmp/cluster_probe >> "$OUT/s30A-probe.log" 2>&1
echo "== probe rc=$? at $((SECONDS - t0)) s"; cat "$OUT/s30A-probe.log" | cut -c1-240
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
echo "== fold at $((SECONDS - t0)) s"
timeout 60 "$B/test-mk" -m "$M/e4b.gguf" -n 4 --rounds 4 --bench-n 64 --max-nmse 10 --max-disagree 100 --variant 0x4000 > "$OUT/s30A-fold.log" 2>&1
grep -E "variant|speed" "$OUT/s30A-fold.log" | cut -c1-200 | tail -3
if [ $((SECONDS - t0)) -lt 530 ]; then
  LLAMA_MEGAKERNEL_PROFILE=1 timeout 40 "$B/test-mk" -m "$M/e4b-q4km.gguf" -n 48 --rounds 0 --max-nmse 10 --max-disagree 100 > "$OUT/s30A-profile.log" 2>&1
  grep -E "llama_mk profile" "$OUT/s30A-profile.log" | grep -E "M=1|steps of 1" | cut -c1-110 | head -22
fi
echo "== done at $((SECONDS - t0)) s"
