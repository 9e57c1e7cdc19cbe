#!/usr/bin/env bash
# STQ1_0 RP16 unpack kernel (helper h19, patch 0032: tiles through shared memory, coalesced loads and stores) on the
# lent H200, one device call from the repo root:
#   run(command="bash .dev/h19/run.sh", carry=[".dev/h19"], timeout_s=600)
# .dev/h19 holds src.tar.xz + src.commit (harness/cuda_device.sh pack of the series with the new unpack kernel) and this
# script (= bench/stq1_0_mmq/run-h19.sh); the bench is the repo's harness/bench_cuda.py. Builds (sm_90, FA off), then
# tests and the prefill bench, each step with its own time limit; logs in $OUT (build.log test.log bench.log
# bench.json); a summary on stdout, ending with the unpack's cost: time(stq1_0_rp16) - time(stq1_0) per case and the
# GB/s that makes (the GGUF bytes read once and written once).
set -u
H=.dev/h19; W=/tmp/h19; SRC=$W/src; B=$W/build; O=${OUT:-$H/out}; T=$B/bin
mkdir -p "$O" "$SRC"; t0=$SECONDS
left() { local l=$((410 - (SECONDS - t0))); echo $(( l < $1 ? (l > 5 ? l : 5) : $1 )); } # whole script < 420 s
{
    echo "== $(date -u +%FT%TZ) build $(cat $H/src.commit)"; nvidia-smi -L; nvcc --version | tail -1
    tar -xJf $H/src.tar.xz -C $SRC
    cmake -S $SRC -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF > /dev/null
    timeout $(left 300) ninja -C $B -j "$(nproc)" test-backend-ops test-stq1_0-rp16 2>&1 \
        | grep -Ev '^\[[0-9]+/[0-9]+\] (Building|Linking)'
    echo "== build done, $((SECONDS - t0)) s"
} > $O/build.log 2>&1
tail -4 $O/build.log
{
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
grep -E 'FAIL|tests passed|PASSED|differ|done' $O/test.log | tail -14
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
