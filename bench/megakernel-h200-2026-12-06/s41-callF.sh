#!/usr/bin/env bash
# Session 41, call F (warm, after s40-callA.sh's build and the 7 receive calls of the real Gemma 3 270M): one decode
# launch of the 270M under ncu with per-SASS-instruction warp-state samples (device.sh stage ncusrc), to split a small
# model's step by function: the attention's chunks (call E: 13 us a layer on the critical path, 23 % of the step) against
# the mat-vecs and the staging. The CSVs come back gzipped; here:
#   .venv/bin/python -m harness.cuda_toolkit --nvcc --sass --ncu ncu-sass.csv.gz -I ... megakernel/cuda/mk.cu
#   run(command="bash bench/megakernel-h200-2026-12-06/s41-callF.sh", carry=[".dev/cuda"], timeout_s=300)
MK_MODELS=gemma3 bash megakernel/device.sh ncusrc
gzip -9 "$OUT"/ncu-*.csv
ls -la "$OUT"
