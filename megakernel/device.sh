#!/usr/bin/env bash
# The megakernel on the lent GPU machine, in one device call (see megakernel/README.md).
#
# Here:  harness/cuda_device.sh pack            # the applied llama.cpp tree -> .dev/cuda/src.tar.xz
#        .venv/bin/python harness/synth_gemma4.py --tokenizer-from "$(.venv/bin/stq-metal model)" \
#            --tokenizer-only .dev/mk/tokenizer.gguf   # (once) the tokenizer the models need
# There: run(command="bash megakernel/device.sh STAGES", carry=[".dev"])
#   stages, in order: check (nvcc syntax check of mk.cu and mk-draft.cu, stops early on errors), build, models, test,
#   draft (the fused MTP draft kernel vs llama.cpp's assistant graph: test-mk-draft --fused on the pairs of
#   MK_DRAFT_MODELS, default "small-h small", incl. -np 2, k = 8, a planted barrier bug and memcheck), bench, profile (per-phase times inside the launch, per step size M; MK_PROF=2: also every block's barrier arrivals; MK_PROF_ARGS: more test-mk options, e.g. "--rounds 2 --verify-cost" for verify steps of M = 2..5; MK_PROF_LINES: profile lines shown, default 40), server (llama-server speculative == greedy), ctx (by context length: checks at a long prompt, tok/s at tg 32..1024
#   vs the graph and MK_CTX_VARIANT), sweep (blocks per SM 1..3), ncu (one decode launch: speed of light, memory, warp stall
#   reasons), deep (decode after prompts of MK_DEEP tokens, default "2048 4096": checks, tok/s vs the graph, profile), ncusrc (the same as a report: raw metrics + per-SASS-instruction samples as CSV; both after a 361-token prompt with MK_NCU_LONG=1), ncuv (one verify launch
#   of MK_NCU_M tokens, default 4: sections + SASS samples; first run in session 25), e2e (MTP speculation end to end
#   through llama-server, harness/bench_mtp.py: MK_E2E_MODEL, MK_E2E_ARGS), sanitize, sides (side b: MK_AB_BASE's megakernel built into the same tree, see stage_sides), vcost (verify kernels per
#   side, MK_VCOST_SIDES), ab (two builds A/B, MK_AB_BASE: see stage_ab; last). Logs and results under $OUT (every stage tees its full output there).
# Environment: MK_CHECK_ARGS (check: extra nvcc options),
#   MK_VARIANT (bench: also a kernel variant, ggml-mk.h GGML_MK_VAR_*, e.g. 0x400: checked bitwise
#   against the default megakernel and timed against it AB/BA in the same process; MK_VARIANT_OTHER_BITS=1 for a variant
#   whose bits differ by design, e.g. 0x80000000: then checked within NMSE 1e-3 and by argmax; stages bench and ctx), MK_CMAKE_ARGS (extra cmake options, e.g. "-DGGML_RPC=ON -DLLAMA_BUILD_TESTS=ON"), MK_TARGETS
#   (default llama-bench: more targets let other device scripts reuse this build), MK_MODELS (default "small"): small / small-f16 = synthetic gemma4 pair with Q4_0 / F16
#   matrices (harness/synth_gemma4.py), small-h = F16 with an assistant that reads the target's hidden state strongly, e2b / e4b = Gemma-4-E2B/E4B-shaped synthetic targets made on the
#   GPU (megakernel/synth_gpu.py), e2b-mtp / e4b-mtp = the same shapes as a structured pair whose drafts are accepted
#   at a rate set by the target's noise (synth_gpu.py --noise 1, rescaled in place by stage e2e), e2b-q4km / e4b-q4km = the
#   e2b / e4b target requantized by llama-quantize to Q4_K_M (a Q4_K_M-like mix: Q4_K, Q6_K; stage build then also builds
#   llama-quantize), gemma3 = the real Gemma 3 270M, carried in pieces (stage receive):
#     split -n 7 -d "$(.venv/bin/stq-metal model)" .dev/mk/g3.   # here, once: 7 pieces of 36 MB (a call carries the
#                                                                 # tracked tree too, ~12 MB in session 40: 64 MiB in all)
#     for each piece P: run("MK_PIECE=P bash megakernel/device.sh receive", carry=[P]) in quick succession
#     (the machine keeps /tmp only while warm: 30 s between calls); the last call verifies the sha256.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEV="$HERE/.dev"
OUT="${OUT:-$DEV/out}"
WORK="${MK_WORK:-/tmp/stq-mk}"
SRC="$WORK/src"
BLD="$WORK/build"
MODELS="$WORK/models"
JOBS="${MK_JOBS:-$(nproc)}"
export PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$WORK" "$MODELS"

log() { echo "== $(date -u +%T) $*"; }

unpack() {
    local sum
    [ -f "$DEV/cuda/src.tar.xz" ] || return 0   # (a call that only carries a model piece)
    sum="$(sha256sum "$DEV/cuda/src.tar.xz" | cut -c1-16)"
    if [ ! -f "$SRC/.packed-$sum" ]; then
        rm -rf "$SRC" && mkdir -p "$SRC" && tar -xJf "$DEV/cuda/src.tar.xz" -C "$SRC" && touch "$SRC/.packed-$sum"
    fi
}

stage_check() {
    local f rc=0
    : > "$OUT/check.log"
    for f in mk mk-draft; do
        log "nvcc syntax check of megakernel/cuda/$f.cu"
        nvcc -std=c++17 -arch=sm_90 -c -o /dev/null "$HERE/megakernel/cuda/$f.cu" \
            -I"$SRC/ggml/src" -I"$SRC/ggml/include" -I"$HERE/megakernel" -I"$HERE/megakernel/cuda" \
            -Xptxas -v ${MK_CHECK_ARGS:-} 2>&1 | tee -a "$OUT/check.log" | grep -v "^ptxas info    : Function properties for" | tail -30
        [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
    done
    return $rc
}

stage_build() {
    log "configure + build (CUDA sm_90, megakernel on)"
    cmake -S "$SRC" -B "$BLD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA="${MK_FA:-OFF}" \
        -DGGML_MEGAKERNEL_DIR="$HERE/megakernel" \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF ${MK_CMAKE_ARGS:-} > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; return 1; }
    local t0=$SECONDS
    local targets="${MK_TARGETS:-llama-bench}"
    case " ${MK_MODELS:-} " in *-q4km\ *) targets="$targets llama-quantize" ;; esac   # (stage models makes them with it)
    ninja -C "$BLD" -j "$JOBS" llama $targets > "$OUT/build.log" 2>&1
    local rc=$?
    grep -E "error|warning: .*mk\.cu|FAILED" "$OUT/build.log" | head -40
    [ $rc -eq 0 ] || return $rc
    g++ -std=c++17 -O2 -o "$BLD/bin/test-mk" "$HERE/megakernel/tests/test-mk.cpp" -I"$SRC/include" -I"$SRC/src" -I"$SRC/ggml/include" \
        -L"$BLD/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$BLD/bin" || return 1
    g++ -std=c++17 -O2 -o "$BLD/bin/test-mk-draft" "$HERE/megakernel/tests/test-mk-draft.cpp" -I"$HERE/megakernel" \
        -I"$HERE/tests/mk_hostemu" -I"$SRC/include" -I"$SRC/src" -I"$SRC/ggml/include" \
        -L"$BLD/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$BLD/bin" || return 1
    log "build done in $((SECONDS - t0)) s"
}

model_path() {
    case "$1" in
    small|small-f16|small-h|tiny-f16) echo "$MODELS/$1/gemma4-synth-target.gguf" ;;
    *)     echo "$MODELS/$1.gguf" ;;
    esac
}

# model $1's files are there (stage models makes them only if not; preflight asks no tokenizer for them)
model_made() {
    case "$1" in
    e2b|e4b|e2b-mtp|e4b-mtp) [ -f "$MODELS/$1.gguf" ] && [ -f "$MODELS/$1-assistant.gguf" ] ;;
    *) [ -f "$(model_path "$1")" ] ;;
    esac
}

stage_models() {
    local m   # (e2b-q4km / e4b-q4km call this for their base model)
    for m in ${MK_MODELS:-small}; do
        case "$m" in
        small|small-f16|small-h|tiny-f16)
            local mt=Q4_0 hg=0 nv=0
            [ "$m" != small ] && mt=F16
            [ "$m" = small-h ] && hg=1   # the assistant reads the target's hidden state strongly (server: draft-mtp)
            [ "$m" = tiny-f16 ] && nv=4096   # the tokenizer's first 4096 tokens: a 64x smaller LM head (racecheck)
            model_made "$m" || \
                PYTHONPATH="$SRC/gguf-py:$HERE" python3 "$HERE/harness/synth_gemma4.py" --matrix-type $mt --h-gain $hg \
                    --n-vocab $nv --tokenizer-from "$DEV/mk/tokenizer.gguf" --out-dir "$MODELS/$m" | tail -1 ;;
        gemma3)
            [ -f "$MODELS/gemma3.gguf" ] || { echo "gemma3: not received (stage receive)"; return 1; } ;;
        e2b|e4b)
            model_made "$m" || \
                PYTHONPATH="$SRC/gguf-py:$HERE" python3 "$HERE/megakernel/synth_gpu.py" --shape "$m" \
                    --tokenizer-from "$DEV/mk/tokenizer.gguf" --out "$MODELS/$m.gguf" --assistant "$MODELS/$m-assistant.gguf" \
                    ${MK_SYNTH_ARGS:-} | tail -3 ;;
        e2b-mtp|e4b-mtp)   # structured pair: the drafts' acceptance set by the target's noise (synth_gpu --noise)
            model_made "$m" || \
                PYTHONPATH="$SRC/gguf-py:$HERE" python3 "$HERE/megakernel/synth_gpu.py" --shape "${m%-mtp}" --noise 1 \
                    --tokenizer-from "$DEV/mk/tokenizer.gguf" --out "$MODELS/$m.gguf" --assistant "$MODELS/$m-assistant.gguf" \
                    ${MK_SYNTH_ARGS:-} | tail -3 ;;
        e2b-q4km|e4b-q4km)   # the same target requantized by llama-quantize to Q4_K_M (its per-tensor choices: Q4_K, Q6_K
            # for attn_v / ffn_down in its use_more_bits layers and for the output): the K-quant mat-vecs (session 27)
            if ! model_made "$m"; then
                MK_MODELS="${m%-q4km}" stage_models || return 1
                [ -x "$BLD/bin/llama-quantize" ] || { echo "$m: no $BLD/bin/llama-quantize (stage build with MK_MODELS=$m builds it)"; return 1; }
                log "$m: llama-quantize --allow-requantize ${m%-q4km}.gguf Q4_K_M"
                "$BLD/bin/llama-quantize" --allow-requantize "$MODELS/${m%-q4km}.gguf" "$MODELS/$m.gguf.part" Q4_K_M "$JOBS" \
                    > "$OUT/quantize-$m.log" 2>&1 && mv "$MODELS/$m.gguf.part" "$MODELS/$m.gguf" ||
                    { tail -5 "$OUT/quantize-$m.log"; rm -f "$MODELS/$m.gguf.part"; return 1; }
                grep -oE "converting to [A-Za-z0-9_]+" "$OUT/quantize-$m.log" | sort | uniq -c
            fi ;;
        *) echo "unknown model $m"; return 2 ;;
        esac
    done
}

stage_receive() {
    # the model's size and sha256 from the harness's one copy (harness/config.py)
    local want_sha want_bytes have
    read -r want_sha want_bytes < <(cd "$HERE" && python3 -c 'from harness import config; print(config.GEMMA_SHA256, config.GEMMA_SIZE)') \
        || { echo "receive: cannot read the model's size and sha256 from $HERE/harness/config.py"; return 1; }
    local piece="${MK_PIECE:-$DEV/mk/piece}" part="$MODELS/gemma3.gguf.part"
    if [ -f "$MODELS/gemma3.gguf" ]; then
        log "gemma3: already received ($MODELS/gemma3.gguf); $piece not used"
        return 0
    fi
    [ -f "$piece" ] || { echo "receive: no piece at $piece (carry it and name it in MK_PIECE)"; return 1; }
    cat "$piece" >> "$part" || { echo "receive: appending $piece to $part failed"; return 1; }
    have=$(stat -c %s "$part")
    log "gemma3: $have of $want_bytes bytes"
    if [ "$have" -gt "$want_bytes" ]; then
        rm -f "$part"
        echo "receive: $have bytes after $piece, more than the model's $want_bytes (a piece sent twice?): $part removed;" \
             "send every piece again, from the first"
        return 1
    fi
    if [ "$have" -eq "$want_bytes" ]; then
        if ! echo "$want_sha  $part" | sha256sum -c --quiet >/dev/null 2>&1; then
            rm -f "$part"
            echo "receive: the $have bytes received do not have the model's sha256 $want_sha (pieces out of order?):" \
                 "$part removed; send every piece again, from the first"
            return 1
        fi
        mv "$part" "$MODELS/gemma3.gguf" && log "gemma3 complete, sha256 ok"
    fi
}

stage_test() {
    for m in ${MK_MODELS:-small}; do
        log "test-mk on $m"
        local tol=""
        # Q4_0/Q8_0 matrices: the graph rounds activations to q8_1 (mmvq), the megakernel does not; on
        # this random, chaotic model those differences grow along the sequence: report, do not judge
        # small-f16: F16 matrices, but a random model whose logits (and MTP hidden rows) drift from the graph's with the
        # position (1.4e-4 at 24 steps, 3.1e-3 over 60 positions on the H200, NOTES.md session 9): a bound that still
        # fails the planted bugs (hidden rows before the norm: 1e3, of the wrong token: 2.3)
        case "$m" in small|e2b|e4b|e2b-q4km|e4b-q4km|gemma3) tol="--max-nmse 10 --max-disagree 1000" ;; small-f16) tol="--max-nmse 1e-2" ;; esac
        "$BLD/bin/test-mk" -m "$(model_path "$m")" -n "${MK_TEST_N:-160}" --rounds 0 $tol 2>&1 | tee -a "$OUT/test.log" | grep -v "^llama_\|^load\|^print_info\|^\.\.\.\|^init\|^graph\|^sched" | tail -40
        log "planted bug: grid barriers off (LLAMA_MEGAKERNEL_DEBUG=1) must FAIL"
        LLAMA_MEGAKERNEL_DEBUG=1 "$BLD/bin/test-mk" -m "$(model_path "$m")" -n 16 --rounds 0 $tol 2>&1 | tee -a "$OUT/test.log" | grep -E "teacher|verify ==|test-mk:" | tail -5 || true
    done
}

stage_bench() {
    for m in ${MK_MODELS:-small}; do
        log "speed on $m"
        "$BLD/bin/test-mk" -m "$(model_path "$m")" -n 8 --rounds "${MK_ROUNDS:-6}" --bench-n "${MK_BENCH_N:-64}" --max-nmse 10 --max-disagree 100 --verify-cost \
            ${MK_VARIANT:+--variant "$MK_VARIANT"} ${MK_VARIANT_OTHER_BITS:+--variant-other-bits} 2>&1 | tee "$WORK/bench-run.log" | tee -a "$OUT/bench.log" | grep -E "speed|verify cost|model size|test-mk:|llama_mk|variant" | tail -10
        # issue 12's report of the run: the weight-read roofline and the launches per token (harness/bench_megakernel.py)
        (cd "$HERE" && PYTHONPATH="$HERE" python3 -m harness.bench_megakernel --build "$BLD" --model "$(model_path "$m")" \
            --log "$WORK/bench-run.log") 2>&1 | grep -iE "roofline|launches|error" | tee -a "$OUT/bench.log"
    done
}

stage_profile() {
    for m in ${MK_MODELS:-small}; do
        log "per-phase profile on $m (LLAMA_MEGAKERNEL_PROFILE=${MK_PROF:-1}; 2: also every block's barrier arrivals)"
        # shellcheck disable=SC2086
        LLAMA_MEGAKERNEL_PROFILE=${MK_PROF:-1} "$BLD/bin/test-mk" -m "$(model_path "$m")" -n 48 --rounds 0 --max-nmse 10 --max-disagree 100 \
            ${MK_PROF_ARGS:-} 2>&1 | tee -a "$OUT/profile.log" | grep -E "llama_mk (grid )?profile" | tail -"${MK_PROF_LINES:-40}"
    done
}

stage_sweep() {
    for m in ${MK_MODELS:-small}; do
        for b in 1 2 3; do
            log "sweep $m: LLAMA_MEGAKERNEL_BLOCKS_PER_SM=$b"
            LLAMA_MEGAKERNEL_BLOCKS_PER_SM=$b "$BLD/bin/test-mk" -m "$(model_path "$m")" -n 8 --rounds 4 --bench-n 32 \
                --max-nmse 10 --max-disagree 100 2>&1 | tee -a "$OUT/sweep.log" | grep -E "^speed" || true
        done
    done
}

# a prompt of N sentences (default 24: the prompt of stage ctx and of ncu/ncusrc with MK_NCU_LONG=1); the models'
# tokenizer (Gemma 3's) makes 15 tokens of each, plus BOS: 361 tokens for 24
long_prompt() {
    python3 -c "print(' '.join(['The quick brown fox jumps over the lazy dog near the old river bank.']*${1:-24}))"
}

# ncu over one megakernel decode launch (the 21st) of test-mk on the last model of MK_MODELS; arguments: ncu's options;
# MK_NCU_LONG=1: after the long prompt (the attention at ~410 cells of context: where the megakernel falls behind the graph)
ncu_launch() {
    local m
    local -a p=()
    m=$(echo ${MK_MODELS:-small} | awk '{print $NF}')
    [ -n "${MK_NCU_LONG:-}" ] && p=(-p "$(long_prompt)" -c 4096)
    log "ncu: one megakernel decode launch on $m${MK_NCU_LONG:+ after the long prompt}"
    LLAMA_MEGAKERNEL=1 ncu --clock-control none -k regex:mk_decode_kernel --launch-skip 20 --launch-count 1 "$@" \
        "$BLD/bin/test-mk" -m "$(model_path "$m")" ${p[@]+"${p[@]}"} -n 24 --rounds 0 --max-nmse 10 --max-disagree 100
}

stage_ncu() {
    ncu_launch --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
        --section LaunchStats --section SchedulerStats --section SourceCounters 2>&1 \
        | grep -v "^==PROF==" | tee "$OUT/ncu.log" | grep -E "Duration|Throughput|Stall|Warp Cycles|Registers|Achieved|Issued" | head -40
}

# the same launch, saved as a report: every raw metric (stall reasons of the whole kernel) and the per-instruction
# (SASS) warp-state samples and executed-instruction counts, as CSV: which code the time goes to
stage_ncusrc() {
    ncu_launch --section WarpStateStats --section SourceCounters --section InstructionStats --section SpeedOfLight \
        -f -o "$WORK/mk-src" > "$OUT/ncusrc-run.log" 2>&1
    ncu -i "$WORK/mk-src.ncu-rep" --page raw --csv > "$OUT/ncu-raw.csv" 2>&1
    grep -o 'smsp__average_warps_issue_stalled_[a-z_]*_per_issue_active.ratio' "$OUT/ncu-raw.csv" | head -3
    ncu -i "$WORK/mk-src.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu-sass.csv" 2>&1 || \
        ncu -i "$WORK/mk-src.ncu-rep" --page source --csv > "$OUT/ncu-sass.csv" 2>&1
    ls -la "$OUT/ncu-raw.csv" "$OUT/ncu-sass.csv"; head -c 600 "$OUT/ncu-sass.csv"; echo
}

# ncu over one verify launch of MK_NCU_M tokens (default 4; the third such launch of test-mk, picked by the kernel's own
# profiler range: LLAMA_MEGAKERNEL_NCU_M, ncu --profile-from-start off) on the last model of MK_MODELS: the sections of
# stage ncu plus the per-SASS-instruction samples as CSV (where a verify step's staging stalls)
stage_ncuv() {
    local m
    m=$(echo ${MK_MODELS:-small} | awk '{print $NF}')
    log "ncu: one verify launch of M=${MK_NCU_M:-4} tokens on $m"
    LLAMA_MEGAKERNEL=1 LLAMA_MEGAKERNEL_NCU_M=${MK_NCU_M:-4} ncu --clock-control none --profile-from-start off \
        -k regex:mk_decode_kernel --launch-skip 2 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section SourceCounters --section InstructionStats -f -o "$WORK/mk-verify" \
        "$BLD/bin/test-mk" -m "$(model_path "$m")" -n 8 --rounds 0 --max-nmse 10 --max-disagree 100 > "$OUT/ncuv-run.log" 2>&1
    ncu -i "$WORK/mk-verify.ncu-rep" --page details > "$OUT/ncuv.log" 2>&1
    grep -E "Duration|Throughput|Stall|Warp Cycles|Issued|Achieved" "$OUT/ncuv.log" | head -40
    ncu -i "$WORK/mk-verify.ncu-rep" --page source --csv --print-source sass > "$OUT/ncuv-sass.csv" 2>&1
    ls -la "$OUT/ncuv.log" "$OUT/ncuv-sass.csv"
}

# the fused MTP draft kernel (issue 14) vs llama.cpp's own gemma4-assistant graph on the GPU, token for token on live
# decode states across the sliding window (megakernel/tests/test-mk-draft.cpp --fused); then a planted bug (grid
# barriers off) that must fail, and memcheck over a few launches
stage_draft() {
    local m rc=0 tol tgt dft runs args
    for m in ${MK_DRAFT_MODELS:-small-h small}; do
        case "$m" in
        e2b|e4b) tgt="$(model_path "$m")"; dft="$MODELS/$m-assistant.gguf"; runs=$'-k 3 -n 24\n-k 8 -n 8' ;;
        *)       tgt="$MODELS/$m/gemma4-synth-target.gguf"; dft="$MODELS/$m/gemma4-synth-assistant.gguf"
                 runs=$'-k 4 -n '"${MK_DRAFT_N:-160}"$'\n-k 8 -n 48 --np 2\n-k 1 -n 48 --fa 1' ;;
        esac
        # Q4_0: llama.cpp rounds the activations to q8_1 per 32 for mmvq, the kernel to its own 8-bit records
        tol=""; [ "$m" != small-h ] && [ "$m" != small-f16 ] && tol="--max-nmse 1e-2 --max-nmse-h 1e-2"
        while IFS= read -r args; do
            log "test-mk-draft --fused on $m: $args"
            # shellcheck disable=SC2086
            "$BLD/bin/test-mk-draft" -m "$tgt" -md "$dft" --fused $args $tol < /dev/null 2>&1 | tee -a "$OUT/draft.log" \
                | grep -E "^(OK|FAIL|near tie|state [0-9]+ |draft plan|  layer|timing|test-mk-draft)" | head -24
            [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
        done <<< "$runs"
    done
    log "planted bug: grid barriers off in the draft kernel (must FAIL)"
    LLAMA_MEGAKERNEL_DEBUG=1 "$BLD/bin/test-mk-draft" -m "$MODELS/small-h/gemma4-synth-target.gguf" \
        -md "$MODELS/small-h/gemma4-synth-assistant.gguf" --fused -k 4 -n 8 2>&1 | tee -a "$OUT/draft.log" | grep -E "^(OK|FAIL|test-mk-draft)" | tail -4
    [ "${PIPESTATUS[0]}" -eq 1 ] || { echo "the planted bug went unnoticed"; rc=1; }
    log "compute-sanitizer memcheck of the fused draft"
    compute-sanitizer --tool memcheck --error-exitcode 3 "$BLD/bin/test-mk-draft" -m "$MODELS/small-h/gemma4-synth-target.gguf" \
        -md "$MODELS/small-h/gemma4-synth-assistant.gguf" --fused -k 4 -n 3 2>&1 | tee -a "$OUT/draft.log" | grep -E "ERROR SUMMARY|Invalid|test-mk-draft:" | head -6
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
    return $rc
}

# MTP speculation end to end through llama-server (harness/bench_mtp.py): greedy and draft-mtp, megakernel and graph, at
# the acceptance rates MK_E2E_ARGS names (default: probe a noise grid, then the levels nearest 0.75, 0.5 and 0.25 accepted
# per draft) on MK_E2E_MODEL (default e4b-mtp, stage models); needs llama-server in MK_TARGETS
stage_e2e() {
    local m=${MK_E2E_MODEL:-e4b-mtp}
    log "end to end: MTP speculation vs greedy through llama-server on $m"
    # shellcheck disable=SC2086
    (cd "$HERE" && STQ_METAL_CACHE="$WORK/cache" PYTHONPATH="$SRC/gguf-py:$HERE" python3 -m harness.bench_mtp --bin "$BLD/bin" \
        --target "$(model_path "$m")" --assistant "$MODELS/$m-assistant.gguf" \
        ${MK_E2E_ARGS:---k 2,3 --rounds 2 -n 128 --accept 0.75,0.5,0.25 --noise-grid 24,32,40,48,56,64,80} \
        --json "$OUT/e2e-$(date +%H%M%S).json") 2>&1 | tee -a "$OUT/e2e.log" | grep -v "^\[stq-metal\]"
    return "${PIPESTATUS[0]}"
}

# the megakernel by context length (attention groups, GGML_MK_VAR_ONE_GROUP): checks at a long prompt (verify == decode
# bitwise across several attention groups), then greedy tok/s of the megakernel, the graph and variant MK_CTX_VARIANT
# (default 0x40000: one group, the attention before the groups) for each tg length of MK_CTX_BENCH (default
# "32 256 1024") after the short default prompt, and MK_CTX_LONG_N tokens after the long prompt; MK_CTX_PROF=1 (or 2): also
# the per-phase profile after the long prompt, default and variant; on the last model of MK_MODELS. Fails when the checks
# fail (the variant's bitwise comparison in the speed runs only reports: its bits may differ past one group)
stage_ctx() {
    local m long rc
    m=$(echo ${MK_MODELS:-small} | awk '{print $NF}')
    long=$(long_prompt)
    log "ctx: checks at a long prompt (361 tokens) on $m"
    "$BLD/bin/test-mk" -m "$(model_path "$m")" -p "$long" -n 16 --rounds 0 -c 4096 --max-nmse 10 --max-disagree 1000 2>&1 |
        tee -a "$OUT/ctx.log" | grep -E "verify ==|NMSE|greedy|hidden states, verify|FAIL"
    rc=${PIPESTATUS[0]}   # (the checks' verdict is the stage's; the speed runs below only report)
    local bn v=${MK_CTX_VARIANT:-0x40000}
    for bn in ${MK_CTX_BENCH:-32 256 1024}; do
        log "ctx: greedy tg$bn, megakernel vs graph vs variant $v"
        "$BLD/bin/test-mk" -m "$(model_path "$m")" -n 4 --rounds 2 --bench-n "$bn" -c 4096 --max-nmse 10 --max-disagree 1000 \
            --variant "$v" ${MK_VARIANT_OTHER_BITS:+--variant-other-bits} 2>&1 | tee -a "$OUT/ctx.log" | grep -E "^speed|^variant"
    done
    log "ctx: greedy tg${MK_CTX_LONG_N:-512} after the long prompt (the variant's bits may differ there: other groups)"
    "$BLD/bin/test-mk" -m "$(model_path "$m")" -p "$long" -n 4 --rounds 2 --bench-n "${MK_CTX_LONG_N:-512}" -c 4096 \
        --max-nmse 10 --max-disagree 1000 --variant "$v" ${MK_VARIANT_OTHER_BITS:+--variant-other-bits} 2>&1 | tee -a "$OUT/ctx.log" | grep -E "^speed|^variant"
    if [ -n "${MK_CTX_PROF:-}" ]; then   # the per-phase profile after the long prompt, the default kernel and the variant
        local pv
        for pv in 0 "$v"; do
            log "ctx: per-phase profile after the long prompt, tg256, variant $pv"
            LLAMA_MEGAKERNEL_VARIANT=$pv LLAMA_MEGAKERNEL_PROFILE=$MK_CTX_PROF "$BLD/bin/test-mk" -m "$(model_path "$m")" -p "$long" \
                -n 4 --rounds 1 --bench-n 256 -c 4096 --max-nmse 10 --max-disagree 1000 2>&1 | tee -a "$OUT/ctx-prof.log" |
                grep -E "llama_mk (grid )?profile" | grep -E "token:|M=1 "
        done
    fi
    return "$rc"
}

# deep in a context: for each prompt length D of MK_DEEP (tokens, default "2048 4096"; a prompt of D/15 sentences, D + 1
# tokens where 15 divides D; -c rounded up to fit it, the generated tokens and the checks'), on the last model of MK_MODELS: the checks there (teacher-forced NMSE
# vs the graph, verify == decode bitwise M = 2..8, the stage's verdict), tok/s megakernel vs graph at tg MK_DEEP_N
# (default 256) after the prompt, and the per-phase profile there (M = 1 lines) -> deep.log. MK_DEEP_VARIANT: kernel
# variants (one or more): the checks with the last of them on (LLAMA_MEGAKERNEL_VARIANT), and a speed run for each that
# also times it against the default (as stage bench's MK_VARIANT, with MK_VARIANT_OTHER_BITS); the profile stays the
# default kernel's. MK_DEEP_FA: test-mk's --fa for all of it (default 0: V cached transposed; 1: V rows as K's and the
# graph's flash attention, for models whose flash attention the CUDA backend takes: on the E4B-shaped target it puts some
# layers on the CPU, 86 graph splits, far too slow at thousands of tokens, and llama-server's -fa auto turns it off)
stage_deep() {
    local m d p c n v vl fa rc=0
    m=$(echo ${MK_MODELS:-small} | awk '{print $NF}')
    vl=$(echo ${MK_DEEP_VARIANT:-} | awk '{print $NF}')
    n=${MK_DEEP_N:-256}
    fa=${MK_DEEP_FA:-0}
    for d in ${MK_DEEP:-2048 4096}; do
        p=$(long_prompt $((d/15)))
        c=$(( (d + n + 256 + 255)/256*256 ))
        log "deep: checks at a ~$d-token prompt on $m (-c $c, --fa $fa)${vl:+, kernel variant $vl}"
        env ${vl:+LLAMA_MEGAKERNEL_VARIANT=$vl} "$BLD/bin/test-mk" -m "$(model_path "$m")" -p "$p" -n 16 --rounds 0 -c "$c" --fa "$fa" --max-nmse 10 --max-disagree 1000 2>&1 |
            tee -a "$OUT/deep.log" | grep -E "verify ==|NMSE|greedy|hidden states, verify|FAIL"
        [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
        for v in ${MK_DEEP_VARIANT:-none}; do
            [ "$v" = none ] && v=""
            log "deep: greedy tg$n after the ~$d-token prompt, megakernel vs graph${v:+ vs variant $v}"
            "$BLD/bin/test-mk" -m "$(model_path "$m")" -p "$p" -n 4 --rounds 2 --bench-n "$n" -c "$c" --fa "$fa" --max-nmse 10 \
                --max-disagree 1000 ${v:+--variant "$v"} ${v:+${MK_VARIANT_OTHER_BITS:+--variant-other-bits}} 2>&1 |
                tee -a "$OUT/deep.log" | grep -E "^speed|^variant"
        done
        log "deep: per-phase profile after the ~$d-token prompt (tg64)"
        LLAMA_MEGAKERNEL_PROFILE=1 "$BLD/bin/test-mk" -m "$(model_path "$m")" -p "$p" -n 4 --rounds 1 --bench-n 64 -c "$c" --fa "$fa" \
            --max-nmse 10 --max-disagree 1000 2>&1 | tee -a "$OUT/deep.log" | grep -E "llama_mk profile" | grep -E "token:|M=1 "
    done
    return "$rc"
}

# llama-server with the megakernel: speculative (draft-simple k = 1..4, -np 2, draft-mtp k = 1..4) == greedy
# (megakernel/server_check.py); needs a build with llama-server (MK_TARGETS) and the models small, small-f16 and small-h
stage_server() {
    log "llama-server: speculative == greedy with the megakernel (synthetic gemma4 pair)"
    STQ_METAL_CACHE="$WORK/cache" python3 "$HERE/megakernel/server_check.py" --bin "$BLD/bin" \
        --target "$MODELS/small-f16/gemma4-synth-target.gguf" --draft "$MODELS/small/gemma4-synth-target.gguf" \
        --assistant "$MODELS/small-f16/gemma4-synth-assistant.gguf" \
        --mtp-target "$MODELS/small-h/gemma4-synth-target.gguf" --mtp-assistant "$MODELS/small-h/gemma4-synth-assistant.gguf" \
        --json "$OUT/server.json" 2>&1 | tee -a "$OUT/server.log" | grep -v "^\[stq-metal\]" | tail -32
    return "${PIPESTATUS[0]}"
}

# compute-sanitizer over test-mk on the small F16 pair (-n 2: teacher-forced and greedy steps, verify M = 2..8; racecheck: below).
# racecheck tracks every shared-memory access of a block: on the whole grid it never finished (sessions 8-19), nor on
# one block of the small F16 pair with only the megakernel instrumented (session 20: > 95 s before the first step's
# result: its LM head has 262144 rows). So by default it runs on ONE block (LLAMA_MEGAKERNEL_GRID=${MK_SAN_RACE_GRID:-1}),
# on the same pair with the tokenizer's first 4096 tokens (model tiny-f16, made here if missing; MK_SAN_RACE_MODEL),
# with only the megakernel's kernels instrumented (--kernel-name kns=mk_, where the tool has the option; the graph's
# kernels of the reference context then run uninstrumented), and with test-mk's short checks (MK_SAN_RACE_ARGS, default
# "-n 1 --verify-max 3 --hidden-batches 1": 22 megakernel launches instead of -n 2's 54; verify M = 2, 3 still spans
# the one-token, small-batch and staging code). Each tool runs under a cap (MK_SAN_CAP seconds, default
# 400); a tool that reaches it is reported as "TIMED OUT (not finished)" and fails the stage, as do reported errors
stage_sanitize() {
    local tool nb grid filt rc bad=0 t0
    filt=""
    # (the help into a variable first: `| grep -q` under pipefail would fail the probe when grep closes the pipe early)
    local help
    help="$(compute-sanitizer --help 2>/dev/null)"
    if grep -q -- "--kernel-name" <<< "$help"; then
        filt="--kernel-name kns=mk_"
    fi
    for tool in ${MK_SAN_TOOLS:-memcheck synccheck racecheck}; do
        # (racecheck and synccheck track every mbarrier of the grid: 16 warps x the weight stages per block)
        nb=""; grid="${MK_SAN_GRID:-}"
        [ "$tool" = memcheck ] || nb="--num-cuda-barriers ${MK_SAN_BARRIERS:-8192}"
        local f="" m=small-f16 args="-n 2"
        if [ "$tool" = racecheck ]; then
            grid="${MK_SAN_GRID:-${MK_SAN_RACE_GRID:-1}}"
            f="$filt"
            m="${MK_SAN_RACE_MODEL:-tiny-f16}"
            args="${MK_SAN_RACE_ARGS:--n 1 --verify-max 3 --hidden-batches 1}"
        fi
        MK_MODELS=$m stage_models || return 1
        log "compute-sanitizer $tool on $m (grid: ${grid:-whole}; kernels: ${f:-all}; test-mk $args; cap ${MK_SAN_CAP:-400} s)"
        t0=$SECONDS
        # shellcheck disable=SC2086
        LLAMA_MEGAKERNEL_GRID=$grid timeout -k 5 "${MK_SAN_CAP:-400}" compute-sanitizer --tool $tool $nb $f --error-exitcode 3 \
            "$BLD/bin/test-mk" -m "$(model_path "$m")" $args --rounds 0 --max-nmse 10 --max-disagree 100 > "$OUT/sanitize-$tool.log" 2>&1
        rc=$?
        cat "$OUT/sanitize-$tool.log" >> "$OUT/sanitize.log"
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race|Hazard|test-mk:|^verify ==|^teacher" "$OUT/sanitize-$tool.log" | head -8
        case $rc in
            0)       echo "$tool: rc 0 in $((SECONDS - t0)) s" ;;
            124|137) echo "$tool: TIMED OUT (not finished) after $((SECONDS - t0)) s"; bad=1 ;;
            *)       echo "$tool: rc $rc in $((SECONDS - t0)) s (3: errors reported)"; bad=1 ;;
        esac
    done
    return $bad
}

# A/B of two builds of the megakernel in alternating processes, for a change that is no run-time variant: A = this
# tree's megakernel (stage build first), B = the megakernel sources under MK_AB_BASE (e.g. here: `mkdir -p .dev/mk-base &&
# git archive BASE megakernel | tar -x -C .dev/mk-base`, then MK_AB_BASE=.dev/mk-base/megakernel, carried). B is built
# in the same build tree (only what the megakernel's sources touch is rebuilt), so run this stage last: the build
# tree is B's afterwards. Each side's bin/ is kept in a folder of its own and loaded through LD_LIBRARY_PATH (ldd
# printed). On the last model of MK_MODELS, MK_AB_ROUNDS (default 2) rounds of A B B A: test-mk's checks and greedy tg32
# (megakernel vs graph: the graph is the same code on both sides, so it shows the machine's drift), then tg256 after the
# long prompt; then each side's per-phase profile after the long prompt. A change meant to keep the bits prints the
# same check lines (NMSE, greedy) on both sides
# the two sides of an A/B in one build tree: side a (bin-a) the binaries stage build made from this tree, side b (bin-b)
# the megakernel sources of MK_AB_BASE (a `megakernel` folder, e.g. `git archive REV megakernel` unpacked) built into the
# same tree (only libllama and test-mk change). Stages ab and vcost run them
stage_sides() {
    local base="${MK_AB_BASE:?MK_AB_BASE: the megakernel sources of side b}" side
    base="$(cd "$base" && pwd)" || return 1
    rm -rf "$WORK/bin-a" "$WORK/bin-b" && cp -a "$BLD/bin" "$WORK/bin-a" || return 1
    log "sides: the megakernel of $base into the same build tree (side b)"
    local t0=$SECONDS
    cmake -S "$SRC" -B "$BLD" -DGGML_MEGAKERNEL_DIR="$base" > "$OUT/ab-build.log" 2>&1 &&
        ninja -C "$BLD" -j "$JOBS" llama >> "$OUT/ab-build.log" 2>&1 &&
        g++ -std=c++17 -O2 -o "$BLD/bin/test-mk" "$base/tests/test-mk.cpp" -I"$SRC/include" -I"$SRC/src" -I"$SRC/ggml/include" \
            -L"$BLD/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$BLD/bin" >> "$OUT/ab-build.log" 2>&1 || { tail -20 "$OUT/ab-build.log"; return 1; }
    log "sides: side b built in $((SECONDS - t0)) s"
    cp -a "$BLD/bin" "$WORK/bin-b" || return 1
    for side in a b; do
        echo "side $side:"; LD_LIBRARY_PATH="$WORK/bin-$side" ldd "$WORK/bin-$side/test-mk" | grep -E "libllama|libggml"
    done
}

# verify steps' kernels per side (after stage sides): test-mk --verify-cost with the kernel's profile in processes of
# MK_VCOST_SIDES (default "a b b a a b"; "a+V": side a with LLAMA_MEGAKERNEL_VARIANT=V), on the last model of MK_MODELS;
# one line per process: the kernel's us for steps of M = 1..5 tokens, and test-mk's bitwise checks (verify == decode)
stage_vcost() {
    local m sv side v rc=0
    m=$(echo ${MK_MODELS:-small} | awk '{print $NF}')
    for sv in ${MK_VCOST_SIDES:-a b b a a b}; do
        side=${sv%%+*}; v=0; [ "$sv" != "$side" ] && v=${sv#*+}
        echo "#### side $sv" >> "$OUT/vcost.log"
        LD_LIBRARY_PATH="$WORK/bin-$side" LLAMA_MEGAKERNEL_VARIANT=$v LLAMA_MEGAKERNEL_PROFILE=1 "$WORK/bin-$side/test-mk" \
            -m "$(model_path "$m")" -n 8 --rounds 2 --bench-n 8 --max-nmse 10 --max-disagree 100 --hidden-batches 0 \
            --verify-cost > "$OUT/vcost-1.log" 2>&1 || rc=1
        cat "$OUT/vcost-1.log" >> "$OUT/vcost.log"
        log "vcost side $sv: $(grep -E "steps of [1-5] tok" "$OUT/vcost-1.log" |
            sed -E 's/.*steps of ([0-9]) tokens?: kernel ([0-9.]+) us.*/M=\1 \2/' | tr '\n' ' ')"
        grep -E "verify ==|FAIL" "$OUT/vcost-1.log"
    done
    rm -f "$OUT/vcost-1.log"
    return $rc
}

stage_ab() {
    local m side r long
    m=$(echo ${MK_MODELS:-small} | awk '{print $NF}')
    long=$(long_prompt)
    stage_sides || return 1
    for r in $(seq "${MK_AB_ROUNDS:-2}"); do
        for side in a b b a; do
            log "ab: round $r side $side"
            LD_LIBRARY_PATH="$WORK/bin-$side" "$WORK/bin-$side/test-mk" -m "$(model_path "$m")" -n 16 --rounds 2 --bench-n 32 \
                --max-nmse 10 --max-disagree 1000 2>&1 | grep -E "^speed|teacher|greedy|verify =="
            LD_LIBRARY_PATH="$WORK/bin-$side" "$WORK/bin-$side/test-mk" -m "$(model_path "$m")" -p "$long" -n 4 --rounds 2 \
                --bench-n 256 -c 4096 --max-nmse 10 --max-disagree 1000 2>&1 | grep -E "^speed"
        done
    done
    for side in a b; do
        log "ab: per-phase profile after the long prompt, tg256, side $side"
        LD_LIBRARY_PATH="$WORK/bin-$side" LLAMA_MEGAKERNEL_PROFILE=1 "$WORK/bin-$side/test-mk" -m "$(model_path "$m")" -p "$long" \
            -n 4 --rounds 1 --bench-n 256 -c 4096 --max-nmse 10 --max-disagree 1000 2>&1 | grep -E "llama_mk profile" | grep -E "token:|M=1 "
    done
}

# before any stage (a build takes minutes of device time): the models the stages will make from the tokenizer need it
# carried (`carry` .dev/mk/tokenizer.gguf); say so now, not after the build
preflight() {
    local st m
    for st in "$@"; do
        [ "$st" = models ] || continue
        for m in ${MK_MODELS:-small}; do
            [ "$m" = gemma3 ] && continue   # (carried whole: stage receive)
            model_made "$m" && continue
            case "$m" in *-q4km) model_made "${m%-q4km}" && continue ;; esac   # (requantized from its base model)
            if [ ! -f "$DEV/mk/tokenizer.gguf" ]; then
                echo "device.sh: model $m is made from $DEV/mk/tokenizer.gguf, which is missing: make it here with"
                echo "  .venv/bin/python harness/synth_gemma4.py --tokenizer-from \"\$(.venv/bin/stq-metal model)\" --tokenizer-only .dev/mk/tokenizer.gguf"
                echo "and carry it: run(..., carry=[\".dev/cuda\", \".dev/mk/tokenizer.gguf\"]). Nothing was run."
                return 1
            fi
        done
    done
}

[ $# -gt 0 ] || { sed -n "2,/^set -uo/p" "$0" | sed "$ d"; exit 2; }
preflight "$@" || exit 1
unpack
rc=0
for st in "$@"; do
    if ! "stage_$st"; then
        log "stage $st failed"
        rc=1
        [ "$st" = check ] || [ "$st" = build ] && exit 1   # nothing after them can run
    fi
done
exit $rc
