#!/usr/bin/env python3
"""Per-function SASS main-loop instruction counts (the largest backward-branch loop) of a cubin.

    python3 sass_loop.py CUBIN [FUNCTION-SUBSTRING] [--cuobjdump PATH]
"""
import collections, re, subprocess, sys

def main():
    args = sys.argv[1:]
    tool = "cuobjdump"
    if "--cuobjdump" in args:
        i = args.index("--cuobjdump"); tool = args[i + 1]; del args[i:i + 2]
    cubin = args[0]; filt = args[1] if len(args) > 1 else ""
    out = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    funcs = re.split(r"\n\s*Function : ", out)[1:]
    for f in funcs:
        name = f.split("\n", 1)[0].strip()
        if filt not in name:
            continue
        ins = []  # (addr, opcode, text)
        for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", f):
            addr = int(m.group(1), 16); text = m.group(2).strip()
            op = re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]
            ins.append((addr, op, text))
        best = None
        for a, op, text in ins:
            if op.startswith("BRA"):
                t = re.search(r"0x([0-9a-f]+)", text.split(None, 1)[1] if " " in text else "")
                if t and int(t.group(1), 16) < a:
                    lo = int(t.group(1), 16)
                    body = [x for x in ins if lo <= x[0] <= a]
                    if best is None or len(body) > len(best):
                        best = body
        if not best:
            print(f"{name}: no loop"); continue
        c = collections.Counter(re.sub(r"\..*", "", op) for _, op, _ in best)
        top = " ".join(f"{k} {v}" for k, v in c.most_common())
        print(f"{name}: total {len(ins)}, main loop {len(best)}: {top}")

main()
