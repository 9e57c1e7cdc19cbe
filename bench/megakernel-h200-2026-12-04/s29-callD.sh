#!/usr/bin/env bash
# session 29 call D (cold): F32 / F16 / BF16 weights 4 values per lane (the default now) against a group per lane
# (GGML_MK_VAR_FLOAT_GROUPS 0x8000000, before) in one process (test-mk --variant: its bitwise check says "differ" by
# design), on the E4B-shaped Q4_0 target (F32 per-layer projections: the profile's "per-layer proj" and "proj+" phases,
# 136 + 175 us a step in call B); then the checks against the graph and the per-phase profile
#   run(command="bash bench/megakernel-h200-2026-12-04/s29-callD.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"])
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench" MK_MODELS="e4b"
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models
bash megakernel/device.sh build models > "$OUT/s29D-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
grep -E "^== |error" "$OUT/s29D-build.log" | tail -4
[ $rc -eq 0 ] || exit 1
echo "== $(date -u +%T) variant 0x8000000 (before) vs default"
timeout 60 "$B/test-mk" -m "$M/e4b.gguf" -n 4 --rounds 6 --bench-n 64 --max-nmse 10 --max-disagree 100 --variant 0x8000000 > "$OUT/s29D-var.log" 2>&1
grep -E "variant|speed" "$OUT/s29D-var.log" | cut -c1-200 | tail -3
echo "== $(date -u +%T) checks vs the graph at $((SECONDS - t0)) s"
timeout 60 "$B/test-mk" -m "$M/e4b.gguf" -n 16 --rounds 2 --bench-n 64 --max-nmse 10 --max-disagree 100 --verify-cost > "$OUT/s29D-bench.log" 2>&1
echo "rc=$?"; grep -E "NMSE|greedy|verify ==|speed|verify cost \(mega|test-mk:" "$OUT/s29D-bench.log" | cut -c1-230 | tail -7
LLAMA_MEGAKERNEL_PROFILE=1 timeout 40 "$B/test-mk" -m "$M/e4b.gguf" -n 48 --rounds 0 --max-nmse 10 --max-disagree 100 > "$OUT/s29D-profile.log" 2>&1
grep -E "llama_mk profile" "$OUT/s29D-profile.log" | grep "M=1" | grep -E "per-layer|gate/up|down|lm head" | cut -c1-100
echo "== done at $((SECONDS - t0)) s"
