#!/bin/bash
# issue 17 helper rp16, call 2: the final stq1_0-rp16.cu (K split per shape, PDL) through rp16_ggml.cu, no ggml-cuda build
set -u
H=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/h17b-out}; mkdir -p "$OUT"
W=/tmp/h17b2; mkdir -p $W
{
echo "== $(date -u +%FT%TZ) $(cat "$H/src.commit")"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
tar -xJf "$H/src.tar.xz" -C $W ggml/include ggml/src
t=$SECONDS
nvcc -std=c++17 -O3 -arch=sm_90 -DGGML_USE_CUDA -I$W/ggml/src/ggml-cuda -I$W/ggml/src -I$W/ggml/include -Xptxas -v \
    "$H/rp16_ggml.cu" -o $W/rp16_ggml > $W/nvcc.log 2>&1 || { tail -30 $W/nvcc.log; exit 3; }
grep -A1 "mul_mat_vec_stq1_0_rp16ILi1E" $W/nvcc.log | grep -E "Used|spill" | head -6
echo "== build $((SECONDS - t)) s"
timeout 150 $W/rp16_ggml ${ROUNDS:-15}; echo "rc=$?"
} > "$OUT/call2.log" 2>&1
cat "$OUT/call2.log"
