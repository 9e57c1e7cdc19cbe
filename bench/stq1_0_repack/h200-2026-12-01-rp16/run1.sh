#!/bin/bash
# issue 17 helper rp16: one device call = build (ggml-cuda + tests), RP16 correctness, bench, memcheck.
#   bash .dev/h17b/run.sh        (from the repo root; results under $OUT)
set -u
H=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/h17b-out}; mkdir -p "$OUT"
W=/tmp/h17b; SRC=$W/src; BLD=$W/build
T0=$SECONDS
left() { echo $(( ${BUDGET:-330} - (SECONDS - T0) )); }
{
echo "== $(date -u +%FT%TZ) $(cat "$H/src.commit")"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
nvcc --version | tail -1
if [ ! -f "$SRC/.ok" ]; then rm -rf "$SRC"; mkdir -p "$SRC"; tar -xJf "$H/src.tar.xz" -C "$SRC" && touch "$SRC/.ok"; fi
cmake -S "$SRC" -B "$BLD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF > /dev/null
t=$SECONDS
ninja -C "$BLD" -j "$(nproc)" test-stq1_0-rp16 test-mul-mat-batch-invariance test-backend-ops 2>&1 | grep -Ev '^\[[0-9]+/[0-9]+\] (Building|Linking)' | tail -40
echo "== build $((SECONDS - t)) s"
} > "$OUT/build.log" 2>&1
tail -3 "$OUT/build.log"
test -x "$BLD/bin/test-stq1_0-rp16" || { echo "BUILD FAILED"; tail -60 "$OUT/build.log"; exit 3; }
{
echo "== $(date -u +%FT%TZ) test-stq1_0-rp16 (full)"
timeout 120 "$BLD/bin/test-stq1_0-rp16" -b CUDA0; echo "rc=$?"
echo "== GGML_CUDA_STQ1_0_REPACK=0"
GGML_CUDA_STQ1_0_REPACK=0 timeout 30 "$BLD/bin/test-stq1_0-rp16" -b CUDA0 --quick; echo "rc=$? (77 = skipped: expected)"
echo "== test-mul-mat-batch-invariance stq1_0 (ordinary buffers)"
timeout 60 "$BLD/bin/test-mul-mat-batch-invariance" -b CUDA0 -t stq1_0 2>&1 | tail -4; echo "rc=$?"
} > "$OUT/test.log" 2>&1
grep -E "FAIL|PASSED|FAILED|rc=|SKIP" "$OUT/test.log" | head -30
{
echo "== $(date -u +%FT%TZ) bench (left $(left) s)"
timeout $(( $(left) - 60 )) python3 "$H/harness/bench_cuda.py" --build "$BLD" --types stq1_0_rp16,stq1_0,q4_0 \
    --workloads big,verify,routed --rounds 7 --json "$OUT/bench.json"; echo "rc=$?"
} > "$OUT/bench.log" 2>&1
tail -16 "$OUT/bench.log"
{
echo "== $(date -u +%FT%TZ) memcheck test-stq1_0-rp16 --quick (left $(left) s)"
timeout $(( $(left) - 25 )) compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 "$BLD/bin/test-stq1_0-rp16" -b CUDA0 --quick 2>&1 | tail -6; echo "rc=$?"
echo "== $(date -u +%FT%TZ) test-backend-ops MUL_MAT stq1_0 (left $(left) s)"
timeout $(( $(left) - 5 )) "$BLD/bin/test-backend-ops" test -b CUDA0 -o MUL_MAT -p stq1_0 2>&1 | grep -E "tests passed|FAIL" | tail -5; echo "rc=$?"
} > "$OUT/extra.log" 2>&1
cat "$OUT/extra.log"
echo "== total $((SECONDS - T0)) s"
