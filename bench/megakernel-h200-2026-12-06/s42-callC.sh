#!/usr/bin/env bash
# Session 42, call C (cold, the last ~460 s of device time after 12 refused starts): the build and the E2B-shaped Q4_0
# target (made on the GPU: smaller than E4B, quicker to make), then the chunk-4 variant's A/B against the default in one
# process (2 rounds, tg32; MK_VARIANT_OTHER_BITS=1: held within NMSE 1e-3 of the default and to its argmax).
#   run(command="bash bench/megakernel-h200-2026-12-06/s42-callC.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=450)
export MK_MODELS=e2b
bash megakernel/device.sh build models
MK_VARIANT=0x80000000 MK_VARIANT_OTHER_BITS=1 MK_ROUNDS=2 MK_BENCH_N=32 bash megakernel/device.sh bench
