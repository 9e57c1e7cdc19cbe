"""The patch stack: patches/NNNN-topic.patch applied as commits on top of the pin.

apply   -- turn the missing patches into commits (idempotent; refuses a tree with foreign changes)
revert  -- return the tree to the pin exactly (refuses to drop work that is not in patches/)
status  -- applied / missing / locally modified patches, local commits, uncommitted files
export  -- regenerate patches/ from the commits, with stable bytes (fixed dates, zero hashes)
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import config
from .util import HarnessError, atomic_write_bytes, run, say

DATE_RE = re.compile(r"^Date: .*$", re.M)
FIXED_DATE = "Date: Thu, 1 Oct 2026 00:00:00 +0000"


def _git(tree: Path, *args: str, check: bool = True, input: str | None = None, env=None):
    return run(["git", "-C", str(tree), *args], check=check, input=input, env=env)


def list_patches(patches_dir: Path) -> list[Path]:
    return sorted(p for p in Path(patches_dir).glob("*.patch") if p.is_file())


def series_hash(patches_dir: Path) -> str:
    h = hashlib.sha256()
    for p in list_patches(patches_dir):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def patch_subject(text: str) -> str:
    """The subject `git am` will give the commit: the folded Subject header minus [PATCH...]."""
    m = re.search(r"^Subject: (.*(?:\n[ \t].*)*)", text, re.M)
    if not m:
        return ""
    subj = re.sub(r"\n[ \t]+", " ", m.group(1)).strip()
    return re.sub(r"^\[[^\]]*PATCH[^\]]*\]\s*", "", subj)


def _patch_id(tree: Path, diff_text: str) -> str:
    out = _git(tree, "patch-id", "--stable", input=diff_text).stdout.split()
    return out[0] if out else ""


def commits_over_pin(tree: Path, pin: str = config.PIN) -> list[tuple[str, str]]:
    out = _git(tree, "log", "--reverse", "--format=%H%x00%s", f"{pin}..HEAD").stdout
    return [tuple(line.split("\0", 1)) for line in out.splitlines() if line]  # type: ignore[misc]


def commit_patch_id(tree: Path, sha: str) -> str:
    return _patch_id(tree, _git(tree, "show", "--format=", "--no-color", sha).stdout)


def harness_made(tree: Path, sha: str) -> bool:
    """Was this commit made by `apply` (and not amended or rebased by a person since)?"""
    email = _git(tree, "log", "-1", "--format=%ce", sha).stdout.strip()
    return email == config.HARNESS_COMMITTER[1]


def dirty_files(tree: Path) -> list[str]:
    out = _git(tree, "status", "--porcelain", "--untracked-files=all").stdout
    return [line for line in out.splitlines() if line.strip()]


@dataclass
class SeriesState:
    patches: list[Path]
    commits: list[tuple[str, str]]
    # one per patch: "applied", "modified" (a commit in its place differs), "missing"
    patch_status: list[str] = field(default_factory=list)
    local_commits: list[tuple[str, str]] = field(default_factory=list)  # commits not matching patches/
    dirty: list[str] = field(default_factory=list)

    @property
    def n_applied_prefix(self) -> int:
        n = 0
        for s in self.patch_status:
            if s != "applied":
                break
            n += 1
        return n

    @property
    def clean_prefix(self) -> bool:
        """Commits over the pin are exactly the first N patches (nothing foreign)."""
        return not self.local_commits and all(s == "applied" for s in self.patch_status[:len(self.commits)])


def state(tree: Path, patches_dir: Path = config.PATCHES_DIR, pin: str = config.PIN) -> SeriesState:
    patches = list_patches(patches_dir)
    commits = commits_over_pin(tree, pin)
    st = SeriesState(patches=patches, commits=commits, dirty=dirty_files(tree))
    for i, p in enumerate(patches):
        if i >= len(commits):
            st.patch_status.append("missing")
            continue
        sha, _ = commits[i]
        same = commit_patch_id(tree, sha) == _patch_id(tree, p.read_text(errors="replace"))
        st.patch_status.append("applied" if same else "modified")
    for i, (sha, subj) in enumerate(commits):
        if i >= len(patches) or st.patch_status[i] != "applied":
            st.local_commits.append((sha, subj))
    return st


def format_status(st: SeriesState) -> str:
    lines = []
    for p, s in zip(st.patches, st.patch_status):
        note = {"applied": "", "missing": "",
                "modified": "  (the work tree's commit in its place differs: run export to keep it)"}[s]
        lines.append(f"  {s:8s} {p.name}{note}")
    if not st.patches:
        lines.append("  (patches/ is empty)")
    for sha, subj in st.local_commits:
        lines.append(f"  local    {sha[:12]} {subj}  (not in patches/: run export to keep it)")
    for d in st.dirty:
        lines.append(f"  uncommitted {d}")
    return "\n".join(lines)


def _refuse_dirty(tree: Path, st: SeriesState, action: str) -> None:
    if st.dirty:
        files = "\n".join(f"    {d}" for d in st.dirty[:50])
        more = f"\n    ... and {len(st.dirty) - 50} more" if len(st.dirty) > 50 else ""
        raise HarnessError(
            f"refusing to {action}: {tree} holds changes the harness did not make:\n{files}{more}\n"
            f"Nothing was changed. Commit them there (git -C {tree} commit -am ...) and run export to keep "
            f"them in patches/, or move them away yourself (git -C {tree} stash -u), then retry.")


def _hunk_report(patch: Path, text: str, err: str) -> str:
    """Name file and hunk from `git apply --check -v` output."""
    m = re.search(r"error: patch failed: (.+):(\d+)", err)
    if m:
        fname, line = m.group(1), int(m.group(2))
        hunks = []
        section = None
        for l in text.splitlines():
            if l.startswith("diff --git "):
                section = l.split(" b/", 1)[-1]
            elif l.startswith("@@") and section == fname:
                hunks.append(l)
        idx = None
        for k, h in enumerate(hunks, 1):
            mm = re.match(r"@@ -(\d+)", h)
            if mm and int(mm.group(1)) == line:
                idx = k
                break
        hunk = f"hunk #{idx} of {len(hunks)}: {hunks[idx - 1]}" if idx else f"the hunk at line {line}"
        return f"patch {patch.name} does not apply: file {fname}, {hunk}"
    m = re.search(r"error: (.+?): (does not exist in index|No such file or directory|already exists in "
                  r"working directory)", err)
    if m:
        return f"patch {patch.name} does not apply: file {m.group(1)}: {m.group(2)}"
    return f"patch {patch.name} does not apply"


def apply(tree: Path, patches_dir: Path = config.PATCHES_DIR, pin: str = config.PIN) -> int:
    """Apply the missing patches as commits. Returns how many were applied (0 = already applied)."""
    st = state(tree, patches_dir, pin)
    _refuse_dirty(tree, st, "apply")
    if not st.clean_prefix or len(st.commits) > len(st.patches):
        keep = st.n_applied_prefix
        stale = st.commits[keep:]
        if all(harness_made(tree, sha) for sha, _ in stale):
            # patches/ changed since the harness applied it (an update of this repository): the stale
            # commits are the harness's own, reproducible from an older patches/, so replace them
            base = st.commits[keep - 1][0] if keep else pin
            say(f"patches/ changed since the last apply: replacing {len(stale)} commit(s) made by the "
                f"harness, re-applying from patch {keep + 1}")
            _git(tree, "reset", "-q", "--hard", base)
            st = state(tree, patches_dir, pin)
    if not st.clean_prefix or len(st.commits) > len(st.patches):
        raise HarnessError(
            f"refusing to apply: the commits over the pin in {tree} differ from patches/:\n{format_status(st)}\n"
            f"Run `python harness/build.py export` to save them into patches/, or "
            f"`python harness/build.py --revert --force` to drop them (that discards them).")
    todo = st.patches[len(st.commits):]
    if not todo:
        say(f"already applied: {len(st.patches)} patch(es) on top of the pin, nothing changed")
        return 0
    name, email = config.HARNESS_COMMITTER
    env = {"GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email}
    for p in todo:
        text = p.read_text(errors="replace")
        chk = _git(tree, "apply", "--check", "-v", str(p), check=False)
        if chk.returncode != 0:
            done = len(st.commits) + todo.index(p)
            raise HarnessError(f"{_hunk_report(p, text, chk.stderr)}\n--- git apply says ---\n"
                               f"{chk.stderr.strip()[-3000:]}\n"
                               f"The {done} patch(es) before it stay applied; the tree is otherwise unchanged.")
        am = _git(tree, "-c", f"user.name={name}", "-c", f"user.email={email}", "am", "-q",
                  "--committer-date-is-author-date", "--keep-non-patch", str(p), check=False, env=env)
        if am.returncode != 0:
            _git(tree, "am", "--abort", check=False)
            raise HarnessError(f"git am failed on {p.name}:\n{am.stdout[-1500:]}{am.stderr[-3000:]}")
        say(f"applied {p.name}")
    return len(todo)


def revert(tree: Path, patches_dir: Path = config.PATCHES_DIR, pin: str = config.PIN,
           force: bool = False) -> None:
    st = state(tree, patches_dir, pin)
    _refuse_dirty(tree, st, "revert")
    if st.local_commits and not force:
        lst = "\n".join(f"    {sha[:12]} {subj}" for sha, subj in st.local_commits)
        raise HarnessError(f"refusing to revert: these commits in {tree} are not in patches/:\n{lst}\n"
                           f"Run `python harness/build.py export` first to keep them, or pass --force to "
                           f"discard them.")
    _git(tree, "reset", "-q", "--hard", pin)
    if _git(tree, "diff", "--quiet", pin, check=False).returncode != 0 or dirty_files(tree):
        raise HarnessError(f"revert of {tree} did not reach the pin cleanly; inspect it with git status")
    say(f"reverted {tree} to the pin {pin[:12]}")


def export(tree: Path, patches_dir: Path = config.PATCHES_DIR, pin: str = config.PIN) -> dict[str, list[str]]:
    """Write patches/ from the commits over the pin. Unchanged patches keep their bytes and names."""
    st = state(tree, patches_dir, pin)
    if st.dirty:
        _refuse_dirty(tree, st, "export (uncommitted changes would be left out)")
    patches_dir = Path(patches_dir)
    old = {p.name: p for p in list_patches(patches_dir)}
    old_by_subject: dict[str, str] = {}
    for n, p in old.items():
        old_by_subject.setdefault(patch_subject(p.read_text(errors="replace")), n)
    report: dict[str, list[str]] = {"unchanged": [], "written": [], "removed": []}
    with tempfile.TemporaryDirectory() as tmp:
        if st.commits:
            _git(tree, "format-patch", "-q", "--zero-commit", "--no-signature", "--no-numbered",
                 "--no-color", "-o", tmp, f"{pin}..HEAD")
        generated = sorted(Path(tmp).glob("*.patch"))
        if len(generated) != len(st.commits):
            raise HarnessError(f"format-patch wrote {len(generated)} patches for {len(st.commits)} commits")
        new: list[tuple[str, bytes]] = []
        prev = 0
        for g in generated:
            text = DATE_RE.sub(FIXED_DATE, g.read_text(errors="surrogateescape"), count=1)
            data = text.encode(errors="surrogateescape")
            keep = old_by_subject.get(patch_subject(text))
            if keep and int(keep[:4]) > prev:
                fname, prev = keep, int(keep[:4])
            else:
                prev += 1
                fname = f"{prev:04d}-{g.name[5:]}"
            new.append((fname, data))
    names = {n for n, _ in new}
    for fname, data in new:
        dest = patches_dir / fname
        if dest.exists() and dest.read_bytes() == data:
            report["unchanged"].append(fname)
        else:
            atomic_write_bytes(dest, data)
            report["written"].append(fname)
    for n, p in old.items():
        if n not in names:
            p.unlink()
            report["removed"].append(n)
    return report
