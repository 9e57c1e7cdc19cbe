#!/usr/bin/env bash
# session 20 call C (cold): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# 1. issue 12 item 4: compute-sanitizer racecheck of the decode/verify kernel, as device.sh's sanitize stage now runs it
#    (one block, only the megakernel's kernels instrumented; call B's run with every kernel instrumented did not finish
#    in 324 s), capped by the time left
# 2. the per-phase profile of verify launches M = 1..5 on the E4B-shaped pair after session 19's small-batch code
#    (where the verify's extra time goes now: the next lever), if time is left
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench" MK_MODELS="small-f16"
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models
bash megakernel/device.sh build models > "$OUT/callC-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
[ $rc -eq 0 ] || { tail -20 "$OUT/callC-build.log"; exit 1; }
compute-sanitizer --version | tail -1
compute-sanitizer --help | grep -i -A4 -- "--kernel-name" | head -12
cap=$((550 - 110 - (SECONDS - t0))); [ $cap -lt 60 ] && cap=60
echo "== $(date -u +%T) racecheck, cap $cap s"
MK_SAN_TOOLS=racecheck MK_SAN_CAP=$cap bash megakernel/device.sh sanitize 2>&1 | tail -14
echo "== racecheck stage rc=${PIPESTATUS[0]} at $((SECONDS - t0)) s"
if [ $((SECONDS - t0)) -lt 460 ]; then
    MK_MODELS=e4b-mtp timeout 80 bash megakernel/device.sh models > "$OUT/callC-models.log" 2>&1
    echo "== e4b-mtp model rc=$? at $((SECONDS - t0)) s"
    cap=$((550 - (SECONDS - t0))); [ $cap -lt 10 ] && cap=10
    MK_MODELS=e4b-mtp MK_PROF_ARGS="--rounds 2 --verify-cost" MK_PROF_LINES=130 timeout $cap bash megakernel/device.sh profile \
        > "$OUT/callC-profile.log" 2>&1
    echo "== profile rc=$? at $((SECONDS - t0)) s"
    grep -E "steps of|M=[14] " "$OUT/callC-profile.log" | cut -c1-160 | head -60
fi
