#!/usr/bin/env bash
# The Hy4-shaped synthetic STQ1_0 MoE (harness/synth_hy4.py) on CUDA, on the lent GPU machine.
#
# Here (no GPU needed):
#   harness/hy4_device.sh pack
#       packs the applied llama.cpp tree (harness/cuda_device.sh pack) into .dev/cuda/src.tar.xz and the
#       Gemma 3 270M tokenizer, cut to the synthetic model's vocabulary, into .dev/hy4/tokenizer.gguf
#       (~1 MB: the model itself is generated there, it is larger than one call may carry; STQ_GEMMA=FILE
#       names the Gemma GGUF, else the harness fetches it)
#
# There (through the device tool, from the repo root; two calls while the machine stays warm):
#   run(command="bash harness/hy4_device.sh remote build", carry=[".dev"], timeout_s=600)
#   run(command="bash harness/hy4_device.sh remote test", carry=[".dev"], timeout_s=600)
#       build: CUDA sm_90 build of llama-server + llama-quantize in /tmp/stq-hy4/build (build.log)
#       test:  generates the model with that llama-quantize, then pytest tests/test_hy4.py with
#              STQ_CPU_BUILD = STQ_CUDA_BUILD = that build: tensor table, CPU serving + chat template,
#              hyv4 twin, and CUDA (-ngl 99 -dev CUDA0) vs CPU (-dev none) first-token log-probabilities
#              and greedy tokens (test.log; the model's quantize.log); the metal-emu test is deselected
#
# Environment (remote): STQ_HY4_WORK (default /tmp/stq-hy4), STQ_CUDA_JOBS (default: nproc),
#   STQ_HY4_CMAKE_ARGS: extra cmake options, after the defaults (a repeated -D wins), STQ_HY4_TARGETS: extra
#   ninja targets. One build can then serve harness/cuda_device.sh's rpc stage too, e.g.
#     STQ_HY4_CMAKE_ARGS="-DGGML_RPC=ON -DLLAMA_BUILD_TESTS=ON -DGGML_CUDA_FA=OFF" \
#     STQ_HY4_TARGETS="ggml-rpc-server test-backend-ops llama-bench" bash harness/hy4_device.sh remote build
#     STQ_CUDA_WORK=/tmp/stq-hy4 STQ_RPC_BUILD=/tmp/stq-hy4/build bash harness/cuda_device.sh remote rpc
#   (GGML_CUDA_FA defaults to ON upstream: the FlashAttention kernels cost minutes of build time). The web UI is
#   off (-DLLAMA_USE_PREBUILT_UI=OFF, as harness/build.py): llama-server's default fetches it from Hugging Face.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEV="$HERE/.dev"

pack() {
    bash "$HERE/harness/cuda_device.sh" pack "$@"
    mkdir -p "$DEV/hy4"
    (cd "$HERE" && python3 - "$DEV/hy4/tokenizer.gguf" <<'EOF'
import os, sys
from pathlib import Path
from harness import models, synth_hy4
from harness.gguf_layout import write_gguf
gemma = Path(os.environ["STQ_GEMMA"]) if os.environ.get("STQ_GEMMA") else models.ensure_gemma()
kv, types = synth_hy4.tokenizer_kv(gemma, synth_hy4.Hy4Params().n_vocab)
write_gguf(Path(sys.argv[1]), {"general.architecture": "none", **kv}, [], kv_types=types)
print(f"wrote {sys.argv[1]}")
EOF
    )
}

remote() {
    local out="${OUT:-$DEV/hy4/out}" work="${STQ_HY4_WORK:-/tmp/stq-hy4}"
    local src="$work/src" bld="$work/build" jobs="${STQ_CUDA_JOBS:-$(nproc)}"
    mkdir -p "$out"
    export PYTHONUNBUFFERED=1
    [ -f "$DEV/cuda/src.tar.xz" ] || { echo "error: .dev/cuda/src.tar.xz missing: run 'harness/hy4_device.sh pack' here" >&2; exit 1; }
    local sum
    sum="$(sha256sum "$DEV/cuda/src.tar.xz" | cut -c1-16)"
    if [ ! -f "$src/.packed-$sum" ]; then
        rm -rf "$src"; mkdir -p "$src"
        tar -xJf "$DEV/cuda/src.tar.xz" -C "$src"
        touch "$src/.packed-$sum"
    fi
    for st in "$@"; do
        case "$st" in
        build)
            {
                echo "== $(date -u +%FT%TZ) build ($(cat "$DEV/cuda/src.commit" 2>/dev/null || echo '?')) ${STQ_HY4_CMAKE_ARGS:-}"
                cmake -S "$src" -B "$bld" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
                    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF \
                    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
                    -DLLAMA_USE_PREBUILT_UI=OFF ${STQ_HY4_CMAKE_ARGS:-} > /dev/null
                local t0=$SECONDS t
                ninja -C "$bld" -j "$jobs" llama-server llama-quantize ${STQ_HY4_TARGETS:-} 2>&1 | grep -Ev '^\[[0-9]+/[0-9]+\] (Building|Linking)' || true
                for t in llama-server llama-quantize ${STQ_HY4_TARGETS:-}; do
                    test -x "$bld/bin/$t" || { echo "!! $bld/bin/$t was not built"; exit 1; }
                done
                echo "== build done in $((SECONDS - t0)) s"
            } 2>&1 | tee -a "$out/build.log"
            ;;
        test)
            {
                echo "== $(date -u +%FT%TZ) pytest tests/test_hy4.py (CUDA build $bld)"
                nvidia-smi -L || true
                (cd "$HERE" && STQ_METAL_CACHE="$work/cache" STQ_CPU_BUILD="$bld" STQ_CUDA_BUILD="$bld" \
                    STQ_GEMMA="$DEV/hy4/tokenizer.gguf" \
                    python3 -m pytest -q -s -p no:cacheprovider tests/test_hy4.py -k "not metal_emu" -rs 2>&1) || true
                cp "$work"/cache/models/hy4-synth-*/quantize.log "$out/" 2>/dev/null || true
            } 2>&1 | tee -a "$out/test.log"
            ;;
        *) echo "error: unknown stage '$st' (build test)" >&2; exit 2 ;;
        esac
    done
}

case "${1:-}" in
    pack)   shift; pack "$@" ;;
    remote) shift; [ $# -gt 0 ] || set -- build test; remote "$@" ;;
    *)      sed -n '2,27p' "${BASH_SOURCE[0]}"; exit 2 ;;
esac
