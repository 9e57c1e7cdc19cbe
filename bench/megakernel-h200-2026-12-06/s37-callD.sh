#!/usr/bin/env bash
# Session 37, call D (cold): issue 12 item 1 on the flagship shape: does llama-server decode faster with the megakernel?
# E4B-shaped Q4_0 pair, greedy and mtp k = 1 through llama-server, megakernel vs graph (LLAMA_MEGAKERNEL=0) in the same
# run (harness.bench_mtp, servers side by side, 2 rounds in alternating order, backend sampling, the megakernel's host
# timeline), at the model's own noise (no rescaling), then the same test-mk AB/BA as ever for comparison:
#   run(command="bash bench/megakernel-h200-2026-12-06/s37-callD.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"],
#       timeout_s=560)
set -u
MK_TARGETS="llama-bench llama-server" MK_MODELS="e4b-mtp" MK_ROUNDS=2 MK_BENCH_N=32 \
    bash megakernel/device.sh build models bench 2>&1 | grep -E "^== |speed|roofline|launches|FAIL|error"
MK_TARGETS="llama-bench llama-server" MK_E2E_MODEL="e4b-mtp" \
    MK_E2E_ARGS="--k 1 --rounds 2 -n 96 --backend-sampling --mk-timeline" \
    bash megakernel/device.sh e2e 2>&1 | grep -E "^== |tok/s|accepted|ids|FAIL|error|timeline|median" | tail -40
gzip -9 "$OUT"/*.log 2>/dev/null
