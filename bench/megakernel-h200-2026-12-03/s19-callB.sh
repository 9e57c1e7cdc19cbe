#!/usr/bin/env bash
# session 19 call B, right after call A (warm machine: build and models in /tmp/stq-mk are kept; cold: rebuilt):
# run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# 1. issue 14: the costs of a speculative step with today's kernel on the E4B-shaped pair: test-mk --verify-cost
#    (one launch of M = 1..5 tokens, megakernel and graph) and the fused draft launch for k = 2 and 3 (test-mk-draft)
# 2. issue 12 item 4: compute-sanitizer racecheck of the decode/verify kernel on the small F16 pair with ONE block
#    (LLAMA_MEGAKERNEL_GRID=1: racecheck tracks shared memory, which is per block; earlier runs on 4-8 blocks never
#    finished), only the megakernel instrumented (--kernel-name kns=mk_decode, if the tool takes it), capped by the
#    time left
set -u
t0=$SECONDS
. bench/megakernel-h200-2026-12-03/s19-env.sh
bash megakernel/device.sh build models > "$OUT/callB-build.log" 2>&1
echo "== build + models rc=$? at $((SECONDS - t0)) s"
{
    echo "== $(date -u +%T) verify cost, e4b-mtp (test-mk --verify-cost)"
    timeout 120 $B/test-mk -m $M/e4b-mtp.gguf -n 8 --rounds 2 --bench-n 32 --max-nmse 10 --max-disagree 100 --verify-cost
    for k in 2 3; do
        echo "== $(date -u +%T) fused draft k=$k, e4b-mtp"
        timeout 60 $B/test-mk-draft -m $M/e4b-mtp.gguf -md $M/e4b-mtp-assistant.gguf --fused -k $k -n 16 \
            --max-nmse 1e-2 --max-nmse-h 1e-2 < /dev/null
    done
} > "$OUT/callB-cost.log" 2>&1
grep -E "^== |^speed|verify cost|^timing|^OK|^FAIL" "$OUT/callB-cost.log" | cut -c1-220
echo "== cost done at $((SECONDS - t0)) s"
filt=""
compute-sanitizer --kernel-name kns=mk_decode --tool racecheck /bin/true > /dev/null 2>&1 && filt="--kernel-name kns=mk_decode"
echo "kernel filter: ${filt:-none (option refused)}"; compute-sanitizer --version | tail -1
cap=$((585 - (SECONDS - t0))); [ $cap -lt 30 ] && cap=30
echo "== $(date -u +%T) racecheck, grid 1, small-f16, cap $cap s"
LLAMA_MEGAKERNEL_GRID=1 timeout -k 5 $cap compute-sanitizer --tool racecheck $filt --num-cuda-barriers 8192 --error-exitcode 3 \
    $B/test-mk -m $M/small-f16/gemma4-synth-target.gguf -n 2 --rounds 0 --max-nmse 10 --max-disagree 100 > "$OUT/callB-race.log" 2>&1
echo "racecheck rc=$? (124/137: timed out) at $((SECONDS - t0)) s"
grep -E "RACECHECK SUMMARY|ERROR SUMMARY|Race|Hazard|test-mk:|llama_mk: megakernel|^OK|^FAIL" "$OUT/callB-race.log" | head -20
