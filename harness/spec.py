"""Lossless speculative decoding checks and demo, through llama-server's HTTP API.

A *run* starts one llama-server (harness.server.running: loopback, free port, always stopped),
sends each prompt to /completion at temperature 0 with `n_probs` so that every generated token
comes back with its id and the log-probability the target computed for it, and records the draft
counters of the server's timings. Two runs are compared token by token: ids must be equal, and so
must the log-probabilities (bit-for-bit equal logits), which catches a batch-variant kernel long
before a near-tie flips a token.

The batch-invariant CPU path of the series is controlled by the environment variable
GGML_CPU_BATCH_INVARIANT of the server process (unset: on for batches of up to 32 tokens;
0: off, upstream kernel selection; N: batches of up to N tokens; "all": every batch).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import server

# llama-server's log lines of the megakernel (patch 0050, megakernel/llama-mk.cpp; visible at -lv 4) that the speculative
# checks and benches read
MK_ON_LINE       = "llama_mk: megakernel on"                            # (then the device: CUDA0, MTL0, ...)
MK_FALLBACK_LINE = "llama_mk: standard graph for this batch"
MK_FUSED_LINE    = "llama_mk_draft: the fused MTP draft kernel drafts"
MK_SAMPLING_LINE = "llama_mk: backend samplers run on the megakernel's logits"  # (llama_context::decode, once)

# one thread: on a busy 2-core machine a 2-thread pool stalls at every barrier; the results do not
# depend on the thread count
DEFAULT_ARGS = ["-c", "4096", "-np", "1", "-t", "1", "--no-warmup"]

# n-gram drafting from the context: look up the last 3 tokens, propose up to 8 (the defaults, 12 and
# 48, need long verbatim repeats)
NGRAM_ARGS = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8"]

PROMPTS = [
    "The history of the printing press begins",
    "Here is a short recipe for a vegetable soup:",
    "In mathematics, a prime number is",
    "The three laws of thermodynamics state that",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The capital of Australia is Canberra, and the capital of Canada is",
    "Photosynthesis converts light energy into",
]


@dataclass
class Gen:
    prompt: str
    tokens: list[int]
    logprobs: list[float]
    draft_n: int = 0
    draft_accepted: int = 0
    seconds: float = 0.0
    text: str = ""

    @property
    def tok_per_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Run:
    label: str
    gens: list[Gen] = field(default_factory=list)
    log: str = ""   # the server's own log (read right after it stopped: other servers' logs, e.g. a parallel test's, are not in it)

    @property
    def draft_n(self) -> int:
        return sum(g.draft_n for g in self.gens)

    @property
    def draft_accepted(self) -> int:
        return sum(g.draft_accepted for g in self.gens)

    @property
    def seconds(self) -> float:
        return sum(g.seconds for g in self.gens)

    @property
    def n_tokens(self) -> int:
        return sum(len(g.tokens) for g in self.gens)


@contextlib.contextmanager
def env_vars(env: dict[str, str | None] | None):
    """Set (value) or unset (None) environment variables for the processes started inside."""
    env = env or {}
    old = {k: os.environ.get(k) for k in env}
    try:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def complete(port: int, prompt: str, n_predict: int, host: str = "127.0.0.1", timeout: float = 600.0,
             probs: bool = True) -> Gen:
    """One greedy /completion with per-token ids and log-probabilities (probs=False: ids only; a request for
    probabilities before sampling keeps the server from sampling on the backend)."""
    import requests
    body = {
        "prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1,
        "n_probs": 1 if probs else 0, "return_tokens": True, "cache_prompt": False, "ignore_eos": True,
        "stream": False,
    }
    t0 = time.perf_counter()
    r = requests.post(f"http://{host}:{port}/completion", json=body, timeout=timeout)
    dt = time.perf_counter() - t0
    if r.status_code != 200:
        raise RuntimeError(f"/completion failed: HTTP {r.status_code}: {r.text[:500]}")
    j = r.json()
    probs = j.get("completion_probabilities") or []
    tokens = [int(t) for t in j.get("tokens") or [p["id"] for p in probs]]
    logprobs = [float(p.get("logprob", float("nan"))) for p in probs]
    tm = j.get("timings") or {}
    return Gen(prompt, tokens, logprobs, int(tm.get("draft_n", 0) or 0), int(tm.get("draft_n_accepted", 0) or 0), dt,
               j.get("content", ""))


def run(bin_dir: Path, model: Path, prompts: list[str], n_predict: int, args: list[str] | None = None,
        env: dict[str, str | None] | None = None, concurrent: bool = False, label: str = "",
        timeout: float = 180.0, probs: bool = True) -> Run:
    """Start a server with `args`, generate for every prompt (one after another, or all at once),
    stop the server. probs=False: ids only (see complete)."""
    binary = Path(bin_dir) / "llama-server"
    out = Run(label or " ".join(args or []))
    with env_vars(env), server.running(binary, model, args=[*DEFAULT_ARGS, *(args or [])], timeout=timeout) as info:
        port = info["port"]
        log = Path(info["log"])
        if not concurrent:
            out.gens = [complete(port, p, n_predict, probs=probs) for p in prompts]
        else:
            res: list[Gen | BaseException | None] = [None] * len(prompts)

            def work(i: int) -> None:
                try:
                    res[i] = complete(port, prompts[i], n_predict, probs=probs)
                except BaseException as e:  # noqa: BLE001 - reported below
                    res[i] = e

            threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for r in res:
                if isinstance(r, BaseException):
                    raise r
            out.gens = [r for r in res if isinstance(r, Gen)]
    out.log = log.read_text(errors="replace") if log.exists() else ""
    return out


def first_diff(a: list, b: list) -> int | None:
    """Index of the first differing element (or the shorter length), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass
class Cmp:
    token_diffs: list[int | None]     # per prompt: first differing token id, None if equal
    logprob_diffs: list[int | None]   # per prompt: first differing log-probability, None if equal

    @property
    def tokens_equal(self) -> bool:
        return all(d is None for d in self.token_diffs)

    @property
    def bits_equal(self) -> bool:
        return self.tokens_equal and all(d is None for d in self.logprob_diffs)


def compare(ref: Run, got: Run) -> Cmp:
    if len(ref.gens) != len(got.gens):
        raise ValueError(f"runs differ in prompt count: {len(ref.gens)} vs {len(got.gens)}")
    td, ld = [], []
    for run_ in (ref, got):
        for g in run_.gens:
            if len(g.logprobs) != len(g.tokens):
                raise RuntimeError(f"[{run_.label}] the server reported {len(g.logprobs)} probabilities for "
                                   f"{len(g.tokens)} tokens: a build without patch 0041 (probabilities of "
                                   f"accepted draft tokens) cannot be compared bit for bit")
    for a, b in zip(ref.gens, got.gens):
        td.append(first_diff(a.tokens, b.tokens))
        n = min(len(a.logprobs), len(b.logprobs))
        ld.append(first_diff(a.logprobs[:n], b.logprobs[:n]) if n else None)
    return Cmp(td, ld)


def summary(ref: Run, got: Run, cmp: Cmp) -> str:
    marks = ["=" if t is None else f"d@{t}" for t in cmp.token_diffs]
    lp = ["=" if t is None else f"p@{t}" for t in cmp.logprob_diffs]
    return (f"[{got.label}] tokens {marks} logprobs {lp}; drafts accepted {got.draft_accepted}/{got.draft_n}; "
            f"{got.n_tokens} tokens in {got.seconds:.1f} s vs greedy {ref.seconds:.1f} s")
