#!/usr/bin/env bash
# session 22 call B (cold): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# issue 14: MTP end to end with the servers' samplers on the device (--backend-sampling: the megakernel's steps run the
# sampler chain in a graph of their own over the kernel's logits, LLM_GRAPH_TYPE_MK_SAMPLING), E4B-shaped pair, noise 40
# (0.754 accepted per draft in session 20), k = 2, 3, megakernel and graph
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench llama-server" MK_MODELS="e4b-mtp"
bash megakernel/device.sh build models > "$OUT/callB-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
grep -E "^== |error" "$OUT/callB-build.log" | tail -8
[ $rc -eq 0 ] || exit 1
cap=$((590 - (SECONDS - t0))); [ $cap -lt 30 ] && cap=30
echo "== $(date -u +%T) e2e --backend-sampling, cap $cap s"
MK_E2E_ARGS="--k 2,3 --rounds 2 -n 128 --noise 40 --backend-sampling" timeout -k 5 $cap bash megakernel/device.sh e2e \
    > "$OUT/callB-e2e.log" 2>&1
echo "== e2e rc=$? at $((SECONDS - t0)) s (124/137: timed out)"
grep -vE "^\[stq-metal\]|^llama_|^load|^print_info" "$OUT/callB-e2e.log" | tail -40 | cut -c1-220
