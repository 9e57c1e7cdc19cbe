#!/usr/bin/env bash
# Session 38, call I (cold): mv_mma.cu again with more pairs of blocks in flight per warp in the mma way (call H's
# unroll 2 streamed 1104 / 811 GB/s against dp4a's 2161 / 2233 at M = 1): -DMV_UNROLL=8 and 16, both shapes:
#   run(command="bash bench/megakernel-h200-2026-12-06/s38-callI.sh", carry=[".dev/cuda"], timeout_s=300)
set -u
S=/tmp/stq-mv/src
mkdir -p $S && tar -xJf .dev/cuda/src.tar.xz -C $S
for u in 8 16; do
    nvcc -std=c++17 -O3 -arch=sm_90 -DMV_UNROLL=$u -I$S/ggml/src -I$S/ggml/include -Imegakernel -Imegakernel/cuda \
        bench/megakernel-floor/mv_mma.cu -o /tmp/stq-mv/mv_mma$u > /tmp/stq-mv/nvcc$u.log 2>&1 &
done
wait
for u in 8 16; do
    for shape in "--rows 10240 --k 2560" "--rows 2560 --k 10240"; do
        echo "== MV_UNROLL=$u $shape"
        /tmp/stq-mv/mv_mma$u $shape --mats 8 --reps 11 2>&1 | grep -vE "^mv_mma: done" | tee -a "$OUT/mv_mma.log"
    done
done
