"""`stq-metal serve start --preset NAME` (harness/presets.py) on stand-in downloads.

A temporary cache (STQ_METAL_CACHE) holds small files where `stq-metal model pull NAME` would store
the real ones (<cache>/models/<owner>--<name>/<file name in the repository>): the Gemma 3 270M
Q4_K_M as the Gemma 4 E2B target, the synthetic Gemma 4 target/MTP-assistant pair
(harness/synth_gemma4.py) as E4B and its assistant, and tiny hand-written GGUFs for Hy4 (a `hy_v4`
one, a `hyv4` one, an incomplete split set). Checked: the exact argv of --dry-run, how user flags
after `--` replace or append, the missing-file and hyv4 refusals (non-zero exit, nothing started),
--help, and real starts on the CPU build: a preset answers /health and /props, and the -spec preset
runs llama-server with draft-mtp speculation (its /slots says speculative, a completion drafts).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from harness import presets, server, synth_gemma4
from harness.gguf_layout import RawTensor, write_gguf
from harness.pull import PRESETS as PULL

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = str(ROOT / "harness" / "gemma-turns.jinja")

# file names as the repositories name them (the exact names do not matter: pull's glob selects them)
E2B = "gemma-4-E2B-it-Q4_K_M.gguf"
E4B = "gemma-4-E4B-it-Q4_K_M.gguf"
E4B_MTP = "gemma-4-E4B-it-qat-assistant-MTP-Q8_0.gguf"
HY4 = "Hy4-preview-STQ1_0-{:05d}-of-00003.gguf"


def _dir(cache: Path, pull_name: str) -> Path:
    return cache / "models" / PULL[pull_name].repo.replace("/", "--")


def _place(cache: Path, pull_name: str, name: str, src: Path | None = None, arch: str | None = None) -> Path:
    """A stand-in where `model pull` stores `name`: a symlink to `src`, or a tiny GGUF of `arch`."""
    d = _dir(cache, pull_name)
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    if src is not None:
        p.symlink_to(src)
    else:
        write_gguf(p, {"general.architecture": arch},
                   [RawTensor("token_embd.weight", (8, 4), 0, np.zeros(32, np.float32).tobytes())])
    return p


def _cli(cache: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, STQ_METAL_CACHE=str(cache), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "harness.cli", "serve", *args], cwd=ROOT, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)


def _dry(cache: Path, *args: str, binary: str) -> list[str]:
    r = _cli(cache, "start", "--binary", binary, "--dry-run", *args)
    assert r.returncode == 0, r.stderr
    return shlex.split(r.stdout)


@pytest.fixture()
def fake_bin(tmp_path) -> str:
    b = tmp_path / "bin" / "llama-server"
    b.parent.mkdir()
    b.write_text("#!/bin/sh\nexit 1\n")
    return str(b)


@pytest.fixture(scope="module")
def g4pair(gemma_model) -> tuple[Path, Path]:
    return synth_gemma4.ensure_pair(gemma_model)


def test_help_lists_every_preset():
    r = _cli(Path("/nonexistent"), "--help")
    assert r.returncode == 0
    for name, p in presets.SERVE_PRESETS.items():
        line = next((x for x in r.stdout.splitlines() if x.split()[:1] == [name]), None)
        assert line, f"{name} not listed in --help"
        assert f"pull: {p.model}" in line
    assert "--preset with --model is an error" in " ".join(r.stdout.split())
    rb = subprocess.run(["bash", "-c", 'sed -n "/start) setup core/p" RUNBOOK.sh'], cwd=ROOT, text=True,
                        stdout=subprocess.PIPE).stdout
    assert "serve start" in rb  # ./RUNBOOK.sh start --help is this help


def test_dry_run_exact_argv(tmp_path, fake_bin, gemma_model, g4pair):
    cache = tmp_path / "cache"
    e2b = _place(cache, "gemma4-e2b", E2B, gemma_model)
    e4b = _place(cache, "gemma4-e4b", E4B, g4pair[0])
    mtp = _place(cache, "gemma4-e4b-mtp", E4B_MTP, g4pair[1])
    head = lambda m, port="8080": [fake_bin, "-m", str(m), "--host", "127.0.0.1", "--port", port, "--jinja"]  # noqa: E731

    # cpu: no -ngl; the 270M (no chat template of its own) gets Gemma's turn format before the preset flags
    assert _dry(cache, "--preset", "gemma4-e2b", binary=fake_bin) == \
        head(e2b) + ["--chat-template-file", TEMPLATE, "-c", "32768"]
    # a GPU backend: -ngl 99 (and -ngld 99 for the assistant); the synthetic gemma4 target has no template either
    assert _dry(cache, "--preset", "gemma4-e4b-spec", "--backend", "cuda", "--port", "9000", binary=fake_bin) == \
        head(e4b, "9000") + ["--chat-template-file", TEMPLATE, "-c", "32768", "-ngl", "99",
                             "--spec-type", "draft-mtp", "-md", str(mtp), "-ngld", "99"]
    # user flags after --: an option the preset sets (any spelling) replaces the preset's; the rest is appended
    assert _dry(cache, "--preset", "gemma4-e4b-spec", "--backend", "metal-emu", "--",
                "--ctx-size=4096", "--spec-type", "ngram-simple", "-t", "2", binary=fake_bin) == \
        head(e4b) + ["--chat-template-file", TEMPLATE, "-ngl", "99", "-md", str(mtp), "-ngld", "99",
                     "--ctx-size=4096", "--spec-type", "ngram-simple", "-t", "2"]
    # a chat template of the user's replaces Gemma's turn format
    assert _dry(cache, "--preset", "gemma4-e2b", "--", "--chat-template", "chatml", binary=fake_bin) == \
        head(e2b) + ["-c", "32768", "--chat-template", "chatml"]

    # hy4: the first part of a complete split set (a hy_v4 file)
    for i in (1, 2, 3):
        _place(cache, "hy4-stq1_0", HY4.format(i), arch="hy_v4")
    hy = _dir(cache, "hy4-stq1_0") / HY4.format(1)
    assert _dry(cache, "--preset", "hy4", "--backend", "cuda", binary=fake_bin) == head(hy) + ["-c", "32768", "-ngl", "99"]


def test_hy4_on_an_amx_cpu_gets_no_repack(tmp_path, fake_bin, monkeypatch):
    """The cpu backend on a CPU with AMX: the hy4 preset adds --no-repack (llama.cpp's AMX weight buffers abort
    Hy4's load, seen on the H200 machine); not on other CPUs, not on GPU backends, not over the user's choice."""
    cache = tmp_path / "cache"
    for i in (1, 2, 3):
        _place(cache, "hy4-stq1_0", HY4.format(i), arch="hy_v4")
    hy = _dir(cache, "hy4-stq1_0") / HY4.format(1)
    head = [fake_bin, "-m", str(hy), "--host", "127.0.0.1", "--port", "8080", "--jinja", "-c", "32768"]
    amx, plain = tmp_path / "cpuinfo-amx", tmp_path / "cpuinfo-plain"
    amx.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f amx_bf16 amx_tile amx_int8 avx512_fp16\n")
    plain.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n")
    monkeypatch.setenv("STQ_CPUINFO", str(amx))
    assert _dry(cache, "--preset", "hy4", binary=fake_bin) == head + ["--no-repack"]
    assert _dry(cache, "--preset", "hy4", "--backend", "cuda", binary=fake_bin) == head + ["-ngl", "99"]
    assert _dry(cache, "--preset", "hy4", "--", "--repack", binary=fake_bin) == head + ["--repack"]
    monkeypatch.setenv("STQ_CPUINFO", str(plain))
    assert _dry(cache, "--preset", "hy4", binary=fake_bin) == head


def test_preset_and_model_exclusive(tmp_path):
    r = _cli(tmp_path, "start", "--preset", "gemma4-e2b", "--model", "x.gguf", "--dry-run")
    assert r.returncode == 2 and "not allowed with argument" in r.stderr
    r = _cli(tmp_path, "start", "--preset", "gemma4-e9b", "--dry-run")
    assert r.returncode == 2 and "gemma4-e4b-spec" in r.stderr  # the choices are listed
    r = _cli(tmp_path, "stop", "--preset", "gemma4-e2b")
    assert r.returncode == 1 and "for `serve start`" in r.stderr


def test_missing_files_name_the_pull_commands(tmp_path, fake_bin, gemma_model):
    cache = tmp_path / "cache"
    # neither file of the -spec preset: both pulls named; dry run and real start alike, nothing started
    for mode in (["--dry-run"], []):
        r = _cli(cache, "start", "--preset", "gemma4-e2b-spec", "--binary", fake_bin, *mode)
        assert r.returncode == 1, r.stdout + r.stderr
        assert re.search(r"stq-metal model pull gemma4-e2b$", r.stderr, re.M)
        assert "stq-metal model pull gemma4-e2b-mtp" in r.stderr
        assert f"'{PULL['gemma4-e2b'].pattern}'" in r.stderr and str(_dir(cache, "gemma4-e2b")) in r.stderr
        assert r.stdout == "" and not (cache / "run").exists()
    # the target present, the assistant not: only the assistant's pull is named
    _place(cache, "gemma4-e2b", E2B, gemma_model)
    r = _cli(cache, "start", "--preset", "gemma4-e2b-spec", "--binary", fake_bin)
    assert r.returncode == 1 and "stq-metal model pull gemma4-e2b-mtp" in r.stderr
    assert not re.search(r"stq-metal model pull gemma4-e2b$", r.stderr, re.M)
    # a split set with a part missing: the part is named
    _place(cache, "hy4-stq1_0", HY4.format(1), arch="hy_v4")
    _place(cache, "hy4-stq1_0", HY4.format(3), arch="hy_v4")
    r = _cli(cache, "start", "--preset", "hy4", "--binary", fake_bin, "--dry-run")
    assert r.returncode == 1 and HY4.format(2) in r.stderr and "stq-metal model pull hy4-stq1_0" in r.stderr


def test_partial_download_is_not_a_file(tmp_path, fake_bin):
    """What the hub client leaves while downloading (.cache/.../*.incomplete) and a file that failed
    its check (moved to NAME.bad) do not count as downloaded."""
    cache = tmp_path / "cache"
    d = _dir(cache, "gemma4-e4b")
    (d / ".cache" / "huggingface" / "download").mkdir(parents=True)
    (d / ".cache" / "huggingface" / "download" / f"x.{'0' * 64}.incomplete").write_bytes(b"partial")
    (d / (E4B + ".bad")).write_bytes(b"bad")
    r = _cli(cache, "start", "--preset", "gemma4-e4b", "--binary", fake_bin, "--dry-run")
    assert r.returncode == 1 and "stq-metal model pull gemma4-e4b" in r.stderr


def test_hyv4_arch_refused_with_the_command(tmp_path, fake_bin):
    cache = tmp_path / "cache"
    for i in (1, 2, 3):
        _place(cache, "hy4-stq1_0", HY4.format(i), arch="hyv4")
    first = _dir(cache, "hy4-stq1_0") / HY4.format(1)
    for mode in (["--dry-run"], []):
        r = _cli(cache, "start", "--preset", "hy4", "--binary", fake_bin, *mode)
        assert r.returncode == 1 and r.stdout == ""
        assert f"stq-metal hyv4 {first} --write" in r.stderr
        assert not (cache / "run").exists()  # nothing started


def _wait_stopped(cache: Path) -> None:
    r = _cli(cache, "stop")
    assert r.returncode == 0, r.stderr


def _start(cache: Path, preset: str, cpu_build: Path, n_ctx: int) -> tuple[int, dict]:
    """`serve start --preset PRESET` on the CPU build with the user's -c N_CTX -t 2; the port and the
    harness's record of the server (its command line and log). The caller stops it (_wait_stopped)."""
    port = server.free_port()
    r = _cli(cache, "start", "--preset", preset, "--binary", str(cpu_build / "bin" / "llama-server"),
             "--port", str(port), "--", "-c", str(n_ctx), "-t", "2", timeout=300)
    if r.returncode != 0:
        _cli(cache, "stop")
        pytest.fail(f"start --preset {preset} failed:\n{r.stdout}{r.stderr}")
    return port, json.loads((cache / "run" / "server.json").read_text())


def test_preset_serves_health_and_props(tmp_path, cpu_build, gemma_model):
    cache = tmp_path / "cache"
    e2b = _place(cache, "gemma4-e2b", E2B, gemma_model)
    port, rec = _start(cache, "gemma4-e2b", cpu_build, 1024)
    try:
        assert rec["cmd"][rec["cmd"].index("-c"):] == ["-c", "1024", "-t", "2"]  # the user's -c replaced 32768
        assert requests.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
        props = requests.get(f"http://127.0.0.1:{port}/props", timeout=10).json()
        assert props["model_path"] == str(e2b)
        assert props["default_generation_settings"]["n_ctx"] == 1024
        assert "<start_of_turn>" in props["chat_template"]  # Gemma's turn format (harness/gemma-turns.jinja)
    finally:
        _wait_stopped(cache)


def test_spec_preset_runs_draft_mtp(tmp_path, cpu_build, g4pair):
    cache = tmp_path / "cache"
    _place(cache, "gemma4-e4b", E4B, g4pair[0])
    mtp = _place(cache, "gemma4-e4b-mtp", E4B_MTP, g4pair[1])
    port, rec = _start(cache, "gemma4-e4b-spec", cpu_build, 2048)
    try:
        assert ["--spec-type", "draft-mtp", "-md", str(mtp)] == rec["cmd"][rec["cmd"].index("--spec-type"):][:4]
        slots = requests.get(f"http://127.0.0.1:{port}/slots", timeout=10).json()
        assert slots and all(s["speculative"] for s in slots), slots
        out = requests.post(f"http://127.0.0.1:{port}/completion", timeout=300,
                            json={"prompt": "The quick brown fox", "n_predict": 16, "temperature": 0}).json()
        t = out["timings"]
        assert t.get("draft_n", 0) > 0, t  # the assistant drafted
        # the server's log is written by its logging thread: the end-of-task lines can land after the reply
        want = [f"loading draft model '{mtp}'", "draft acceptance"]
        deadline = time.monotonic() + 30
        while True:
            log = Path(rec["log"]).read_text(errors="replace")
            missing = [w for w in want if w not in log]
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert not missing, f"not in the server log after 30 s: {missing}\n{log[-3000:]}"
    finally:
        _wait_stopped(cache)
