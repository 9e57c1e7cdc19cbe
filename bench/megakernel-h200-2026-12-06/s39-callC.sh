#!/usr/bin/env bash
# Session 39, call C (cold, no llama.cpp build): mv_mma.cu with mma-o (mma-x's walk of strips, mma-c's plain sums):
# does mma-x lose to mma-c (call A: 975 / 1219 / 957 against 1385 / 1684 / 1641 GB/s) by the order it reads the
# strips in, or by its merges (spills)? Gate/up's shape over 33 matrices (no ragged last round), down's with 4 columns:
#   run(command="bash bench/megakernel-h200-2026-12-06/s39-callC.sh", carry=[".dev/cuda"], timeout_s=240)
bash bench/megakernel-floor/mv_mma-device.sh --reps 9 base= -- "--rows 10240 --k 2560 --cols 8 --mats 33" "--rows 2560 --k 10240 --cols 4 --mats 8"
