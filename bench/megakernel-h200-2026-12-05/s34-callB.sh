#!/usr/bin/env bash
# session 34, call B (warm, right after s34-callA.sh: its build is side a, the candidate GGML_MK_VAR_VAL_ROUND2 compiled
# in): side b = the megakernel of cd08078 (.dev/mk-base, `git archive cd08078 megakernel`) built into the same tree.
#   run(command="bash bench/megakernel-h200-2026-12-05/s34-callB.sh", carry=[".dev/mk-base"], timeout_s=600)
# Call A's default verify kernels (variant 0) of 2..4 tokens were ~3.5 % slower than call C's (session 33's script, an
# hour before, another machine) of the same defaults: is the candidate's second loop slowing the default path? test-mk
# --verify-cost with the profile, sides a b b a a b (side a also with the variant: a+v).
set -u
t0=$SECONDS
W=/tmp/stq-mk; M=$W/models/e4b-mtp.gguf; BLD=$W/build; SRC=$W/src
[ -x "$BLD/bin/test-mk" ] || { echo "no call A build here"; exit 1; }
base="$PWD/.dev/mk-base/megakernel"
rm -rf "$W/bin-a" "$W/bin-b" && cp -a "$BLD/bin" "$W/bin-a"
cmake -S "$SRC" -B "$BLD" -DGGML_MEGAKERNEL_DIR="$base" > "$OUT/s34B-build.log" 2>&1 &&
    ninja -C "$BLD" -j "$(nproc)" llama >> "$OUT/s34B-build.log" 2>&1 &&
    g++ -std=c++17 -O2 -o "$BLD/bin/test-mk" "$base/tests/test-mk.cpp" -I"$SRC/include" -I"$SRC/src" -I"$SRC/ggml/include" \
        -L"$BLD/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$BLD/bin" >> "$OUT/s34B-build.log" 2>&1 || { tail -20 "$OUT/s34B-build.log"; exit 1; }
cp -a "$BLD/bin" "$W/bin-b"
echo "== base built at $((SECONDS - t0)) s"
for sv in a b b a+v a b a+v a; do
    side=${sv%+v}; v=0; [ "$sv" != "$side" ] && v=0x80000000
    [ $((SECONDS - t0)) -lt 560 ] || break
    echo "#### side $sv" >> "$OUT/s34B-verify.log"
    LD_LIBRARY_PATH="$W/bin-$side" LLAMA_MEGAKERNEL_VARIANT=$v LLAMA_MEGAKERNEL_PROFILE=1 timeout -k 5 40 "$W/bin-$side/test-mk" \
        -m $M -n 8 --rounds 2 --bench-n 8 --max-nmse 10 --max-disagree 100 --hidden-batches 0 --verify-cost > "$OUT/s34B-v.log" 2>&1
    echo "== side $sv rc=$? at $((SECONDS - t0)) s: $(grep -E "steps of [1-5] tok" "$OUT/s34B-v.log" | sed -E 's/.*steps of ([0-9]) tokens?: kernel ([0-9.]+) us.*/M=\1 \2/' | tr '\n' ' ')"
    grep -E "llama_mk|verify|test-mk:|FAIL" "$OUT/s34B-v.log" >> "$OUT/s34B-verify.log"
done
rm -f "$OUT/s34B-v.log"; gzip -9 "$OUT"/s34B-*.log
echo "== done at $((SECONDS - t0)) s"
