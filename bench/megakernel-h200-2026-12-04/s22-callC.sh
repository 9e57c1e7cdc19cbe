#!/usr/bin/env bash
# session 22 call C (warm, right after B): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"])
# the same run as call B's without --backend-sampling (the host samples: session 20's setting), same build and model,
# as the baseline of the same machine and hour
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench llama-server" MK_MODELS="e4b-mtp"
cap=$((${MK_CAP:-590} - (SECONDS - t0)))
echo "== $(date -u +%T) e2e (host sampling), cap $cap s"
MK_E2E_ARGS="--k 2,3 --rounds 2 -n 128 --noise 40" timeout -k 5 $cap bash megakernel/device.sh e2e > "$OUT/callC-e2e.log" 2>&1
echo "== e2e rc=$? at $((SECONDS - t0)) s (124/137: timed out)"
grep -vE "^\[stq-metal\]|^llama_|^load|^print_info" "$OUT/callC-e2e.log" | tail -40 | cut -c1-220
