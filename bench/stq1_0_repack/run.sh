#!/bin/bash
# Device side of the STQ1_0 repack micro-benchmark: build (with the 0031 kernel from the carried ggml headers),
# run every case twice (process order A then B), optionally ncu on three kernels. Results under $OUT.
#   bash run.sh [ncu]      (from the folder holding mb.cu, ggml/ and cuhdr/)
set -u
OUT=${OUT:-/tmp/mb-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
nvcc --version | tail -2
INC="-DWITH_BASELINE -DGGML_USE_CUDA -I ggml/src -I ggml/include -I ggml/src/ggml-cuda -Xcompiler -idirafter -Xcompiler cuhdr"
( time nvcc -std=c++17 -O3 -arch=sm_90 -Xptxas -v $INC mb.cu -o mb ) > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 3; }
grep -E "registers|spill" "$OUT/build.log" | sort | uniq -c | head -5
set -o pipefail
MB_CSV=$OUT/run1.csv ./mb all ${MB_ROUNDS:-20} ${MB_REPS:-30} 2>&1 > "$OUT/run1.log" || { echo "run1 failed: $?"; exit 4; }
MB_CSV=$OUT/run2.csv ./mb all ${MB_ROUNDS:-20} ${MB_REPS:-30} > "$OUT/run2.log" 2>&1 || { echo "run2 failed: $?"; tail -20 "$OUT/run2.log"; exit 5; }
grep -E "^==|^variant|^(base|mma|dp4a|load|diag)" "$OUT/run2.log"
if [ "${1:-}" = ncu ]; then
    MB_ONLY=${NCU_ONLY:-mma-ks4-rpc1-pf1,mma-mt2-ks4-rpc1} timeout 100 ncu --clock-control none \
        --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        -k regex:'k_rp16|mul_mat_vec_stq1_0' --launch-count ${NCU_COUNT:-3} ./mb big 1 1 > "$OUT/ncu.log" 2>&1
    echo "ncu rc=$?"
    grep -E "k_rp16|mul_mat_vec_stq1_0|Duration|Issue Slots Busy|Issued Ipc|No Eligible|Warp Cycles Per Issued|Achieved Occupancy|Memory Throughput|DRAM Throughput|Registers Per|Pipe|pipe" "$OUT/ncu.log" | head -60
fi
