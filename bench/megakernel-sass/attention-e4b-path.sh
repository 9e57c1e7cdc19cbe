#!/usr/bin/env bash
# The attention chunk loop's nvcc SASS on E4B's path (NOTES.md session 31): a copy of megakernel/ (the working tree's,
# or git revision REV's) with the head's dimension pairs (np = NP), the transposed V and its 16-byte loads forced, so that the static
# instruction count of each loop is the one E4B executes; prints the block-per-(token, head) attention (sliding, NP 4;
# global, NP 8) and its three innermost loops (the chunk loop, the cell step).
#   bash bench/megakernel-sass/attention-e4b-path.sh [REV]    # e.g. 7cc176d: the loop before session 31
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=${STQ_METAL_CACHE:-$HOME/.cache/stq-metal}/llama.cpp
[ -d "$SRC/ggml/src" ] || { echo "no applied llama.cpp tree at $SRC (./RUNBOOK.sh setup makes it)" >&2; exit 1; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
if [ $# -gt 0 ]; then
    git archive "$1" megakernel | tar -x -C "$T" && mv "$T/megakernel" "$T/mk"
else
    mkdir -p "$T/mk/cuda" && cp megakernel/*.h "$T/mk/" && cp megakernel/cuda/* "$T/mk/cuda/"
fi
python3 - "$T/mk/cuda/mk-kernel.cuh" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
for a, b in [("const int np     = hd/64;", "const int np     = NP;"), ("const bool vt    = kv.v_sd != 2;", "const bool vt    = true;")]:
    if a not in s:
        sys.exit(f"attention-e4b-path: '{a}' not found in {p}: the attention's prologue changed, update this script")
    s = s.replace(a, b)
i = s.index("const bool vt16  = vt &&")
s = s[:i] + "const bool vt16  = true" + s[s.index(";", s.index("(n_kv + 7)/8*8", i)):]
open(p, "w").write(s)
PY
for np in 4 8; do
    .venv/bin/python -m harness.cuda_toolkit --nvcc --sass --loops "mk_attentionILi${np}ELb1ELb0" -I "$SRC/ggml/src" \
        -I "$SRC/ggml/include" -I "$T/mk" -I "$T/mk/cuda" "$T/mk/cuda/mk.cu" > "$T/out.txt" 2>&1 || { tail -20 "$T/out.txt"; exit 1; }
    grep -E "mk_attentionILi${np}ELb1ELb0" "$T/out.txt" | head -1
    grep -i "loop" "$T/out.txt" | sed -n 2,4p
done
