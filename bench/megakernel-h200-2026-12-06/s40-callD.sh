#!/usr/bin/env bash
# Session 40, call D (warm, after s40-callA.sh's build and the 7 receive calls): the kernel variants that touch what a
# small model's step spends its time on (NOTES.md "Session 40": attention, heads, staging), on the real Gemma 3 270M,
# each against the default in one process (test-mk --variant: bitwise check over teacher-forced steps, then greedy
# AB/BA): 0x4000 fold the heads phase into the attention, 0x100000 half-size attention groups (twice the blocks),
# 0x8000 a mat-vec's first tiles after its staging, 0x200 every plain mat-vec's inputs staged once for the grid.
#   run(command="bash bench/megakernel-h200-2026-12-06/s40-callD.sh", carry=[".dev/cuda"], timeout_s=300)
BLD=${MK_WORK:-/tmp/stq-mk}/build
M=${MK_WORK:-/tmp/stq-mk}/models/gemma3.gguf
for v in 0x4000 0x100000 0x8000 0x200; do
    echo "== variant $v"
    "$BLD/bin/test-mk" -m "$M" -n 16 --rounds 6 --bench-n 64 --max-nmse 10 --max-disagree 100 --variant $v \
        2>&1 | tee -a "$OUT/variants.log" | grep -E "^speed|^variant|test-mk:" | tail -4
done
