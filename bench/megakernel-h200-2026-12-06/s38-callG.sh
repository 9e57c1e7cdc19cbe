#!/usr/bin/env bash
# Session 38, call G (warm after call F: its build; else cold): the E2B-shaped pair through llama-server, greedy and
# k = 2, 3 at noise 25 (session 37: 0.88 / 0.83 accepted per draft), megakernel vs graph, backend sampling, every
# megakernel server's step in parts (session 37 saw greedy through the server at 1.00x the graph, test-mk 1.17x):
#   run(command="bash bench/megakernel-h200-2026-12-06/s38-callG.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"],
#       timeout_s=560)
set -u
MK_TARGETS="llama-bench llama-server" MK_MODELS="e2b-mtp" bash megakernel/device.sh build models 2>&1 | grep -E "^== |FAIL|error"
MK_TARGETS="llama-bench llama-server" MK_E2E_MODEL="e2b-mtp" \
    MK_E2E_ARGS="--k 2,3 --rounds 2 -n 128 --noise 25 --backend-sampling --mk-timeline" \
    bash megakernel/device.sh e2e 2>&1 | grep -E "^== |^  [a-z]|a step through|ids|FAIL|error|^bench" | grep -v "^  round"
gzip -9 "$OUT"/*.log 2>/dev/null
