"""`stq-metal bench megakernel`: the Gemma decode megakernel vs llama.cpp's standard graph.

One process, one model, two contexts (megakernel on / LLAMA_MEGAKERNEL=0), greedy decode timed in
rounds of alternating order (AB/BA), medians and the median of the paired ratios; with --verify-cost
also the time of one verify batch of M = 1..5 tokens over one token. Needs a build of the series with
the megakernel (the harness builds it in: CUDA, Metal, metal-emu) and its GPU; on the lent H200 run
`bash megakernel/device.sh bench` (it makes the E4B-shaped model there).

    stq-metal bench megakernel --build BUILD_DIR --model MODEL.gguf [--rounds 6] [--tg 64] [--verify-cost]

On a Mac (Apple silicon), from a checkout of this repository (README "Megakernel on a Mac"):

    stq-metal bench megakernel --backend metal --check --verify-cost --model gemma-4-E2B-it-Q4_K_M.gguf \
        --json mk-mac.json

--backend metal builds the series for Metal (the harness cache) when --build is not given; --check first
runs test-mk's correctness checks on a small synthetic gemma4 model (logits vs the Metal graph, greedy
agreement) and on --model (logits vs a CPU copy of the model: the megakernel must be at least as close to the
CPU as the graph), both with verify == decode bitwise for M = 2..8: the first time Apple's compiler and an
Apple GPU run the kernel, these say whether it is right before its speed means anything.

Besides tok/s it reports what issue 12 asks of every model: the weight bytes one decode step must read (the
matrices of every phase in the megakernel's order, decode_phases; the embedding rows and norm vectors are left
out, < 0.1 %), the weight-read roofline (the device's peak memory bandwidth / those bytes: PEAK_GBS by the device
name test-mk's log prints, or --peak-gbs) and each side's share of it, and the launches per token (the megakernel:
one kernel a step; the graph: llama.cpp's node count of its one-token graph, an upper bound on its kernels: views
are nodes, fused ops are not subtracted; ncu counted 1189 CUDA kernels a token on E4B, issue 12). With --verify-cost
a second, short run under LLAMA_MEGAKERNEL_PROFILE=1 gives the verify batches' cost in the kernel alone: the whole
batch calls' ratios include llama_decode's host time on both sides of the ratio and understate it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from . import config
from .util import HarnessError, atomic_write_bytes, which

TEST_MK = config.MEGAKERNEL_DIR / "tests" / "test-mk.cpp"


def build_test_mk(build: Path, out: Path) -> Path:
    cache = (build / "CMakeCache.txt")
    if not cache.is_file():
        raise HarnessError(f"{build} is not a cmake build directory (no CMakeCache.txt)")
    m = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", cache.read_text(errors="replace"), re.M)
    if not m:
        raise HarnessError(f"{cache} names no source directory")
    src, lib = Path(m.group(1)), build / "bin"
    cxx = which(["c++", "g++", "clang++"])
    if not cxx:
        raise HarnessError("no C++ compiler (c++, g++, clang++) to build test-mk")
    cmd = [cxx, "-std=c++17", "-O2", str(TEST_MK), "-o", str(out), f"-I{src}/include", f"-I{src}/src", f"-I{src}/ggml/include",
           f"-L{lib}", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise HarnessError(f"building test-mk failed:\n{' '.join(cmd)}\n{r.stderr[-3000:]}")
    return out


# peak memory bandwidth (GB/s, vendor figures) by the device name the backend logs (CUDA: "Device 0: NAME,";
# Metal: "GPU name:   MTL0 (NAME)"); names whose parts differ in bandwidth (M3 Max, M4 Max: binned or not) are left out:
# give --peak-gbs for them
PEAK_GBS = {
    "NVIDIA H200": 4800.0,
    "NVIDIA H100 80GB HBM3": 3350.0,   # H100 SXM5
    "NVIDIA H100 PCIe": 2000.0,
    "NVIDIA H100 NVL": 3900.0,
    "NVIDIA A100-SXM4-80GB": 2039.0,
    "NVIDIA A100-SXM4-40GB": 1555.0,
    "NVIDIA GeForce RTX 4090": 1008.0,
    "NVIDIA GeForce RTX 3090": 936.0,
    "Apple M1": 68.25, "Apple M1 Pro": 200.0, "Apple M1 Max": 400.0, "Apple M1 Ultra": 800.0,
    "Apple M2": 100.0, "Apple M2 Pro": 200.0, "Apple M2 Max": 400.0, "Apple M2 Ultra": 800.0,
    "Apple M3": 100.0, "Apple M3 Pro": 150.0, "Apple M4": 120.0, "Apple M4 Pro": 273.0,
}


def decode_phases(size: dict[str, int]) -> list[tuple[int, str]]:
    """The weight bytes of each grid-barrier phase of a gemma3/gemma4 decode step, in the megakernel's order (mk_step in
    megakernel/cuda/mk-kernel.cuh), from {tensor name: bytes}: [(bytes, phase name)]. One source for this bench's
    roofline and bench/megakernel-floor/phases.py (floor.cu's phase list)."""
    n_layer = 1 + max(int(n.split(".")[1]) for n in size if n.startswith("blk."))
    ple = "per_layer_model_proj.weight" in size
    b = lambda *names: sum(size.get(n, 0) for n in names)  # noqa: E731
    out: list[tuple[int, str]] = []
    if ple:
        out += [(b("per_layer_model_proj.weight"), "per-layer proj"), (0, "per-layer inputs")]
    for il in range(n_layer):
        p = f"blk.{il}."
        out += [(b(p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"), f"{il} q/k/v"),
                (0, f"{il} heads"), (0, f"{il} attention"),
                (b(p + "attn_output.weight"), f"{il} o proj"),
                (b(p + "ffn_gate.weight", p + "ffn_up.weight"), f"{il} gate/up"),
                (b(p + "ffn_down.weight"), f"{il} down")]
        if ple:
            out += [(b(p + "inp_gate.weight"), f"{il} per-layer gate"), (b(p + "proj.weight"), f"{il} per-layer proj+")]
    out.append((b("output.weight") or b("token_embd.weight"), "lm head"))   # (tied: the LM head reads the embeddings)
    return out


def weight_bytes_per_token(model: Path, build: Path) -> int:
    """The bytes of weights one decode step reads (decode_phases), the tensors' sizes from the GGUF's layout and the
    build's own type traits (STQ1_0 included)."""
    from .ggml import GGML
    from .gguf_layout import read_layout
    g = GGML(build)
    size = {}
    for t in read_layout(model).tensors:
        rows = t.n_elements // t.dims[0] if t.dims and t.dims[0] else 0
        try:
            size[t.name] = g.row_size(t.type_id, t.dims[0]) * rows if rows else 0
        except HarnessError as e:
            raise HarnessError(f"{model}: tensor {t.name} (type {t.type_id}, ne {list(t.dims)}): {e}") from e
    if not any(n.startswith("blk.") for n in size):
        raise HarnessError(f"{model}: no blk.N tensors: not a gemma3/gemma4 decoder")
    return sum(n for n, _ in decode_phases(size))


def device_name(out: str) -> str | None:
    """The GPU test-mk ran on, from the backend's log: ggml-cuda's first device ("Device 0: NAME, compute capability
    ..."), or ggml-metal's "GPU name:   MTL0 (NAME)" (with several devices "(NAME (dev pP/vV))")."""
    m = re.search(r"Device 0: ([^,\n]+),", out) or re.search(r"GPU name:\s+\S+ \((.+?)(?: \(dev p\d+/v\d+\))?\)\s*$", out, re.M)
    return m.group(1).strip() if m else None


def graph_nodes_tg(out: str) -> int | None:
    """The node count of llama.cpp's one-token graph (sched_reserve's "graph: nodes = PP / TG" or, when the two agree,
    "nodes = N")."""
    m = re.search(r"graph(?: \(pp bs=\d+, tg bs=\d+\))?: nodes = (\d+)(?: / (\d+))?", out)
    if not m:
        return None
    return int(m.group(2) or m.group(1))


def roofline(res: dict, wbytes: int, peak_gbs: float | None) -> dict:
    """tok/s at the weight-read roofline and each side's share of it (None where the peak is unknown)."""
    r: dict = {"weight_bytes_per_token": wbytes, "peak_gbs": peak_gbs}
    if peak_gbs:
        r["roofline_tok_s"] = peak_gbs*1e9/wbytes
        for who in ("megakernel", "graph"):
            r[f"{who}_roofline_pct"] = 100.0*res[f"{who}_tok_s"]*wbytes/(peak_gbs*1e9)
    return r


def parse(out: str) -> dict:
    res: dict = {}
    m = re.search(r"speed, greedy tg(\d+), (\d+) rounds AB/BA: megakernel ([\d.]+) tok/s, graph ([\d.]+) tok/s, "
                  r"ratio ([\d.]+)", out)
    if m:
        res.update(tg=int(m.group(1)), rounds=int(m.group(2)), megakernel_tok_s=float(m.group(3)),
                   graph_tok_s=float(m.group(4)), ratio=float(m.group(5)))
    for who in ("megakernel", "graph"):
        m = re.search(rf"verify cost \({who}\), whole batch call: (.*)", out)
        if m:
            res[f"verify_{who}"] = {int(a): float(b) for a, b in re.findall(r"M=(\d+) [\d.]+ us \(([\d.]+)x\)", m.group(1))}
        m = re.search(rf"verify cost \({who}\), its parts \(decode / logits row / seq_rm, us\): (.*)", out)
        if m:
            res[f"verify_{who}_parts_us"] = {int(a): [float(b), float(c), float(d)] for a, b, c, d in
                                             re.findall(r"M=(\d+) ([\d.]+) / ([\d.]+) / ([\d.]+)", m.group(1))}
    # LLAMA_MEGAKERNEL_PROFILE=1: the kernels' own time per step size (the first profile print of each M)
    prof: dict = {}
    for mm, us in re.findall(r"llama_mk profile: \d+ steps of (\d+) tokens?: kernel ([\d.]+) us", out):
        prof.setdefault(int(mm), float(us))
    if prof:
        res["kernel_us"] = prof
    on = re.search(r"llama_mk: megakernel (on .*|off.*)", out)
    res["megakernel"] = on.group(1) if on else "no llama_mk line (build without GGML_MEGAKERNEL_DIR?)"
    return res


def check(exe: Path, model: Path, n: int, cpu_ref: bool = False) -> tuple[bool, str]:
    """test-mk's correctness checks on one model (no timing): (passed, summary lines). cpu_ref: judge the logits
    against a CPU copy of the model (the megakernel must be at least as close to it as the graph is) instead of
    bounding their distance to the graph's: a real model's quantized weights make the GPU graph itself differ
    (the real Gemma 3 270M on the H200: graph vs CPU NMSE mean 4e-3, megakernel vs CPU 1.8e-3)."""
    cmd = [str(exe), "-m", str(model), "-n", str(n), "--rounds", "0"]
    if cpu_ref:
        cmd += ["--cpu-ref", "--max-nmse", "10", "--max-disagree", str(n)]
    print("running:", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    out = r.stdout + r.stderr
    lines = [x for x in out.splitlines() if x.startswith(("llama_mk:", "ggml_metal_mk", "teacher", "free", "verify", "test-mk",
                                                          "vs the CPU"))
             or "error" in x.lower()]
    return r.returncode == 0 and "test-mk: passed" in out and "megakernel on" in out, "\n".join(lines)


def synth_model() -> Path:
    """The small synthetic gemma4 model of the metal-emu tests (F16 matrices, 4096 tokens, window 16)."""
    from . import models, synth_gemma4
    target, _ = synth_gemma4.ensure_pair(models.ensure_gemma(), p=synth_gemma4.SynthParams(
        matrix_type="F16", n_vocab=4096, window=16))
    return target


def run_test_mk(args, checks: dict) -> tuple[str, int]:
    """test-mk's checks (--check: their results into checks) and its timed run: (its output, exit status)."""
    with tempfile.TemporaryDirectory() as td:
        exe = build_test_mk(args.build, Path(td) / "test-mk")
        if args.check:
            for name, model, n, ref in (("synthetic gemma4", synth_model(), 32, False), (args.model.name, args.model, 32, True)):
                ok, lines = check(exe, model, n, cpu_ref=ref)
                checks[name] = {"passed": ok, "lines": lines}
                print(f"check on {name}: {'passed' if ok else 'FAILED'}\n{lines}", flush=True)
        cmd = [str(exe), "-m", str(args.model), "-n", "8", "--rounds", str(args.rounds), "--bench-n", str(args.tg),
               "--fa", str(args.fa), "--max-nmse", "10", "--max-disagree", "100"]
        if args.verify_cost:
            cmd.append("--verify-cost")
        print("running:", " ".join(cmd), flush=True)
        r = subprocess.run(cmd, capture_output=True, text=True)
        out = r.stdout + r.stderr
        if args.verify_cost:
            # the verify batches' cost in the kernel alone: the whole batch call above also times llama_decode's host work,
            # the same in numerator and denominator, which pulls every ratio toward 1 (NOTES.md session 32); a second,
            # short run with the megakernel's profile (one-token steps and verify batches of 2..8 tokens)
            pcmd = [str(exe), "-m", str(args.model), "-n", "8", "--rounds", "2", "--bench-n", "8", "--max-nmse", "10",
                    "--max-disagree", "100", "--hidden-batches", "0", "--verify-cost"]
            print("running: LLAMA_MEGAKERNEL_PROFILE=1", " ".join(pcmd), flush=True)
            pr = subprocess.run(pcmd, capture_output=True, text=True, env={**os.environ, "LLAMA_MEGAKERNEL_PROFILE": "1"})
            out += "\n".join(x for x in (pr.stdout + pr.stderr).splitlines() if x.startswith("llama_mk profile:")) + "\n"
    return out, r.returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="stq-metal bench megakernel", description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("cuda", "metal", "metal-emu"), help="with no --build: build the series "
                    "for this backend (harness cache) and use that build")
    ap.add_argument("--build", type=Path, help="build directory of the series (bin/ with libllama)")
    ap.add_argument("--model", type=Path, required=True, help="a gemma3/gemma4 GGUF")
    ap.add_argument("--check", action="store_true", help="first check correctness: the synthetic gemma4 model against the "
                    "graph, --model against a CPU copy of it (test-mk --cpu-ref), verify == decode on both")
    ap.add_argument("--rounds", type=int, default=6, help="AB/BA rounds (default 6)")
    ap.add_argument("--tg", type=int, default=64, help="tokens generated per round (default 64)")
    ap.add_argument("--fa", type=int, choices=(0, 1), default=0, help="flash attention for the graph (default 0)")
    ap.add_argument("--verify-cost", action="store_true", help="also time verify batches of M = 1..5 tokens")
    ap.add_argument("--peak-gbs", type=float, help="the device's peak memory bandwidth in GB/s for the roofline (default: "
                    "PEAK_GBS by the device name the backend logs; no roofline line for a device not in it)")
    ap.add_argument("--log", type=Path, help="report from this saved test-mk output (one run, e.g. from "
                    "megakernel/device.sh's bench stage) instead of running test-mk; --build still gives the type sizes")
    ap.add_argument("--json", type=Path, help="write the results here as JSON")
    args = ap.parse_args(argv)
    if not args.model.is_file():
        raise HarnessError(f"model {args.model} does not exist")
    if args.peak_gbs is not None and not args.peak_gbs > 0:
        raise HarnessError(f"--peak-gbs {args.peak_gbs}: a bandwidth in GB/s, greater than 0")
    if args.log is not None and not args.log.is_file():
        raise HarnessError(f"--log {args.log} does not exist")
    if args.build is None:
        if not args.backend:
            raise HarnessError("give --build BUILD_DIR or --backend (cuda, metal, metal-emu) to build the series")
        from . import build as buildmod
        args.build = buildmod.ensure_build(args.backend, targets=("llama", "ggml"))
    checks: dict = {}
    if args.log is not None:
        out, rc = args.log.read_text(errors="replace"), 0
    else:
        out, rc = run_test_mk(args, checks)
    res = parse(out)
    if "ratio" not in res:
        print(out[-4000:], file=sys.stderr)
        raise HarnessError(f"test-mk printed no speed line (exit {rc}{', in ' + str(args.log) if args.log else ''})")
    print(f"megakernel: {res['megakernel']}")
    print(f"| tok/s megakernel | tok/s graph | ratio (median of paired, {res['rounds']} rounds AB/BA, tg{res['tg']}) |")
    print(f"| {res['megakernel_tok_s']:.1f} | {res['graph_tok_s']:.1f} | {res['ratio']:.3f} |")
    dev = device_name(out)
    peak = args.peak_gbs or PEAK_GBS.get(dev or "")
    res["device"] = dev
    res.update(roofline(res, weight_bytes_per_token(args.model, args.build), peak))
    wb = res["weight_bytes_per_token"]
    if peak:
        print(f"weight-read roofline: {wb/1e9:.3f} GB of weights a token at {peak:.0f} GB/s ({dev or 'device'}"
              f"{', --peak-gbs' if args.peak_gbs else ''}) = {res['roofline_tok_s']:.0f} tok/s; megakernel "
              f"{res['megakernel_roofline_pct']:.1f} %, graph {res['graph_roofline_pct']:.1f} %")
    else:
        print(f"weight-read roofline: {wb/1e9:.3f} GB of weights a token; device {dev or '(none named in the log)'} has no "
              f"peak bandwidth in PEAK_GBS: give --peak-gbs for the roofline")
    nodes = graph_nodes_tg(out)
    res["launches_per_token"] = {"megakernel": 1 if res["megakernel"].startswith("on") else None, "graph_nodes_max": nodes}
    print("launches per token: megakernel " + ("1 kernel a step (plus the step's upload and readback copies)"
                                               if res["megakernel"].startswith("on") else "off (the graph ran on both sides)")
          + f"; graph at most {nodes if nodes is not None else '?'} (the nodes of llama.cpp's one-token graph)")
    if 1 in res.get("kernel_us", {}):
        k1 = res["kernel_us"][1]
        print("verify cost / one token (the megakernel's kernel alone, LLAMA_MEGAKERNEL_PROFILE): "
              + ", ".join(f"M={m}: {us/k1:.2f}x" for m, us in sorted(res["kernel_us"].items())) + f" (M=1 {k1:.1f} us)")
    elif args.verify_cost:
        print("verify cost / one token (the kernel alone): no megakernel profile (the megakernel is off)")
    for who in ("megakernel", "graph"):
        if f"verify_{who}" in res:
            costs = ", ".join(f"M={k}: {v:.2f}x" for k, v in res[f"verify_{who}"].items())
            print(f"verify cost / one token ({who}, whole batch calls: includes the host's time per batch; "
                  f"the kernel's own ratios: LLAMA_MEGAKERNEL_PROFILE=1): {costs}")
        if f"verify_{who}_parts_us" in res:
            parts = ", ".join(f"M={k}: {v[0]:.0f} / {v[1]:.0f} / {v[2]:.0f}" for k, v in res[f"verify_{who}_parts_us"].items())
            print(f"verify batch call's parts ({who}; llama_decode / logits row / seq_rm, us): {parts}")
    if checks:
        res["checks"] = checks
    if args.json:
        atomic_write_bytes(args.json, json.dumps(res, indent=2).encode())
    return 0 if all(c["passed"] for c in checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
