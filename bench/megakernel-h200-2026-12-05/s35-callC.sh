#!/usr/bin/env bash
# session 35, call C (written, never ran: the device refused its starts; NOTES.md "Session 35"): issue 14 on the
# E2B-shaped pair with main (last measured in session 24 with the kernel of then), all through device.sh's stages:
# bench (test-mk: greedy megakernel vs graph AB/BA and the verify cost), e2e (harness.bench_mtp: k = 2 and 3 at noise 26
# and 25 (session 24: noise 26 gave 0.751 at k = 2), the graph's greedy and draft-mtp in the same runs, backend sampling):
#   run(command="bash bench/megakernel-h200-2026-12-05/s35-callC.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"],
#       timeout_s=600, kind="nvidia-h100-x1")
MK_TARGETS="llama-bench llama-server" MK_MODELS="e2b-mtp" MK_ROUNDS=2 MK_BENCH_N=32 MK_E2E_MODEL="e2b-mtp" \
    MK_E2E_ARGS="--k 2,3 --rounds 2 -n 128 --noise 26,25 --backend-sampling" \
    bash megakernel/device.sh build models bench e2e
