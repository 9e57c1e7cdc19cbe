#!/usr/bin/env bash
# session 20 call A (cold): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf", ".dev/mk-base20"], timeout_s=600)
# 1. build (this tree's kernel: one shared mk_stage scratch) + models small-f16 and e4b-mtp
# 2. issue 14 end to end: MTP speculation through llama-server on the E4B-shaped pair at the two noise levels nearest
#    0.75 accepted per draft (36, 40), k = 2 and 3, megakernel and graph, capped by the time left
set -u
t0=$SECONDS
. bench/megakernel-h200-2026-12-03/s20-env.sh
bash megakernel/device.sh build models > "$OUT/callA-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
grep -E "^== |error" "$OUT/callA-build.log" | tail -12
[ $rc -eq 0 ] || exit 1
cap=$((590 - (SECONDS - t0))); [ $cap -lt 30 ] && cap=30
echo "== $(date -u +%T) e2e, cap $cap s"
MK_MODELS=e4b-mtp MK_E2E_ARGS="--k 2,3 --rounds 2 -n 128 --noise 36,40" timeout -k 5 $cap bash megakernel/device.sh e2e \
    > "$OUT/callA-e2e.log" 2>&1
echo "== e2e rc=$? at $((SECONDS - t0)) s (124/137: timed out)"
grep -vE "^\[stq-metal\]|^llama_|^load|^print_info" "$OUT/callA-e2e.log" | tail -40 | cut -c1-220
