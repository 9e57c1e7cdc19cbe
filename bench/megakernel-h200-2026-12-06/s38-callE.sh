#!/usr/bin/env bash
# Session 38, call E (cold): where does the megakernel's lead go inside llama-server (call D, E4B: test-mk greedy 1.166x
# the graph, through llama-server 1.03x; the server's launch..end 4241 us a token against the kernel's ~4030 us)?
# test-mk's per-phase profile (the kernel's own time outside the server), then greedy and mtp k = 1 through
# llama-server with LLAMA_MEGAKERNEL_PROFILE=1 (the kernel's time per step inside the server, the host timeline), with
# the backend samplers (a sampling graph after every launch) and without them (the logits to the host):
#   run(command="bash bench/megakernel-h200-2026-12-06/s38-callE.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"],
#       timeout_s=560)
set -u
MK_TARGETS="llama-bench llama-server" MK_MODELS="e4b-mtp" MK_PROF_LINES=3 \
    bash megakernel/device.sh build models profile 2>&1 | grep -E "^== |steps of|FAIL|error"
W=/tmp/stq-mk
for bs in "--backend-sampling" ""; do
    rm -f $W/cache/run/ctx-*.log
    MK_TARGETS="llama-bench llama-server" MK_E2E_MODEL="e4b-mtp" \
        MK_E2E_ARGS="--k 1 --rounds 2 -n 64 --mk-profile $bs" \
        bash megakernel/device.sh e2e 2>&1 | grep -E "^== |^  [a-z]|ids|FAIL|error" | grep -v "^  round" | tail -12
    echo "-- kernel inside the servers (${bs:-host sampling}):"
    grep -h "steps of" $W/cache/run/ctx-*.log | sed 's/phases as.*//' | head -8
    cat $W/cache/run/ctx-*.log | gzip -9 > "$OUT/servers${bs:+-bs}.log.gz"
done
gzip -9 "$OUT"/*.log 2>/dev/null
