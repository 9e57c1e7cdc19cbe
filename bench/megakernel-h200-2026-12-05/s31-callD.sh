#!/usr/bin/env bash
# session 31, call D (written in session 30 as "s30-callC.sh"; NOT RUN yet; since a1f2672 the clusters are the default
# and 0x10000000 the unclustered staging, so the two runs below still compare the two ways). Warm, right after s31-callA.sh (it
# reuses that call's build and models):
#   run(command="bash bench/megakernel-h200-2026-12-05/s31-callD.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"])
# ncu of one verify launch of 4 tokens on the E4B-shaped target, the default and the cluster staging
# (since a1f2672 the default; 0x10000000 = GGML_MK_VAR_NO_CLUSTER_STAGE, staged whole in every block), CSVs gzipped. Where the samples go per function, here (the same nvcc 13.0):
#   .venv/bin/python -m harness.cuda_toolkit --nvcc --sass --ncu ncuv-sass-V.csv -I ... megakernel/cuda/mk.cu
# (session 29: the unclustered mk_stage_cols 25 % of a verify of 4; the clusters should halve it)
set -u
t0=$SECONDS
W=/tmp/stq-mk
[ -x "$W/build/bin/test-mk" ] || { echo "no build: the machine is not call B's"; exit 1; }
export MK_MODELS=e4b-mtp
for v in 0 0x10000000; do
    cap=260; [ $v = 0 ] || cap=$((540 - (SECONDS - t0)))
    echo "== $(date -u +%T) ncuv (verify launch of 4 tokens), variant $v, cap $cap s"
    LLAMA_MEGAKERNEL_VARIANT=$v timeout -k 5 $cap bash megakernel/device.sh ncuv > "$W/ncuv-$v.log" 2>&1
    echo "rc=$? at $((SECONDS - t0)) s"; grep -E "Duration|DRAM Throughput|cluster" "$W/ncuv-$v.log" | head -4 | cut -c1-200
    [ -f "$OUT/ncuv-sass.csv" ] && mv "$OUT/ncuv-sass.csv" "$OUT/ncuv-sass-$v.csv" && gzip -f "$OUT/ncuv-sass-$v.csv"
    cp "$W/ncuv-$v.log" "$OUT/s31D-ncuv-$v.log"
done
echo "== done at $((SECONDS - t0)) s"
