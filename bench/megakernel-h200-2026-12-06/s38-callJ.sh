#!/usr/bin/env bash
# Session 38, call J (cold, no llama.cpp build): bench/megakernel-floor/mv_mma.cu with its third way, mma-s (the 16
# rows' blocks staged through shared memory by row-contiguous copies; calls H/I: direct loads ~1080 / 800 GB/s), the int8 MMA lever for the verify's
# mat-vecs against the megakernel's own dp4a code (mk_pairs), M = 1..8 columns, at E4B's gate/up (10240 x 2560) and down
# (2560 x 10240) widths, 8 matrices of each (118 MB: past L2):
#   run(command="bash bench/megakernel-h200-2026-12-06/s38-callJ.sh", carry=[".dev/cuda"], timeout_s=240)
set -u
S=/tmp/stq-mv/src
mkdir -p $S && tar -xJf .dev/cuda/src.tar.xz -C $S
nvcc -std=c++17 -O3 -arch=sm_90 -I$S/ggml/src -I$S/ggml/include -Imegakernel -Imegakernel/cuda \
    bench/megakernel-floor/mv_mma.cu -o /tmp/stq-mv/mv_mma 2>&1 | grep -v "Function properties\|^ptxas info" | tail -5
for shape in "--rows 10240 --k 2560" "--rows 2560 --k 10240"; do
    /tmp/stq-mv/mv_mma $shape --mats 8 --reps 15 2>&1 | tee -a "$OUT/mv_mma.log"
done
