#!/usr/bin/env bash
# CUDA on the lent GPU machine, in as few device calls as possible.
#
# Here (no GPU needed):
#   harness/cuda_device.sh pack [TREE]
#       TREE: a llama.cpp tree with the series applied (default: the harness's applied tree,
#       `python3 harness/build.py --apply`). Packs its tracked files, without .git, models/, docs/,
#       media/, examples/ and the other GPU backends, into .dev/cuda/src.tar.xz (~7 MB; .dev/ is
#       ignored by git and is carried to the device by naming it in `carry`).
#
# There (through the device tool, from the repo root; the machine stays warm ~30 s between calls, and a
# warm machine keeps /tmp/stq-cuda/{src,build}, so a second call within that window skips the build):
#   run(command="bash harness/cuda_device.sh remote all", carry=[".dev"], timeout_s=600)
#       stages (any subset, in this order): build test sanitize bench ncu rpc  ("all" = build test sanitize bench)
#       mmv (issue 17): the STQ1_0 cp.async mat-vec kernel: batch invariance (default dispatch: MUL_MAT on the
#       kernel, MUL_MAT_ID on mmvq; and GGML_CUDA_STQ1_0_MMV=id: both on the kernel) and test-backend-ops MUL_MAT /
#       MUL_MAT_ID with it (id) and with mmvq (0), then bench_cuda.py new/old/old/new (GGML_CUDA_STQ1_0_MMV=id/0,
#       so the routed case compares the kernels too) and the one-column variants (STQ_MMV_VARIANTS, default "r2 r8 w2 s2 s8"; STQ_MMV_ROUNDS, default 5;
#       STQ_MMV_SANITIZE=1 adds memcheck) -> mmv.log, mmv-ab*.json (4 files); about 4 minutes after the build
#       rpc: its own -DGGML_RPC=ON build; test-backend-ops -b RPC0 against a CUDA rpc-server on loopback
#       (STQ_RPC_MODEL=FILE.gguf on the device adds harness/bench_rpc.py: CUDA local vs through rpc;
#       STQ_RPC_BUILD=DIR reuses a build with -DGGML_RPC=ON and those targets, e.g. megakernel/device.sh's)
#       sanitize: compute-sanitizer memcheck, racecheck and synccheck over the STQ1_0 kernels (mmq prompt batches,
#       the RP16 unpack and mat-vec, the mat-vec kernels, GET_ROWS, CPY), each step under its own timeout, one line
#       per step (status, the tool's ERROR SUMMARY, seconds; "TIMED OUT" when killed) and a table at the end ->
#       sanitize.log; the tools' whole output -> sanitize-raw.log
#       logs and results go to $OUT (at most 8 files come back): build.log, test.log, sanitize.log,
#       sanitize-raw.log, bench.log, bench.json, ncu.log
#
# Environment (remote): STQ_CUDA_FA=ON builds the FlashAttention kernels too (default OFF: they cost
# minutes of build time and no STQ1_0 path uses them); STQ_CUDA_JOBS (default: nproc); STQ_CUDA_DEADLINE=S: the
# sanitize steps end by S seconds after `remote` started (a step not started for want of time says SKIPPED), e.g.
# STQ_CUDA_DEADLINE=555 for `remote build sanitize` in one 600 s call.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEV="$HERE/.dev/cuda"

pack() {
    local tree="${1:-}"
    if [ -z "$tree" ]; then
        tree="$(cd "$HERE" && python3 -c 'from harness import config; print(config.default_tree())')"
    fi
    if ! git -C "$tree" rev-parse --git-dir >/dev/null 2>&1; then
        echo "error: $tree is not a git work tree (apply the series first: python3 harness/build.py --apply)" >&2
        exit 1
    fi
    if [ -n "$(git -C "$tree" status --porcelain --untracked-files=no)" ]; then
        echo "warning: $tree has uncommitted changes; packing the working files as they are" >&2
    fi
    mkdir -p "$DEV"
    local list tmp
    list="$(mktemp)"
    tmp="$DEV/src.tar.xz.tmp"
    git -C "$tree" ls-files -z | tr '\0' '\n' | grep -Ev \
        -e '^(models|docs|media|examples|\.github|\.devops|gguf-py/tests|tools/server/public|tools/server/webui)/' \
        -e '^ggml/src/ggml-(metal|vulkan|sycl|opencl|cann|webgpu|hip|musa|zdnn|kompute|zendnn|virtgpu|openvino|hexagon)/' \
        > "$list" || true
    # test-backend-ops and the tokenizer tests reference a few model files by path only; nothing reads them
    (cd "$tree" && tar --no-recursion -cJf "$tmp" -T "$list")
    mv "$tmp" "$DEV/src.tar.xz"
    rm -f "$list"
    (cd "$tree" && git log -1 --format='%H %s') > "$DEV/src.commit"
    echo "packed $(wc -c < "$DEV/src.tar.xz") bytes from $tree ($(cut -c1-12 "$DEV/src.commit")) into $DEV/src.tar.xz"
}

remote() {
    local stages="${*:-all}"
    t_remote=$SECONDS
    [ "$stages" = "all" ] && stages="build test sanitize bench"
    local out="${OUT:-$DEV/out}"
    mkdir -p "$out"
    # outside the carried .dev (a call that carries .dev replaces it there): kept while the machine is warm
    local work="${STQ_CUDA_WORK:-/tmp/stq-cuda}"
    local src="$work/src" bld="$work/build"
    local jobs="${STQ_CUDA_JOBS:-$(nproc)}"
    export PYTHONUNBUFFERED=1

    if [ ! -f "$DEV/src.tar.xz" ]; then
        echo "error: $DEV/src.tar.xz is missing: run 'harness/cuda_device.sh pack' here and carry .dev" >&2
        exit 1
    fi
    # unpack only when the tarball changed (a warm machine keeps the tree and the build)
    local sum
    sum="$(sha256sum "$DEV/src.tar.xz" | cut -c1-16)"
    if [ ! -f "$src/.packed-$sum" ]; then
        rm -rf "$src"
        mkdir -p "$src"
        tar -xJf "$DEV/src.tar.xz" -C "$src"
        # interim, until the series' test-backend-ops has STQ1_0 cases (patch 0004): test STQ1_0 wherever
        # test-backend-ops loops over all quantized types (device copy only; the series is not changed)
        if ! grep -q GGML_TYPE_STQ1_0 "$src/tests/test-backend-ops.cpp"; then
            sed -i 's/^    GGML_TYPE_IQ4_NL, GGML_TYPE_IQ3_S, GGML_TYPE_IQ4_XS,$/&\n    GGML_TYPE_STQ1_0, \/\/ interim (cuda_device.sh)/' "$src/tests/test-backend-ops.cpp"
            grep -q GGML_TYPE_STQ1_0 "$src/tests/test-backend-ops.cpp" && echo "note: interim STQ1_0 entry added to all_types of test-backend-ops (no patch 0004 yet)"
        fi
        touch "$src/.packed-$sum"
    fi

    for st in $stages; do
        case "$st" in
        build)
            {
                echo "== $(date -u +%FT%TZ) build ($(cat "$DEV/src.commit" 2>/dev/null || echo '?'))"
                nvidia-smi -L || true
                nvcc --version | tail -2
                echo "ccache: $(command -v ccache || echo absent)"
                cmake -S "$src" -B "$bld" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
                    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA="${STQ_CUDA_FA:-OFF}" \
                    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
                    -DLLAMA_BUILD_TESTS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF > /dev/null
                local t0=$SECONDS
                ninja -C "$bld" -j "$jobs" test-backend-ops test-mul-mat-batch-invariance test-stq1_0-rp16 2>&1 | grep -Ev '^\[[0-9]+/[0-9]+\] (Building|Linking)' || true
                test -x "$bld/bin/test-mul-mat-batch-invariance"
                echo "== build done in $((SECONDS - t0)) s"
            } 2>&1 | tee -a "$out/build.log"
            ;;
        test)
            {
                echo "== $(date -u +%FT%TZ) batch invariance"
                "$bld/bin/test-mul-mat-batch-invariance" -b CUDA0 -t stq1_0 || echo "!! stq1_0 batch invariance FAILED"
                "$bld/bin/test-mul-mat-batch-invariance" -b CUDA0 -t q4_0 --expect-variant || echo "!! q4_0 control FAILED"
                echo "== $(date -u +%FT%TZ) test-backend-ops (STQ1_0 cases)"
                for op in MUL_MAT MUL_MAT_ID GET_ROWS CPY; do
                    "$bld/bin/test-backend-ops" test -b CUDA0 -o "$op" -p stq1_0 2>&1 | grep -E 'stq1_0|tests passed|FAIL|not supported' | grep -v ': OK$' | tail -40 || true
                done
                echo "== $(date -u +%FT%TZ) pytest tests/test_cuda_stq1_0.py tests/test_cuda_stq1_0_rp16.py"
                (cd "$HERE" && STQ_CUDA_BUILD="$bld" python3 -m pytest -q -p no:cacheprovider tests/test_cuda_stq1_0.py \
                    tests/test_cuda_stq1_0_rp16.py -rs 2>&1 | tail -40) || true
            } 2>&1 | tee -a "$out/test.log"
            ;;
        sanitize)
            # compute-sanitizer over the STQ1_0 CUDA kernels (issue 17 item 3): memcheck, racecheck (shared-memory
            # hazards: the mmq tiles, the RP16 unpack's swizzled tiles, the mat-vec reductions) and synccheck. One
            # line per step (tool, case, status, the tool's ERROR SUMMARY, seconds), each step under its own
            # `timeout` (cap below, cut to what is left before STQ_CUDA_DEADLINE, seconds since `remote` started),
            # a table at the end; the tools' whole output goes to sanitize-raw.log. A timed-out step says so.
            {
                cd "$HERE"
                local rows="$work/san-rows.txt" raw_all="$out/sanitize-raw.log"
                : > "$rows"
                echo "== $(date -u +%FT%TZ) compute-sanitizer (memcheck, racecheck, synccheck) over the STQ1_0 kernels"
                nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
                nvcc --version | tail -2 || true
                compute-sanitizer --version 2>&1 | tail -2 || true
                echo "deadline: ${STQ_CUDA_DEADLINE:-none} s after the start of 'remote' (now $((SECONDS - t_remote)) s)"
                # the prompt-batch (mmq) cases of test-backend-ops: n >= 9 columns (MUL_MAT) or tokens (MUL_MAT_ID);
                # 1..8 take the mat-vec kernels. -p is a regex searched in the case's parameter string
                local mmq_p='stq1_0,.*,m=[0-9]+,n=(9|[1-9][0-9]+),k='
                echo "MMQ below = test-backend-ops -p '$mmq_p'"
                local tbo="$bld/bin/test-backend-ops" rp16="$bld/bin/test-stq1_0-rp16" bi="$bld/bin/test-mul-mat-batch-invariance"
                # san_step TOOL CAP_S LABEL [VAR=VALUE ...] -- PROGRAM ARGS...
                san_step() {
                    local tool=$1 cap=$2 label=$3
                    shift 3
                    local envs=()
                    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
                    shift
                    local lim=$cap n
                    if [ -n "${STQ_CUDA_DEADLINE:-}" ]; then
                        local left=$((STQ_CUDA_DEADLINE - (SECONDS - t_remote) - 15))
                        if [ "$left" -lt "$lim" ]; then lim=$left; fi
                    fi
                    n=$(($(wc -l < "$rows") + 1))
                    echo "-- [$n] $(date -u +%TZ) $tool: $label (limit ${lim} s)"
                    if [ "$lim" -lt 15 ]; then
                        echo "   SKIPPED: not started, ${lim} s left before the deadline"
                        printf '%s\t%s\t%s\t%s\t%s\n' "$tool" "$label" "SKIPPED (deadline)" - - >> "$rows"
                        return 0
                    fi
                    local opts=(--tool "$tool" --error-exitcode 3 --print-limit 50)
                    if [ "$tool" = memcheck ]; then opts+=(--leak-check no); fi
                    local f="$work/san-$n.txt" t0=$SECONDS rc=0
                    env ${envs[@]+"${envs[@]}"} timeout -k 10 "$lim" compute-sanitizer "${opts[@]}" "$@" > "$f" 2>&1 || rc=$?
                    local dt=$((SECONDS - t0)) status summ
                    sed -i 's/\x1b\[[0-9;]*m//g' "$f"
                    summ="$(grep -E 'ERROR SUMMARY' "$f" | tail -1 | sed 's/^=* *//' || true)"
                    case $rc in
                        0)       status="finished, clean" ;;
                        3)       status="finished, ERRORS REPORTED by $tool" ;;
                        124|137) status="TIMED OUT after ${lim} s (killed, not finished)" ;;
                        *)       status="finished with rc $rc (the test failed or the tool broke: see sanitize-raw.log)" ;;
                    esac
                    echo "   rc $rc, ${dt} s: $status"
                    echo "   ${summ:-no ERROR SUMMARY line}"
                    grep -E 'RACECHECK SUMMARY|tests passed|PASSED|FAILED|OK: [0-9]+ differing|[0-9]+ passed|[0-9]+ failed' "$f" | sed 's/^/   /' | tail -4 || true
                    # the first reports, if any (kernel, access, address, source line)
                    grep -E '^========= ' "$f" | grep -Ev 'ERROR SUMMARY|RACECHECK SUMMARY|COMPUTE-SANITIZER|^========= *$' | head -40 | sed 's/^/   /' || true
                    { echo "######## [$n] $tool: $label: rc $rc, ${dt} s, limit ${lim} s"; echo "######## $*"; head -c 1000000 "$f"; } >> "$raw_all"
                    printf '%s\t%s\t%s\t%s\t%s\n' "$tool" "$label" "$status" "${summ:-no summary}" "$dt" >> "$rows"
                }
                # 1. memcheck: the new kernels first (RP16 unpack + 16-token mmq; mmq's 512-column / 256-expert cases
                #    are in MUL_MAT / MUL_MAT_ID -p stq1_0), then racecheck and synccheck on the same kernels,
                #    then the older memcheck steps (mat-vec batch invariance, GET_ROWS, CPY, the pytest subset)
                san_step memcheck 90 "test-stq1_0-rp16 --quick, REPACK=all (RP16 mat-vec, unpack, 16 cols/tokens on mmq)" \
                    GGML_CUDA_STQ1_0_REPACK=all -- "$rp16" -b CUDA0 --quick
                san_step memcheck 90 "test-backend-ops -o MUL_MAT -p stq1_0 (all STQ1_0 cases, n = 1..512)" -- "$tbo" test -b CUDA0 -o MUL_MAT -p stq1_0
                san_step memcheck 120 "test-backend-ops -o MUL_MAT_ID -p stq1_0 (all, incl. 256 experts top-8 x 512 tokens)" -- "$tbo" test -b CUDA0 -o MUL_MAT_ID -p stq1_0
                # 2. racecheck: shared-memory hazards (10-100x slower: mmq-sized cases only for test-backend-ops)
                san_step racecheck 120 "test-backend-ops -o MUL_MAT -p MMQ (n >= 9: mmq)" -- "$tbo" test -b CUDA0 -o MUL_MAT -p "$mmq_p"
                san_step racecheck 150 "test-backend-ops -o MUL_MAT_ID -p MMQ (n >= 9 tokens: mmq ids path)" -- "$tbo" test -b CUDA0 -o MUL_MAT_ID -p "$mmq_p"
                san_step racecheck 150 "test-stq1_0-rp16 --quick, REPACK=all" GGML_CUDA_STQ1_0_REPACK=all -- "$rp16" -b CUDA0 --quick
                # 3. synccheck: barriers in divergent code, invalid __syncwarp masks
                san_step synccheck 60 "test-backend-ops -o MUL_MAT -p MMQ (n >= 9: mmq)" -- "$tbo" test -b CUDA0 -o MUL_MAT -p "$mmq_p"
                san_step synccheck 90 "test-backend-ops -o MUL_MAT_ID -p MMQ (n >= 9 tokens: mmq ids path)" -- "$tbo" test -b CUDA0 -o MUL_MAT_ID -p "$mmq_p"
                san_step synccheck 60 "test-stq1_0-rp16 --quick, REPACK=all" GGML_CUDA_STQ1_0_REPACK=all -- "$rp16" -b CUDA0 --quick
                # 4. the older memcheck steps
                san_step memcheck 60 "test-mul-mat-batch-invariance -t stq1_0 --quick (mat-vec kernels)" -- "$bi" -b CUDA0 -t stq1_0 --quick
                san_step memcheck 40 "test-backend-ops -o GET_ROWS -p stq1_0" -- "$tbo" test -b CUDA0 -o GET_ROWS -p stq1_0
                san_step memcheck 40 "test-backend-ops -o CPY -p stq1_0" -- "$tbo" test -b CUDA0 -o CPY -p stq1_0
                san_step memcheck 60 "pytest subset (cuBLAS prefill, get_rows, cpy, e8-top2)" STQ_CUDA_BUILD="$bld" -- \
                    python3 -m pytest -q -p no:cacheprovider tests/test_cuda_stq1_0.py \
                    -k "(test_mul_mat and 768-100 and (-9 or -32)) or get_rows or cpy or (e8-top2)"
                echo "== $(date -u +%FT%TZ) compute-sanitizer summary ($((SECONDS - t_remote)) s after the start of 'remote')"
                printf '%-10s | %-100s | %-50s | %-30s | %s\n' tool case status "ERROR SUMMARY" seconds
                while IFS=$'\t' read -r a b c d e; do
                    printf '%-10s | %-100s | %-50s | %-30s | %s\n' "$a" "$b" "$c" "$d" "$e"
                done < "$rows"
            } 2>&1 | tee -a "$out/sanitize.log"
            ;;
        bench)
            (cd "$HERE" && python3 harness/bench_cuda.py --build "$bld" --json "$out/bench.json" ${STQ_BENCH_ARGS:-}) 2>&1 | tee -a "$out/bench.log"
            ;;
        ncu)
            {
                echo "== $(date -u +%FT%TZ) ncu: STQ1_0 and Q4_0 mmvq at 32768x16384"
                (cd "$HERE" && ncu --clock-control none -k regex:'mul_mat_vec_(q|stq1_0)' --launch-skip 8 --launch-count 2 \
                    --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \
                    --section InstructionStats --section MemoryWorkloadAnalysis \
                    python3 harness/bench_cuda.py --build "$bld" --workloads big --types stq1_0,q4_0 --rounds 1 \
                    --graphs 1 --min-nodes 4 --copy-mb 64) 2>&1 | grep -Ev '^==PROF==' | tail -150
            } 2>&1 | tee -a "$out/ncu.log"
            ;;
        rpc)
            # issue 16: STQ1_0 through ggml-rpc against a CUDA rpc-server on loopback (own build folder:
            # -DGGML_RPC=ON and the tools, which the main build leaves out)
            {
                local rb="${STQ_RPC_BUILD:-$work/build-rpc}" port=50152
                if [ -z "${STQ_RPC_BUILD:-}" ]; then
                    echo "== $(date -u +%FT%TZ) rpc build"
                    cmake -S "$src" -B "$rb" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
                        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA="${STQ_CUDA_FA:-OFF}" -DGGML_RPC=ON \
                        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
                        -DLLAMA_BUILD_TESTS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF > /dev/null
                    ninja -C "$rb" -j "$jobs" test-backend-ops ggml-rpc-server llama-bench 2>&1 | grep -Ev '^\[[0-9]+/[0-9]+\] (Building|Linking)' || true
                else
                    echo "== $(date -u +%FT%TZ) rpc: the existing build $rb (STQ_RPC_BUILD; GGML_RPC=ON, tests and tools built there)"
                fi
                "$rb/bin/ggml-rpc-server" --host 127.0.0.1 --port $port > "$out/rpc-server.log" 2>&1 &
                local rpid=$!
                sleep 3
                echo "== $(date -u +%FT%TZ) test-backend-ops -b RPC0 (CUDA rpc-server on 127.0.0.1:$port), STQ1_0 cases"
                for op in MUL_MAT MUL_MAT_ID GET_ROWS CPY; do
                    "$rb/bin/test-backend-ops" test -b RPC0 --rpc 127.0.0.1:$port -o "$op" -p stq1_0 2>&1 | grep -E 'stq1_0|tests passed|FAIL|not supported|Backend' | grep -v ': OK$' | tail -40 || true
                done
                # patch 0065: the server answers supports_op for its device, so RPC0 must answer like CUDA0 (same GPU)
                echo "== $(date -u +%FT%TZ) test-backend-ops support: RPC0 (the CUDA rpc-server) vs CUDA0, every case"
                "$rb/bin/test-backend-ops" support -b CUDA0 > "$work/support-cuda0.txt" 2>&1 || true
                "$rb/bin/test-backend-ops" support -b RPC0 --rpc 127.0.0.1:$port > "$work/support-rpc0.txt" 2>&1 || true
                python3 - "$work/support-cuda0.txt" "$work/support-rpc0.txt" <<'PY' || true
import re, sys
def parse(path):
    text = re.sub(r"\x1b\[[0-9;]*m", "", open(path, errors="replace").read())
    return dict(re.findall(r"^\s+(\S.*): (NOT SUPPORTED|SUPPORTED)\s*$", text, re.M))
a, b = parse(sys.argv[1]), parse(sys.argv[2])
differ = [k for k in a if b.get(k) != a[k]]
refused = sum(v == "NOT SUPPORTED" for v in a.values())
print(f"CUDA0: {len(a)} cases, {refused} not supported; RPC0: {len(b)} cases; answered differently: {len(differ)}")
for k in differ[:20]:
    print(f"  differs: {k}: CUDA0 {a[k]}, RPC0 {b.get(k)}")
PY
                kill -0 $rpid 2>/dev/null && echo "rpc-server alive after the STQ1_0 cases and the support queries" || echo "!! the rpc-server died (see rpc-server.log)"
                kill $rpid || true
                wait $rpid 2>/dev/null || true
                if [ -n "${STQ_RPC_MODEL:-}" ] && [ -f "$STQ_RPC_MODEL" ]; then
                    echo "== $(date -u +%FT%TZ) bench_rpc on $STQ_RPC_MODEL"
                    (cd "$HERE" && python3 -m harness.bench_rpc --bin "$rb/bin" --model "$STQ_RPC_MODEL" --servers 1 \
                        --rounds 4 -t 4 --local-ngl 99 ${STQ_RPC_BENCH_ARGS:-}) || echo "!! bench_rpc failed"
                fi
            } 2>&1 | tee -a "$out/rpc.log"
            ;;
        mmv)
            # issue 17 (patch 0031): the STQ1_0 cp.async mat-vec kernel. Correctness first (batch invariance,
            # test-backend-ops MUL_MAT / MUL_MAT_ID), then the kernel for both ops (GGML_CUDA_STQ1_0_MMV=id; by default
            # MUL_MAT_ID keeps mmvq) against mmvq (GGML_CUDA_STQ1_0_MMV=0) in
            # processes ordered new old old new, each timing stq1_0 and q4_0 in turn (the ratio to Q4_0 comes from
            # one process), then the one-column variants (r2 r8 w2 s2 s8) on the n = 1 cases
            {
                echo "== $(date -u +%FT%TZ) mmv: batch invariance (default: MUL_MAT new kernel, MUL_MAT_ID mmvq)"
                "$bld/bin/test-mul-mat-batch-invariance" -b CUDA0 -t stq1_0 || echo "!! stq1_0 batch invariance FAILED"
                echo "== $(date -u +%FT%TZ) mmv: batch invariance (GGML_CUDA_STQ1_0_MMV=id: new kernel for both)"
                GGML_CUDA_STQ1_0_MMV=id "$bld/bin/test-mul-mat-batch-invariance" -b CUDA0 -t stq1_0 || echo "!! stq1_0 batch invariance (id) FAILED"
                echo "== $(date -u +%FT%TZ) mmv: test-backend-ops MUL_MAT / MUL_MAT_ID -p stq1_0 (new kernel for both, then mmvq)"
                for mode in id 0; do
                    for op in MUL_MAT MUL_MAT_ID; do
                        echo "-- GGML_CUDA_STQ1_0_MMV=$mode $op"
                        GGML_CUDA_STQ1_0_MMV=$mode "$bld/bin/test-backend-ops" test -b CUDA0 -o "$op" -p stq1_0 2>&1 | grep -E 'stq1_0|tests passed|FAIL|not supported' | grep -v ': OK$' | tail -20 || true
                    done
                done
                if [ -n "${STQ_MMV_SANITIZE:-}" ]; then
                    echo "== $(date -u +%FT%TZ) mmv: compute-sanitizer memcheck, MUL_MAT / MUL_MAT_ID -p stq1_0"
                    for op in MUL_MAT MUL_MAT_ID; do
                        GGML_CUDA_STQ1_0_MMV=id compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 \
                            "$bld/bin/test-backend-ops" test -b CUDA0 -o "$op" -p stq1_0 2>&1 | grep -E 'ERROR SUMMARY|tests passed|Invalid|out of bounds' | head -10 || echo "!! memcheck: $op reported errors"
                    done
                fi
                local i=0
                for mode in id 0 0 id; do
                    i=$((i + 1))
                    echo "== $(date -u +%FT%TZ) mmv: A/B process $i: GGML_CUDA_STQ1_0_MMV=$mode"
                    (cd "$HERE" && GGML_CUDA_STQ1_0_MMV=$mode python3 harness/bench_cuda.py --build "$bld" --types stq1_0,q4_0 \
                        --workloads big,routed,verify --rounds "${STQ_MMV_ROUNDS:-5}" --graphs 3 --copy-mb 1024 \
                        --json "$out/mmv-ab$i-mode$mode.json" 2>&1 | grep -Ev 'warmup complete|^  Device|found 1 CUDA') || echo "!! bench (mode $mode) failed"
                done
                for mode in ${STQ_MMV_VARIANTS-r2 r8 w2 s2 s8}; do
                    echo "== $(date -u +%FT%TZ) mmv: variant GGML_CUDA_STQ1_0_MMV=$mode (n = 1 cases)"
                    (cd "$HERE" && GGML_CUDA_STQ1_0_MMV=$mode python3 harness/bench_cuda.py --build "$bld" --types stq1_0,q4_0 \
                        --workloads big,routed,decode --rounds "${STQ_MMV_ROUNDS:-5}" --graphs 3 --copy-mb 1024 2>&1 \
                        | grep -Ev 'warmup complete|^  Device|found 1 CUDA' | tail -8) || echo "!! bench (variant $mode) failed"
                done
                echo "== $(date -u +%FT%TZ) mmv: A/B summary (medians over the processes of each mode)"
                python3 - "$out" <<'PYEOF' || echo "!! A/B summary failed"
import glob, json, statistics, sys
runs = {}
copy = []
for f in sorted(glob.glob(sys.argv[1] + "/mmv-ab*-mode*.json")):
    mode = f.rsplit("mode", 1)[1].split(".")[0]
    d = json.load(open(f))
    copy.append(d["copy_gbs"])
    for r in d["results"]:
        runs.setdefault((r["case"], mode, r["type"]), []).append(r)
cp = statistics.median(copy) if copy else float("nan")
print(f"copy {cp:.0f} GB/s; new = GGML_CUDA_STQ1_0_MMV=id (mmv-stq1_0.cu for MUL_MAT and MUL_MAT_ID), old = 0 (mmvq)")
print(f"{'case':32s} {'new us':>8s} {'old us':>8s} {'new/old':>8s} {'new %copy':>9s} {'new/q4_0':>9s} {'old/q4_0':>9s}")
for case in dict.fromkeys(c for c, _, _ in runs):
    def med(mode, t, key):
        rs = runs.get((case, mode, t), [])
        return statistics.median(r[key] for r in rs) if rs else float("nan")
    new, old = med("id", "stq1_0", "median_us"), med("0", "stq1_0", "median_us")
    gbs = med("id", "stq1_0", "gbs")
    # ratio_vs_candidate of the q4_0 row = median over rounds of stq1_0/q4_0 within one process
    rn, ro = med("id", "q4_0", "ratio_vs_candidate"), med("0", "q4_0", "ratio_vs_candidate")
    print(f"{case:32s} {new:8.2f} {old:8.2f} {new/old:8.3f} {100*gbs/cp:8.0f}% {rn:9.3f} {ro:9.3f}")
PYEOF
                echo "== $(date -u +%FT%TZ) mmv: done"
            } 2>&1 | tee -a "$out/mmv.log"
            ;;
        *)
            echo "error: unknown stage '$st' (build test sanitize bench ncu rpc mmv all)" >&2
            exit 2
            ;;
        esac
    done
}

case "${1:-}" in
    pack)   shift; pack "$@" ;;
    remote) shift; remote "$@" ;;
    *)      sed -n '2,33p' "${BASH_SOURCE[0]}"; exit 2 ;;
esac
