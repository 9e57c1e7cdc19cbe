#!/usr/bin/env bash
# Session 41, call G (not yet run; warm, after s40-callA.sh's build and the 7 receive calls of the real Gemma 3 270M):
# the kernel variant GGML_MK_VAR_CHUNK4 (0x80000000: attention chunks of 4 cells, 4 cells a step; nvcc: the chunk loop
# 682 SASS instructions and no spills, against the default's 1434 and 17). Its bits differ from the default's on a GPU
# (other chunks, so another combine order): the bench stage holds it within NMSE 1e-3 of the default and to its argmax
# (MK_VARIANT_OTHER_BITS=1, test-mk --variant-other-bits; session 42), not bit for bit. Its checks come from the test
# stage run with the variant on (LLAMA_MEGAKERNEL_VARIANT: the megakernel against the graph, teacher-forced and greedy,
# verify == decode bitwise M = 2..8), its speed from the bench stage (the variant against the
# default in one process, AB/BA), its attention from the profile (the new points: prologue, warp 0's chunks).
#   run(command="bash bench/megakernel-h200-2026-12-06/s41-callG.sh", carry=[".dev/cuda"], timeout_s=300)
export MK_MODELS=gemma3
LLAMA_MEGAKERNEL_VARIANT=0x80000000 MK_TEST_N=160 bash megakernel/device.sh test
MK_VARIANT=0x80000000 MK_VARIANT_OTHER_BITS=1 bash megakernel/device.sh bench
MK_PROF_LINES=60 bash megakernel/device.sh profile
LLAMA_MEGAKERNEL_VARIANT=0x80000000 MK_PROF_LINES=22 bash megakernel/device.sh profile
