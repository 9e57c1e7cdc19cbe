#!/usr/bin/env bash
# Session 43, call D (not run in session 43: its device time went to the variants at depth, then to refused starts; warm after a build of this tree): the E2B-shaped Q4_0 target (made on the GPU), the chunk-4 variant
# (0x80000000) against the default there (tg32, 4 rounds AB/BA, its bits judged by closeness: MK_VARIANT_OTHER_BITS=1),
# then stage deep on E2B at 4096 (+1) tokens.
#   run(command="bash bench/megakernel-h200-2026-12-06/s43-callD.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=400)
export MK_MODELS=e2b
bash megakernel/device.sh models
MK_VARIANT=0x80000000 MK_VARIANT_OTHER_BITS=1 MK_ROUNDS=4 MK_BENCH_N=32 bash megakernel/device.sh bench
MK_DEEP="4096" bash megakernel/device.sh deep
