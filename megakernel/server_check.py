"""llama-server with the megakernel on a GPU: speculative decoding must give greedy's ids and log-probabilities.

Run on the device machine by `megakernel/device.sh server` (after `build` with llama-server and `models` with the
synthetic gemma4 pair); no GPU here. Every server runs with LLAMA_MEGAKERNEL=1 unless said otherwise, and its log
must say that the megakernel is on. Checks, each against plain greedy decoding with the megakernel (-np 1):
  - draft-mtp (the pair's assistant) with k = 1..4, one slot: ids and log-probabilities equal;
  - draft-mtp k = 3 with two slots (-np 2) and the prompts sent at once: equal (k = 3: two slots' verify batches
    of 4 tokens still fit one megakernel step of <= 8 tokens);
  - the standard graph (LLAMA_MEGAKERNEL=0), greedy: reported (agreement with the megakernel; not judged).
160 generated tokens cross the synthetic model's 128-token sliding window. Exit status 1 when a check fails.

    python3 megakernel/server_check.py --bin BUILD/bin --target T.gguf --assistant A.gguf [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import config, spec  # noqa: E402

N_PREDICT = 160
BASE = ["-c", "4096", "-ngl", "99", "-fa", "off", "-lv", "4"]


def mtp_args(assistant: Path, k: int) -> list[str]:
    return ["-md", str(assistant), "-ngld", "99", "--spec-type", "draft-mtp", "--spec-draft-n-max", str(k),
            "--spec-draft-n-min", "0"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, type=Path, help="build's bin directory (llama-server)")
    ap.add_argument("--target", required=True, type=Path, help="synthetic gemma4 target GGUF")
    ap.add_argument("--assistant", required=True, type=Path, help="its MTP assistant GGUF")
    ap.add_argument("--prompts", type=int, default=4, help="prompts of harness.spec.PROMPTS to use (default 4)")
    ap.add_argument("--json", type=Path, help="write the results here")
    a = ap.parse_args()

    prompts = spec.PROMPTS[:a.prompts]
    mk = {"LLAMA_MEGAKERNEL": "1"}
    results: dict[str, object] = {}
    fails = 0

    def server_run(label: str, args: list[str], env: dict, concurrent: bool = False) -> spec.Run:
        t0 = time.time()
        r = spec.run(a.bin, a.target, prompts, N_PREDICT, args=[*BASE, *args], env=env, concurrent=concurrent,
                     label=label, timeout=600)
        logs = [p.read_text(errors="replace") for p in config.run_dir().glob("*.log") if p.stat().st_mtime >= t0]
        on = any("llama_mk: megakernel on CUDA" in x for x in logs)
        print(f"{label}: {r.n_tokens} tokens in {r.seconds:.2f} s, drafts {r.draft_accepted}/{r.draft_n}, "
              f"megakernel {'on' if on else 'OFF'}")
        r.mk_on = on  # type: ignore[attr-defined]
        return r

    greedy = server_run("greedy, megakernel", ["-np", "1"], mk)
    if not greedy.mk_on:
        print("FAIL: the greedy server ran without the megakernel")
        fails += 1

    graph = server_run("greedy, graph", ["-np", "1"], {"LLAMA_MEGAKERNEL": "0"})
    try:
        cmp = spec.compare(graph, greedy)
        print("megakernel vs graph (greedy, not judged): " + spec.summary(graph, greedy, cmp))
        results["graph_vs_megakernel_tokens_equal"] = cmp.tokens_equal
    except (RuntimeError, ValueError) as e:
        print(f"megakernel vs graph: not comparable: {e}")

    cases = [(f"draft-mtp k={k}, megakernel", mtp_args(a.assistant, k) + ["-np", "1"], False) for k in (1, 2, 3, 4)]
    cases.append(("draft-mtp k=3, -np 2 concurrent, megakernel", mtp_args(a.assistant, 3) + ["-np", "2"], True))
    for label, args, conc in cases:
        got = server_run(label, args, mk, concurrent=conc)
        try:
            c = spec.compare(greedy, got)
        except (RuntimeError, ValueError) as e:
            print(f"FAIL: [{label}] {e}")
            results[label] = {"ok": False, "error": str(e)}
            fails += 1
            continue
        ok = c.tokens_equal and c.bits_equal and got.draft_accepted > 0 and got.mk_on
        print(("ok: " if ok else "FAIL: ") + spec.summary(greedy, got, c))
        results[label] = {"ok": ok, "tokens_equal": c.tokens_equal, "bits_equal": c.bits_equal,
                          "draft_n": got.draft_n, "draft_accepted": got.draft_accepted, "tok_s": got.n_tokens/got.seconds if got.seconds else 0.0}
        fails += not ok

    print(f"server_check: {'FAILED' if fails else 'passed'} ({fails} failing)")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
