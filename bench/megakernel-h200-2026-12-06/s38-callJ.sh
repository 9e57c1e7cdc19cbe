#!/usr/bin/env bash
# Session 38, call J (cold, no llama.cpp build): call H's run (both shapes, 8 columns) on mv_mma.cu with its third way,
# mma-s (the 16 rows' blocks staged through shared memory by row-contiguous copies; calls H/I: direct loads ~1080 / 800
# GB/s). Run as recorded at a2bfd87 (three ways); since then mv_mma.cu also has mma-a, left out where it does not fit:
#   run(command="bash bench/megakernel-h200-2026-12-06/s38-callJ.sh", carry=[".dev/cuda"], timeout_s=240)
exec bash "$(dirname "$0")/s38-callH.sh"
