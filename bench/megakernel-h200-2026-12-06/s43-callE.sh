#!/usr/bin/env bash
# Session 43, call E (cold; not run in session 43: two starts refused, 288 s left, less than a build): kernel variant 0x80
# (GGML_MK_VAR_TWO_UNITS, mk_att_two: the attention's block way takes units u and u + blocks in one round, warps 0..7 and
# 8..15, where a step has more units than blocks; the same bits as the default's one unit a round) on the E4B-shaped Q4_0
# target, deep in a context where it applies (the global layers: 968 units at 7681 + 128 cells, 520 at 4096 + 128, on
# 132 blocks).
# Stage deep with MK_DEEP_VARIANT=0x80: the checks there with the variant on (verify == decode bitwise: verify steps take
# two units where one-token steps may not), megakernel vs graph and the variant vs the default (bitwise, then tok/s AB/BA,
# tg128), the default's profile. 7681 tokens first (-c 8192, as call C's 7201): there call C measured 0.758x the graph.
#   run(command="bash bench/megakernel-h200-2026-12-06/s43-callE.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=560)
export MK_MODELS=e4b
bash megakernel/device.sh build models
MK_DEEP="7680 4096" MK_DEEP_N=128 MK_DEEP_VARIANT=0x80 bash megakernel/device.sh deep
