#!/usr/bin/env bash
# Session 40, call A (cold): the build. Then, in quick succession (the machine keeps /tmp only while warm: 30 s), the 7
# pieces of the real Gemma 3 270M (split -n 7 -d "$(.venv/bin/stq-metal model)" .dev/mk/g3.: 36 MB each, since every
# call also carries the tracked tree, 28 MB then, under 64 MiB in all), N = 0..6:
#   run(command="MK_PIECE=.dev/mk/g3.0N bash megakernel/device.sh receive", carry=[".dev/mk/g3.0N"])
# and then s40-callB.sh. This call:
#   run(command="bash bench/megakernel-h200-2026-12-06/s40-callA.sh", carry=[".dev/cuda"], timeout_s=480)
MK_MODELS=gemma3 bash megakernel/device.sh build
