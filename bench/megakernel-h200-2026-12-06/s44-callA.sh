#!/usr/bin/env bash
# Session 44, call A (cold): session 43's call E (kernel variant 0x80, GGML_MK_VAR_TWO_UNITS: the attention's block way
# takes two units a round, warps 0..7 and 8..15, where a step has more units than blocks; the same bits as the default)
# after a 7681-token prompt on the E4B-shaped Q4_0 target, first with V cached transposed (--fa 0, as call C measured:
# 0.758x the graph at 7201) and then with flash attention on (--fa 1: llama-server's default on CUDA; V rows as K's, never
# measured deep): the checks with the variant on, megakernel vs graph, the variant vs the default (bitwise, tok/s AB/BA
# tg128), the default's profile. Logs: $OUT/deep.log (both runs, in order).
#   run(command="bash bench/megakernel-h200-2026-12-06/s44-callA.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=580)
export MK_MODELS=e4b
bash megakernel/device.sh build models
MK_DEEP="7680" MK_DEEP_N=128 MK_DEEP_VARIANT=0x80 MK_DEEP_FA=0 bash megakernel/device.sh deep
MK_DEEP="7680" MK_DEEP_N=128 MK_DEEP_VARIANT=0x80 MK_DEEP_FA=1 bash megakernel/device.sh deep
