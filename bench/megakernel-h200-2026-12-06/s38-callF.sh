#!/usr/bin/env bash
# Session 38, call F (cold): issue 14 on the E4B-shaped pair through llama-server at a realistic acceptance (noise 38:
# ~0.8 accepted per draft at k = 3 in session 25), megakernel vs upstream's draft-mtp in the same run, every server's
# step in parts (harness.bench_mtp's step split from the megakernel's timeline: launch, set-up, after, draft, server);
# backend sampling, as a server user who wants speed runs it:
#   run(command="bash bench/megakernel-h200-2026-12-06/s38-callF.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"],
#       timeout_s=560)
set -u
MK_TARGETS="llama-bench llama-server" MK_MODELS="e4b-mtp" bash megakernel/device.sh build models 2>&1 | grep -E "^== |FAIL|error"
MK_TARGETS="llama-bench llama-server" MK_E2E_MODEL="e4b-mtp" \
    MK_E2E_ARGS="--k 2,3 --rounds 2 -n 128 --noise 38 --backend-sampling --mk-timeline" \
    bash megakernel/device.sh e2e 2>&1 | grep -E "^== |^  [a-z]|a step through|ids|FAIL|error|^bench" | grep -v "^  round"
gzip -9 "$OUT"/*.log 2>/dev/null
