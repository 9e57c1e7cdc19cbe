#!/usr/bin/env bash
# Session 44, call B (cold): call A cut to what less device time holds: after a 7681-token prompt on the E4B-shaped Q4_0
# target (-c 8192, tg128), 0x880 (two units a round + load pairs) and 0x80 against the default with V transposed
# (--fa 0), then 0x880 with flash attention on (--fa 1). See s44-callA.sh. Ran 04:31-04:40 UTC with timeout_s=500 (H100):
# the --fa 1 stage did not finish (its graph runs some layers' flash attention on the CPU: 86 splits); logs s44/.
#   run(command="bash bench/megakernel-h200-2026-12-06/s44-callB.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=...)
export MK_MODELS=e4b
bash megakernel/device.sh build models
MK_DEEP="7680" MK_DEEP_N=128 MK_DEEP_VARIANT="0x80 0x880" MK_DEEP_FA=0 bash megakernel/device.sh deep
MK_DEEP="7680" MK_DEEP_N=128 MK_DEEP_VARIANT="0x880" MK_DEEP_FA=1 bash megakernel/device.sh deep
