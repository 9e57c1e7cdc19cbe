#!/usr/bin/env bash
# session 18 call C, as run through the device tool: run(command="bash <this>", carry=[".dev/cuda",
# ".dev/mk/tokenizer.gguf", ".dev/mk-base"]) from the repository root, after `mkdir -p .dev/mk-base && git archive
# 4e0b0a8 megakernel | tar -x -C .dev/mk-base` (the base: before mk_mv_run took mk_mv_begin's fetch position).
# ncu source counters of the candidate first (after the long prompt), then the A/B (it leaves the base in the tree)
MK_NCU_LONG=1 MK_MODELS=e4b-mtp bash megakernel/device.sh build models ncusrc > "$OUT/callC.log" 2>&1
rc=$?
[ -f "$OUT/ncu-sass.csv" ] && gzip -f "$OUT/ncu-sass.csv"
MK_MODELS=e4b-mtp MK_AB_BASE=.dev/mk-base/megakernel bash megakernel/device.sh ab >> "$OUT/callC.log" 2>&1
rc2=$?
grep -E "^== |^speed|teacher|greedy|verify ==|side|lib(llama|ggml-cuda)|M=1 (gate|down|q/k|o proj|lm|per-layer|attention)|token:" "$OUT/callC.log" | cut -c1-200
echo "rc build/ncusrc $rc ab $rc2"
exit $((rc + rc2))
