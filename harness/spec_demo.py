"""Speculative decoding next to its greedy twin: same text, and how much faster.

    python -m harness.spec_demo --bin BUILD/bin --model gemma-3-270m-q4_k_m.gguf [--draft self|q8|ngram|FILE]

Starts llama-server twice per round (greedy, then speculative; the second round in the other
order: AB/BA), generates the same prompts at temperature 0, prints the two texts side by side,
whether every token id and log-probability is identical, the drafts accepted, and the speed ratio
(median over rounds of generated tokens per second, speculative / greedy, in this one run).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

try:
    from . import spec
except ImportError:  # python harness/spec_demo.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from harness import spec

# plain prose for the base model to continue (no chat template: /completion on raw text); the ngram
# draft proposes the continuation of any 3-token phrase already in the context
DEMO_PROMPT = ("The water cycle describes how water moves between the oceans, the air and the land. "
               "Water evaporates from the oceans, rises into the air, cools and condenses into clouds, "
               "and falls back to the ground as rain or snow. The water cycle")


def spec_args(kind: str, model: Path, k: int, workdir: Path, bin_dir: Path) -> list[str]:
    if kind == "ngram":
        return list(spec.NGRAM_ARGS)
    if kind == "self":
        draft = model
    elif kind == "q8":
        draft = workdir / "draft-q8_0.gguf"
        subprocess.run([str(bin_dir / "llama-quantize"), "--allow-requantize", str(model), str(draft), "Q8_0", "2"],
                       check=True, capture_output=True)
    else:
        draft = Path(kind)
    return ["-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0"]


def side_by_side(a: str, b: str, width: int = 48, lines: int = 12) -> str:
    wa = textwrap.wrap(a.replace("\n", " / "), width) or [""]
    wb = textwrap.wrap(b.replace("\n", " / "), width) or [""]
    n = min(max(len(wa), len(wb)), lines)
    wa += [""] * (n - len(wa))
    wb += [""] * (n - len(wb))
    rows = [f"{'greedy':<{width}} | speculative", f"{'-' * width}-+-{'-' * width}"]
    rows += [f"{x:<{width}} | {y}" for x, y in zip(wa[:n], wb[:n])]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="spec_demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", type=Path, required=True, help="folder with llama-server (and llama-quantize for --draft q8)")
    ap.add_argument("--model", type=Path, required=True, help="target GGUF")
    ap.add_argument("--draft", default="ngram", help="ngram | self | q8 | PATH of a draft GGUF (default ngram)")
    ap.add_argument("-k", type=int, default=4, help="draft tokens per step for a draft model (default 4)")
    ap.add_argument("-n", type=int, default=160, help="tokens to generate (default 160)")
    ap.add_argument("--rounds", type=int, default=2, help="AB/BA rounds for the speed ratio (default 2)")
    ap.add_argument("--prompt", default=DEMO_PROMPT, help="text to continue (default: a paragraph of plain prose)")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="spec-demo-") as td:
        sargs = spec_args(args.draft, args.model, args.k, Path(td), args.bin)
        prompts = [args.prompt]
        ratios, greedy_runs, spec_runs = [], [], []
        for r in range(max(1, args.rounds)):
            order = ["greedy", "spec"] if r % 2 == 0 else ["spec", "greedy"]
            got = {}
            for which in order:
                got[which] = spec.run(args.bin, args.model, prompts, args.n,
                                      args=sargs if which == "spec" else [], label=which)
            greedy_runs.append(got["greedy"])
            spec_runs.append(got["spec"])
            ratios.append(got["spec"].gens[0].tok_per_s / max(got["greedy"].gens[0].tok_per_s, 1e-9))

        g, s = greedy_runs[0].gens[0], spec_runs[0].gens[0]
        cmp = spec.compare(greedy_runs[0], spec_runs[0])
        print(side_by_side(g.text, s.text))
        print()
        how = "ngram-simple (3-token lookup, up to 8 drafted)" if args.draft == "ngram" else f"{args.draft}, k = {args.k}"
        print(f"draft: {how}, {args.n} tokens")
        print(f"token ids identical: {cmp.tokens_equal}; log-probabilities identical: {cmp.bits_equal}")
        print(f"drafts accepted: {s.draft_accepted}/{s.draft_n}")
        gs = statistics.median(x.gens[0].tok_per_s for x in greedy_runs)
        ss = statistics.median(x.gens[0].tok_per_s for x in spec_runs)
        print(f"greedy {gs:.1f} tok/s, speculative {ss:.1f} tok/s, ratio {statistics.median(ratios):.2f}x "
              f"(median of {len(ratios)} AB/BA rounds, wall time of the request incl. prompt)")
        return 0 if cmp.bits_equal else 1


if __name__ == "__main__":
    raise SystemExit(main())
