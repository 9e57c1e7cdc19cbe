#!/usr/bin/env bash
# Session 39, call B (cold, no llama.cpp build): what limits the cp.async ring's stream (call A: mma-c 1385 / 1684 /
# 1641 GB/s, mma-x 975 / 1219 / 957, against dp4a's 2174 / 2622 / 2363). Four builds of mv_mma.cu, compiled at once:
#   base   call A's (strips of 4 pairs, ring of 4, no prefetch hint)
#   pf256  the copies with cp.async's .L2::256B prefetch hint (a strip is 144 bytes at 144-byte offsets: its lines are
#          shared with the next strip, which mma-x reads much later)
#   ap8    strips of 8 pairs (288 bytes), ring of 2, .L2::256B (mma-x left out)
#   ring5  a ring of 5 (4 steps in flight; down's shape does not fit: its ring ways are left out)
# each on gate/up's shape (8 matrices, 8 columns) and down's (4 columns):
#   run(command="bash bench/megakernel-h200-2026-12-06/s39-callB.sh", carry=[".dev/cuda"], timeout_s=300)
bash bench/megakernel-floor/mv_mma-device.sh base= "pf256=-DMV_L2PF=256" "ap8=-DMV_AP_PAIRS=8 -DMV_RING=2 -DMV_L2PF=256" \
    "ring5=-DMV_RING=5" -- "--rows 10240 --k 2560 --cols 8 --mats 8" "--rows 2560 --k 10240 --cols 4 --mats 8"
