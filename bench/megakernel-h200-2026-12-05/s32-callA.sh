#!/usr/bin/env bash
# session 32, call A (cold): run(command="bash bench/megakernel-h200-2026-12-05/s32-callA.sh",
#   carry=[".dev/cuda", ".dev/mk/tokenizer.gguf", ".dev/mk-base"], timeout_s=600)
# Issue 12: the kernel reads its debug flags from its shared copy of the arguments (mk_args.flags), not through the
# model's plan in global memory: s29C's ncu put ~17.7k long-scoreboard samples (~3 % of the launch) on those loads, one
# before every grid barrier's arrival and one after most barriers (go(): GENERIC_M; the attention: FOLD, DEVICE_ATT).
# Same bits. device.sh's ab stage: side A = this tree (candidate), side B = .dev/mk-base (git archive of HEAD before the
# change: `mkdir -p .dev/mk-base && git archive HEAD megakernel | tar -x -C .dev/mk-base`), processes a b b a, tg32 and
# 256 tokens after the ~390-token prompt, then both sides' per-phase profiles. Builds llama-server too, for call B.
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench llama-server" MK_MODELS="e4b-mtp"
bash megakernel/device.sh build models > "$OUT/s32A-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
[ $rc -eq 0 ] || { grep -E "^== |error" "$OUT/s32A-build.log" | tail -8; exit 1; }
MK_AB_BASE=.dev/mk-base/megakernel MK_AB_ROUNDS=1 timeout -k 5 $((590 - (SECONDS - t0))) \
    bash megakernel/device.sh ab > "$OUT/s32A-ab.log" 2>&1
echo "== ab rc=$? at $((SECONDS - t0)) s"
grep -E "^== |^speed|^side|teacher|greedy|verify ==|kernel|M=1 " "$OUT/s32A-ab.log" | grep -v "libggml\|libllama" | cut -c1-160
