#!/usr/bin/env bash
# mv_mma.cu on the lent GPU: the body of a device call (bench/megakernel-h200-*/s39-call*.sh name what each ran).
#   bash bench/megakernel-floor/mv_mma-device.sh [--reps N] NAME=FLAGS ... -- SHAPE ...
# Every build NAME (nvcc with FLAGS, e.g. "a8r2=-DMV_AP_PAIRS=8 -DMV_RING=2", "base=" for none) is compiled at once,
# then run on every SHAPE (mv_mma's options, one quoted word each: "--rows 10240 --k 2560 --cols 8 --mats 33").
# Needs .dev/cuda/src.tar.xz (harness/cuda_device.sh pack: the headers mk-kernel.cuh includes); the output also goes to
# $OUT/mv_mma.log.
set -u
reps=7
if [ "${1:-}" = --reps ]; then reps=$2; shift 2; fi
builds=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do builds+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
[ ${#builds[@]} -gt 0 ] && [ $# -gt 0 ] || { echo "usage: $0 [--reps N] NAME=FLAGS ... -- SHAPE ..." >&2; exit 2; }
: "${OUT:?OUT: the folder the device call brings back (run this through the device tool, which sets it)}"
S=/tmp/stq-mv/src
mkdir -p $S && tar -xJf .dev/cuda/src.tar.xz -C $S || exit 1
for b in "${builds[@]}"; do
    nvcc -std=c++17 -O3 -arch=sm_90 ${b#*=} -I$S/ggml/src -I$S/ggml/include -Imegakernel -Imegakernel/cuda \
        bench/megakernel-floor/mv_mma.cu -o "/tmp/stq-mv/mv_${b%%=*}" > "/tmp/stq-mv/nvcc_${b%%=*}.log" 2>&1 &
done
wait
for b in "${builds[@]}"; do
    for shape in "$@"; do
        echo "== ${b%%=*}: $shape" | tee -a "$OUT/mv_mma.log"
        "/tmp/stq-mv/mv_${b%%=*}" $shape --reps "$reps" 2>&1 | tee -a "$OUT/mv_mma.log" || tail -5 "/tmp/stq-mv/nvcc_${b%%=*}.log"
    done
done
