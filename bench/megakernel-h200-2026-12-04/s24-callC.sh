#!/usr/bin/env bash
# session 24 call C (warm, right after call B): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# issue 12 item 4: compute-sanitizer racecheck of the megakernel on one block (tiny-f16, test-mk's short checks:
# device.sh sanitize's defaults), with the whole call as its cap
set -u
t0=$SECONDS
MK_SAN_TOOLS=racecheck MK_SAN_CAP=${MK_CAP:-540} bash megakernel/device.sh sanitize 2>&1 | tail -12
echo "== done at $((SECONDS - t0)) s"
