#!/usr/bin/env bash
# session 24 call D (cold; call C found a fresh machine without call B's build): run(command="bash <this>",
# carry=[".dev/cuda", ".dev/mk/tokenizer.gguf"], timeout_s=600)
# issue 12 item 4: the build, then compute-sanitizer racecheck of the megakernel on one block (tiny-f16, test-mk's short
# checks: device.sh sanitize's defaults), capped by the time left
set -u
t0=$SECONDS
bash megakernel/device.sh build > "$OUT/callD-build.log" 2>&1
rc=$?
echo "== build rc=$rc at $((SECONDS - t0)) s"
[ $rc -eq 0 ] || { grep -E "^== |error" "$OUT/callD-build.log" | tail -8; exit 1; }
cap=$((${MK_CAP:-560} - (SECONDS - t0))); [ $cap -lt 30 ] && exit 0
MK_SAN_TOOLS=racecheck MK_SAN_CAP=$cap bash megakernel/device.sh sanitize 2>&1 | tail -12
echo "== done at $((SECONDS - t0)) s"
