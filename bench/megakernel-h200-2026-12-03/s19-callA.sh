#!/usr/bin/env bash
# session 19 call A, as run through the device tool: run(command="bash <this>", carry=[".dev/cuda",
# ".dev/mk/tokenizer.gguf"], timeout_s=600) from the repository root (cold machine: build ~260 s, models ~50 s).
# Issue 17 item 3: harness/cuda_device.sh's sanitize stage (compute-sanitizer memcheck, racecheck, synccheck over the
# STQ1_0 mmq, RP16 unpack and mat-vec kernels) in the build of s19-env.sh, its steps cut to end by ~585 s
set -u
t0=$SECONDS
. bench/megakernel-h200-2026-12-03/s19-env.sh
bash megakernel/device.sh build models > "$OUT/callA-build.log" 2>&1
echo "== build + models rc=$? at $((SECONDS - t0)) s"; grep -E "^== |error|FAIL" "$OUT/callA-build.log" | tail -8
ls $B/test-backend-ops $B/test-stq1_0-rp16 $B/test-mul-mat-batch-invariance $B/test-mk || exit 1
STQ_CUDA_WORK=$W STQ_CUDA_DEADLINE=$((583 - (SECONDS - t0))) bash harness/cuda_device.sh remote sanitize > "$OUT/callA-san.log" 2>&1
echo "== sanitize rc=$? at $((SECONDS - t0)) s"
grep -E "^-- \[|^   rc|ERROR SUMMARY|RACECHECK|TIMED|SKIPPED|^== " "$OUT/callA-san.log" | cut -c1-200 | tail -50
