"""Small shared helpers: errors, hashing, atomic writes, commands with progress and log tails."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shlex
import subprocess
import sys
import tempfile
from collections import deque
from pathlib import Path
from typing import Iterable, Iterator, Mapping


class HarnessError(RuntimeError):
    """An error meant for the user: the message says what failed and how to proceed."""


def say(msg: str) -> None:
    print(f"[stq-metal] {msg}", flush=True)


@contextlib.contextmanager
def cache_lock(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock (flock on `path`) while touching something in the cache several processes may use at
    once: the llama.cpp work tree and its build folders (two test workers, a demo beside a test run). A process that
    has to wait says so, naming `what` and the lock file; the lock ends with the process, also when it is killed."""
    path = Path(path).resolve()
    if _held_locks.get(path):   # already ours (a nested call in this process): flock would wait for itself
        _held_locks[path] += 1
        try:
            yield
        finally:
            _held_locks[path] -= 1
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another stq-metal process ({what}; lock {path})")
            fcntl.flock(f, fcntl.LOCK_EX)
        _held_locks[path] = 1
        try:
            yield
        finally:
            _held_locks[path] = 0
            fcntl.flock(f, fcntl.LOCK_UN)


_held_locks: dict[Path, int] = {}


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temp file in the same folder, fsync, rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def fsync_dir(d: Path) -> None:
    """Make a rename in directory d durable (best effort: some filesystems refuse fsync on a directory)."""
    try:
        fd = os.open(d if str(d) else ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def run(cmd: list[str], cwd: Path | None = None, env: Mapping[str, str] | None = None,
        check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    """Run a short command, capture its output; on failure raise HarnessError with command + output."""
    full_env = None
    if env is not None:
        full_env = dict(os.environ)
        full_env.update(env)
    p = subprocess.run(cmd, cwd=cwd, env=full_env, input=input, text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if check and p.returncode != 0:
        raise HarnessError(
            f"command failed (exit {p.returncode}) in {cwd or os.getcwd()}:\n  {shlex.join(cmd)}\n"
            f"{(p.stdout or '')[-2000:]}{(p.stderr or '')[-4000:]}")
    return p


def run_logged(cmd: list[str], log: Path, cwd: Path | None = None, env: Mapping[str, str] | None = None,
               step: str = "", echo: bool = True, tail: int = 60) -> None:
    """Run a long command, streaming its output to the terminal (progress) and to `log`.

    On failure raise HarnessError naming the step and the command, with the tail of the log."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    log.parent.mkdir(parents=True, exist_ok=True)
    last: deque[str] = deque(maxlen=tail)
    with open(log, "w") as lf:
        lf.write(f"$ {shlex.join(cmd)}\n")
        p = subprocess.Popen(cmd, cwd=cwd, env=full_env, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, bufsize=1)
        assert p.stdout is not None
        for line in p.stdout:
            lf.write(line)
            last.append(line.rstrip("\n"))
            if echo:
                sys.stdout.write(f"  {line}" if not line.startswith("[") else line)
                sys.stdout.flush()
        rc = p.wait()
    if rc != 0:
        tail_txt = "\n".join(last)
        raise HarnessError(f"{step or 'step'} failed (exit {rc}).\n  command: {shlex.join(cmd)}\n"
                           f"  cwd: {cwd}\n  full log: {log}\n--- last {len(last)} lines ---\n{tail_txt}")


def which(names: Iterable[str]) -> str | None:
    from shutil import which as _which
    for n in names:
        p = _which(n)
        if p:
            return p
    return None
