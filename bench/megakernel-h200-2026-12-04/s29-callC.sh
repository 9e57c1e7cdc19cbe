#!/usr/bin/env bash
# session 29 call C (warm, after s29-callB.sh): ncu over the working tree's build (side A: session 28's changes + the
# record swizzle), E4B-shaped Q4_0: one decode launch (device.sh ncusrc: stall reasons + per-SASS samples) and one
# verify launch of 4 tokens (device.sh ncuv), each capped, CSVs gzipped
#   run(command="bash bench/megakernel-h200-2026-12-04/s29-callC.sh", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"])
set -u
t0=$SECONDS
W=/tmp/stq-mk; B=$W/build/bin
[ -x "$W/bin-a/test-mk" ] || { echo "no side A build: the machine is not call B's"; exit 1; }
rm -rf "$B" && cp -a "$W/bin-a" "$B" || exit 1
export MK_MODELS=e4b
echo "== $(date -u +%T) ncusrc (one decode launch)"
timeout -k 5 230 bash megakernel/device.sh ncusrc > "$W/ncusrc-stage.log" 2>&1
echo "rc=$? at $((SECONDS - t0)) s"; tail -6 "$W/ncusrc-stage.log" | cut -c1-200
[ -f "$OUT/ncu-sass.csv" ] && gzip -f "$OUT/ncu-sass.csv"; [ -f "$OUT/ncu-raw.csv" ] && gzip -f "$OUT/ncu-raw.csv"
cap=$((520 - (SECONDS - t0)))
echo "== $(date -u +%T) ncuv (verify launch of 4 tokens), cap $cap s"
timeout -k 5 $cap bash megakernel/device.sh ncuv > "$W/ncuv-stage.log" 2>&1
echo "rc=$? at $((SECONDS - t0)) s"; tail -12 "$W/ncuv-stage.log" | cut -c1-200
[ -f "$OUT/ncuv-sass.csv" ] && gzip -f "$OUT/ncuv-sass.csv"
echo "== done at $((SECONDS - t0)) s"
