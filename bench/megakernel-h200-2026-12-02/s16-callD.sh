#!/usr/bin/env bash
# session 16 call D (commit 111c80e), as run through the device tool: run(command="export OUT; bash <this>",
# carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"]) from the repository root (kept here as the record of the figures in
# NOTES.md "Attention groups of 8 chunks"; 0x100000 then meant groups of 8 chunks, the default of that build being 16)
MK_MODELS=e4b-mtp MK_CTX_PROF=1 MK_CTX_VARIANT=0x80000 MK_CTX_BENCH="32 1024" bash megakernel/device.sh build models ctx > $OUT/callD.log 2>&1
rc=$?
B=/tmp/stq-mk/build/bin; M=/tmp/stq-mk/models/e4b-mtp.gguf
long=$(python3 -c "print(' '.join(['The quick brown fox jumps over the lazy dog near the old river bank.']*24))")
{ echo "== checks at the long prompt, half groups"
  LLAMA_MEGAKERNEL_VARIANT=0x100000 $B/test-mk -m $M -p "$long" -n 16 --rounds 0 -c 4096 --max-nmse 10 --max-disagree 1000 2>&1 | grep -E "verify ==|NMSE|greedy|FAIL"
  for bn in 32 1024; do echo "== tg$bn half groups"; $B/test-mk -m $M -n 4 --rounds 2 --bench-n $bn -c 4096 --max-nmse 10 --max-disagree 1000 --variant 0x100000 2>&1 | grep -E "^speed|^variant"; done
  echo "== long+512 half groups"; $B/test-mk -m $M -p "$long" -n 4 --rounds 2 --bench-n 512 -c 4096 --max-nmse 10 --max-disagree 1000 --variant 0x100000 2>&1 | grep -E "^speed|^variant"
  echo "== profile half groups"; LLAMA_MEGAKERNEL_VARIANT=0x100000 LLAMA_MEGAKERNEL_PROFILE=1 $B/test-mk -m $M -p "$long" -n 4 --rounds 1 --bench-n 256 -c 4096 --max-nmse 10 --max-disagree 1000 2>&1 | grep -E "llama_mk (grid )?profile" | grep -E "token:|M=1 "
} > $OUT/callD-half.log 2>&1
exit $rc
