#!/usr/bin/env bash
# Session 36, call B (cold), to set mk_once_on's bound. Before the call, here (uncommitted, reverted after):
#   sed -i 's/^#define MK_ONCE_MIN 8192$/#define MK_ONCE_MIN 4096/' megakernel/cuda/mk-kernel.cuh
# The tree carried with MK_ONCE_MIN 4096 (main's and call A's: 8192), i.e.
# the default also stages once O's inputs at 2 and 3 tokens and the global layers' O at 1; against every block
# staging (GGML_MK_VAR_STAGE_EVERY 0x100) and every plain mat-vec once (GGML_MK_VAR_ONCE_ALL 0x200: the per-layer
# projection too), one binary:
#   run(command="bash bench/megakernel-h200-2026-12-06/s36-callB.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"],
#       timeout_s=600)
# bench: test-mk --variant 0x100 on E4B (bitwise check, tok/s AB/BA in one process); vcost: verify kernels of
# M = 1..5 with the profile, processes a a+0x100 a+0x200 a+0x200 a+0x100 a
set -u
MK_TARGETS="llama-bench" MK_MODELS="e4b-mtp" MK_VARIANT=0x100 MK_ROUNDS=4 MK_BENCH_N=32 \
    bash megakernel/device.sh build models bench 2>&1 | grep -E "^== |speed|verify|variant|FAIL|error"
rm -rf /tmp/stq-mk/bin-a && cp -a /tmp/stq-mk/build/bin /tmp/stq-mk/bin-a
MK_MODELS="e4b-mtp" MK_VCOST_SIDES="a a+0x100 a+0x200 a+0x200 a+0x100 a" bash megakernel/device.sh vcost 2>&1 | grep -E "^== |verify ==|FAIL"
gzip -9 "$OUT"/*.log 2>/dev/null
