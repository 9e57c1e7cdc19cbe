#!/usr/bin/env bash
# Session 42, call B (warm, after s42-callA.sh): the per-phase profile on the E4B-shaped target, the default kernel and
# the chunk-4 variant (the attention's chunks and combine lines), then tok/s by context length (stage ctx: the checks
# at a ~390-token prompt, tg 32 and 1024, tg512 after the long prompt; megakernel vs graph vs the variant).
#   run(command="bash bench/megakernel-h200-2026-12-06/s42-callB.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=420)
export MK_MODELS=e4b
for v in 0 0x80000000; do
    LLAMA_MEGAKERNEL_VARIANT=$v MK_PROF_LINES=24 bash megakernel/device.sh profile
done
MK_CTX_VARIANT=0x80000000 MK_VARIANT_OTHER_BITS=1 MK_CTX_BENCH="32 1024" bash megakernel/device.sh ctx
