#!/usr/bin/env bash
# Session 37, call C (warm after call B, or cold): issue 14 on the E2B-shaped pair with main (last measured end to end in
# session 24), and issue 12's E2B row: test-mk (greedy megakernel vs graph AB/BA, verify == decode), the verify kernels'
# profile (vcost, side a), then harness.bench_mtp (k = 2 and 3 at noise 26 and 25; session 24: noise 26 gave 0.751 at
# k = 2; the graph's greedy and upstream draft-mtp in the same runs; backend sampling):
#   run(command="bash bench/megakernel-h200-2026-12-06/s37-callC.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"],
#       timeout_s=600)
set -u
MK_TARGETS="llama-bench llama-server" MK_MODELS="e2b-mtp" MK_ROUNDS=2 MK_BENCH_N=32 \
    bash megakernel/device.sh build models bench 2>&1 | grep -E "^== |speed|verify|FAIL|error"
rm -rf /tmp/stq-mk/bin-a && cp -a /tmp/stq-mk/build/bin /tmp/stq-mk/bin-a
MK_MODELS="e2b-mtp" MK_VCOST_SIDES="a" bash megakernel/device.sh vcost 2>&1 | grep -E "^== |verify ==|FAIL"
MK_TARGETS="llama-bench llama-server" MK_E2E_MODEL="e2b-mtp" \
    MK_E2E_ARGS="--k 2,3 --rounds 2 -n 128 --noise 26,25 --backend-sampling" \
    bash megakernel/device.sh e2e 2>&1 | grep -E "^== |tok/s|accepted|ids|FAIL|error" | tail -40
gzip -9 "$OUT"/*.log 2>/dev/null
