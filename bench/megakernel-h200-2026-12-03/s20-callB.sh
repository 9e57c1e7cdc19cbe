#!/usr/bin/env bash
# session 20 call B, right after call A (warm: call A's build and models in /tmp/stq-mk are kept):
# run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf", ".dev/mk-base20"], timeout_s=600), where
# .dev/mk-base20 = `git archive 9895833 megakernel` (main before the shared mk_stage scratch)
# 1. megakernel/device.sh ab: this tree's kernel (A) vs the base (B), processes A B B A, one round: check lines (bits),
#    greedy tg32 and tg256 after the long prompt, per-phase profiles (does one shared scratch win back the one-token
#    1.3 % that session 19's small-batch code cost?)
# 2. issue 12 item 4: compute-sanitizer racecheck of the decode/verify kernel on the small F16 pair with ONE block
#    (LLAMA_MEGAKERNEL_GRID=1), only the megakernel instrumented, capped by the time left
set -u
t0=$SECONDS
. bench/megakernel-h200-2026-12-03/s20-env.sh
bash megakernel/device.sh build models > "$OUT/callB-build.log" 2>&1   # (nothing to do when warm)
echo "== build + models rc=$? at $((SECONDS - t0)) s"
MK_MODELS=e4b-mtp MK_AB_BASE=.dev/mk-base20/megakernel MK_AB_ROUNDS=1 timeout -k 5 400 bash megakernel/device.sh ab > "$OUT/callB-ab.log" 2>&1
echo "== ab rc=$? at $((SECONDS - t0)) s"
grep -E "^== |^speed|greedy|verify ==|NMSE|token:|M=1 " "$OUT/callB-ab.log" | cut -c1-220
filt=""
compute-sanitizer --kernel-name kns=mk_decode --tool racecheck /bin/true > /dev/null 2>&1 && filt="--kernel-name kns=mk_decode"
echo "kernel filter: ${filt:-none (option refused)}"; compute-sanitizer --version | tail -1
cap=$((590 - (SECONDS - t0))); [ $cap -lt 30 ] && cap=30
echo "== $(date -u +%T) racecheck, grid 1, small-f16, cap $cap s (side a's build)"
LD_LIBRARY_PATH=$W/bin-a LLAMA_MEGAKERNEL_GRID=1 timeout -k 5 $cap compute-sanitizer --tool racecheck $filt --num-cuda-barriers 8192 \
    --error-exitcode 3 $W/bin-a/test-mk -m $M/small-f16/gemma4-synth-target.gguf -n 2 --rounds 0 --max-nmse 10 --max-disagree 100 \
    > "$OUT/callB-race.log" 2>&1
echo "racecheck rc=$? (124/137: timed out) at $((SECONDS - t0)) s"
grep -E "RACECHECK SUMMARY|ERROR SUMMARY|Race|Hazard|test-mk:|llama_mk: megakernel|^OK|^FAIL" "$OUT/callB-race.log" | head -20
