#!/usr/bin/env bash
# Session 42, call A (cold): the build and the E4B-shaped Q4_0 target (made on the GPU), then the chunk-4 variant
# (0x80000000, GGML_MK_VAR_CHUNK4) on it: the bench stage's A/B of the variant against the default in one process (its
# bits differ by design, other chunks and another combine order: MK_VARIANT_OTHER_BITS=1 has test-mk hold it within
# NMSE 1e-3 of the default and to its argmax instead of bit for bit), then test-mk's checks with the variant on
# (megakernel vs graph teacher-forced and greedy, verify == decode bitwise M = 2..8, the planted barrier bug). The
# speed first: with little device time left, a cut call still brings it back.
#   run(command="bash bench/megakernel-h200-2026-12-06/s42-callA.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
export MK_MODELS=e4b
bash megakernel/device.sh build models
MK_VARIANT=0x80000000 MK_VARIANT_OTHER_BITS=1 MK_ROUNDS=4 MK_BENCH_N=48 bash megakernel/device.sh bench
LLAMA_MEGAKERNEL_VARIANT=0x80000000 MK_TEST_N=48 bash megakernel/device.sh test
