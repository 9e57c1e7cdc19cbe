#!/usr/bin/env bash
# session 19 call B, right after call A (warm machine: call A's build and models in /tmp/stq-mk are kept):
# run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf", ".dev/mk-base19"], timeout_s=600), where
# .dev/mk-base19 = `git archive 4374d30 megakernel` (the kernel before the small-batch code, MK_MC_SMALL)
# 1. megakernel/device.sh ab: this tree's kernel (A) vs the base (B) in the same build tree, processes A B B A: check
#    lines (bits), greedy tg32 and tg256 after the long prompt (one-token steps must not get slower), profiles
# 2. verify cost M = 1..5 of each side (test-mk --verify-cost), processes A B B A: the small-batch code's gain
# 3. issue 14: the fused draft launch, k = 2 and 3 (side A), if time is left
set -u
t0=$SECONDS
. bench/megakernel-h200-2026-12-03/s19-env.sh
export MK_MODELS=e4b-mtp
bash megakernel/device.sh build models > "$OUT/callB-build.log" 2>&1
echo "== build + models rc=$? at $((SECONDS - t0)) s"
MK_AB_BASE=.dev/mk-base19/megakernel MK_AB_ROUNDS=${S19_AB_ROUNDS:-2} bash megakernel/device.sh ab > "$OUT/callB-ab.log" 2>&1
echo "== ab rc=$? at $((SECONDS - t0)) s"
grep -E "^== |^speed|greedy|verify ==|NMSE|token:|M=1 " "$OUT/callB-ab.log" | cut -c1-200
for side in a b b a; do
    [ $((SECONDS - t0)) -lt 520 ] || { echo "verify cost side $side: skipped (time)"; continue; }
    echo "== $(date -u +%T) verify cost side $side"
    LD_LIBRARY_PATH=$W/bin-$side timeout 60 $W/bin-$side/test-mk -m $M/e4b-mtp.gguf -n 4 --rounds 2 --bench-n 8 --verify-cost \
        --max-nmse 10 --max-disagree 100 2>&1 | grep -E "^verify cost"
done 2>&1 | tee "$OUT/callB-vcost.log"
for k in 2 3; do
    [ $((SECONDS - t0)) -lt 560 ] || { echo "draft k=$k: skipped (time)"; continue; }
    echo "== $(date -u +%T) fused draft k=$k, e4b-mtp (side a)"
    LD_LIBRARY_PATH=$W/bin-a timeout 30 $W/bin-a/test-mk-draft -m $M/e4b-mtp.gguf -md $M/e4b-mtp-assistant.gguf --fused -k $k -n 8 \
        --max-nmse 1e-2 --max-nmse-h 1e-2 < /dev/null 2>&1 | grep -E "^timing|^OK|^FAIL"
done 2>&1 | tee "$OUT/callB-draft.log"
echo "== done at $((SECONDS - t0)) s"
