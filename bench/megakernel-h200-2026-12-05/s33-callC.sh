#!/usr/bin/env bash
# session 33, call C: for the NEXT session (session 33's device time ran out: two refused starts). Cold:
#   run(command="bash bench/megakernel-h200-2026-12-05/s33-callC.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"],
#       timeout_s=600)   (~280 s build and models, ~200 s of runs)
# 1. Issue 12: the candidate GGML_MK_VAR_FLOAT_PACK (0x20000000, session 33: short float rows several to a weight tile;
#    E4B's per-layer projection 2 rows of 256 F32 values a tile) against the default in the same process (test-mk
#    --variant: bitwise check, then greedy speed variant vs default, AB/BA), tg32 and 256 tokens after a ~400-token
#    prompt, two processes each; then both per-phase profiles after the prompt (the per-layer proj+ phase is the one
#    it changes: s33A 194-206 us a step).
# 2. test-mk --verify-cost after session 33's fix (the prompt's graph awaited, one untimed batch of each M): the whole
#    calls' ratios and their parts, and the kernel's own per M (LLAMA_MEGAKERNEL_PROFILE=1), same process (item 3's
#    default processes).
set -u
t0=$SECONDS
left() { echo $((585 - (SECONDS - t0))); }
export MK_TARGETS="llama-bench" MK_MODELS="e4b-mtp"
W=/tmp/stq-mk; M=$W/models/e4b-mtp.gguf; B=$W/build/bin
bash megakernel/device.sh build models > "$OUT/s33C-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
[ $rc -eq 0 ] || { grep -E "^== |error" "$OUT/s33C-build.log" | tail -8; exit 1; }
P="$(python3 -c 'print(" ".join(["the quick brown fox jumps over the lazy dog"]*45))')"
for i in 1 2; do
    [ "$(left)" -gt 60 ] || break
    timeout -k 5 $(($(left) - 10)) $B/test-mk -m $M -n 16 --rounds 3 --bench-n 32 --max-nmse 10 --max-disagree 1000 \
        --hidden-batches 0 --variant 0x20000000 > "$OUT/s33C-var-tg32-$i.log" 2>&1
    echo "== variant tg32 process $i rc=$? at $((SECONDS - t0)) s"; grep -E "variant|test-mk:" "$OUT/s33C-var-tg32-$i.log" | cut -c1-220
    [ "$(left)" -gt 60 ] || break
    timeout -k 5 $(($(left) - 10)) $B/test-mk -m $M -p "$P" -n 4 --rounds 3 --bench-n 256 -c 4096 --max-nmse 10 \
        --max-disagree 1000 --hidden-batches 0 --variant 0x20000000 > "$OUT/s33C-var-long-$i.log" 2>&1
    echo "== variant after the prompt process $i rc=$? at $((SECONDS - t0)) s"; grep -E "variant|test-mk:" "$OUT/s33C-var-long-$i.log" | cut -c1-220
done
for v in 0 0x20000000; do
    [ "$(left)" -gt 40 ] || break
    LLAMA_MEGAKERNEL_VARIANT=$v LLAMA_MEGAKERNEL_PROFILE=1 timeout -k 5 $(($(left) - 10)) $B/test-mk -m $M -p "$P" -n 4 \
        --rounds 1 --bench-n 256 -c 4096 --max-nmse 10 --max-disagree 1000 --hidden-batches 0 > "$OUT/s33C-profile-$v.log" 2>&1
    echo "== profile (variant $v) rc=$? at $((SECONDS - t0)) s"
    grep -E "llama_mk profile" "$OUT/s33C-profile-$v.log" | grep -E "token:|M=1 " | cut -c1-160
done
# 3. the candidate GGML_MK_VAR_STAGE_ROUND (0x40000000: a verify batch's rms round of the pending residual 2 slots a
#    round, one round trip instead of 2 on E4B's rows): verify == decode bitwise M = 2..8 under it (test-mk's check 3)
#    and the verify cost with the kernel's profile, processes default, variant, variant, default
i=0
for v in 0 0x40000000 0x40000000 0; do
    i=$((i + 1))
    [ "$(left)" -gt 40 ] || break
    LLAMA_MEGAKERNEL_VARIANT=$v LLAMA_MEGAKERNEL_PROFILE=1 timeout -k 5 $(($(left) - 5)) $B/test-mk -m $M -n 8 --rounds 2 \
        --bench-n 8 --max-nmse 10 --max-disagree 100 --hidden-batches 0 --verify-cost > "$OUT/s33C-verify-$i-$v.log" 2>&1
    echo "== verify-cost process $i (variant $v) rc=$? at $((SECONDS - t0)) s"
    grep -E "verify ==|verify cost|test-mk:|profile: .* steps of|staging" "$OUT/s33C-verify-$i-$v.log" | grep -E "verify|test-mk|steps of|M=3 \(staging" | cut -c1-400
done
