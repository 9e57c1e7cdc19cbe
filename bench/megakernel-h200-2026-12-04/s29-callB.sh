#!/usr/bin/env bash
# session 29 call B (warm, right after s28-callA.sh, which built the working tree: session 28's changes + the record
# swizzle, mk_rec_slot). Side A = that build; side B = HEAD 8c0dd95's megakernel (no swizzle), built into the same tree.
#   here first: rm -rf .dev/mk-base && mkdir -p .dev/mk-base && git archive 8c0dd95 megakernel | tar -x -C .dev/mk-base
#   run(command="bash bench/megakernel-h200-2026-12-04/s29-callB.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf", ".dev/mk-base"])
set -u
t0=$SECONDS
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models; SRC=$W/src; BLD=$W/build
[ -x "$B/test-mk" ] || { echo "no build: the machine is not call A's"; exit 1; }
echo "== $(date -u +%T) side A: variants (0x4000000 on the mix, 0x2000000 on Q4_0), Q4_0 checks, profiles"
timeout 60 "$B/test-mk" -m "$M/e4b-q4km.gguf" -n 4 --rounds 4 --bench-n 64 --max-nmse 10 --max-disagree 100 --variant 0x4000000 > "$OUT/s29B-q4km-var.log" 2>&1
grep -E "variant|speed" "$OUT/s29B-q4km-var.log" | cut -c1-200 | tail -3
timeout 60 "$B/test-mk" -m "$M/e4b.gguf" -n 4 --rounds 4 --bench-n 64 --max-nmse 10 --max-disagree 100 --variant 0x2000000 > "$OUT/s29B-q40-var.log" 2>&1
grep -E "variant|speed" "$OUT/s29B-q40-var.log" | cut -c1-200 | tail -3
timeout 90 "$B/test-mk" -m "$M/e4b.gguf" -n 16 --rounds 4 --bench-n 64 --max-nmse 10 --max-disagree 100 --verify-cost > "$OUT/s29B-q40-bench.log" 2>&1
echo "rc=$?"; grep -E "NMSE|greedy|verify ==|speed|verify cost|test-mk:" "$OUT/s29B-q40-bench.log" | cut -c1-230 | tail -8
for mdl in e4b-q4km e4b; do
    LLAMA_MEGAKERNEL_PROFILE=1 timeout 40 "$B/test-mk" -m "$M/$mdl.gguf" -n 48 --rounds 0 --max-nmse 10 --max-disagree 100 > "$OUT/s29B-$mdl-profile.log" 2>&1
done
echo "== profiles done at $((SECONDS - t0)) s"
base="$(cd .dev/mk-base/megakernel && pwd)" || exit 1
rm -rf "$W/bin-a" "$W/bin-b" && cp -a "$B" "$W/bin-a" || exit 1
timeout 300 bash -c "cmake -S '$SRC' -B '$BLD' -DGGML_MEGAKERNEL_DIR='$base' && ninja -C '$BLD' llama && g++ -std=c++17 -O2 -o '$B/test-mk' '$base/tests/test-mk.cpp' -I'$SRC/include' -I'$SRC/src' -I'$SRC/ggml/include' -L'$B' -lllama -lggml -lggml-base -Wl,-rpath,'$B'" > "$OUT/s29B-base-build.log" 2>&1 || { tail -20 "$OUT/s29B-base-build.log"; exit 1; }
cp -a "$B" "$W/bin-b" || exit 1
echo "== base built at $((SECONDS - t0)) s"
for mdl in e4b e4b-q4km; do
    for side in a b b a; do
        [ $((SECONDS - t0)) -gt 540 ] && break 2
        echo "== $(date -u +%T) $mdl side $side at $((SECONDS - t0)) s"
        LD_LIBRARY_PATH="$W/bin-$side" timeout 45 "$W/bin-$side/test-mk" -m "$M/$mdl.gguf" -n 4 --rounds 2 --bench-n 64 \
            --max-nmse 10 --max-disagree 1000 --verify-cost 2>&1 | grep -E "^speed|verify cost \(mega|verify ==" | cut -c1-200
    done
done
echo "== done at $((SECONDS - t0)) s"
