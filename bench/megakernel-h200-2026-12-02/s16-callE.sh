#!/usr/bin/env bash
# session 16 call E (commit 27eb9c9, reverted after it): attention group size (16 default / 8 / 4 with several units per
# block) by context length; run through the device tool as run(command="export OUT; bash <this>", carry=[".dev/cuda",
# ".dev/mk/tokenizer.gguf", <this>]) (it ran from .dev/callE.sh; kept here as the record of NOTES.md's figures)
cd "$(dirname "$0")/.."
MK_MODELS=e4b-mtp MK_CTX_PROF=1 MK_CTX_VARIANT=0x200000 MK_CTX_BENCH="32 1024" bash megakernel/device.sh build models ctx > $OUT/callE.log 2>&1
rc=$?
B=/tmp/stq-mk/build/bin; M=/tmp/stq-mk/models/e4b-mtp.gguf
long=$(python3 -c "print(' '.join(['The quick brown fox jumps over the lazy dog near the old river bank.']*24))")
T="$B/test-mk -m $M -c 4096 --max-nmse 10 --max-disagree 1000"
{
for v in 0x100000 0x200000; do
  echo "== checks at the long prompt, variant $v"
  LLAMA_MEGAKERNEL_VARIANT=$v $T -p "$long" -n 16 --rounds 0 2>&1 | grep -E "verify ==|NMSE|greedy|FAIL"
done
echo "== tg1024 half groups"; $T -n 4 --rounds 2 --bench-n 1024 --variant 0x100000 2>&1 | grep -E "^speed|^variant"
echo "== long+512 half groups"; $T -p "$long" -n 4 --rounds 2 --bench-n 512 --variant 0x100000 2>&1 | grep -E "^speed|^variant"
for v in 0 0x200000 0x100000; do
  echo "== verify cost after the long prompt, variant $v"
  LLAMA_MEGAKERNEL_VARIANT=$v $T -p "$long" -n 2 --rounds 4 --bench-n 8 --verify-cost 2>&1 | grep -E "^verify cost"
done
echo "== profile half groups"; LLAMA_MEGAKERNEL_VARIANT=0x100000 LLAMA_MEGAKERNEL_PROFILE=1 $T -p "$long" -n 4 --rounds 1 --bench-n 256 2>&1 | grep -E "llama_mk (grid )?profile" | grep -E "token:|M=1 "
} > $OUT/callE-extra.log 2>&1
grep -E "^== |speed|variant|FAIL|error|M=1 (att|barr)|token:|verify ==" $OUT/callE.log | tail -60
cut -c1-160 $OUT/callE-extra.log | grep -v "M=1 [^ab]"
exit $rc
