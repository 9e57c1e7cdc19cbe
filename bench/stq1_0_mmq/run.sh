#!/usr/bin/env bash
# STQ1_0 mmq (issue 17 item 2, patch 0034) on the lent H200, one device call from the repo root:
#   run(command="bash .dev/h18/run.sh", carry=[".dev/h18"], timeout_s=600)
# .dev/h18 holds src.tar.xz + src.commit (harness/cuda_device.sh pack of the series with 0034/0035 applied), this
# script and the bench_cuda.py with the prefill workloads. Builds (sm_90, FA off), then tests and a prefill bench,
# each step with its own time limit; logs in $OUT (build.log test.log bench.log bench.json); a summary on stdout.
set -u
H=.dev/h18; W=/tmp/h18; SRC=$W/src; B=$W/build; O=${OUT:-$H/out}; T=$B/bin
mkdir -p "$O" "$SRC"; t0=$SECONDS
{
    echo "== $(date -u +%FT%TZ) build $(cat $H/src.commit)"; nvidia-smi -L; nvcc --version | tail -1
    tar -xJf $H/src.tar.xz -C $SRC
    cmake -S $SRC -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF > /dev/null
    ninja -C $B -j "$(nproc)" test-backend-ops test-mul-mat-batch-invariance test-stq1_0-rp16 2>&1 \
        | grep -Ev '^\[[0-9]+/[0-9]+\] (Building|Linking)'
    echo "== build done, $((SECONDS - t0)) s"
} > $O/build.log 2>&1
tail -4 $O/build.log
{
    echo "== batch invariance n = 1..8 (mmvq / mat-vec kernels untouched)"
    timeout 60 $T/test-mul-mat-batch-invariance -b CUDA0 -t stq1_0 2>&1 | tail -4
    for op in MUL_MAT MUL_MAT_ID; do
        echo "== test-backend-ops -o $op -p stq1_0 ($((SECONDS - t0)) s)"
        timeout 150 $T/test-backend-ops test -b CUDA0 -o $op -p stq1_0 2>&1 | sed 's/\x1b\[[0-9;]*m//g' \
            | grep -E 'stq1_0|tests passed|FAIL'
    done
    echo "== test-stq1_0-rp16 --quick, REPACK=all: RP16 16 columns/tokens now on mmq ($((SECONDS - t0)) s)"
    GGML_CUDA_STQ1_0_REPACK=all timeout 120 $T/test-stq1_0-rp16 -b CUDA0 --quick 2>&1 | tail -15
    echo "== tests done, $((SECONDS - t0)) s"
} > $O/test.log 2>&1
grep -E 'FAIL|tests passed|PASSED|differ|done' $O/test.log | tail -14
grep -E 'n=(9|17|32|33|128|512).*OK' $O/test.log | head -4
PYTHONPATH=. timeout 170 python3 $H/bench_cuda.py --build $B --types stq1_0,q4_0,stq1_0_rp16 \
    --workloads prefill,routed-prefill --rounds 5 --graphs 3 --min-nodes 16 --copy-mb 512 --json $O/bench.json \
    > $O/bench.log 2>&1
tail -9 $O/bench.log; echo "== all done, $((SECONDS - t0)) s"
