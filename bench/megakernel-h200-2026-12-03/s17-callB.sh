#!/usr/bin/env bash
# session 17 call B, as run through the device tool: run(command="bash <this>", carry=[".dev/cuda",
# ".dev/mk/tokenizer.gguf", ".dev/mk-base"]) from the repository root, after `mkdir -p .dev/mk-base && git archive
# a58e2b1 megakernel | tar -x -C .dev/mk-base` (the base: the megakernel before the mat-vec walk's stage counter)
MK_MODELS=e4b-mtp MK_AB_BASE=.dev/mk-base/megakernel bash megakernel/device.sh build models ab > "$OUT/callB.log" 2>&1
rc=$?
grep -E "^== |^speed|teacher|greedy|verify ==|side|lib(llama|ggml-cuda)|M=1 (gate|down|q/k|o proj|lm|per-layer|attention)|token:" "$OUT/callB.log" | cut -c1-200
exit $rc
