#!/usr/bin/env bash
# Session 40, call D (warm, after s40-callA.sh's build and the 7 receive calls; not yet run): the kernel variants that
# touch what a small model's step spends its time on (NOTES.md "Session 40": attention, heads, staging), on the real
# Gemma 3 270M, each through device.sh's stage bench with MK_VARIANT (test-mk --variant: bitwise check against the
# default, then greedy AB/BA in one process): 0x4000 fold the heads phase into the attention, 0x100000 half-size
# attention groups (twice the blocks), 0x8000 a mat-vec's first tiles after its staging, 0x200 every plain mat-vec's
# inputs staged once for the grid.
#   run(command="bash bench/megakernel-h200-2026-12-06/s40-callD.sh", carry=[".dev/cuda"], timeout_s=300)
for v in 0x4000 0x100000 0x8000 0x200; do
    MK_MODELS=gemma3 MK_VARIANT=$v bash megakernel/device.sh bench
done
