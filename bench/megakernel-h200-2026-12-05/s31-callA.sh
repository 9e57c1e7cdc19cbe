#!/usr/bin/env bash
# session 31, call A (written in session 30 as "s30-callB.sh"; session 31 added the floor's pipelines). RAN 10:07 UTC on
# an H100 (run(..., kind="nvidia-h100-x1")): NOTES.md "Session 31", logs in s31/. As first call of a session (cold):
#   run(command="bash bench/megakernel-h200-2026-12-05/s31-callA.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"],
#       timeout_s=600)
# 1. issue 12's design question: bench/megakernel-floor/floor.cu on the E4B phase list, with its two pipelines that carry
#    the weight stream across the grid barriers (session 31): "tiles" = the megakernel's own (per-warp stages, the next
#    phase's first tiles before the barrier), "ring" = one producer warp per SM running ahead by the ring's size. If the
#    ring's floor is far below the tiles' (session 24's plain floor: 1683 us = 594 tok/s), the >= 920 tok/s goal needs
#    that producer/consumer form; if not, no weight pipeline reaches it on this GPU with a grid barrier per phase.
#    A --quick smoke run first (a bug in the pipelines traps after a bounded wait instead of holding the call).
# 2. (beside the floor's compile, and after the floor) a verify batch (2..8 tokens) staged over clusters of 2 blocks (GGML_MK_VAR_CLUSTER_STAGE 0x10000000, the candidate,
#    off by default when this ran; since a1f2672 the default, and 0x10000000 means the unclustered staging) against the default, test-mk checks + verify cost, processes in the order default, candidate,
#    candidate, default, as many as the call's time allows (call B runs the rest); the candidate's processes check
#    verify == decode bitwise M = 2..8 with the clustered launches (a line "llama_mk: ... cluster" says whether it ran
#    clustered or fell back)
set -u
t0=$SECONDS
left() { echo $((${MK_CAP:-585} - (SECONDS - t0))); }
export MK_MODELS="e4b-mtp"
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models
bash megakernel/device.sh build models > "$OUT/s31A-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
grep -E "^== |error" "$OUT/s31A-build.log" | tail -4
[ $rc -eq 0 ] || exit 1

# the floor's nvcc compile (it includes the whole kernel: ~1-2 min on one core) runs beside the first verify processes
PYTHONPATH=$W/src/gguf-py python3 bench/megakernel-floor/phases.py "$M/e4b-mtp.gguf" > "$OUT/phases-e4b.txt" 2> "$OUT/phases-e4b.err"
tail -1 "$OUT/phases-e4b.err"
nvcc -std=c++17 -O3 -arch=sm_90 -I$W/src/ggml/src -I$W/src/ggml/include -Imegakernel -Imegakernel/cuda \
    bench/megakernel-floor/floor.cu -o $W/floor > "$OUT/s31A-floor-build.log" 2>&1 &
floor_pid=$!

verify() {   # process $1 of the order, variant $2
    LLAMA_MEGAKERNEL_VARIANT=$2 timeout 70 "$B/test-mk" -m "$M/e4b-mtp.gguf" -n 16 --rounds 1 --bench-n 32 --max-nmse 10 \
        --max-disagree 100 --verify-cost > "$OUT/s31A-verify-$1-$2.log" 2>&1
    echo "== $1 variant $2 rc=$? at $((SECONDS - t0)) s"
    grep -E "NMSE|greedy|verify ==|verify cost \(mega|test-mk:|cluster|variant|FAIL" "$OUT/s31A-verify-$1-$2.log" | cut -c1-200 | tail -7
}
verify 1 0
verify 2 0x10000000

wait $floor_pid
echo "== floor built rc=$? at $((SECONDS - t0)) s"; grep -E "error" "$OUT/s31A-floor-build.log" | head -5
if [ -x $W/floor ] && [ -s "$OUT/phases-e4b.txt" ]; then
    timeout 40 $W/floor --phases "$OUT/phases-e4b.txt" --k 2560 --quick > "$OUT/s31A-floor-quick.log" 2>&1
    rc=$?
    echo "== floor --quick rc=$rc at $((SECONDS - t0)) s"; cut -c1-160 "$OUT/s31A-floor-quick.log" | tail -20
    if [ $rc -eq 0 ]; then
        timeout 150 $W/floor --phases "$OUT/phases-e4b.txt" --k 2560 --reps 20 > "$OUT/s31A-floor.log" 2>&1
        echo "== floor rc=$? at $((SECONDS - t0)) s"; cut -c1-160 "$OUT/s31A-floor.log"
    fi
fi

for i in 3 4; do
    v=0x10000000; [ $i = 4 ] && v=0
    [ "$(left)" -lt 80 ] && { echo "== verify process $i ($v) and later: no time left, call B runs them (MK_VERIFY_FROM=$i)"; break; }
    verify $i $v
done
echo "== done at $((SECONDS - t0)) s"
