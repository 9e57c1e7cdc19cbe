#!/usr/bin/env bash
# Session 44, call B (cold; ran 04:31-04:40 UTC on an H100 with timeout_s=500, the --fa 1 stage cut by the limit: its graph
# runs some layers' flash attention on the CPU, 86 splits; NOTES.md "Session 44", logs s44/): deep in a context on the
# E4B-shaped Q4_0 target (a 7681-token prompt, -c 8192, tg128), kernel variants against the default, each timed AB/BA in
# one process after a bitwise check; the checks (verify == decode bitwise, NMSE vs the graph) with the last variant on,
# the profile the default's:
#   0x80  GGML_MK_VAR_TWO_UNITS   the attention's block way takes two units a round (warps 0..7 and 8..15)
#   0x880 with GGML_MK_VAR_LOAD_PAIRS (0x800): 512-dim heads load two steps' cells per round trip (transposed V: 8-byte
#         loads of 4 cells) and read the unit's Q from shared memory
# first with V cached transposed (--fa 0, what -fa auto gives this model shape), then 0x880 with flash attention on.
#   run(command="bash bench/megakernel-h200-2026-12-06/s44-callB.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=500)
export MK_MODELS=e4b
bash megakernel/device.sh build models
MK_DEEP="7680" MK_DEEP_N=128 MK_DEEP_VARIANT="0x80 0x880" MK_DEEP_FA=0 bash megakernel/device.sh deep
MK_DEEP="7680" MK_DEEP_N=128 MK_DEEP_VARIANT="0x880" MK_DEEP_FA=1 bash megakernel/device.sh deep
