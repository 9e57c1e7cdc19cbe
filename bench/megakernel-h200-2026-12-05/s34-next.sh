#!/usr/bin/env bash
# For session 35 (cold): the candidate of branch `valround` (s34/valround-pair.patch: mk_stage_cols<MC, PAIR>, over a
# pair of blocks the verify staging's values 2 slots a round for the block's own columns; untimed) against main, two
# builds in one tree. Here, first:
#   rm -rf .dev/mk-cand && mkdir -p .dev/mk-cand && git archive valround megakernel | tar -x -C .dev/mk-cand
#   (or: git worktree add /tmp/vr main && (cd /tmp/vr && git apply bench/megakernel-h200-2026-12-05/s34/valround-pair.patch
#    && git archive --format=tar HEAD megakernel | ...): the patch's megakernel tree under .dev/mk-cand/megakernel)
#   run(command="bash bench/megakernel-h200-2026-12-05/s34-next.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf",
#       ".dev/mk-cand"], timeout_s=600, kind="nvidia-h100-x1")
# Side a: main's build (device.sh build); side b: .dev/mk-cand's megakernel built into the same tree. test-mk
# --verify-cost with the kernel's profile, sides a b b a a b (verify == decode bitwise M = 2..8 in each); M = 2..4 are the
# steps it changes (session 34: main 5693 / 6272 / 6702 us).
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench" MK_MODELS="e4b-mtp"
W=/tmp/stq-mk; M=$W/models/e4b-mtp.gguf; BLD=$W/build; SRC=$W/src
cand="$PWD/.dev/mk-cand/megakernel"
[ -f "$cand/cuda/mk-kernel.cuh" ] || { echo "no $cand: see the header"; exit 1; }
bash megakernel/device.sh build models > "$OUT/s35-build.log" 2>&1 || { grep -E "^== |error" "$OUT/s35-build.log" | tail -8; exit 1; }
echo "== build + models at $((SECONDS - t0)) s"
rm -rf "$W/bin-a" "$W/bin-b" && cp -a "$BLD/bin" "$W/bin-a"
cmake -S "$SRC" -B "$BLD" -DGGML_MEGAKERNEL_DIR="$cand" > "$OUT/s35-cand-build.log" 2>&1 &&
    ninja -C "$BLD" -j "$(nproc)" llama >> "$OUT/s35-cand-build.log" 2>&1 &&
    g++ -std=c++17 -O2 -o "$BLD/bin/test-mk" "$cand/tests/test-mk.cpp" -I"$SRC/include" -I"$SRC/src" -I"$SRC/ggml/include" \
        -L"$BLD/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$BLD/bin" >> "$OUT/s35-cand-build.log" 2>&1 || { tail -20 "$OUT/s35-cand-build.log"; exit 1; }
cp -a "$BLD/bin" "$W/bin-b"
echo "== candidate built at $((SECONDS - t0)) s"
for side in a b b a a b; do
    [ $((SECONDS - t0)) -lt 570 ] || break
    echo "#### side $side" >> "$OUT/s35-verify.log"
    LD_LIBRARY_PATH="$W/bin-$side" LLAMA_MEGAKERNEL_PROFILE=1 timeout -k 5 40 "$W/bin-$side/test-mk" -m $M -n 8 --rounds 2 \
        --bench-n 8 --max-nmse 10 --max-disagree 100 --hidden-batches 0 --verify-cost > "$OUT/s35-v.log" 2>&1
    echo "== side $side rc=$? at $((SECONDS - t0)) s: $(grep -E "steps of [1-5] tok" "$OUT/s35-v.log" | sed -E 's/.*steps of ([0-9]) tokens?: kernel ([0-9.]+) us.*/M=\1 \2/' | tr '\n' ' ')"
    grep -E "verify ==|FAIL" "$OUT/s35-v.log"
    grep -E "llama_mk|verify|test-mk:|FAIL" "$OUT/s35-v.log" >> "$OUT/s35-verify.log"
done
rm -f "$OUT/s35-v.log"; gzip -9 "$OUT"/s35-*.log
echo "== done at $((SECONDS - t0)) s"
