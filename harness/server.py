"""Manage one llama-server: start (pid file, log file, health wait), stop (clean shutdown), status."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from . import config
from .util import HarnessError, atomic_write_bytes, say


def pid_file(name: str = "server") -> Path:
    return config.run_dir() / f"{name}.json"


def port_busy(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _alive(pid: int, exe: bytes = b"llama-server") -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.exists():  # guard against a recycled pid
        try:
            return exe in cmdline.read_bytes()
        except OSError:
            return False
    return True


def _log_tail(log: Path, n: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def health(port: int, host: str = "127.0.0.1", timeout: float = 2.0) -> bool:
    import requests
    try:
        return requests.get(f"http://{host}:{port}/health", timeout=timeout).status_code == 200
    except Exception:  # noqa: BLE001
        return False


def status(name: str = "server") -> dict | None:
    """The pid-file record of a running server (with `healthy`), or None. Removes a stale pid file."""
    pf = pid_file(name)
    if not pf.exists():
        return None
    info = json.loads(pf.read_text())
    if not _alive(info["pid"]):
        pf.unlink(missing_ok=True)
        return None
    info["healthy"] = health(info["port"], info["host"])
    return info


def start(binary: Path, model: Path, port: int = 8080, host: str = "127.0.0.1", args: list[str] | None = None,
          name: str = "server", timeout: float = 180.0) -> dict:
    binary, model = Path(binary), Path(model)
    if not binary.exists():
        raise HarnessError(f"llama-server binary not found: {binary} (build it: python harness/build.py --build)")
    if not model.exists():
        raise HarnessError(f"model file not found: {model}")
    cur = status(name)
    if cur:
        raise HarnessError(f"a server '{name}' is already running (pid {cur['pid']}, port {cur['port']}, "
                           f"log {cur['log']}); stop it first: ./RUNBOOK.sh stop")
    if port_busy(port, host):
        raise HarnessError(f"port {port} on {host} is already in use; refusing to start a second server "
                           f"(choose another with --port)")
    config.run_dir().mkdir(parents=True, exist_ok=True)
    log = config.run_dir() / f"{name}.log"
    cmd = [str(binary), "-m", str(model), "--host", host, "--port", str(port), "--jinja", *(args or [])]
    with open(log, "w") as lf:
        lf.write("$ " + " ".join(cmd) + "\n")
        lf.flush()
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    info = {"pid": proc.pid, "port": port, "host": host, "model": str(model), "log": str(log),
            "cmd": cmd, "started": time.time()}
    atomic_write_bytes(pid_file(name), json.dumps(info, indent=1).encode())
    say(f"llama-server starting (pid {proc.pid}, http://{host}:{port}, log {log})")
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            pid_file(name).unlink(missing_ok=True)
            raise HarnessError(f"llama-server exited with code {proc.returncode} during startup.\n"
                               f"--- {log} (tail) ---\n{_log_tail(log)}")
        if health(port, host, timeout=1.0):
            say(f"llama-server healthy after {time.time() - t0:.1f} s")
            return info
        time.sleep(0.3)
    _terminate(proc.pid)
    pid_file(name).unlink(missing_ok=True)
    raise HarnessError(f"llama-server not healthy after {timeout:.0f} s; stopped it.\n--- {log} ---\n{_log_tail(log)}")


def _terminate(pid: int, timeout: float = 20.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            wpid, _ = os.waitpid(pid, os.WNOHANG)  # reap if it is our child
            if wpid == pid:
                return
        except ChildProcessError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def stop(name: str = "server") -> bool:
    """Stop the named server; returns False when none was running."""
    info = status(name)
    if not info:
        pid_file(name).unlink(missing_ok=True)
        return False
    _terminate(info["pid"])
    pid_file(name).unlink(missing_ok=True)
    say(f"llama-server (pid {info['pid']}, port {info['port']}) stopped")
    return True


def chat(port: int, prompt: str, max_tokens: int = 64, host: str = "127.0.0.1", **extra) -> dict:
    """One OpenAI-style chat completion at temperature 0 (unless overridden)."""
    import requests
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0.0, **extra}
    r = requests.post(f"http://{host}:{port}/v1/chat/completions", json=body, timeout=600)
    if r.status_code != 200:
        raise HarnessError(f"chat completion failed: HTTP {r.status_code}: {r.text[:500]}")
    return r.json()


@contextlib.contextmanager
def running(binary: Path, model: Path, args: list[str] | None = None, name: str | None = None,
            port: int | None = None, timeout: float = 180.0):
    """Context manager for tests and demos: a server on a free loopback port, always stopped."""
    name = name or f"ctx-{os.getpid()}-{time.monotonic_ns()}"
    info = start(binary, model, port or free_port(), args=args, name=name, timeout=timeout)
    try:
        yield info
    finally:
        stop(name)
