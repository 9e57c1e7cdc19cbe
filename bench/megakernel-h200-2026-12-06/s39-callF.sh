#!/usr/bin/env bash
# Session 39, call F (cold, no llama.cpp build): call E again after its bug: mma-b's copies walked mma-x's order of
# strips while its sums took them in mma-c's (wrong outputs where a row has more than 2 strips: its check FAILed; its
# times were of mma-o's walk). Two builds: base (16 warps, strips of 4 pairs, ring of 4) and a8r2 (8 pairs, ring of 2),
# on gate/up's shape over 33 matrices and down's (4 columns):
#   run(command="bash bench/megakernel-h200-2026-12-06/s39-callF.sh", carry=[".dev/cuda"], timeout_s=300)
bash bench/megakernel-floor/mv_mma-device.sh base= "a8r2=-DMV_AP_PAIRS=8 -DMV_RING=2" -- "--rows 10240 --k 2560 --cols 8 --mats 33" "--rows 2560 --k 10240 --cols 4 --mats 8"
