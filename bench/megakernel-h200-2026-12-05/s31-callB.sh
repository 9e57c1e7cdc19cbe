#!/usr/bin/env bash
# session 31, call B: warm, right after s31-callA.sh (reuses its build and models). Its draft part ran in session 31; its
# e2e failed there (call A builds no llama-server): it now builds llama-server first when missing:
#   run(command="bash bench/megakernel-h200-2026-12-05/s31-callB.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"],
#       timeout_s=600)
# 1. the verify processes call A had no time for, so that the order default, candidate, candidate, default is whole
#    (0x10000000 vs the default; the cluster candidate when written, the unclustered staging since a1f2672): call A's output says "verify process N ... no time left";
#    pass MK_VERIFY_FROM=N (e.g. run(command="MK_VERIFY_FROM=3 bash ...")); without it all four run
# 2. the fused draft launch for k = 2 (test-mk-draft --fused), for issue 14's k = 2 step (draft + verify of 3)
# 3. end to end through llama-server, k = 2 at noise 38 (~0.75 accepted on E4B), megakernel vs graph, if time is left
set -u
t0=$SECONDS
left() { echo $((${MK_CAP:-585} - (SECONDS - t0))); }
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models
[ -x "$B/test-mk" ] || { echo "no build: the machine is not call A's"; exit 1; }
export MK_MODELS="e4b-mtp"
i=0
for v in 0 0x10000000 0x10000000 0; do
    i=$((i + 1))
    [ -n "${MK_VERIFY_FROM:-}" ] && [ "$i" -lt "$MK_VERIFY_FROM" ] && continue
    [ "$(left)" -lt 200 ] && break
    LLAMA_MEGAKERNEL_VARIANT=$v timeout 70 "$B/test-mk" -m "$M/e4b-mtp.gguf" -n 16 --rounds 1 --bench-n 32 --max-nmse 10 \
        --max-disagree 100 --verify-cost > "$OUT/s31B-verify-$i-$v.log" 2>&1
    echo "== $i variant $v rc=$? at $((SECONDS - t0)) s"
    grep -E "NMSE|greedy|verify ==|verify cost \(mega|test-mk:|cluster|variant|FAIL" "$OUT/s31B-verify-$i-$v.log" | cut -c1-200 | tail -7
done
timeout 40 "$B/test-mk-draft" -m "$M/e4b-mtp.gguf" -md "$M/e4b-mtp-assistant.gguf" --fused -k 2 -n 8 > "$OUT/s31B-draft.log" 2>&1
echo "== draft rc=$? at $((SECONDS - t0)) s"
grep -E "fused|draft launch|us|agree|==" "$OUT/s31B-draft.log" | grep -v "^llama\|^load" | cut -c1-200 | tail -6
[ -x "$B/llama-server" ] || { MK_TARGETS="llama-bench llama-server" bash megakernel/device.sh build > "$OUT/s31B-build.log" 2>&1;
    echo "== llama-server built rc=$? at $((SECONDS - t0)) s"; }
cap=$(( $(left) )); [ $cap -lt 60 ] && { echo "== no time for e2e"; exit 0; }
echo "== $(date -u +%T) e2e k 2, noise 38, cap $cap s"
MK_E2E_MODEL=e4b-mtp MK_E2E_ARGS="--k 2 --rounds 2 -n 128 --noise 38" timeout -k 5 $cap bash megakernel/device.sh e2e > "$OUT/s31B-e2e.log" 2>&1
echo "== e2e rc=$? at $((SECONDS - t0)) s (124/137: timed out)"
grep -vE "^\[stq-metal\]|^llama_|^load|^print_info|^  \[" "$OUT/s31B-e2e.log" | tail -14 | cut -c1-200
