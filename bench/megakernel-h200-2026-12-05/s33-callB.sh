#!/usr/bin/env bash
# session 33, call B (cold): NOT RUN (its start was refused; the 340 s left could not hold a cold build): s33-callC.sh
# does the same at its end. As written: run(command="bash bench/megakernel-h200-2026-12-05/s33-callB.sh",
#   carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=450)
# test-mk --verify-cost after its fix (the prompt's asynchronous graph awaited and one untimed batch of each M before the
# timed ones; call A's M = 1 carried the prompt): the whole calls' ratios and their parts, then the same process with
# LLAMA_MEGAKERNEL_PROFILE=1 for the kernel's own time per M (E4B-shaped Q4_0 target of e4b-mtp)
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench" MK_MODELS="e4b-mtp"
W=/tmp/stq-mk; M=$W/models; B=$W/build/bin
bash megakernel/device.sh build models > "$OUT/s33B-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
[ $rc -eq 0 ] || { grep -E "^== |error" "$OUT/s33B-build.log" | tail -8; exit 1; }
for prof in 0 1; do
    [ $((440 - (SECONDS - t0))) -gt 25 ] || exit 0
    env $([ $prof = 1 ] && echo LLAMA_MEGAKERNEL_PROFILE=1) timeout -k 5 $((440 - (SECONDS - t0))) $B/test-mk -m "$M/e4b-mtp.gguf" \
        -n 8 --rounds 2 --bench-n 8 --max-nmse 10 --max-disagree 100 --hidden-batches 0 --verify-cost \
        > "$OUT/s33B-verify-$prof.log" 2>&1
    echo "== verify-cost (profile $prof) rc=$? at $((SECONDS - t0)) s"
    grep -E "verify cost|test-mk:|profile: .* steps of" "$OUT/s33B-verify-$prof.log" | cut -c1-400
done
