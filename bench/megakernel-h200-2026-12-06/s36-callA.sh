#!/usr/bin/env bash
# Session 36, call A (cold): plain mat-vec inputs staged once for the grid (mk_once_on: the new default; E4B: down's
# inputs at every M, O's from 4 tokens on) against every block staging them (GGML_MK_VAR_STAGE_EVERY 0x100, the way
# before), both in one binary:
#   run(command="bash bench/megakernel-h200-2026-12-06/s36-callA.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"],
#       timeout_s=600)
# bench: test-mk --variant 0x100 on E4B (bitwise check against the default, tok/s AB/BA in one process);
# vcost: the verify kernels of M = 1..5 with the profile, one process per side, in the order a a+0x100 a+0x100 a
set -u
MK_TARGETS="llama-bench" MK_MODELS="e4b-mtp" MK_VARIANT=0x100 MK_ROUNDS=4 MK_BENCH_N=32 \
    bash megakernel/device.sh build models bench 2>&1 | grep -E "^== |speed|verify|variant|FAIL|error"
rm -rf /tmp/stq-mk/bin-a && cp -a /tmp/stq-mk/build/bin /tmp/stq-mk/bin-a
MK_MODELS="e4b-mtp" MK_VCOST_SIDES="a a+0x100 a+0x100 a" bash megakernel/device.sh vcost 2>&1 | grep -E "^== |verify ==|FAIL"
gzip -9 "$OUT"/*.log 2>/dev/null
