"""The retag tool on synthetic GGUF files (no build needed; the load check uses a build when one
is configured)."""

from __future__ import annotations

import hashlib
import json
import os
import struct

import numpy as np
import pytest

from harness import retag, stq1_0
from harness.gguf_layout import GGUFFormatError, RawTensor, read_layout, write_gguf

import stq_helpers
from stq_helpers import stq_cpu_build, stq_lib  # noqa: F401 (fixtures)


def sha(p) -> str:
    return hashlib.sha256(open(p, "rb").read()).hexdigest()


def stq_tensor(name, dims, seed):
    rng = np.random.default_rng(seed)
    n = int(np.prod(dims))
    x = rng.standard_normal((n // dims[0], dims[0])).astype(np.float32)
    return RawTensor(name, dims, 42, stq1_0.encode(x).tobytes())


def q2_tensor(name, dims, seed):
    rng = np.random.default_rng(seed)
    n = int(np.prod(dims))
    return RawTensor(name, dims, 42, rng.integers(0, 256, n // 64 * 18, dtype=np.uint8).tobytes())


def f32_tensor(name, dims, seed):
    rng = np.random.default_rng(seed)
    return RawTensor(name, dims, 0, rng.standard_normal(int(np.prod(dims))).astype(np.float32).tobytes())


KV = {"general.architecture": "llama", "general.name": "synthetic", "general.file_type": 41,
      "tokenizer.ggml.tokens": ["a", "b", "c"], "llama.block_count": 1}


def private_file(path, pad_last=True, alignment=32):
    tensors = [
        f32_tensor("token_embd.weight", (256, 3), 1),
        stq_tensor("blk.0.ffn_up.weight", (512, 3), 2),
        f32_tensor("blk.0.attn_norm.weight", (7,), 3),  # odd size, exercises padding
        stq_tensor("blk.0.ffn_down.weight", (256, 1), 4),
        stq_tensor("blk.0.ffn_gate_exps.weight", (768, 5, 8), 5),  # an expert stack, last tensor
    ]
    write_gguf(path, KV, tensors, alignment=alignment, pad_last=pad_last)
    return tensors


def q2_file(path, pad_last=True):
    tensors = [
        f32_tensor("token_embd.weight", (256, 3), 1),
        q2_tensor("blk.0.ffn_up.weight", (512, 3), 2),
        q2_tensor("blk.0.ffn_down.weight", (256, 1), 4),
        q2_tensor("blk.0.attn_q.weight", (64, 5), 6),  # not a multiple of 256: Q2_0 only
    ]
    write_gguf(path, KV, tensors, pad_last=pad_last)
    return tensors


@pytest.mark.parametrize("pad_last", [True, False])
def test_dry_run_lists_and_changes_nothing(tmp_path, capsys, pad_last):
    p = tmp_path / "private.gguf"
    private_file(p, pad_last=pad_last)
    before = sha(p)
    assert retag.main([str(p)]) == 0
    out, err = capsys.readouterr()
    assert out.count("stq1_0 ") == 3 and "blk.0.ffn_gate_exps.weight" in out
    assert "dry run" in err and "--write" in err
    assert sha(p) == before
    assert not (tmp_path / "private.gguf.bak").exists()


@pytest.mark.parametrize("pad_last", [True, False])
def test_retag_in_place_with_backup(tmp_path, pad_last):
    p = tmp_path / "private.gguf"
    tensors = private_file(p, pad_last=pad_last)
    before = open(p, "rb").read()
    assert retag.main([str(p), "--write"]) == 0
    bak = tmp_path / "private.gguf.bak"
    assert bak.read_bytes() == before
    after = p.read_bytes()
    lay = read_layout(p)
    types = {t.name: t.type_id for t in lay.tensors}
    assert types == {"token_embd.weight": 0, "blk.0.ffn_up.weight": 43, "blk.0.attn_norm.weight": 0,
                     "blk.0.ffn_down.weight": 43, "blk.0.ffn_gate_exps.weight": 43}
    # only the three 4-byte type fields changed, from 42 to 43
    diff = np.flatnonzero(np.frombuffer(before, np.uint8) != np.frombuffer(after, np.uint8))
    fields = sorted(t.type_field_offset for t in lay.tensors if t.type_id == 43)
    assert diff.tolist() == fields
    assert all(before[o:o + 4] == struct.pack("<I", 42) for o in fields)
    # data unchanged and decodable as STQ1_0
    for t in lay.tensors:
        src = next(s for s in tensors if s.name == t.name)
        start = lay.data_start + t.offset
        assert after[start:start + len(src.data)] == src.data
    # second run: nothing to do; a second backup would never be clobbered
    assert retag.main([str(p), "--write"]) == 0
    assert p.read_bytes() == after and bak.read_bytes() == before


def test_retag_to_output_keeps_input(tmp_path):
    p = tmp_path / "private.gguf"
    private_file(p)
    before = sha(p)
    out = tmp_path / "sub" / "fixed.gguf"
    out.parent.mkdir()
    assert retag.main([str(p), "--write", "--output", str(out)]) == 0
    assert sha(p) == before
    assert {t.type_id for t in read_layout(out).tensors} == {0, 43}
    assert [f.name for f in out.parent.iterdir()] == ["fixed.gguf"]  # no temp file left
    # an existing output is not replaced without --force
    out2 = tmp_path / "keep.gguf"
    out2.write_bytes(b"user data")
    assert retag.main([str(p), "--write", "-o", str(out2)]) == 2
    assert out2.read_bytes() == b"user data"
    assert retag.main([str(p), "--write", "-o", str(out2), "--force"]) == 0
    assert out2.read_bytes() == out.read_bytes()


def test_existing_backup_is_never_clobbered(tmp_path):
    p = tmp_path / "private.gguf"
    private_file(p)
    before = sha(p)
    (tmp_path / "private.gguf.bak").write_bytes(b"old backup")
    assert retag.main([str(p), "--write"]) == 2
    assert sha(p) == before and (tmp_path / "private.gguf.bak").read_bytes() == b"old backup"
    assert retag.main([str(p), "--write", "--backup-path", str(tmp_path / "b2")]) == 0
    assert sha(tmp_path / "b2") == before


def test_no_backup(tmp_path):
    p = tmp_path / "private.gguf"
    private_file(p)
    assert retag.main([str(p), "--write", "--no-backup"]) == 0
    assert sorted(f.name for f in tmp_path.iterdir()) == ["private.gguf"]
    assert 43 in {t.type_id for t in read_layout(p).tensors}


@pytest.mark.parametrize("pad_last", [True, False])
@pytest.mark.parametrize("args", [[], ["--write"], ["--write", "--no-backup"], ["--write", "-o", "OUT"]])
def test_genuine_q2_0_is_refused_and_unchanged(tmp_path, capsys, pad_last, args):
    p = tmp_path / "q2.gguf"
    q2_file(p, pad_last=pad_last)
    before = sha(p)
    args = [str(tmp_path / "out.gguf") if a == "OUT" else a for a in args]
    assert retag.main([str(p)] + args) == 1
    err = capsys.readouterr().err
    assert "refus" in err and str(p) in err and "Q2_0" in err
    assert sha(p) == before
    assert sorted(f.name for f in tmp_path.iterdir()) == ["q2.gguf"]


def test_mixed_file_is_refused(tmp_path):
    p = tmp_path / "mixed.gguf"
    write_gguf(p, KV, [stq_tensor("a", (256, 2), 1), q2_tensor("b", (512, 2), 2)])
    before = sha(p)
    assert retag.main([str(p), "--write"]) == 1
    assert sha(p) == before


def test_ambiguous_alignment_is_refused(tmp_path):
    # with a 256-byte alignment a 256-element tensor has room for both layouts
    p = tmp_path / "amb.gguf"
    write_gguf(p, KV, [stq_tensor("a", (256, 1), 1), f32_tensor("z", (64,), 2)], alignment=256)
    before = sha(p)
    plan = retag.scan(p)
    assert [c.verdict for c in plan.candidates] == ["ambiguous"]
    assert retag.main([str(p), "--write"]) == 1
    assert sha(p) == before


def test_file_without_type_42(tmp_path, capsys):
    p = tmp_path / "plain.gguf"
    write_gguf(p, KV, [f32_tensor("a", (256, 2), 1)])
    before = sha(p)
    assert retag.main([str(p), "--write"]) == 0
    assert "nothing to do" in capsys.readouterr().err
    assert sha(p) == before


@pytest.mark.parametrize("cut", ["data", "last_tensor", "tensor_info", "kv", "magic"])
def test_truncated_file_gives_clear_error(tmp_path, capsys, cut):
    p = tmp_path / "private.gguf"
    private_file(p)
    lay = read_layout(p)
    size = p.stat().st_size
    last = max(lay.tensors, key=lambda t: t.offset)
    n = {
        "data": lay.data_start + lay.tensors[1].offset + 10,  # inside the first STQ tensor
        "last_tensor": size - 50,
        "tensor_info": lay.tensors[2].info_offset + 5,
        "kv": 40,
        "magic": 2,
    }[cut]
    data = p.read_bytes()[:n]
    t = tmp_path / "trunc.gguf"
    t.write_bytes(data)
    assert retag.main([str(t), "--write"]) == 2
    err = capsys.readouterr().err
    assert str(t) in err
    assert "truncated" in err or "not a GGUF" in err
    if cut in ("data", "last_tensor"):
        assert (lay.tensors[1].name if cut == "data" else last.name) in err
    if cut == "tensor_info":
        assert "at byte" in err and "tensor" in err
    assert t.read_bytes() == data
    assert not (tmp_path / "trunc.gguf.bak").exists()


def test_corrupt_header_errors(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", 1 << 40))
    with pytest.raises(GGUFFormatError, match="x.gguf.*name of tensor #0.*at byte 24"):
        retag.scan(p)
    p.write_bytes(b"GGML" + b"\0" * 20)
    assert retag.main([str(p)]) == 2
    p.write_bytes(b"GGUF" + struct.pack("<I", 1) + b"\0" * 16)
    with pytest.raises(GGUFFormatError, match="version 1"):
        retag.scan(p)
    assert retag.main([str(tmp_path / "missing.gguf")]) == 2


def test_type_42_of_wrong_size_is_an_error(tmp_path):
    p = tmp_path / "odd.gguf"
    write_gguf(p, KV, [RawTensor("w", (256, 2), 42, b"\1" * 50), f32_tensor("z", (8,), 1)])
    with pytest.raises(GGUFFormatError, match="'w'.*fits neither"):
        retag.scan(p)


def test_json_and_help(tmp_path, capsys):
    p = tmp_path / "private.gguf"
    private_file(p)
    assert retag.main([str(p), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["refused"] is None and len(rep["tensors"]) == 3
    assert all(t["verdict"] == "stq1_0" for t in rep["tensors"])
    with pytest.raises(SystemExit) as e:
        retag.main(["--help"])
    assert e.value.code == 0
    h = capsys.readouterr().out
    for flag in ("--write", "--output", "--force", "--backup", "--no-backup", "--backup-path", "--json"):
        assert flag in h


def test_retagged_file_loads_with_patched_build(tmp_path, stq_cpu_build, stq_lib):
    """A retagged file is accepted by the patched ggml's gguf loader (ctypes) and by the patched
    gguf-py reader, and its tensor data dequantizes to what the numpy reference says; the
    private-42 original is refused by the loader (its offsets do not fit Q2_0 sizes)."""
    p = tmp_path / "private.gguf"
    tensors = private_file(p)
    out = tmp_path / "fixed.gguf"
    assert retag.main([str(p), "--write", "-o", str(out)]) == 0

    from harness import ggml
    with pytest.raises(ggml.GGMLError, match="refused"):
        stq_lib.gguf_load(p)
    loaded = stq_lib.gguf_load(out)
    for src in tensors:
        t = loaded[src.name]
        assert t["type"] == (43 if src.type_id == 42 else src.type_id)
        assert t["data"] == src.data
        if src.type_id == 42:
            np.testing.assert_array_equal(stq_lib.dequantize(43, t["data"]), stq1_0.decode(src.data))

    code = f"""
import numpy as np, gguf
from harness import stq1_0
r = gguf.GGUFReader({str(out)!r})
for t in r.tensors:
    if int(t.tensor_type) == 43:
        y = gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1)
        assert np.array_equal(y, stq1_0.decode(np.asarray(t.data).tobytes())), t.name
        print("ok", t.name, y.size)
"""
    got = stq_helpers.run_patched_gguf_py(stq_cpu_build, code)
    assert sorted(l.split()[1] for l in got.splitlines()) == sorted(s.name for s in tensors if s.type_id == 42)


def test_layout_reader_matches_ggml_on_real_model(gemma_model, stq_lib):
    """The own GGUF parser agrees with the build's C loader on a real model (no type 42 in it:
    the retag tool has nothing to do and leaves it alone)."""
    lay = read_layout(gemma_model)
    info = stq_lib.gguf_info(gemma_model)
    assert lay.data_start == info["data_offset"] and lay.alignment == info["alignment"]
    assert [(t.name, t.type_id, t.offset) for t in lay.tensors] == [ti[:3] for ti in info["tensors"]]
    avail = lay.extents()
    for name, _, _, size in info["tensors"]:
        assert size <= avail[name] < size + lay.alignment
    assert lay.kv["general.architecture"] == "gemma3"
    assert len(lay.kv["tokenizer.ggml.tokens"]) == 262144
    assert retag.scan(gemma_model).candidates == []
