"""Manage one llama-server: start (pid file, log file, health wait), stop (clean shutdown), status.

Each server has a name: its pid record is run/NAME.json and its log run/NAME.log (overwritten by the
next start of that name). `serve start` (the user's server) allows one at a time; servers of tests,
the demo and benchmarks (`running()`) are ephemeral, run on free ports beside it, and their logs
(run/ctx-*.log) are pruned to the newest KEEP_EPHEMERAL_LOGS."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from . import config, models
from .util import HarnessError, atomic_write_bytes, say

EPHEMERAL_PREFIX = "ctx-"
KEEP_EPHEMERAL_LOGS = 5


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


def running_servers(include_ephemeral: bool = False) -> list[dict]:
    """Records of every live server with a pid file (stale pid files are removed)."""
    out = []
    d = config.run_dir()
    for pf in sorted(d.glob("*.json")) if d.is_dir() else []:
        name = pf.stem
        if not include_ephemeral and name.startswith(EPHEMERAL_PREFIX):
            continue
        try:
            info = json.loads(pf.read_text())
        except (OSError, ValueError):
            continue
        if info.get("ephemeral") and not include_ephemeral:
            continue
        if _alive(int(info.get("pid", 0) or 0)):
            out.append(dict(info, name=name))
        else:
            pf.unlink(missing_ok=True)
    return out


def resolve_name(name: str | None) -> str:
    """`status`/`stop` without --name: the one user server that runs (else the default name)."""
    if name:
        return name
    live = running_servers()
    return live[0]["name"] if len(live) == 1 else "server"


def _prune_ephemeral_logs(keep: int = KEEP_EPHEMERAL_LOGS) -> None:
    d = config.run_dir()
    logs = sorted(d.glob(f"{EPHEMERAL_PREFIX}*.log"), key=lambda p: p.stat().st_mtime, reverse=True)
    for log in logs[keep:]:
        if not log.with_suffix(".json").exists():  # never the log of a server that still runs
            log.unlink(missing_ok=True)


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


def command(binary: Path, model: Path, port: int = 8080, host: str = "127.0.0.1", args: list[str] | None = None,
            chat_template: str | None = "auto", quiet: bool = False) -> list[str]:
    """The llama-server command line start() runs: `-m MODEL --host H --port P --jinja`, the chat
    template arguments (see start), then `args`. Checks the binary and the model (models.check_gguf)."""
    binary, model = Path(binary), Path(model)
    if not binary.exists():
        raise HarnessError(f"llama-server binary not found: {binary} (build it: python harness/build.py --build)")
    if not model.exists():
        raise HarnessError(f"model file not found: {model}")
    layout = models.check_gguf(model)
    args = list(args or [])
    if chat_template == "auto":
        tmpl = models.chat_template_args(layout, args)
        if tmpl and not quiet:
            say(f"{model.name} has no chat template: using Gemma's turn format ({Path(tmpl[-1]).name})")
        args = tmpl + args
    return [str(binary), "-m", str(model), "--host", host, "--port", str(port), "--jinja", *args]


def start(binary: Path, model: Path, port: int = 8080, host: str = "127.0.0.1", args: list[str] | None = None,
          name: str = "server", timeout: float = 180.0, chat_template: str | None = "auto",
          ephemeral: bool = False) -> dict:
    """Start llama-server --jinja on `model`. The model is checked first (models.check_gguf: a
    truncated file is named with the byte where it ends). chat_template "auto" adds Gemma's turn
    format for a Gemma GGUF without its own template (models.chat_template_args); None adds nothing."""
    cmd = command(binary, model, port, host, args, chat_template)
    binary, model = Path(binary), Path(model)
    cur = status(name)
    if cur:
        raise HarnessError(f"a server '{name}' is already running (pid {cur['pid']}, port {cur['port']}, "
                           f"log {cur['log']}); stop it first: ./RUNBOOK.sh stop")
    if port_busy(port, host):
        raise HarnessError(f"port {port} on {host} is already in use; refusing to start a second server "
                           f"(choose another with --port)")
    config.run_dir().mkdir(parents=True, exist_ok=True)
    log = config.run_dir() / f"{name}.log"
    with open(log, "w") as lf:
        lf.write("$ " + " ".join(cmd) + "\n")
        lf.flush()
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    info = {"pid": proc.pid, "port": port, "host": host, "model": str(model), "log": str(log),
            "cmd": cmd, "started": time.time(), "ephemeral": ephemeral}
    atomic_write_bytes(pid_file(name), json.dumps(info, indent=1).encode())
    if name.startswith(EPHEMERAL_PREFIX):
        _prune_ephemeral_logs()
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


def _messages(prompt: str | list[dict], system: str | None = None) -> list[dict]:
    msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    return ([{"role": "system", "content": system}] if system else []) + msgs


def _post(port: int, path: str, body: dict, host: str = "127.0.0.1", timeout: float = 600) -> dict:
    import requests
    r = requests.post(f"http://{host}:{port}{path}", json=body, timeout=timeout)
    if r.status_code != 200:
        raise HarnessError(f"{path} failed: HTTP {r.status_code}: {r.text[:500]}")
    return r.json()


def chat(port: int, prompt: str | list[dict], max_tokens: int = 64, host: str = "127.0.0.1",
         system: str | None = None, **extra) -> dict:
    """One OpenAI-style chat completion at temperature 0 (unless overridden). `prompt` is the user
    message, or a whole list of messages."""
    body = {"messages": _messages(prompt, system), "max_tokens": max_tokens, "temperature": 0.0, **extra}
    return _post(port, "/v1/chat/completions", body, host)


def apply_template(port: int, prompt: str | list[dict], host: str = "127.0.0.1", system: str | None = None) -> str:
    """The prompt text the server builds from these messages (its /apply-template endpoint)."""
    return _post(port, "/apply-template", {"messages": _messages(prompt, system)}, host)["prompt"]


def tokenize(port: int, text: str, host: str = "127.0.0.1", add_special: bool = True) -> list[int]:
    """The server's tokenization of `text` (special tokens parsed; BOS added when the model adds it)."""
    return _post(port, "/tokenize", {"content": text, "add_special": add_special, "parse_special": True},
                 host)["tokens"]


@contextlib.contextmanager
def running(binary: Path, model: Path, args: list[str] | None = None, name: str | None = None,
            port: int | None = None, timeout: float = 180.0, chat_template: str | None = "auto"):
    """Context manager for tests and demos: an ephemeral server on a free loopback port, always stopped."""
    name = name or f"{EPHEMERAL_PREFIX}{os.getpid()}-{time.monotonic_ns()}"
    info = start(binary, model, port or free_port(), args=args, name=name, timeout=timeout,
                 chat_template=chat_template, ephemeral=True)
    try:
        yield info
    finally:
        stop(name)
