#!/usr/bin/env bash
# (Never ran: the device refused starts until too little time was left; call B, its cut, ran instead. Its --fa 1 half
# would not finish in a call: flash attention forced on puts some of this model's layers on the CPU, NOTES.md session 44.)
# Session 44, call A (cold): deep in a context on the E4B-shaped Q4_0 target (a 7681-token prompt, -c 8192, tg128), the
# new attention variants against the default, first with V cached transposed (--fa 0, as session 43's call C: 0.758x the
# graph at 7201) and then with flash attention on (--fa 1: llama-server's default on CUDA; V rows as K's; never measured
# deep). Variants (the same bits as the default; each timed AB/BA against it in one process, after a bitwise check):
#   0x80  GGML_MK_VAR_TWO_UNITS   the attention's block way takes two units a round (warps 0..7 and 8..15)
#   0x800 GGML_MK_VAR_LOAD_PAIRS  512-dim heads: two steps' cells per load round trip (transposed V: 8-byte loads of
#                                 4 cells), the unit's Q in shared memory
#   0x880 both
# The checks (verify == decode bitwise, NMSE vs the graph) run with the last variant on; the profile is the default's.
# Logs: $OUT/deep.log (both runs, in order).
#   run(command="bash bench/megakernel-h200-2026-12-06/s44-callA.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=590)
export MK_MODELS=e4b
bash megakernel/device.sh build models
MK_DEEP="7680" MK_DEEP_N=128 MK_DEEP_VARIANT="0x80 0x800 0x880" MK_DEEP_FA=0 bash megakernel/device.sh deep
MK_DEEP="7680" MK_DEEP_N=128 MK_DEEP_VARIANT="0x800 0x880" MK_DEEP_FA=1 bash megakernel/device.sh deep
