#!/usr/bin/env bash
# session 28's device plan, call C (warm, after call B). NOT RUN in session 28. The whole change against session 27's
# final megakernel (the two bit-identical changes have no variant, and this also catches what the new code costs the
# paths it does not speed up): build the base into the same tree (as device.sh's stage ab), then test-mk processes
# A B B A on both models (A = this change).
#   here first: rm -rf .dev/mk-base && mkdir -p .dev/mk-base && git archive c75f5a2 megakernel | tar -x -C .dev/mk-base
#   run(command="bash bench/megakernel-h200-2026-12-04/s28-callC.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf", ".dev/mk-base"], timeout_s=600)
set -u
t0=$SECONDS
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models; SRC=$W/src; BLD=$W/build
[ -x "$B/test-mk" ] || { echo "no build: the machine is not call A's"; exit 1; }
base="$(cd .dev/mk-base/megakernel && pwd)" || exit 1
rm -rf "$W/bin-a" "$W/bin-b" && cp -a "$B" "$W/bin-a" || exit 1
cmake -S "$SRC" -B "$BLD" -DGGML_MEGAKERNEL_DIR="$base" > "$OUT/s28C-base-build.log" 2>&1 &&
    ninja -C "$BLD" llama >> "$OUT/s28C-base-build.log" 2>&1 &&
    g++ -std=c++17 -O2 -o "$B/test-mk" "$base/tests/test-mk.cpp" -I"$SRC/include" -I"$SRC/src" -I"$SRC/ggml/include" \
        -L"$B" -lllama -lggml -lggml-base -Wl,-rpath,"$B" >> "$OUT/s28C-base-build.log" 2>&1 || { tail -20 "$OUT/s28C-base-build.log"; exit 1; }
cp -a "$B" "$W/bin-b" || exit 1
echo "== base built at $((SECONDS - t0)) s"
for side in a b; do echo "side $side:"; LD_LIBRARY_PATH="$W/bin-$side" ldd "$W/bin-$side/test-mk" | grep -E "libllama|libggml-cuda"; done
for mdl in e4b-q4km e4b; do
    for side in a b b a; do
        [ $((SECONDS - t0)) -gt 560 ] && break 2
        echo "== $(date -u +%T) $mdl side $side at $((SECONDS - t0)) s"
        LD_LIBRARY_PATH="$W/bin-$side" timeout 60 "$W/bin-$side/test-mk" -m "$M/$mdl.gguf" -n 8 --rounds 2 --bench-n 64 \
            --max-nmse 10 --max-disagree 1000 --verify-cost 2>&1 | grep -E "^speed|verify cost|greedy|verify ==" | cut -c1-200
    done
done
echo "== done at $((SECONDS - t0)) s"
