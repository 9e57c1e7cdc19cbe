"""Getting the pinned source: sha256 checks before extraction, the sdist's git module, downloads."""

from __future__ import annotations

import hashlib
import http.server
import io
import shutil
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest

from harness import config, source
from harness.util import HarnessError


def git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(tree), *args], check=True, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE).stdout.strip()


@pytest.fixture
def fake_sdist(tmp_path: Path):
    """An sdist shaped like llama-cpp-python's: vendor/llama.cpp + .git/modules/vendor/llama.cpp."""
    work = tmp_path / "mk" / "pkg-1.0"
    vendor = work / "vendor" / "llama.cpp"
    vendor.mkdir(parents=True)
    git(vendor, "init", "-q")
    (vendor / "CMakeLists.txt").write_text("project(x)\n")
    git(vendor, "add", "-A")
    git(vendor, "-c", "user.name=T", "-c", "user.email=t@t", "commit", "-q", "-m", "upstream pin")
    pin = git(vendor, "rev-parse", "HEAD")
    mod = work / ".git" / "modules" / "vendor"
    mod.mkdir(parents=True)
    shutil.move(str(vendor / ".git"), str(mod / "llama.cpp"))
    (vendor / ".git").write_text("gitdir: ../../.git/modules/vendor/llama.cpp\n")
    with open(mod / "llama.cpp" / "config", "a") as f:
        f.write("\tworktree = ../../../../vendor/llama.cpp\n[includeIf \"gitdir:/ci/x\"]\n\tpath = /ci/creds\n")
    (work / "setup.py").write_text("# not extracted\n")
    sdist = tmp_path / "pkg-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(work, arcname="pkg-1.0")
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    return sdist, sha, pin


def test_sdist_becomes_standalone_repo_at_pin(fake_sdist, tmp_path):
    sdist, sha, pin = fake_sdist
    dest = tmp_path / "tree"
    source.extract_sdist(sdist, dest, expected_sha256=sha, pin=pin)
    assert git(dest, "rev-parse", "HEAD") == pin
    assert git(dest, "status", "--porcelain") == ""
    assert (dest / ".git").is_dir()
    assert "worktree" not in (dest / ".git" / "config").read_text()
    assert not (dest / "setup.py").exists()


def test_sha256_mismatch_refused_before_extraction(fake_sdist, tmp_path):
    sdist, sha, pin = fake_sdist
    dest = tmp_path / "tree"
    with pytest.raises(HarnessError, match="sha256"):
        source.extract_sdist(sdist, dest, expected_sha256="0" * 64, pin=pin)
    assert not dest.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".extract")] == []


def test_sdist_at_wrong_commit_refused(fake_sdist, tmp_path):
    sdist, sha, pin = fake_sdist
    dest = tmp_path / "tree"
    with pytest.raises(HarnessError, match="expected the pin"):
        source.extract_sdist(sdist, dest, expected_sha256=sha, pin="f" * 40)
    assert not dest.exists()


def test_existing_destination_not_overwritten(fake_sdist, tmp_path):
    sdist, sha, pin = fake_sdist
    dest = tmp_path / "tree"
    dest.mkdir()
    (dest / "keep").write_text("mine")
    with pytest.raises(HarnessError, match="refusing to overwrite"):
        source.extract_sdist(sdist, dest, expected_sha256=sha, pin=pin)
    assert (dest / "keep").read_text() == "mine"


@pytest.fixture
def http_file(tmp_path):
    payload = b"not the sdist you are looking for\n" * 1000
    (tmp_path / "srv").mkdir()
    (tmp_path / "srv" / "f.tar.gz").write_bytes(payload)

    class H(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k):
            super().__init__(*a, directory=str(tmp_path / "srv"), **k)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/f.tar.gz", payload
    srv.shutdown()


def test_download_verifies_sha256(http_file, tmp_path):
    url, payload = http_file
    dest = tmp_path / "dl" / "f.tar.gz"
    with pytest.raises(HarnessError, match="sha256 mismatch"):
        source.download(url, dest, "0" * 64)
    assert not dest.exists()  # never a partial or unverified file under the final name
    assert (tmp_path / "dl" / "f.tar.gz.bad").exists()
    good = hashlib.sha256(payload).hexdigest()
    assert source.download(url, dest, good) == dest
    assert dest.read_bytes() == payload


def test_pinned_facts():
    assert config.PIN == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    assert config.SDIST_SHA256 == "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
