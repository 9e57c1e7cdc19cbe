"""Get the pinned llama.cpp source as a git work tree.

Three ways (see README): the llama-cpp-python sdist from PyPI (default, sha256-verified before anything
is extracted), a git clone of upstream checked out at the pin, or a user's own checkout at the pin."""

from __future__ import annotations

import re
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from . import config
from .util import HarnessError, run, say, sha256_file

GIT_CONFIG = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n" \
             "\tlogallrefupdates = true\n[gc]\n\tauto = 0\n"


def _git(tree: Path, *args: str, check: bool = True):
    return run(["git", "-C", str(tree), *args], check=check)


def head_commit(tree: Path) -> str:
    p = _git(tree, "rev-parse", "HEAD", check=False)
    if p.returncode != 0:
        raise HarnessError(f"{tree} is not a git work tree with a commit (git rev-parse HEAD failed): "
                           f"{p.stderr.strip()}")
    return p.stdout.strip()


def sdist_url(simple: str = config.PYPI_SIMPLE) -> str:
    """Find the sdist's download address in the PyPI simple index."""
    import requests
    url = f"{simple.rstrip('/')}/{config.SDIST_PROJECT}/"
    try:
        r = requests.get(url, timeout=60)
        r.raise_for_status()
    except Exception as e:  # noqa: BLE001 - report any network error the same way
        raise HarnessError(f"cannot read the PyPI index {url}: {e}") from e
    for href in re.findall(r'href="([^"]+)"', r.text):
        if href.split("#")[0].endswith("/" + config.SDIST_FILENAME):
            return href.split("#")[0]
    raise HarnessError(f"{config.SDIST_FILENAME} is not listed in {url}")


def download(url: str, dest: Path, expected_sha256: str, expected_size: int | None = None) -> Path:
    """Download `url` to `dest` with progress, verify the sha256; never leaves a partial `dest`."""
    import requests
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    say(f"downloading {url}")
    with requests.get(url, stream=True, timeout=60) as r:
        r.raise_for_status()
        total = int(r.headers.get("content-length") or expected_size or 0)
        done, t0, last = 0, time.time(), 0.0
        with open(part, "wb") as f:
            for chunk in r.iter_content(1 << 20):
                f.write(chunk)
                done += len(chunk)
                now = time.time()
                if now - last > 2 or done == total:
                    last = now
                    pct = f"{100 * done / total:5.1f}%" if total else ""
                    print(f"  {done / 1e6:8.1f} MB {pct} {done / 1e6 / max(now - t0, 1e-3):6.1f} MB/s",
                          flush=True)
    got = sha256_file(part)
    if got != expected_sha256:
        bad = part.with_name(dest.name + ".bad")
        part.replace(bad)
        raise HarnessError(f"sha256 mismatch for {url}: got {got}, expected {expected_sha256}; "
                           f"the download was kept as {bad} and nothing was extracted")
    part.replace(dest)
    return dest


def verify_sdist(path: Path, expected_sha256: str = config.SDIST_SHA256) -> None:
    got = sha256_file(path)
    if got != expected_sha256:
        raise HarnessError(f"{path}: sha256 {got} does not match the pinned {expected_sha256} "
                           f"(FACTS: {config.SDIST_FILENAME}); refusing to extract it. Delete the file "
                           f"to download it again, or pass the right file with --sdist.")


def extract_sdist(sdist: Path, dest: Path, expected_sha256: str = config.SDIST_SHA256,
                  pin: str = config.PIN) -> Path:
    """Verify `sdist`, then turn its vendor/llama.cpp (+ its git module) into a standalone repo at `dest`."""
    verify_sdist(sdist, expected_sha256)
    if dest.exists():
        raise HarnessError(f"{dest} already exists; refusing to overwrite it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    say(f"extracting {config.SDIST_VENDOR} from {sdist.name}")
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".extract-") as tmp:
        tmpd = Path(tmp)
        with tarfile.open(sdist, "r:gz") as tf:
            top = None
            members = []
            for m in tf:
                parts = m.name.split("/", 1)
                if top is None:
                    top = parts[0]
                if len(parts) < 2:
                    continue
                rel = parts[1]
                if rel.startswith(config.SDIST_VENDOR + "/") or rel.startswith(config.SDIST_GITDIR + "/"):
                    members.append(m)
            if not members:
                raise HarnessError(f"{sdist}: no {config.SDIST_VENDOR} inside; is this the right sdist?")
            tf.extractall(tmpd, members=members, filter="data")
        root = tmpd / str(top)
        vendor = root / config.SDIST_VENDOR
        gitdir = root / config.SDIST_GITDIR
        if not gitdir.is_dir():
            raise HarnessError(f"{sdist}: {config.SDIST_GITDIR} is missing; the sdist carries no git metadata")
        gitfile = vendor / ".git"
        if gitfile.is_file() or gitfile.is_symlink():
            gitfile.unlink()
        shutil.move(str(gitdir), str(gitfile))
        (gitfile / "config").write_text(GIT_CONFIG)  # drop worktree/includeIf entries of the sdist's CI
        head = head_commit(vendor)
        if head != pin:
            raise HarnessError(f"{sdist}: vendored llama.cpp is at {head}, expected the pin {pin}")
        dirty = _git(vendor, "status", "--porcelain").stdout.strip()
        if dirty:
            raise HarnessError(f"{sdist}: vendored llama.cpp differs from its own commit:\n{dirty[:2000]}")
        shutil.move(str(vendor), str(dest))
    return dest


def fetch_sdist(dest: Path, sdist: Path | None = None) -> Path:
    if sdist is None:
        sdist = config.downloads_dir() / config.SDIST_FILENAME
        if not sdist.exists():
            download(sdist_url(), sdist, config.SDIST_SHA256, config.SDIST_SIZE)
    elif not sdist.exists():
        raise HarnessError(f"--sdist {sdist}: no such file")
    return extract_sdist(sdist, dest)


def fetch_git(dest: Path, url: str = config.GIT_URL, pin: str = config.PIN) -> Path:
    if dest.exists():
        raise HarnessError(f"{dest} already exists; refusing to overwrite it")
    tmp = dest.with_name(dest.name + ".clone-tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    say(f"cloning {url} at {pin}")
    run(["git", "init", "-q", str(tmp)])
    run(["git", "-C", str(tmp), "remote", "add", "origin", url])
    p = run(["git", "-C", str(tmp), "fetch", "--depth", "1", "origin", pin], check=False)
    if p.returncode != 0:
        shutil.rmtree(tmp)
        raise HarnessError(f"git fetch of {pin} from {url} failed:\n{p.stderr[-2000:]}\n"
                           f"Without network access use the default source (--source sdist).")
    run(["git", "-C", str(tmp), "checkout", "-q", "--detach", "FETCH_HEAD"])
    tmp.rename(dest)
    return dest


def check_user_tree(tree: Path, pin: str = config.PIN) -> None:
    """A user's checkout must be at the pin, or at the pin plus commits on top of it."""
    if not (tree / ".git").exists():
        raise HarnessError(f"--llama-dir {tree}: not a git checkout of llama.cpp")
    head = head_commit(tree)
    if head == pin:
        return
    has_pin = _git(tree, "cat-file", "-e", pin + "^{commit}", check=False).returncode == 0
    if has_pin and _git(tree, "merge-base", "--is-ancestor", pin, head, check=False).returncode == 0:
        return
    subject = _git(tree, "log", "-1", "--format=%s", head, check=False).stdout.strip()
    raise HarnessError(
        f"--llama-dir {tree} is at commit {head} ({subject!r}), not at the pin {pin}.\n"
        f"Fix: git -C {tree} fetch origin {pin} && git -C {tree} switch -c {config.WORK_BRANCH} {pin}\n"
        f"(or drop --llama-dir to let the harness fetch the pinned source into its cache)")


def ensure_tree(tree: Path | None = None, source: str = "sdist", sdist: Path | None = None,
                user_tree: bool = False) -> Path:
    """Return a work tree at the pin (fetching it if absent) on the harness branch."""
    if user_tree:
        assert tree is not None
        tree = Path(tree).resolve()
        check_user_tree(tree)
        return tree
    tree = Path(tree or config.default_tree())
    if not tree.exists():
        if source == "sdist":
            fetch_sdist(tree, sdist)
        elif source == "git":
            fetch_git(tree)
        else:
            raise HarnessError(f"unknown --source {source!r} (sdist or git)")
        run(["git", "-C", str(tree), "checkout", "-q", "-B", config.WORK_BRANCH, config.PIN])
        say(f"pinned llama.cpp ready at {tree}")
    check_user_tree(tree)
    return tree


if __name__ == "__main__":  # pragma: no cover
    print(ensure_tree(), file=sys.stderr)
