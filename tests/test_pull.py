"""`stq-metal model pull` (harness/pull.py) against a real local HTTP server speaking the hub's
file-resolve protocol (tests/hub_server.py, 127.0.0.1 only): the huggingface-hub client runs
unmodified in a subprocess with HF_ENDPOINT pointed at the server.

Covered: a transfer cut mid-file resumes with a Range request and verifies; split parts by glob;
404 (listed file gone, unknown repository, no match); sha256 mismatch (file moved aside, never
left under its name); HF_TOKEN sent as a bearer token, refused without it; a disk-space
preflight on a real 1 MiB tmpfs (skipped where mounting is not permitted); the retag offer for a
GGUF with type-42 STQ1_0 tensors (and --retag applying it), the hyv4 hint. About 10 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hub_server import Hub  # noqa: E402

from harness import synth_hy4  # noqa: E402
from harness.gguf_layout import RawTensor, read_layout, write_gguf  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "hf_test_token_5f3a"


def _pull(hub: Hub, tmp_path: Path, *args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1",
               HF_HUB_DISABLE_XET="1", PYTHONPATH=str(ROOT))
    if token:
        env["HF_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "harness.pull", *args], env=env, capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def _rand(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_interrupted_transfer_resumes_and_verifies(tmp_path):
    # the client writes 10 MiB chunks: cut after 12 MiB so that one chunk is on disk when the connection drops
    data = _rand(24 << 20, 1)
    with Hub({"acme/big": {"big.gguf": data}}, token=TOKEN) as hub:
        hub.cut["big.gguf"] = 12 << 20
        r = _pull(hub, tmp_path, "acme/big", "big.gguf", "--dir", str(tmp_path / "out"))
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "out" / "big.gguf").read_bytes() == data
        ranges = hub.ranges("/big.gguf")
        assert ranges[0] is None and ranges[-1] == f"bytes={10 << 20}-", ranges
        assert all(a == f"Bearer {TOKEN}" for *_, a in hub.log)
        # a second pull finds the file complete and only re-checks it
        n = len(hub.ranges("/big.gguf"))
        r = _pull(hub, tmp_path, "acme/big", "big.gguf", "--dir", str(tmp_path / "out"))
        assert r.returncode == 0 and len(hub.ranges("/big.gguf")) == n


def test_split_parts_by_glob(tmp_path):
    parts = {f"m-0000{i}-of-00003.gguf": _rand(1000 * i, i) for i in (1, 2, 3)}
    with Hub({"acme/split": {**parts, "README.md": b"# card\n"}}) as hub:
        r = _pull(hub, tmp_path, "acme/split", "m-*-of-*.gguf", "--dir", str(tmp_path / "out"))
        assert r.returncode == 0, r.stderr
        for n, b in parts.items():
            assert (tmp_path / "out" / n).read_bytes() == b
        assert not (tmp_path / "out" / "README.md").exists()
        assert r.stdout.splitlines()[-3:] == [str(tmp_path / "out" / n) for n in sorted(parts)]


def test_not_found(tmp_path):
    with Hub({"acme/m": {"a.gguf": b"x" * 100, "b.gguf": b"y" * 100}}) as hub:
        hub.gone.add("b.gguf")
        r = _pull(hub, tmp_path, "acme/m", "b.gguf", "--dir", str(tmp_path / "out"))
        assert r.returncode == 1 and "b.gguf" in r.stderr and "404" in r.stderr, r.stderr
        r = _pull(hub, tmp_path, "acme/m", "c.gguf", "--dir", str(tmp_path / "out"))
        assert r.returncode == 1 and "no file matches 'c.gguf'" in r.stderr and "a.gguf" in r.stderr
        r = _pull(hub, tmp_path, "acme/nope", "a.gguf", "--dir", str(tmp_path / "out"))
        assert r.returncode == 1 and "acme/nope" in r.stderr and "not found" in r.stderr


def test_hash_mismatch_is_moved_aside(tmp_path):
    data = _rand(5000, 3)
    with Hub({"acme/m": {"m.gguf": data}}) as hub:
        hub.corrupt.add("m.gguf")
        r = _pull(hub, tmp_path, "acme/m", "m.gguf", "--dir", str(tmp_path / "out"))
        assert r.returncode == 1 and "sha256" in r.stderr, r.stderr
        assert not (tmp_path / "out" / "m.gguf").exists()
        assert (tmp_path / "out" / "m.gguf.bad").exists()


def test_token_required(tmp_path):
    with Hub({"acme/private": {"m.gguf": b"z" * 64}}, token=TOKEN) as hub:
        r = _pull(hub, tmp_path, "acme/private", "m.gguf", "--dir", str(tmp_path / "out"), token=None)
        assert r.returncode == 1 and "HF_TOKEN" in r.stderr, r.stderr
        r = _pull(hub, tmp_path, "acme/private", "m.gguf", "--dir", str(tmp_path / "out"), token="wrong")
        assert r.returncode == 1
        r = _pull(hub, tmp_path, "acme/private", "m.gguf", "--dir", str(tmp_path / "out"))
        assert r.returncode == 0, r.stderr


def test_disk_space_preflight_on_a_small_tmpfs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if m.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({m.stderr.strip() or m.returncode}); the preflight is untested")
    try:
        with Hub({"acme/m": {"m.gguf": _rand(3 << 20, 4)}}) as hub:
            r = _pull(hub, tmp_path, "acme/m", "m.gguf", "--dir", str(mnt / "out"))
            assert r.returncode == 1 and "not enough disk space" in r.stderr, r.stderr
            assert not any(hub.ranges("/m.gguf")), "the download started although the space check failed"
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def _stq_gguf(arch: str = "llama") -> bytes:
    # one 256-weight tensor stored with the private type id 42 in STQ1_0's 42-byte layout
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "x.gguf"
        write_gguf(p, {"general.architecture": arch}, [RawTensor("blk.0.ffn_down.weight", (256, 1), 42, bytes(42))])
        return p.read_bytes()


def test_retag_offered_and_applied(tmp_path):
    with Hub({"acme/hymt": {"hymt.gguf": _stq_gguf()}}) as hub:
        r = _pull(hub, tmp_path, "acme/hymt", "hymt.gguf", "--dir", str(tmp_path / "a"))
        assert r.returncode == 0 and "stq-metal retag" in r.stdout, r.stdout + r.stderr
        assert read_layout(tmp_path / "a" / "hymt.gguf").tensors[0].type_id == 42
        r = _pull(hub, tmp_path, "acme/hymt", "hymt.gguf", "--dir", str(tmp_path / "b"), "--retag")
        assert r.returncode == 0 and "retagged 1" in r.stdout, r.stdout + r.stderr
        assert read_layout(tmp_path / "b" / "hymt.gguf").tensors[0].type_id == 43


def test_hyv4_hint(tmp_path):
    kv, types = synth_hy4.arch_kv(synth_hy4.Hy4Params(), "hyv4")
    p = tmp_path / "src.gguf"
    write_gguf(p, kv, [RawTensor("token_embd.weight", (4, 2), 0, bytes(32))], kv_types=types)
    with Hub({"acme/hy4": {"hy4.gguf": p.read_bytes()}}) as hub:
        r = _pull(hub, tmp_path, "acme/hy4", "hy4.gguf", "--dir", str(tmp_path / "out"))
        assert r.returncode == 0 and "stq-metal hyv4" in r.stdout, r.stdout + r.stderr


def test_presets_and_usage(tmp_path):
    r = subprocess.run([sys.executable, "-m", "harness.pull", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and "hy4-stq1_0" in r.stdout and "gemma4-e4b-mtp" in r.stdout
    r = subprocess.run([sys.executable, "-m", "harness.pull", "no-such-preset"], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 2 and "preset" in r.stderr
