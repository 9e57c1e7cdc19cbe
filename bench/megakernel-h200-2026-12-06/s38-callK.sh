#!/usr/bin/env bash
# Session 38, call K (NOT RUN in session 38: no device time was left; the next session runs it first) (cold, no llama.cpp build): mv_mma.cu with its fourth way, mma-a (the 16 rows' strips by cp.async
# into a ring of 4 areas a warp, 3 steps in flight; call J's mma-s held the next step in registers: 1358 / 1224 GB/s
# against dp4a's 2231 / 2333), gate/up's shape with 8 columns, down's with 4 (--cols 4: shared memory):
#   run(command="bash bench/megakernel-h200-2026-12-06/s38-callK.sh", carry=[".dev/cuda"], timeout_s=180)
set -u
S=/tmp/stq-mv/src
mkdir -p $S && tar -xJf .dev/cuda/src.tar.xz -C $S
nvcc -std=c++17 -O3 -arch=sm_90 -I$S/ggml/src -I$S/ggml/include -Imegakernel -Imegakernel/cuda \
    bench/megakernel-floor/mv_mma.cu -o /tmp/stq-mv/mv_mma > /tmp/stq-mv/nvcc.log 2>&1 || tail -5 /tmp/stq-mv/nvcc.log
for shape in "--rows 10240 --k 2560 --cols 8" "--rows 2560 --k 10240 --cols 4"; do
    /tmp/stq-mv/mv_mma $shape --mats 8 --reps 11 2>&1 | tee -a "$OUT/mv_mma.log"
done
