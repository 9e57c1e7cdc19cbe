#!/usr/bin/env bash
# Session 35 (RAN 22:33 UTC on an H100, cold, 42 s; results in NOTES.md "Session 35", logs s35/s35n-*): floor.cu's
# staging study (--stage): per phase, the inputs staged by every block with the kernel's own mk_stage / mk_stage_cols
# against staged once for the grid (each block rounds its slice to 8-bit records, one bulk copy of them per block; the
# normed inputs pay a second grid barrier), M = 1..4, E4B's widths (2560 / 10240) and E2B's (1536 / 6144), 339 phases,
# no weights. Reading: "once / every block" well below 1 at M = 3..4 (and not above 1 at M = 1) says the next build is
# the staging once for the grid; near or above 1, the staging's repeated work is not the lever.
#   run(command="bash bench/megakernel-h200-2026-12-05/s35-next.sh", carry=[".dev/cuda"], timeout_s=400,
#       kind="nvidia-h100-x1")
set -u
t0=$SECONDS
W=/tmp/stq-mk; S=$W/src
mkdir -p "$S" && tar -xJf .dev/cuda/src.tar.xz -C "$S" || exit 1
nvcc -std=c++17 -O3 -arch=sm_90 -I"$S/ggml/src" -I"$S/ggml/include" -Imegakernel -Imegakernel/cuda \
    bench/megakernel-floor/floor.cu -o "$W/floor" > "$OUT/s35n-floor-build.log" 2>&1 || { tail -20 "$OUT/s35n-floor-build.log"; exit 1; }
echo "== floor built at $((SECONDS - t0)) s"
yes "16 phase" | head -339 > "$W/phases-339.txt"
timeout -k 5 60 "$W/floor" --phases "$W/phases-339.txt" --stage --quick || { echo "== quick run failed rc=$?"; exit 1; }
for kk in "2560 10240" "1536 6144"; do
    set -- $kk
    echo "== $(date -u +%T) K $1, KF $2"
    timeout -k 5 120 "$W/floor" --phases "$W/phases-339.txt" --stage --reps 20 --k $1 --k-ff $2 | tee "$OUT/s35n-stage-$1.log"
done
echo "== done at $((SECONDS - t0)) s"
