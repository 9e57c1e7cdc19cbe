#!/usr/bin/env bash
# session 35, call B (cold): issue 14's "at 0.75 accepted per draft >= 1.6x greedy megakernel" as a measured point
# (session 34 had k = 3 at 0.791 (noise 38) and 0.659 (noise 40) only, 0.75 interpolated): main (352e0f3), E4B-shaped
# Q4_0 pair, k = 3 at noise 38.5 and 39, k = 2 at noise 38.5, backend sampling, each against its own greedy megakernel:
#   run(command="bash bench/megakernel-h200-2026-12-05/s35-callB.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"],
#       timeout_s=600, kind="nvidia-h100-x1")
set -u
t0=$SECONDS
left() { echo $((${MK_CAP:-585} - (SECONDS - t0))); }
export MK_TARGETS="llama-bench llama-server" MK_MODELS="e4b-mtp"
W=/tmp/stq-mk; M=$W/models/e4b-mtp.gguf; B=$W/build/bin
bash megakernel/device.sh build models > "$OUT/s35B-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
[ $rc -eq 0 ] || { grep -E "^== |error" "$OUT/s35B-build.log" | tail -8; exit 1; }
for kn in 3:38.5 3:39 2:38.5; do
    k=${kn%%:*}; n=${kn#*:}
    cap=$(( $(left) - 5 )); [ $cap -lt 70 ] && break
    echo "== $(date -u +%T) e2e k = $k noise $n, backend sampling, cap $cap s"
    STQ_METAL_CACHE="$W/cache" PYTHONPATH="$W/src/gguf-py:$PWD" timeout -k 5 $cap \
        python3 -m harness.bench_mtp --bin "$B" --target "$M" --assistant "$W/models/e4b-mtp-assistant.gguf" \
        --k $k --rounds 2 -n 128 --noise $n --no-graph --backend-sampling --json "$OUT/s35B-e2e-k$k-n$n.json" \
        > "$OUT/s35B-e2e-k$k-n$n.log" 2>&1
    echo "== e2e rc=$? at $((SECONDS - t0)) s (124/137: timed out)"
    grep -E "^noise" -A4 "$OUT/s35B-e2e-k$k-n$n.log" | cut -c1-170
done
gzip -9 "$OUT"/s35B-*.log 2>/dev/null
echo "== done at $((SECONDS - t0)) s"
