"""A newcomer's first run (issue 11), the parts that need no llama.cpp build: set-up probes and
doctor, quiet builds, the GGUF check before llama-server starts, the chat-template choice, one
user server at a time, pruned server logs, honest benchmark readiness."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness import bench, build, cli, models, server
from harness.gguf_layout import GGUFFormatError, RawTensor, read_layout, write_gguf
from harness.util import HarnessError

ROOT = Path(__file__).resolve().parent.parent
PROBES = ("python", "venv", "git", "cxx", "cmake", "ninja", "cmake_ninja", "ccache", "clang19", "asan",
          "symbolizer", "aarch64", "qemu")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STQ_METAL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


# --- set-up probes -------------------------------------------------------------------------------

def _doctor(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "RUNBOOK.sh"), "doctor"], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=120)


def test_doctor_prints_every_probe_and_its_exit_status_follows_them(cache):
    env = dict(os.environ, STQ_METAL_CACHE=str(cache))
    p = _doctor(env)
    lines = p.stdout.splitlines()
    for name in PROBES + ("harness",):
        assert any(ln.split()[:1] == [name] for ln in lines), f"probe {name} not printed:\n{p.stdout}"
    failing = [ln for ln in lines if " FAIL " in ln]
    assert (p.returncode == 0) == (not failing), p.stdout
    assert "all probes pass" in p.stdout or failing
    assert (cache / "logs" / "setup.log").is_file()  # probe output went to the log, not the terminal


@pytest.mark.skipif(sys.platform != "linux", reason="the clang-19 probes are Linux-only")
def test_doctor_sees_a_broken_clang(cache, tmp_path):
    """A clang++-19 that cannot compile must fail the clang19 and asan probes (and doctor)."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "clang++-19").write_text("#!/bin/sh\necho 'fatal error: planted' >&2\nexit 1\n")
    (fake / "clang++-19").chmod(0o755)
    env = dict(os.environ, STQ_METAL_CACHE=str(cache), PATH=f"{fake}:{os.environ['PATH']}")
    p = _doctor(env)
    assert p.returncode == 1, p.stdout
    status = {ln.split()[0]: ln.split()[1] for ln in p.stdout.splitlines() if ln.startswith("  ")}
    assert status["clang19"] == "FAIL" and status["asan"] == "FAIL", p.stdout
    assert "libclang-rt-19-dev" in p.stdout and "clang-19" in p.stdout  # the packages are named
    assert status["git"] == "ok"


def test_runbook_help_lists_doctor():
    p = subprocess.run(["bash", "RUNBOOK.sh", "help"], cwd=ROOT, text=True, stdout=subprocess.PIPE)
    assert p.returncode == 0 and "doctor" in p.stdout and "logs/setup.log" in p.stdout


def test_ci_runs_doctor_before_the_tests():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "doctor" in ci and ci.index("doctor") < ci.index("RUNBOOK.sh test")


# --- quiet builds --------------------------------------------------------------------------------

def test_build_output_goes_to_the_log_and_progress_to_the_terminal(tmp_path, capsys):
    lines = [f"[{i}/40] Building CXX object x{i}.o" for i in range(1, 41)]
    lines[5:5] = ["/usr/lib/gcc/x86_64-linux-gnu/12/include/avx512fintrin.h:6: warning: 'u' may be used "
                  "uninitialized [-Wmaybe-uninitialized]"] * 300
    script = tmp_path / "fake_ninja.py"
    script.write_text("import sys\nfor ln in %r:\n    print(ln)\n" % lines)
    log = tmp_path / "build.log"
    build.run_build([sys.executable, str(script)], log, step="fake build")
    out = capsys.readouterr().out
    assert "uninitialized" not in out
    assert "300 compiler warnings" in out and str(log) in out
    progress = [ln for ln in out.splitlines() if "steps" in ln]
    assert 5 <= len(progress) <= 11 and "40/40 steps (100%)" in progress[-1]
    assert log.read_text().count("may be used") == 300 and "[40/40]" in log.read_text()


def test_failed_build_names_the_step_log_and_error(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("print('[1/2] Building x.o')\nprint('x.cpp:3:1: error: expected ;')\nraise SystemExit(1)\n")
    log = tmp_path / "build.log"
    with pytest.raises(HarnessError) as e:
        build.run_build([sys.executable, str(script)], log, step="cmake build (cpu)")
    msg = str(e.value)
    assert "cmake build (cpu) failed" in msg and str(log) in msg and "expected ;" in msg


# --- the GGUF check before llama-server starts -----------------------------------------------------

def _gguf(path: Path, kv: dict | None = None, n: int = 512) -> Path:
    rng = np.random.default_rng(11)
    data = rng.standard_normal(n).astype("<f4").tobytes()
    kv = {"general.architecture": "gemma3", **(kv or {})}
    write_gguf(path, kv, [RawTensor("a.weight", (n,), 0, data), RawTensor("b.weight", (n,), 0, data)])
    return path


def test_complete_gguf_passes(tmp_path):
    layout = models.check_gguf(_gguf(tmp_path / "ok.gguf"))
    assert [t.name for t in layout.tensors] == ["a.weight", "b.weight"]


@pytest.mark.parametrize("where", ["last tensor", "first tensor", "header"])
def test_truncated_gguf_is_named_with_the_byte(tmp_path, where):
    f = _gguf(tmp_path / "cut.gguf")
    data = f.read_bytes()
    layout = read_layout(f)
    keep = {"last tensor": len(data) - 1, "first tensor": layout.data_start + 100, "header": 100}[where]
    short = tmp_path / "short.gguf"
    short.write_bytes(data[:keep])
    with pytest.raises(GGUFFormatError) as e:
        models.check_gguf(short)
    msg = str(e.value)
    assert msg.startswith(f"{short}: truncated") and "at byte" in msg, msg
    if where != "header":  # a data cut: the byte named is where the file ends
        assert msg.endswith(f"at byte {keep}"), msg
        assert ("'b.weight'" if where == "last tensor" else "'a.weight'") in msg


def test_server_start_refuses_a_truncated_gguf_before_starting(tmp_path, cache):
    f = _gguf(tmp_path / "m.gguf")
    f.write_bytes(f.read_bytes()[:-100])
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\ntouch " + str(tmp_path / "started") + "\n")
    fake.chmod(0o755)
    with pytest.raises(GGUFFormatError, match="truncated"):
        server.start(fake, f, server.free_port(), name="pytest-trunc")
    assert not (tmp_path / "started").exists()


# --- chat template choice -----------------------------------------------------------------------------

def test_gemma_without_template_gets_the_shipped_turn_format(tmp_path):
    layout = read_layout(_gguf(tmp_path / "g.gguf"))
    args = models.chat_template_args(layout)
    assert args == ["--chat-template-file", str(models.GEMMA_TEMPLATE)]
    text = models.GEMMA_TEMPLATE.read_text()
    for piece in ("<start_of_turn>", "<end_of_turn>", "bos_token", "add_generation_prompt", "<start_of_turn>model"):
        assert piece in text


def test_own_template_or_user_choice_or_other_arch_left_alone(tmp_path):
    own = read_layout(_gguf(tmp_path / "own.gguf", {"tokenizer.chat_template": "{{ messages }}"}))
    assert models.chat_template_args(own) == []
    plain = read_layout(_gguf(tmp_path / "g.gguf"))
    assert models.chat_template_args(plain, ["--chat-template-file", "x.jinja"]) == []
    assert models.chat_template_args(plain, ["--chat-template=chatml"]) == []
    other = read_layout(_gguf(tmp_path / "l.gguf", {"general.architecture": "llama"}))
    assert models.chat_template_args(other) == []


# --- one user server at a time, logs that do not pile up -------------------------------------------

def _fake_record(cache: Path, name: str, pid: int, ephemeral: bool = False) -> None:
    d = cache / "run"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.json").write_text(json.dumps({"pid": pid, "port": 1, "host": "127.0.0.1", "model": "m",
                                                "log": str(d / f"{name}.log"), "ephemeral": ephemeral}))


def test_serve_start_refuses_while_another_user_server_runs(cache, monkeypatch, capsys):
    _fake_record(cache, "first", 4242)
    monkeypatch.setattr(server, "_alive", lambda pid: pid == 4242)
    started = []
    monkeypatch.setattr(server, "start", lambda *a, **k: started.append(a))
    rc = cli.main(["serve", "start", "--name", "second", "--binary", "/x/llama-server", "--model", "/x/m.gguf"])
    assert rc == 1 and not started
    err = capsys.readouterr().err
    assert "'first' is already running" in err and "one at a time" in err
    assert server.resolve_name(None) == "first"  # stop/status without --name find it


def test_ephemeral_servers_do_not_block_and_stale_records_go(cache, monkeypatch):
    _fake_record(cache, "ctx-1-2", 4243, ephemeral=True)
    _fake_record(cache, "gone", 4244)
    monkeypatch.setattr(server, "_alive", lambda pid: pid == 4243)
    assert server.running_servers() == []
    assert not (cache / "run" / "gone.json").exists()
    assert [r["name"] for r in server.running_servers(include_ephemeral=True)] == ["ctx-1-2"]


def test_ephemeral_logs_keep_the_newest(cache):
    d = cache / "run"
    d.mkdir(parents=True)
    for i in range(12):
        f = d / f"ctx-{i}.log"
        f.write_text("x")
        os.utime(f, (1000 + i, 1000 + i))
    (d / "ctx-0.json").write_text("{}")  # a server that still runs keeps its log
    (d / "server.log").write_text("x")
    server._prune_ephemeral_logs(keep=5)
    left = sorted(p.name for p in d.glob("*.log"))
    assert left == sorted(["ctx-0.log", "server.log"] + [f"ctx-{i}.log" for i in range(7, 12)])


# --- benchmarks -------------------------------------------------------------------------------------------

def test_bench_readiness_is_probed(monkeypatch):
    monkeypatch.setattr(bench, "which", lambda names: None)  # no nvidia-smi, no compiler
    ok, why = bench.readiness("cuda")
    assert not ok and "nvidia-smi" in why
    ok, why = bench.readiness("metal", system="Linux", machine="x86_64")
    assert not ok and "macOS" in why
    assert bench.readiness("metal", system="Darwin", machine="arm64")[0]
    assert not bench.readiness("cpu")[0]


def test_bench_list_marks_gpu_benchmarks_not_ready_without_gpu(capsys):
    if shutil.which("nvidia-smi") or sys.platform == "darwin":
        pytest.skip("this machine has a GPU or is a Mac")
    assert bench.main([]) == 0
    out = capsys.readouterr().out
    rows = {ln.split()[0]: ln for ln in out.splitlines()}
    assert "[ready" not in rows["cuda"] and "[ready" not in rows["metal"]
    assert "[ready" in rows["cpu"]


@pytest.mark.parametrize("which", ["cpu", "cuda", "spec"])
def test_bench_help_names_the_front_door(which):
    p = subprocess.run([sys.executable, "-m", "harness.cli", "bench", which, "--help"], cwd=ROOT, text=True,
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"usage: stq-metal bench {which}")
