#!/usr/bin/env bash
# session 23 call D (warm, right after call C): run(command="bash <this>", timeout_s=240)
# issue 14: a replicate of call C's noise 38 level, k = 3 and 4, three rounds, megakernel only
test -x /tmp/stq-mk/build/bin/llama-server && test -f /tmp/stq-mk/models/e4b-mtp.gguf || { echo "cold machine: nothing to rerun"; exit 3; }
MK_MODELS=e4b-mtp MK_E2E_ARGS="--k 3,4 --rounds 3 -n 128 --noise 38 --backend-sampling --no-graph" timeout -k 5 200 \
    bash megakernel/device.sh e2e > "$OUT/callD-e2e.log" 2>&1
echo "rc=$?"
grep -E "^noise" -A6 "$OUT/callD-e2e.log" | grep -v "^  \[" | cut -c1-170
grep "round" "$OUT/callD-e2e.log" | cut -c1-120
