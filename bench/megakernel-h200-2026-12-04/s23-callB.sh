#!/usr/bin/env bash
# session 23 call B (cold): run(command="bash <this>", carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# issues 14/12: the logits rows handed to the backend samplers on the device (llama_mk_logits_dev: no copy to the host
# and back). 1) greedy megakernel with --backend-sampling gives host sampling's ids (E4B-shaped pair, 2 prompts x 48
# tokens); 2) end to end at noise 38 (call A: 0.71 accepted per draft at k = 3) with the finer timeline
set -u
t0=$SECONDS
export MK_TARGETS="llama-bench llama-server" MK_MODELS="e4b-mtp"
bash megakernel/device.sh build models > "$OUT/callB-build.log" 2>&1
rc=$?
echo "== build + models rc=$rc at $((SECONDS - t0)) s"
[ $rc -eq 0 ] || { grep -E "^== |error" "$OUT/callB-build.log" | tail -8; exit 1; }
W=/tmp/stq-mk
echo "== $(date -u +%T) ids: backend sampling (device rows) vs host sampling, megakernel greedy"
STQ_METAL_CACHE="$W/cache" PYTHONPATH="$W/src/gguf-py:$PWD" timeout -k 5 120 python3 - > "$OUT/callB-ids.log" 2>&1 <<'PY'
from pathlib import Path
from harness import spec
b, m = Path("/tmp/stq-mk/build/bin"), Path("/tmp/stq-mk/models/e4b-mtp.gguf")
args = ["-c", "4096", "-ngl", "99", "-fa", "off", "-lv", "4"]
env = {"LLAMA_MEGAKERNEL": "1"}
runs = {x: spec.run(b, m, spec.PROMPTS[:2], 48, args=args + extra, env=env, timeout=300, probs=False, label=x)
        for x, extra in (("host", []), ("backend", ["--backend-sampling"]))}
same = [g.tokens == h.tokens for g, h in zip(runs["host"].gens, runs["backend"].gens)]
print("ids backend == host per prompt:", same, "first diff:",
      [spec.first_diff(g.tokens, h.tokens) for g, h in zip(runs["host"].gens, runs["backend"].gens)])
print("RESULT", "OK" if all(same) else "FAIL")
PY
echo "== ids rc=$? at $((SECONDS - t0)) s"; tail -3 "$OUT/callB-ids.log"
cap=$((${MK_CAP:-560} - (SECONDS - t0))); [ $cap -lt 30 ] && exit 0
echo "== $(date -u +%T) e2e --backend-sampling --mk-timeline noise 38, cap $cap s"
MK_E2E_ARGS="--k 2,3 --rounds 2 -n 128 --noise 38 --backend-sampling --mk-timeline" \
    timeout -k 5 $cap bash megakernel/device.sh e2e > "$OUT/callB-e2e.log" 2>&1
echo "== e2e rc=$? at $((SECONDS - t0)) s (124/137: timed out)"
grep -E "^noise" -A9 "$OUT/callB-e2e.log" | cut -c1-170
grep -E "timeline" "$OUT/callB-e2e.log" | tail -3 | cut -c1-2500
