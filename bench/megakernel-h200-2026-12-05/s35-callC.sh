#!/usr/bin/env bash
# session 35, call C (cold): issue 14 on the E2B-shaped pair with main (352e0f3; last measured in session 24 with the
# kernel of then): greedy tg32 megakernel vs graph (test-mk AB/BA), then end to end k = 2 and 3 at noise 26 and 25
# (session 24: noise 26 gave 0.751 at k = 2), the graph's greedy and draft-mtp in the same runs, backend sampling:
#   run(command="bash bench/megakernel-h200-2026-12-05/s35-callC.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"],
#       timeout_s=600, kind="nvidia-h100-x1")
# (MK_TG=0 skips the tg32 step, MK_LEVELS="26" runs one noise level: how session 35 ran it, with little device time left; MK_MIN: the least cap an e2e level starts with, MK_E2E_EXTRA: more bench_mtp arguments, e.g. --no-graph)
set -u
t0=$SECONDS
left() { echo $((${MK_CAP:-585} - (SECONDS - t0))); }
export MK_TARGETS="llama-bench llama-server" MK_MODELS="e2b-mtp"
W=/tmp/stq-mk; M=$W/models/e2b-mtp.gguf; B=$W/build/bin
bash megakernel/device.sh build models > "$OUT/s35C-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
[ $rc -eq 0 ] || { grep -E "^== |error" "$OUT/s35C-build.log" | tail -8; exit 1; }
[ "${MK_TG:-1}" = 1 ] && timeout -k 5 90 $B/test-mk -m $M -n 16 --rounds 2 --bench-n 32 --max-nmse 10 --max-disagree 1000 > "$OUT/s35C-tg32.log" 2>&1
echo "== tg32 (MK_TG=${MK_TG:-1}) rc=$? at $((SECONDS - t0)) s"; grep -E "^speed|verify ==|greedy|test-mk:" "$OUT/s35C-tg32.log" | cut -c1-200
for n in ${MK_LEVELS:-26 25}; do
    cap=$(( $(left) - 5 )); [ $cap -lt ${MK_MIN:-90} ] && break
    echo "== $(date -u +%T) e2e k = 2,3 noise $n, graph too, backend sampling, cap $cap s"
    STQ_METAL_CACHE="$W/cache" PYTHONPATH="$W/src/gguf-py:$PWD" timeout -k 5 $cap \
        python3 -m harness.bench_mtp --bin "$B" --target "$M" --assistant "$W/models/e2b-mtp-assistant.gguf" \
        --k 2,3 --rounds 2 -n 128 --noise $n --backend-sampling ${MK_E2E_EXTRA:-} --json "$OUT/s35C-e2e-n$n.json" \
        > "$OUT/s35C-e2e-n$n.log" 2>&1
    echo "== e2e rc=$? at $((SECONDS - t0)) s (124/137: timed out)"
    grep -E "^noise" -A9 "$OUT/s35C-e2e-n$n.log" | cut -c1-170
done
cat "$OUT"/s35C-*.log | gzip -9 > "$OUT/s35C-logs.txt.gz"; rm -f "$OUT"/s35C-*.log
echo "== done at $((SECONDS - t0)) s"
