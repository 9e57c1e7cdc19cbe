"""llama-server control on the real Gemma 3 270M: start / status / chat / stop, busy port refused."""

from __future__ import annotations

import socket

import pytest

from harness import server
from harness.util import HarnessError

pytestmark = pytest.mark.build


def test_server_cycle_and_busy_port(cpu_build, gemma_model):
    binary = cpu_build / "bin" / "llama-server"
    name = "pytest-cycle"
    server.stop(name)
    port = server.free_port()
    info = server.start(binary, gemma_model, port, args=["-c", "1024", "-t", "2"], name=name)
    try:
        st = server.status(name)
        assert st and st["pid"] == info["pid"] and st["healthy"]
        out = server.chat(port, "Say hello.", max_tokens=8)
        assert out["choices"][0]["message"]["content"] is not None
        assert out["usage"]["completion_tokens"] > 0
        # a second start of the same instance is refused ...
        with pytest.raises(HarnessError, match="already running"):
            server.start(binary, gemma_model, server.free_port(), name=name)
        # ... and so is another instance on the busy port
        with pytest.raises(HarnessError, match="already in use"):
            server.start(binary, gemma_model, port, name="pytest-other")
    finally:
        assert server.stop(name)
    assert server.status(name) is None
    assert not server.health(port)
    assert server.stop(name) is False


def test_port_taken_by_someone_else_is_refused(cpu_build, gemma_model):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(HarnessError, match="already in use"):
            server.start(cpu_build / "bin" / "llama-server", gemma_model, port, name="pytest-busy")
    assert server.status("pytest-busy") is None


def test_startup_failure_reports_log(cpu_build, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(HarnessError, match="exited with code"):
        server.start(cpu_build / "bin" / "llama-server", bad, server.free_port(), name="pytest-bad")
    assert server.status("pytest-bad") is None


def test_work_tree_is_pin_plus_series(cpu_build, llama_tree):
    from harness import config, patches
    st = patches.state(llama_tree)
    assert all(s == "applied" for s in st.patch_status), patches.format_status(st)
    assert not st.local_commits and not st.dirty
    import subprocess
    base = subprocess.run(["git", "-C", str(llama_tree), "rev-list", "--max-parents=0", "HEAD"],
                          text=True, stdout=subprocess.PIPE).stdout.split()
    anc = subprocess.run(["git", "-C", str(llama_tree), "merge-base", "--is-ancestor", config.PIN, "HEAD"])
    assert anc.returncode == 0 and base
