#!/usr/bin/env bash
# Session 39, call D (cold, no llama.cpp build): the ring ways with longer strips (calls A-C: strips of 4 pairs, 144
# bytes a row, stream at 1385-1700 GB/s; 8 pairs on down 2029; the walk's jumps cost mma-o 17 % on down: the stream
# wants long contiguous pieces). Longer strips need fewer streaming warps a block (shared memory). Five builds:
#   base     16 warps, strips of 4 pairs (144 B), a ring of 4 (calls A-C)
#   w8a8r3   8 warps, 8 pairs (288 B), a ring of 3
#   w8a20r2  8 warps, 20 pairs (720 B), a ring of 2 (down's shape does not fit: its ring ways left out)
#   w4a20r3  4 warps, 20 pairs (720 B), a ring of 3
#   w4a40r2  4 warps, 40 pairs (1440 B: a whole gate/up row), a ring of 2 (down does not fit)
# on gate/up's shape over 8 and 33 matrices (8 columns) and down's (4 columns):
#   run(command="bash bench/megakernel-h200-2026-12-06/s39-callD.sh", carry=[".dev/cuda"], timeout_s=420)
bash bench/megakernel-floor/mv_mma-device.sh base= "w8a8r3=-DMV_WARPS=8 -DMV_AP_PAIRS=8 -DMV_RING=3" \
    "w8a20r2=-DMV_WARPS=8 -DMV_AP_PAIRS=20 -DMV_RING=2" "w4a20r3=-DMV_WARPS=4 -DMV_AP_PAIRS=20 -DMV_RING=3" \
    "w4a40r2=-DMV_WARPS=4 -DMV_AP_PAIRS=40 -DMV_RING=2" -- "--rows 10240 --k 2560 --cols 8 --mats 8" "--rows 10240 --k 2560 --cols 8 --mats 33" "--rows 2560 --k 10240 --cols 4 --mats 8"
