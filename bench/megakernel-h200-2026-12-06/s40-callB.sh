#!/usr/bin/env bash
# Session 40, call B (warm, after s40-callA.sh and the 7 receive calls): the real Gemma 3 270M Q4_K_M on today's
# megakernel, last measured in session 10 (H200: 785.6 vs the graph's 774.7 tok/s). Checks (stage test: teacher-forced
# and greedy vs the graph, verify == decode, the planted barrier bug), speed (stage bench: megakernel vs graph AB/BA in
# one process, verify cost M = 2..5, roofline, launches), block 0's per-phase profile, then the grid capped at
# 132 / 66 / 33 / 16 blocks (LLAMA_MEGAKERNEL_GRID; a small model's phases are latency: fewer blocks, cheaper barriers?).
# (The grid loop below names device.sh's default work folders itself; s40-callD.sh goes through device.sh instead.)
#   run(command="bash bench/megakernel-h200-2026-12-06/s40-callB.sh", carry=[".dev/cuda"], timeout_s=480)
export MK_MODELS=gemma3 MK_TEST_N=160 MK_PROF_LINES=60
bash megakernel/device.sh test bench profile
BLD=${MK_WORK:-/tmp/stq-mk}/build
M=${MK_WORK:-/tmp/stq-mk}/models/gemma3.gguf
for g in 132 66 33 16 132; do
    echo "== grid capped at $g blocks"
    LLAMA_MEGAKERNEL_GRID=$g "$BLD/bin/test-mk" -m "$M" -n 8 --rounds 4 --bench-n 64 --max-nmse 10 --max-disagree 100 \
        2>&1 | tee -a "$OUT/grid.log" | grep -E "^speed|test-mk:|llama_mk: (grid|verify)" | tail -4
done
