#!/usr/bin/env bash
# Session 39, call I (NOT RUN in session 39: its device time was spent; the next session runs it first, ~100 s cold):
# mma-q, mma-x's walk and bits with a float step for M <= 4 columns only (each quad lane a leaf of the sum's tree, the
# columns passed through shared memory; the nibbles as signed 16*(n - 8): one shift and one convert an output). Its
# check: bit for bit dp4a's at min(cols, 4) columns. Estimated (NOTES.md "Session 39"): ~2050 / 1950 / 1860 GB/s at
# M = 2 / 3 / 4 against dp4a's ~2080 / 1770 / 1530 on gate/up. Base build (16 warps, strips of 4 pairs, ring of 4),
# gate/up's shape over 33 matrices (8 columns: mma-q times M = 1..4) and down's (4 columns):
#   run(command="bash bench/megakernel-h200-2026-12-06/s39-callI.sh", carry=[".dev/cuda"], timeout_s=240)
bash bench/megakernel-floor/mv_mma-device.sh --reps 9 base= -- "--rows 10240 --k 2560 --cols 8 --mats 33" "--rows 2560 --k 10240 --cols 4 --mats 8"
