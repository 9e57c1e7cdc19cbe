"""The patch-stack machinery on a throw-away repository with throw-away patches."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness import patches, source
from harness.util import HarnessError


def git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(tree), *args], check=True, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE).stdout.strip()


def commit_all(tree: Path, msg: str) -> str:
    git(tree, "add", "-A")
    git(tree, "-c", "user.name=T", "-c", "user.email=t@t", "commit", "-q", "-m", msg)
    return git(tree, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path):
    """A tiny upstream at a 'pin' plus a patches/ dir holding two exported throw-away patches."""
    tree = tmp_path / "llama"
    tree.mkdir()
    git(tree, "init", "-q")
    (tree / "a.txt").write_text("".join(f"line {i}\n" for i in range(40)))
    (tree / "b.txt").write_text("".join(f"b {i}\n" for i in range(60)))
    pin = commit_all(tree, "upstream")
    a = (tree / "a.txt").read_text().replace("line 5\n", "line five\n")
    (tree / "a.txt").write_text(a)
    commit_all(tree, "first: change a")
    b = (tree / "b.txt").read_text().replace("b 3\n", "b three\n").replace("b 50\n", "b fifty\n")
    (tree / "b.txt").write_text(b)
    (tree / "new.txt").write_text("new file\n")
    commit_all(tree, "second: change b and add new")
    pdir = tmp_path / "patches"
    pdir.mkdir()
    patches.export(tree, pdir, pin)
    git(tree, "reset", "-q", "--hard", pin)
    return tree, pdir, pin


def head_tree(tree: Path) -> str:
    return git(tree, "rev-parse", "HEAD^{tree}")


def test_export_writes_numbered_stable_patches(repo):
    tree, pdir, pin = repo
    names = [p.name for p in patches.list_patches(pdir)]
    assert names == ["0001-first-change-a.patch", "0002-second-change-b-and-add-new.patch"]
    text = (pdir / names[0]).read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    assert "Date: Thu, 1 Oct 2026 00:00:00 +0000" in text
    assert "line five" in text


def test_apply_twice_is_noop(repo):
    tree, pdir, pin = repo
    assert patches.apply(tree, pdir, pin) == 2
    head = git(tree, "rev-parse", "HEAD")
    assert (tree / "new.txt").read_text() == "new file\n"
    assert patches.apply(tree, pdir, pin) == 0
    assert git(tree, "rev-parse", "HEAD") == head
    st = patches.state(tree, pdir, pin)
    assert st.patch_status == ["applied", "applied"] and not st.local_commits and not st.dirty


def test_apply_is_reproducible_commit_for_commit(repo, tmp_path):
    tree, pdir, pin = repo
    patches.apply(tree, pdir, pin)
    first = git(tree, "rev-parse", "HEAD")
    patches.revert(tree, pdir, pin)
    patches.apply(tree, pdir, pin)
    assert git(tree, "rev-parse", "HEAD") == first  # fixed dates + identity: same hashes


def test_revert_returns_to_pin_exactly(repo):
    tree, pdir, pin = repo
    pin_tree = head_tree(tree)
    patches.apply(tree, pdir, pin)
    assert head_tree(tree) != pin_tree
    patches.revert(tree, pdir, pin)
    assert git(tree, "rev-parse", "HEAD") == pin
    assert git(tree, "diff", pin) == ""
    assert git(tree, "status", "--porcelain", "--untracked-files=all") == ""
    assert not (tree / "new.txt").exists()


def test_dirty_tree_refused_and_untouched(repo):
    tree, pdir, pin = repo
    (tree / "a.txt").write_text("my precious edit\n")
    (tree / "mine.txt").write_text("untracked work\n")
    for action in (lambda: patches.apply(tree, pdir, pin), lambda: patches.revert(tree, pdir, pin, force=True),
                   lambda: patches.export(tree, pdir, pin)):
        with pytest.raises(HarnessError) as e:
            action()
        assert "a.txt" in str(e.value) and "mine.txt" in str(e.value)
    assert (tree / "a.txt").read_text() == "my precious edit\n"
    assert (tree / "mine.txt").read_text() == "untracked work\n"
    assert git(tree, "rev-parse", "HEAD") == pin
    assert len(patches.list_patches(pdir)) == 2


def test_local_commit_blocks_apply_and_revert_without_force(repo):
    tree, pdir, pin = repo
    patches.apply(tree, pdir, pin)
    (tree / "a.txt").write_text((tree / "a.txt").read_text() + "local\n")
    local = commit_all(tree, "my local change")
    with pytest.raises(HarnessError, match="differ from patches"):
        patches.apply(tree, pdir, pin)
    with pytest.raises(HarnessError, match="my local change"):
        patches.revert(tree, pdir, pin)
    assert git(tree, "rev-parse", "HEAD") == local
    st = patches.state(tree, pdir, pin)
    assert [s for _, s in st.local_commits] == ["my local change"]
    assert "local" in patches.format_status(st)
    patches.revert(tree, pdir, pin, force=True)
    assert git(tree, "rev-parse", "HEAD") == pin


def test_modified_patch_is_reported(repo):
    tree, pdir, pin = repo
    patches.apply(tree, pdir, pin)
    git(tree, "reset", "-q", "--hard", "HEAD~1")
    (tree / "b.txt").write_text((tree / "b.txt").read_text().replace("b 3\n", "b THREE\n"))
    commit_all(tree, "second: change b and add new")
    st = patches.state(tree, pdir, pin)
    assert st.patch_status == ["applied", "modified"]
    assert "run export" in patches.format_status(st)


def test_broken_patch_names_patch_file_and_hunk(repo):
    tree, pdir, pin = repo
    # upstream moved on under the second patch's second hunk
    b = (tree / "b.txt").read_text().replace("b 49\n", "b forty-nine\n")
    (tree / "b.txt").write_text(b)
    newpin = commit_all(tree, "upstream changed b")
    with pytest.raises(HarnessError) as e:
        patches.apply(tree, pdir, newpin)
    msg = str(e.value)
    assert "0002-second-change-b-and-add-new.patch" in msg
    assert "file b.txt" in msg and "hunk #2 of 2" in msg
    assert "1 patch(es) before it stay applied" in msg
    # the failed patch left nothing behind
    assert git(tree, "status", "--porcelain", "--untracked-files=all") == ""
    assert git(tree, "log", "-1", "--format=%s") == "first: change a"


def test_export_round_trip_and_no_churn(repo):
    tree, pdir, pin = repo
    patches.apply(tree, pdir, pin)
    # a developer edits the series in the work tree: a third commit
    (tree / "c.txt").write_text("third\n")
    commit_all(tree, "third: add c")
    developed = head_tree(tree)
    rep = patches.export(tree, pdir, pin)
    assert rep["written"] == ["0003-third-add-c.patch"]
    assert sorted(rep["unchanged"]) == ["0001-first-change-a.patch", "0002-second-change-b-and-add-new.patch"]
    before = {p.name: p.read_bytes() for p in patches.list_patches(pdir)}
    patches.revert(tree, pdir, pin)
    patches.apply(tree, pdir, pin)
    assert head_tree(tree) == developed
    rep = patches.export(tree, pdir, pin)
    assert rep["written"] == [] and rep["removed"] == []
    assert {p.name: p.read_bytes() for p in patches.list_patches(pdir)} == before


def test_export_drops_removed_commits(repo):
    tree, pdir, pin = repo
    patches.apply(tree, pdir, pin)
    git(tree, "reset", "-q", "--hard", "HEAD~1")
    rep = patches.export(tree, pdir, pin)
    assert rep["removed"] == ["0002-second-change-b-and-add-new.patch"]
    assert [p.name for p in patches.list_patches(pdir)] == ["0001-first-change-a.patch"]


def test_user_tree_at_wrong_commit_refused(repo, tmp_path):
    tree, pdir, pin = repo
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q")
    (other / "x").write_text("x\n")
    wrong = commit_all(other, "not the pin")
    with pytest.raises(HarnessError) as e:
        source.check_user_tree(other, pin)
    assert wrong in str(e.value) and "not the pin" in str(e.value) and "Fix:" in str(e.value)
    source.check_user_tree(tree, pin)  # the pin itself is fine
    patches.apply(tree, pdir, pin)
    source.check_user_tree(tree, pin)  # and so is the pin plus commits on top
    with pytest.raises(HarnessError, match="not a git checkout"):
        source.check_user_tree(tmp_path / "nowhere", pin)


def test_changed_series_replaces_only_harness_commits(repo):
    tree, pdir, pin = repo
    patches.apply(tree, pdir, pin)
    # the repository is updated: patch 0002 changes and a 0003 appears
    p2 = pdir / "0002-second-change-b-and-add-new.patch"
    p2.write_text(p2.read_text().replace("+new file", "+new file v2"))
    patches.apply(tree, pdir, pin)
    assert (tree / "new.txt").read_text() == "new file v2\n"
    assert patches.state(tree, pdir, pin).patch_status == ["applied", "applied"]
    # a person's amend of a harness commit is their work: never replaced
    (tree / "new.txt").write_text("amended by hand\n")
    git(tree, "add", "-A")
    git(tree, "-c", "user.name=P", "-c", "user.email=p@p", "commit", "-q", "--amend", "--no-edit")
    p2.write_text(p2.read_text().replace("+new file v2", "+new file v3"))
    with pytest.raises(HarnessError, match="differ from patches"):
        patches.apply(tree, pdir, pin)
    assert (tree / "new.txt").read_text() == "amended by hand\n"
