#!/usr/bin/env bash
# Session 39, call A (cold, no llama.cpp build): mv_mma.cu with mma-c (the cp.async ring running across a warp's units)
# and mma-x (mma-c's stream walked in the dp4a way's summation tree: every output bit for bit dp4a's), beside dp4a,
# mma-s (call J) and mma-a (call K: the ring per unit, 1348 / 1868 GB/s). Gate/up's shape with 8 columns over 8
# matrices (5120 units of 16 rows for 2112 warps: 2.4 each) and over 33 (10 each: no ragged last round), down's with 4:
#   run(command="bash bench/megakernel-h200-2026-12-06/s39-callA.sh", carry=[".dev/cuda"], timeout_s=240)
bash bench/megakernel-floor/mv_mma-device.sh --reps 11 base= -- "--rows 10240 --k 2560 --cols 8 --mats 8" "--rows 10240 --k 2560 --cols 8 --mats 33" "--rows 2560 --k 10240 --cols 4 --mats 8"
