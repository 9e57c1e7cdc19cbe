#!/usr/bin/env bash
# session 18 call D, as run through the device tool: run(command="bash <this>", carry=[".dev/cuda",
# ".dev/mk/tokenizer.gguf"]) from the repository root: variant 0x200000 (GGML_MK_VAR_SPREAD_UNITS) against the default
# kernel in the same processes (test-mk --variant: AB/BA, bitwise comparison), tg32, tg256 and 256 after the long
# prompt, and the per-phase profile of both after the long prompt
MK_MODELS=e4b-mtp MK_CTX_VARIANT=0x200000 MK_CTX_BENCH="32 256" MK_CTX_LONG_N=256 MK_CTX_PROF=1 \
    bash megakernel/device.sh build models ctx > "$OUT/callD.log" 2>&1
rc=$?
grep -E "^== |^speed|^variant|greedy|verify ==|NMSE|token:|M=1 " "$OUT/callD.log" | cut -c1-200
exit $rc
