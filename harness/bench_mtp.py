"""`stq-metal bench mtp`: end-to-end speed of MTP speculation through llama-server, megakernel and graph, vs greedy.

One target and its gemma4-assistant; every configuration is a llama-server of its own (-ngl 99 -fa off -np 1, -c) (all of a level's servers run
side by side, idle but one; the GPU's memory holds them), asked for the same greedy completions (temperature 0,
ignore_eos, no probabilities: the server's timings are the decode's own):
  greedy-mk      LLAMA_MEGAKERNEL=1, no speculation (the megakernel's one-token steps)
  mtp-kK-mk      LLAMA_MEGAKERNEL=1, --spec-type draft-mtp -md ASSISTANT, K drafts (the fused draft kernel: one launch
                 of K steps; the verify of K+1 tokens one megakernel launch)
  greedy-graph   LLAMA_MEGAKERNEL=0: the pinned llama.cpp's CUDA/Metal graph ("upstream")
  mtp-kK-graph   LLAMA_MEGAKERNEL=0 with draft-mtp: upstream's own speculative path
Rounds run the configurations in alternating order (AB.., ..BA); per configuration: the median tokens per second
(generated tokens / timings.predicted_ms summed over the prompts: prompt processing excluded), the drafts accepted
per drafted token, and the medians of the per-round ratios against greedy-mk and greedy-graph. Lossless check: every
mk speculative run must give greedy-mk's ids, and every mk run the same ids in every round (exit 1 otherwise); a graph speculative run that departs from
greedy-graph is reported with the first differing token (upstream's verify batches are not batch-invariant).

Acceptance rates (synthetic pairs made by megakernel/synth_gpu.py --noise): --noise Y1,Y2 rescales the target's noise
in place (synth_gpu --set-noise) before each level's runs; --accept A1,A2 with --noise-grid G1,G2,.. first probes
the acceptance at every grid value (mtp with the largest K, megakernel, one prompt) and then runs the levels whose
acceptance is closest to each A.

--backend-sampling: every server samples on the device (llama-server --backend-sampling: the request's sampler chain
as ggml ops on the logits, the host reads the sampled ids); the megakernel's steps then run the chain in a small graph
of their own over the kernel's logits (LLM_GRAPH_TYPE_MK_SAMPLING) instead of falling back to the model's graph.

--mk-timeline (or --mk-profile): the megakernel servers' host timeline, and from it where a step's time goes through
the server: launch (the megakernel's launch to its end: upload, kernel, results), set-up (llama_context::decode's start
to the launch: batch, cache cells, masks, embedding rows), after (the launch's end to decode's return: the backend
samplers' graph when on), draft (a fused draft launch), server (decode's or a draft's end to the next: the server's
own work, sampling on the host when the samplers are not on the device). Steady intervals only (counted at least a
tenth as often as the most counted one), each its count x its median, per step; session 38 (H100, E4B-shaped, greedy
with --backend-sampling): 4237 launch + 86 set-up + 70 after + 196 server = 4589 us, 0.2 % off the server's timings.
--k 0 runs the greedy configurations alone (no assistant needed).

    stq-metal bench mtp --bin BUILD/bin --target T.gguf --assistant A.gguf [--k 1,2,3] [--rounds 2] [-n 256]
        [--noise 1,3 | --accept 0.75,0.5,0.25 --noise-grid 0.5,1,2,4,8] [--backend-sampling] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import config, server, spec
from .util import HarnessError, atomic_write_bytes

# -lv 4: the llama_mk lines (megakernel on, fused drafts, fallbacks) reach the server's log
SERVER_ARGS = ["-np", "1", "-ngl", "99", "-fa", "off", "--no-warmup", "-lv", "4"]
MK_LINES = ("llama_mk: megakernel", "llama_mk_draft:", spec.MK_FALLBACK_LINE, spec.MK_SAMPLING_LINE)
TL_LINE = "llama_mk timeline:"   # --mk-timeline / --mk-profile: the host's timeline of the megakernel's steps


@dataclass
class Cfg:
    name: str
    env: dict
    args: list[str]
    greedy: str = ""          # the greedy configuration whose ids this one must give ("" for a greedy one)


@dataclass
class Result:
    tok_s: list[float] = field(default_factory=list)
    draft_n: int = 0
    draft_accepted: int = 0
    ids: list[list[int]] | None = None
    lines: list[str] = field(default_factory=list)
    prof: str = ""
    unstable: bool = False


def configs(assistant: Path, ks: list[int], graph: bool, mk_profile: bool = False, mk_timeline: bool = False) -> list[Cfg]:
    def mtp(k: int) -> list[str]:
        return ["-md", str(assistant), "-ngld", "99", "--spec-type", "draft-mtp", "--spec-draft-n-max", str(k),
                "--spec-draft-n-min", "0"]
    mk = {"LLAMA_MEGAKERNEL": "1", **({"LLAMA_MEGAKERNEL_PROFILE": "1"} if mk_profile else {}),
          **({"LLAMA_MEGAKERNEL_TIMELINE": "1"} if mk_timeline else {})}
    ks = [k for k in ks if k > 0]   # (K = 0: the greedy configurations alone)
    out = [Cfg("greedy-mk", mk, [])]
    out += [Cfg(f"mtp-k{k}-mk", mk, mtp(k), "greedy-mk") for k in ks]
    if graph:
        out.append(Cfg("greedy-graph", {"LLAMA_MEGAKERNEL": "0"}, []))
        out += [Cfg(f"mtp-k{k}-graph", {"LLAMA_MEGAKERNEL": "0"}, mtp(k), "greedy-graph") for k in ks]
    return out


def complete(port: int, prompt: str, n_predict: int) -> dict:
    """One greedy /completion; returns ids, decode time (ms) and the draft counters from the server's timings."""
    import requests
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1, "return_tokens": True,
            "cache_prompt": False, "ignore_eos": True, "stream": False}
    r = requests.post(f"http://127.0.0.1:{port}/completion", json=body, timeout=600)
    if r.status_code != 200:
        raise HarnessError(f"bench mtp: /completion failed: HTTP {r.status_code}: {r.text[:300]}")
    j = r.json()
    tm = j.get("timings") or {}
    ids = [int(t) for t in j.get("tokens") or []]
    ms = float(tm.get("predicted_ms", 0.0) or 0.0)
    if not ids or ms <= 0:
        raise HarnessError(f"bench mtp: the server's reply has no tokens or no timings.predicted_ms: {str(j)[:300]}")
    return {"ids": ids, "ms": ms, "draft_n": int(tm.get("draft_n", 0) or 0),
            "draft_accepted": int(tm.get("draft_n_accepted", 0) or 0)}


def start(stack: contextlib.ExitStack, a, c: Cfg, target: Path) -> dict:
    """The configuration's server (stopped with the stack), warmed up (first launches, allocations)."""
    with spec.env_vars(c.env):   # (the server keeps the environment it was started with)
        info = stack.enter_context(server.running(a.bin / "llama-server", target, timeout=600,
                                                  args=[*SERVER_ARGS, "-c", str(a.ctx), "-t", str(a.threads), *c.args,
                                                        *(["--backend-sampling"] if a.backend_sampling else [])]))
    complete(info["port"], spec.PROMPTS[0], 8)
    return info


def measure(info: dict, prompts: list[str], n_predict: int) -> dict:
    gens = [complete(info["port"], p, n_predict) for p in prompts]
    log = Path(info["log"]).read_text(errors="replace")
    n = sum(len(g["ids"]) for g in gens)
    ms = sum(g["ms"] for g in gens)
    return {"ids": [g["ids"] for g in gens], "tok_s": 1000.0*n/ms, "draft_n": sum(g["draft_n"] for g in gens),
            "draft_accepted": sum(g["draft_accepted"] for g in gens),
            "mk_on": spec.MK_ON_LINE in log,
            "fused": spec.MK_FUSED_LINE in log,
            "fallback": sum(1 for x in log.splitlines() if spec.MK_FALLBACK_LINE in x),
            "lines": sorted({x.strip()[:200] for x in log.splitlines() if any(m in x for m in MK_LINES)}),
            "prof": last_line(log, TL_LINE)}


def last_line(log: str, marker: str) -> str:
    """The log's last line that holds marker, from the marker on ("" if none)."""
    lines = [x[x.index(marker):].strip() for x in log.splitlines() if marker in x]
    return lines[-1] if lines else ""


# the megakernel's timeline (llama-mk.h) as the server's time a step: each interval between two points (a pair "A1 ..
# B1") goes to the part whose (from, to) points hold A and B: launch = the megakernel's launch to its end (upload, kernel,
# results), set-up = llama_context::decode's start to the launch (batch, cache cells, masks, embedding rows), after = the
# launch's end to decode's return (the backend samplers' graph, when on), draft = a fused draft from its start to its
# end, server = decode's or a draft's end to the next decode or draft (the server's own work: host sampling,
# bookkeeping, the reply). The point names are llama-mk.cpp's and patch 0050's llama_mk_tl_mark literals (a test
# checks they are the same set)
STEP_PARTS = {
    "launch": (("step.launch>",), ("step<",)),
    "set-up": (("decode>", "step>", "step.rows>"), ("step>", "step.rows>", "step.launch>")),
    "after":  (("step<", "sampling>", "sampling<"), ("sampling>", "sampling<", "decode<")),
    "draft":  (("draft>", "draft.launch>"), ("draft.launch>", "draft<")),
    "server": (("decode<", "draft<"), ("decode>", "draft>")),
}
# one interval of llama-mk.cpp's timeline line: "; %s: %lld x %d us median, %.1f mean", %s being "A1 .. B1"
_TL_PAIR = re.compile(r"(\S+?)(-?\d+) \.\. (\S+?)(-?\d+): (\d+) x (\d+) us median, ([\d.]+) mean")


def step_part(a: str, b: str) -> str:
    """The part of a server's step (STEP_PARTS) an interval from point a to point b is; "" for none of them."""
    return next((part for part, (src, dst) in STEP_PARTS.items() if a in src and b in dst), "")


def step_split(timeline: str, steady: float = 0.1) -> dict | None:
    """A megakernel server's time a step from its timeline line ("llama_mk timeline: N points; A1 .. B1: C x M us median,
    X mean; ..."): the steady intervals only (a pair counted at least `steady` times the most counted pair's count: the
    prompt's batches and first steps, counted a few times, are left out), each as its count x its median (robust to
    the odd slow step), summed per part (STEP_PARTS) and divided by the steady launches (the steps). None when the
    line holds no launch."""
    pairs = [(m[1], m[3], int(m[5]), int(m[6])) for m in _TL_PAIR.finditer(timeline)]
    if not pairs:
        return None
    top = max(c for _, _, c, _ in pairs)
    keep = [(a, b, c, med) for a, b, c, med in pairs if c >= steady*top]
    steps = sum(c for a, b, c, _ in keep if step_part(a, b) == "launch")
    if steps == 0:
        return None
    us = {p: 0.0 for p in STEP_PARTS}
    other = 0.0
    for a, b, c, med in keep:
        part = step_part(a, b)
        if part:
            us[part] += c*med/steps
        else:
            other += c*med/steps
    total = sum(us.values()) + other
    return {"steps": steps, "us": us, "other_us": other, "total_us": total,
            "launch_share": us["launch"]/total if total > 0 else 0.0}


def format_split(sp: dict) -> str:
    parts = " + ".join(f"{sp['us'][p]:.0f} {p}" for p in STEP_PARTS if sp["us"][p] > 0 or p in ("launch", "server"))
    extra = f" + {sp['other_us']:.0f} other" if sp["other_us"] >= 0.5 else ""
    return (f"a step through the server: {parts}{extra} = {sp['total_us']:.0f} us (the launch {100*sp['launch_share']:.1f} %; "
            f"{sp['steps']} steady steps, their intervals' medians)")


def load_set_noise():
    """megakernel/synth_gpu.py's set_noise (numpy + gguf only: no GPU needed)."""
    path = config.MEGAKERNEL_DIR / "synth_gpu.py"
    s = importlib.util.spec_from_file_location("stq_synth_gpu", path)
    if s is None or s.loader is None:
        raise HarnessError(f"bench mtp: cannot load {path}")
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    return mod.set_noise


def bench_level(a, cfgs: list[Cfg], prompts: list[str]) -> tuple[dict, int]:
    res = {c.name: Result() for c in cfgs}
    fails = 0
    if a.serial:   # one server at a time, restarted for every round
        for rnd in range(a.rounds):
            for c in (cfgs if rnd % 2 == 0 else cfgs[::-1]):
                with contextlib.ExitStack() as stack:
                    fails += rounds(a, [c], {c.name: start(stack, a, c, a.target)}, prompts, res, n=1, first=rnd)
        return summarize(cfgs, res, fails)
    with contextlib.ExitStack() as stack:
        infos = {c.name: start(stack, a, c, a.target) for c in cfgs}
        fails += rounds(a, cfgs, infos, prompts, res)
    return summarize(cfgs, res, fails)


def rounds(a, cfgs: list[Cfg], infos: dict, prompts: list[str], res: dict, n: int = 0, first: int = 0) -> int:
    fails = 0
    for rnd in range(first, first + (n or a.rounds)):
        order = cfgs if rnd % 2 == 0 else cfgs[::-1]
        for c in order:
            r = measure(infos[c.name], prompts, a.n_predict)
            x = res[c.name]
            x.tok_s.append(r["tok_s"])
            x.draft_n += r["draft_n"]
            x.draft_accepted += r["draft_accepted"]
            if x.ids is not None and r["ids"] != x.ids:
                x.unstable = True   # the same server, the same prompts, other ids than its first round
            x.ids = x.ids or r["ids"]
            if r["prof"]:
                x.prof = r["prof"]
            if not x.lines:
                x.lines = r["lines"]
                for line in r["lines"]:
                    print(f"  [{c.name}] {line}")
            if c.env.get("LLAMA_MEGAKERNEL") == "1" and not r["mk_on"]:
                print(f"FAIL: [{c.name}] the server ran without the megakernel")
                fails += 1
            if c.name.endswith("-mk") and c.greedy and (not r["fused"] or r["fallback"]):
                print(f"note: [{c.name}] fused drafts {'on' if r['fused'] else 'NOT on'}, "
                      f"{r['fallback']} batches on the standard graph")
            print(f"  round {rnd + 1} {c.name}: {r['tok_s']:.1f} tok/s, drafts {r['draft_accepted']}/{r['draft_n']}",
                  flush=True)
    return fails


def summarize(cfgs: list[Cfg], res: dict, fails: int) -> tuple[dict, int]:
    base = {c.name: res[c.name] for c in cfgs if not c.greedy}
    out = {}
    for c in cfgs:
        x = res[c.name]
        row = {"tok_s": statistics.median(x.tok_s), "tok_s_rounds": x.tok_s,
               "accepted_per_draft": x.draft_accepted/x.draft_n if x.draft_n else None,
               "draft_n": x.draft_n, "draft_accepted": x.draft_accepted, "log_lines": x.lines,
               "host_profile": x.prof, "step_split": step_split(x.prof) if x.prof else None}
        for b, y in base.items():
            row[f"vs_{b}"] = statistics.median(p/q for p, q in zip(x.tok_s, y.tok_s))
        row["ids_stable_over_rounds"] = not x.unstable
        if x.unstable:
            print(f"{'FAIL' if c.env.get('LLAMA_MEGAKERNEL') == '1' else 'note'}: [{c.name}] its rounds gave different ids")
            fails += c.env.get("LLAMA_MEGAKERNEL") == "1"
        if c.greedy:
            ref = res[c.greedy].ids or []
            same = x.ids == ref
            row["ids_equal_greedy"] = same
            row["first_diff"] = [spec.first_diff(g, r) for g, r in zip(x.ids or [], ref)]
            if not same and c.env.get("LLAMA_MEGAKERNEL") == "1":
                print(f"FAIL: [{c.name}] ids differ from {c.greedy}'s (first differing token per prompt: "
                      f"{row['first_diff']}): the megakernel's speculation must be lossless")
                fails += 1
            elif not same:   # upstream's graph: its verify batches round differently from its one-token steps
                print(f"note: [{c.name}] ids differ from {c.greedy}'s (first differing token per prompt: "
                      f"{row['first_diff']}; upstream's speculation, reported, not judged)")
        out[c.name] = row
    return out, fails


def print_level(title: str, rows: dict) -> None:
    print(f"\n{title}")
    bases = [k[3:] for k in next(iter(rows.values())) if k.startswith("vs_")]
    print(f"  {'configuration':<16} {'tok/s':>8} {'accepted/draft':>15} " + " ".join(f"{'vs ' + b:>16}" for b in bases))
    for name, r in rows.items():
        acc = f"{r['accepted_per_draft']:.3f}" if r["accepted_per_draft"] is not None else "-"
        same = "" if "ids_equal_greedy" not in r else ("  ids == greedy" if r["ids_equal_greedy"] else "  IDS DIFFER")
        print(f"  {name:<16} {r['tok_s']:>8.1f} {acc:>15} " + " ".join(f"{r['vs_' + b]:>15.3f}x" for b in bases) + same)


def ints(s: str) -> list[int]:
    try:
        v = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, got {s!r}") from None
    if not v or any(k < 0 or k > 8 for k in v):
        raise argparse.ArgumentTypeError(f"draft counts are 0..8 (0: greedy alone), got {s!r}")
    return v


def floats(s: str) -> list[float]:
    try:
        return [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {s!r}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="stq-metal bench mtp", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", type=Path, required=True, help="the build's bin folder (llama-server with the megakernel)")
    ap.add_argument("--target", type=Path, required=True, help="the gemma4 target GGUF")
    ap.add_argument("--assistant", type=Path, help="its gemma4-assistant GGUF (the MTP head; needed for any K > 0)")
    ap.add_argument("--k", type=ints, default=[1, 2, 3],
                    help="draft counts K, comma-separated (default 1,2,3); 0: the greedy configurations alone")
    ap.add_argument("--rounds", type=int, default=2, help="rounds in alternating order (default 2: AB.., ..BA)")
    ap.add_argument("-n", "--n-predict", type=int, default=256, help="tokens generated per prompt (default 256)")
    ap.add_argument("--prompts", type=int, default=2, help=f"prompts of harness.spec.PROMPTS (default 2, at most {len(spec.PROMPTS)})")
    ap.add_argument("-t", "--threads", type=int, default=4, help="llama-server CPU threads (default 4)")
    ap.add_argument("--no-graph", action="store_true", help="skip the LLAMA_MEGAKERNEL=0 (upstream) configurations")
    ap.add_argument("-c", "--ctx", type=int, default=4096, help="llama-server context size (default 4096)")
    ap.add_argument("--mk-profile", action="store_true", help="LLAMA_MEGAKERNEL_PROFILE=1 for the megakernel's servers: "
                    "the kernel's per-phase profile in their logs and the host's timeline (as --mk-timeline) in the results "
                    "(the kernel's own profile slows it a little)")
    ap.add_argument("--mk-timeline", action="store_true", help="LLAMA_MEGAKERNEL_TIMELINE=1 for the megakernel's servers: "
                    "the intervals between its steps' points (decode, launch, sampling graph, draft) and the host's "
                    "time between them, count, median and mean each, in the results (host clocks only: the kernels run "
                    "as without it)")
    ap.add_argument("--serial", action="store_true", help="one server at a time, restarted every round (default: a "
                    "level's servers side by side, started once)")
    ap.add_argument("--noise", type=floats, help="noise levels to rescale --target to, in turn (synth_gpu --set-noise)")
    ap.add_argument("--accept", type=floats, help="acceptance rates to aim at (needs --noise-grid)")
    ap.add_argument("--noise-grid", type=floats, help="noise values probed for --accept")
    ap.add_argument("--backend-sampling", action="store_true", help="every server with --backend-sampling: the "
                    "sampler chain runs on the device (for the megakernel: over its logits, in a graph of its own)")
    ap.add_argument("--json", type=Path, help="write every figure here (atomically)")
    a = ap.parse_args(argv)
    if (a.accept is None) != (a.noise_grid is None):
        ap.error("--accept and --noise-grid go together")
    if a.noise and a.accept:
        ap.error("--noise or --accept, not both")
    speculative = any(k > 0 for k in a.k)
    if speculative and a.assistant is None:
        ap.error("--assistant is needed for draft counts K > 0 (--k 0: the greedy configurations alone)")
    if a.accept and not speculative:
        ap.error("--accept probes the acceptance of drafts: it needs a draft count K > 0")
    for p in (a.bin / "llama-server", a.target, *([a.assistant] if speculative else [])):
        if not p.exists():
            ap.error(f"{p}: no such file")
    prompts = spec.PROMPTS[:max(1, a.prompts)]
    results: dict = {"k": a.k, "rounds": a.rounds, "n_predict": a.n_predict, "prompts": len(prompts), "ctx": a.ctx,
                     "serial": a.serial, "backend_sampling": a.backend_sampling, "levels": []}
    set_noise = load_set_noise() if (a.noise or a.accept) else None
    if set_noise is None:
        return run_levels(a, [None], prompts, results, set_noise)
    # the target is rescaled in place (a synthetic file only: set_noise refuses others); it gets its noise back at the end
    first = set_noise(a.target, None)
    try:
        return run_levels(a, list(a.noise or []), prompts, results, set_noise)
    finally:
        set_noise(a.target, first)


def run_levels(a, levels: list, prompts: list[str], results: dict, set_noise) -> int:
    if a.accept:
        probe = configs(a.assistant, [max(a.k)], False)[1]
        seen = []
        for y in a.noise_grid:
            set_noise(a.target, y)
            with contextlib.ExitStack() as stack:
                r = measure(start(stack, a, probe, a.target), prompts[:1], 96)
            acc = r["draft_accepted"]/r["draft_n"] if r["draft_n"] else 0.0
            print(f"probe: noise {y:g}: {probe.name} accepted {r['draft_accepted']}/{r['draft_n']} = {acc:.3f} per draft",
                  flush=True)
            seen.append((y, acc))
        results["probe"] = [{"noise": y, "accepted_per_draft": acc} for y, acc in seen]
        levels = []
        for want in a.accept:
            y = min(seen, key=lambda s: abs(s[1] - want))[0]
            if y not in levels:
                levels.append(y)

    fails = 0
    cfgs = configs(a.assistant, a.k, not a.no_graph, a.mk_profile, a.mk_timeline)
    for y in levels:
        if y is not None:
            set_noise(a.target, y)
        rows, f = bench_level(a, cfgs, prompts)
        fails += f
        print_level(f"noise {y:g}" if y is not None else str(a.target.name), rows)
        for name, r in rows.items():
            if r["host_profile"]:
                print(f"  [{name}] {r['host_profile']}")
        for name, r in rows.items():
            if r.get("step_split"):
                print(f"  [{name}] {format_split(r['step_split'])}")
        results["levels"].append({"noise": y, "configs": rows})
    if a.json:
        atomic_write_bytes(a.json, json.dumps(results, indent=1).encode())
    print(f"\nbench mtp: {'FAILED' if fails else 'done'} ({fails} failing checks)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
