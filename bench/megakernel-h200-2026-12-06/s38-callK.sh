#!/usr/bin/env bash
# Session 38, call K (cold): mv_mma.cu's mma-s with steps of 20 block pairs (-DMV_STEP_PAIRS=20: 720-byte strips, gate/up rows in 2 steps, of the
# 16 rows; call J's 8 pairs streamed 1358 GB/s on gate/up against dp4a's 2231), gate/up's shape only (down's records
# and strips would not fit the shared memory):
#   run(command="bash bench/megakernel-h200-2026-12-06/s38-callK.sh", carry=[".dev/cuda"], timeout_s=150)
set -u
S=/tmp/stq-mv/src
mkdir -p $S && tar -xJf .dev/cuda/src.tar.xz -C $S
nvcc -std=c++17 -O3 -arch=sm_90 -DMV_STEP_PAIRS=20 -I$S/ggml/src -I$S/ggml/include -Imegakernel -Imegakernel/cuda \
    bench/megakernel-floor/mv_mma.cu -o /tmp/stq-mv/mv_mma20 > /tmp/stq-mv/nvcc.log 2>&1 || tail -5 /tmp/stq-mv/nvcc.log
/tmp/stq-mv/mv_mma20 --rows 10240 --k 2560 --mats 8 --reps 11 2>&1 | tee -a "$OUT/mv_mma.log"
