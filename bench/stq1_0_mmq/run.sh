#!/usr/bin/env bash
# STQ1_0 prompt batches on CUDA (issue 17: mmq, patch 0034; the RP16 unpack they use, patch 0032) on the lent H200, one
# device call from the repo root, PACK = a folder holding src.tar.xz + src.commit (`bash harness/cuda_device.sh pack
# [LLAMA_DIR]` of the series, copied there) and this script:
#   run(command="bash PACK/run.sh PACK", carry=["PACK"], timeout_s=600)      (e.g. PACK = .dev/h19)
# Builds (sm_90, FA off), runs the batch invariance test (n = 1..8), test-stq1_0-rp16 --quick with every supported
# matrix repacked (get_tensor's round trip through the unpack, 16 columns / tokens unpacked + mmq), test-backend-ops
# -o MUL_MAT / MUL_MAT_ID -p stq1_0, then harness/bench_cuda.py's prefill workloads (512 columns / tokens, stq1_0 vs
# q4_0 vs stq1_0_rp16, AB/BA medians) and per case the unpack's cost: time(stq1_0_rp16) - time(stq1_0) and the GB/s
# that makes (the GGUF bytes read once and written once). Each step has its own time limit, the whole script stays
# under 420 s; logs in $OUT (build.log test.log bench.log bench.json), a summary on stdout.
# (Session 18 ran its two calls with earlier versions of this: c2d500b's as .dev/h18/run.sh, ec579f0's run-h19.sh.)
set -u
H=${1:?usage: run.sh PACK (the folder with src.tar.xz and src.commit)}
[ -f "$H/src.tar.xz" ] && [ -f "$H/src.commit" ] || { echo "run.sh: $H/src.tar.xz or $H/src.commit missing"; exit 2; }
W=/tmp/stq1_0_mmq; SRC=$W/src; B=$W/build; O=${OUT:-$H/out}; T=$B/bin
mkdir -p "$O" "$SRC"; t0=$SECONDS
left() { local l=$((410 - (SECONDS - t0))); echo $(( l < $1 ? (l > 5 ? l : 5) : $1 )); } # whole script < 420 s
{
    echo "== $(date -u +%FT%TZ) build $(cat "$H/src.commit")"; nvidia-smi -L; nvcc --version | tail -1
    tar -xJf "$H/src.tar.xz" -C $SRC
    cmake -S $SRC -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF > /dev/null
    timeout $(left 300) ninja -C $B -j "$(nproc)" test-backend-ops test-mul-mat-batch-invariance test-stq1_0-rp16 2>&1 \
        | grep -Ev '^\[[0-9]+/[0-9]+\] (Building|Linking)'
    echo "== build done, $((SECONDS - t0)) s"
} > $O/build.log 2>&1
tail -4 $O/build.log
{
    echo "== batch invariance n = 1..8 (the mat-vec kernels)"
    timeout $(left 60) $T/test-mul-mat-batch-invariance -b CUDA0 -t stq1_0 2>&1 | tail -4
    echo "== test-stq1_0-rp16 --quick, REPACK=all: get_tensor round trip (unpack), 16 columns/tokens unpacked + mmq"
    GGML_CUDA_STQ1_0_REPACK=all timeout $(left 60) $T/test-stq1_0-rp16 -b CUDA0 --quick 2>&1 \
        | grep -E 'FAIL|PASSED|n=16|tokens=16'
    for op in MUL_MAT MUL_MAT_ID; do
        echo "== test-backend-ops -o $op -p stq1_0 ($((SECONDS - t0)) s)"
        timeout $(left 80) $T/test-backend-ops test -b CUDA0 -o $op -p stq1_0 2>&1 | sed 's/\x1b\[[0-9;]*m//g' \
            | grep -E 'stq1_0|tests passed|FAIL'
    done
    echo "== tests done, $((SECONDS - t0)) s"
} > $O/test.log 2>&1
grep -E 'FAIL|tests passed|PASSED|differ|OK:|done' $O/test.log | tail -14
PYTHONPATH=. timeout $(left 100) python3 harness/bench_cuda.py --build $B --types stq1_0,q4_0,stq1_0_rp16 \
    --workloads prefill,routed-prefill --rounds 5 --graphs 3 --min-nodes 16 --copy-mb 512 --json $O/bench.json \
    > $O/bench.log 2>&1
tail -9 $O/bench.log
python3 - "$O/bench.json" <<'PY' 2>&1 | tee -a $O/bench.log
import json, sys
res = json.load(open(sys.argv[1]))["results"]
t = {(r["case"], r["type"]): r for r in res}
for case in dict.fromkeys(r["case"] for r in res):
    a, b = t.get((case, "stq1_0")), t.get((case, "stq1_0_rp16"))
    if a and b:
        d = b["median_us"] - a["median_us"]
        gbs = 2*a["bytes_per_call"]/(d*1e3) if d > 0 else float("nan")
        mb = a["bytes_per_call"]/1e6
        print(f"unpack {case}: rp16 - plain = {d:.1f} us for {mb:.1f} MB -> {gbs:.0f} GB/s (read + write)")
PY
echo "== all done, $((SECONDS - t0)) s"
