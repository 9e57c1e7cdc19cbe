#!/usr/bin/env bash
# Session 43, call C (cold): the build and the E4B-shaped Q4_0 target (made on the GPU), then decode deep in a context
# (stage deep, new): MK_DEEP="2048 4096 7680", then D/16 sentences: prompts of 1921, 3841 and 7201 tokens (stage deep
# now takes D/15 sentences, D + 1 tokens; -c 2560 / 4608 / 8192: the attention's chunks of 8 cells, up to ~930 of them),
# each with the checks there (NMSE vs the graph, verify == decode bitwise), tok/s megakernel vs graph at tg256 after it
# (AB/BA, 2 rounds) and the per-phase profile. Never measured before: sessions 15-42 stopped at ~1400 cells.
#   run(command="bash bench/megakernel-h200-2026-12-06/s43-callC.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
export MK_MODELS=e4b
bash megakernel/device.sh build models
MK_DEEP="2048 4096 7680" bash megakernel/device.sh deep
