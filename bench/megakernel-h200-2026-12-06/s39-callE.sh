#!/usr/bin/env bash
# Session 39, call E (cold, no llama.cpp build): mma-b, the ring ways' strips copied by the bulk copy engine (one
# cp.async.bulk a row piece, completing on the area's mbarrier, as the megakernel's tiles are) against mma-c's 16-byte
# cp.async (call D: fewer warps with longer strips stream slower; 8 warps x 288 B = 16 x 144 B: the warps' steps,
# not their bytes, set the rate). Four builds: base (16 warps, 4 pairs, ring of 4), a8r2 (16 warps, 8 pairs, ring of
# 2), w8a8r3, w8a20r2 (down's shape does not fit), on gate/up's shape over 8 and 33 matrices and down's (4 columns):
#   run(command="bash bench/megakernel-h200-2026-12-06/s39-callE.sh", carry=[".dev/cuda"], timeout_s=420)
bash bench/megakernel-floor/mv_mma-device.sh base= "a8r2=-DMV_AP_PAIRS=8 -DMV_RING=2" \
    "w8a8r3=-DMV_WARPS=8 -DMV_AP_PAIRS=8 -DMV_RING=3" "w8a20r2=-DMV_WARPS=8 -DMV_AP_PAIRS=20 -DMV_RING=2" -- "--rows 10240 --k 2560 --cols 8 --mats 8" "--rows 10240 --k 2560 --cols 8 --mats 33" "--rows 2560 --k 10240 --cols 4 --mats 8"
