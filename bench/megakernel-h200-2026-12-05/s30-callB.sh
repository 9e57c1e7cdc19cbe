#!/usr/bin/env bash
# session 30, call B: NOT RUN in session 30 (its one try was refused, then the device tool stopped lending machines).
# For the next session's first call (cold):
#   run(command="bash bench/megakernel-h200-2026-12-05/s30-callB.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"],
#       timeout_s=600)
# A verify batch (2..8 tokens) staged over clusters of 2 blocks (GGML_MK_VAR_CLUSTER_STAGE 0x10000000, the candidate,
# off by default) against the default (every block stages every column) on the E4B-shaped MTP pair's target (Q4_0):
# 1. test-mk checks + verify cost, processes in the order default, candidate, candidate, default (the candidate's
#    processes: verify == decode bitwise M = 2..8 with the clustered launches; a line "llama_mk: ... clusters" would say
#    it fell back)
# 2. the fused draft launch for k = 2 (test-mk-draft --fused), for issue 14's k = 2 step (draft + verify of 3)
# 3. end to end through llama-server, k = 2 at noise 38 (~0.75 accepted on E4B), megakernel vs graph, if time is left
set -u
t0=$SECONDS
export MK_MODELS="e4b-mtp"
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models
bash megakernel/device.sh build models > "$OUT/s30B-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
grep -E "^== |error" "$OUT/s30B-build.log" | tail -4
[ $rc -eq 0 ] || exit 1
i=0
for v in 0 0x10000000 0x10000000 0; do
    i=$((i + 1))
    LLAMA_MEGAKERNEL_VARIANT=$v timeout 70 "$B/test-mk" -m "$M/e4b-mtp.gguf" -n 16 --rounds 1 --bench-n 32 --max-nmse 10 \
        --max-disagree 100 --verify-cost > "$OUT/s30B-verify-$i-$v.log" 2>&1
    echo "== $i variant $v rc=$? at $((SECONDS - t0)) s"
    grep -E "NMSE|greedy|verify ==|verify cost \(mega|test-mk:|cluster|variant|FAIL" "$OUT/s30B-verify-$i-$v.log" | cut -c1-200 | tail -7
done
timeout 40 "$B/test-mk-draft" -m "$M/e4b-mtp.gguf" -md "$M/e4b-mtp-assistant.gguf" --fused -k 2 -n 8 > "$OUT/s30B-draft.log" 2>&1
echo "== draft rc=$? at $((SECONDS - t0)) s"
grep -E "fused|draft launch|us|agree|==" "$OUT/s30B-draft.log" | grep -v "^llama\|^load" | cut -c1-200 | tail -6
cap=$((585 - (SECONDS - t0))); [ $cap -lt 60 ] && { echo "== no time for e2e"; exit 0; }
echo "== $(date -u +%T) e2e k 2, noise 38, cap $cap s"
MK_E2E_MODEL=e4b-mtp MK_E2E_ARGS="--k 2 --rounds 2 -n 128 --noise 38" timeout -k 5 $cap bash megakernel/device.sh e2e > "$OUT/s30B-e2e.log" 2>&1
echo "== e2e rc=$? at $((SECONDS - t0)) s (124/137: timed out)"
grep -vE "^\[stq-metal\]|^llama_|^load|^print_info|^  \[" "$OUT/s30B-e2e.log" | tail -14 | cut -c1-200
