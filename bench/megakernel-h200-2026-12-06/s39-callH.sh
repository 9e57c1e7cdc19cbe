#!/usr/bin/env bash
# Session 39, call H (cold, no llama.cpp build): mma-i, mma-c without its float step (the blocks' integer sums added
# in the mma's accumulator): is the per (row, column, block) float work what holds the MMA ways at ~1700 GB/s (an
# instruction count: ~69 lane-instructions per row and block, against dp4a's ~27 + ~15 a column)? Builds base (16
# warps, strips of 4 pairs, ring of 4) and a8r2 (8 pairs, ring of 2), gate/up's shape over 33 matrices and down's:
#   run(command="bash bench/megakernel-h200-2026-12-06/s39-callH.sh", carry=[".dev/cuda"], timeout_s=300)
bash bench/megakernel-floor/mv_mma-device.sh base= "a8r2=-DMV_AP_PAIRS=8 -DMV_RING=2" -- "--rows 10240 --k 2560 --cols 8 --mats 33" "--rows 2560 --k 10240 --cols 4 --mats 8"
