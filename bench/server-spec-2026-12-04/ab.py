"""Session 24: llama-server`s speculative host gap, patch 0065 (old) vs 0066 (new) on metal-emu (see NOTES.md "Session 24").

Set-up (by hand): build llama-server in a metal-emu tree at each side, copy its bin/ to /tmp/srvab/old and /tmp/srvab/new;
then: .venv/bin/python bench/server-spec-2026-12-04/ab.py ~/.cache/stq-metal/models/gemma-3-270m-q4_k_m.gguf
"""
import sys, time, re
from pathlib import Path
sys.path.insert(0, "/work/main")
from harness import spec, synth_gemma4, config
gm = Path(sys.argv[1])
p = synth_gemma4.SynthParams(matrix_type="Q4_0", h_gain=1.0)
target, assistant = synth_gemma4.ensure_pair(gm, p=p)
base = ["-c", "512", "-ngl", "99", "-fa", "off", "-lv", "4", "--backend-sampling", "-md", str(assistant), "-ngld", "99",
        "--spec-type", "draft-mtp", "--spec-draft-n-max", "3", "--spec-draft-n-min", "0"]
ids = {}
for side in ["old", "new", "new", "old"]:
    d = Path("/tmp/srvab") / side
    env = {"LLAMA_MEGAKERNEL": "1", "GGML_METAL_EMU_GPU_CORES": "1", "LLAMA_MEGAKERNEL_TIMELINE": "16",
           "LD_LIBRARY_PATH": str(d)}
    t0 = time.time()
    r = spec.run(d, target, spec.PROMPTS[:1], 24, args=base, env=env, timeout=900, label=side, probs=False)
    logs = "\n".join(q.read_text(errors="replace") for q in config.run_dir().glob("*.log") if q.stat().st_mtime >= t0)
    tl = [x for x in logs.splitlines() if "llama_mk timeline:" in x]
    got = {a: (int(c), int(m)) for a, c, m in re.findall(r"; ([a-z.<>0-9]+ \.\. [a-z.<>0-9]+): (\d+) x (\d+) us median", tl[-1])} if tl else {}
    print(side, "drafts", r.draft_accepted, r.draft_n, "decode<4..draft>3", got.get("decode<4 .. draft>3"),
          "draft<3..decode>4", got.get("draft<3 .. decode>4"), "sampling<4..decode<4", got.get("sampling<4 .. decode<4"), flush=True)
    ids.setdefault(side, []).append(r.gens[0].tokens)
print("ids equal across all runs:", all(t == ids["old"][0] for v in ids.values() for t in v))
