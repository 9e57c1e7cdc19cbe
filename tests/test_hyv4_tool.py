"""The hyv4 -> hy_v4 metadata rewrite (harness/hyv4.py), on small synthetic GGUF files (no build).

The expected result is the generator's own hy_v4 dialect (synth_hy4.arch_kv), written
independently of the tool's mapping: a rewritten hyv4 file must carry exactly those keys, the same
tensor table and the same data bytes. A 78-layer file (the real block count: its integer indexer
schedule shrinks to bools) is rewritten in place; a 4-layer one grows and needs --output.
"""

from __future__ import annotations

import numpy as np
import pytest

from harness import hyv4, synth_hy4
from harness.gguf_layout import RawTensor, read_layout, write_gguf

ALIGN = 32


def _params(n_layer: int) -> synth_hy4.Hy4Params:
    return synth_hy4.Hy4Params(n_layer=n_layer, indexer_full="F" + "SF" * (n_layer // 2) + "S" * n_layer)


def _tensors(seed: int = 7) -> list[RawTensor]:
    rng = np.random.default_rng(seed)
    out = []
    for name, dims in [("token_embd.weight", (64, 32)), ("output_hc_fn.weight", (256, 4)),
                       ("blk.0.attn_sinks.weight", (4,)), ("blk.1.ffn_gate_exps.weight", (64, 16, 8))]:
        n = int(np.prod(dims))
        out.append(RawTensor(name, dims, 0, rng.standard_normal(n, dtype=np.float32).tobytes()))
    return out


def _write(path, n_layer: int, dialect: str = "hyv4", edit=None):
    p = _params(n_layer)
    p = synth_hy4.Hy4Params(**{**p.__dict__, "indexer_full": p.indexer_full[:n_layer]})
    kv, types = synth_hy4.arch_kv(p, dialect)
    kv = {**kv, "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<pad>", "a", "b"]}
    if edit:
        edit(kv, types)
    write_gguf(path, kv, _tensors(), alignment=ALIGN, kv_types={k: t for k, t in types.items() if k in kv})
    return p


def _data(path) -> bytes:
    lay = read_layout(path)
    with open(path, "rb") as f:
        f.seek(lay.data_start)
        return f.read()


def _expect_hy_v4(path, p: synth_hy4.Hy4Params) -> None:
    got = read_layout(path).kv
    want, _ = synth_hy4.arch_kv(p, "hy_v4")
    for k, v in want.items():
        assert k in got, f"{k} missing after the rewrite"
        if isinstance(v, np.ndarray):
            assert got[k].dtype == v.dtype and np.array_equal(got[k], v), k
        elif isinstance(v, float):
            assert got[k] == pytest.approx(v, rel=1e-6), k
        else:
            assert got[k] == v, k
    assert not [k for k in got if k.startswith("hyv4.")]


def test_in_place_rewrite_backup_and_restore(tmp_path, capsys):
    f = tmp_path / "m.gguf"
    p = _write(f, 78)
    orig = f.read_bytes()
    assert hyv4.main([str(f)]) == 0                       # dry run
    assert f.read_bytes() == orig
    assert "is_full" in capsys.readouterr().out
    assert hyv4.main([str(f), "--write"]) == 0
    assert len(f.read_bytes()) == len(orig)               # header kept the same length
    assert _data(f) == orig[read_layout(f).data_start:]   # the data section did not move
    _expect_hy_v4(f, p)
    bak = hyv4.backup_path_for(f)
    assert orig.startswith(bak.read_bytes())
    # a second rewrite: already hy_v4, nothing to do; the backup is never overwritten
    assert hyv4.main([str(f), "--write"]) == 0
    assert orig.startswith(bak.read_bytes())
    assert hyv4.main([str(f), "--restore"]) == 0
    assert f.read_bytes() == orig


def test_growing_header_needs_output(tmp_path, capsys):
    f = tmp_path / "m.gguf"
    p = _write(f, 4)
    orig = f.read_bytes()
    pl = hyv4.plan(f)
    assert not pl.in_place
    assert hyv4.main([str(f), "--write"]) == 2
    assert "--output" in capsys.readouterr().err
    assert f.read_bytes() == orig
    out = tmp_path / "out.gguf"
    assert hyv4.main([str(f), "--write", "-o", str(out)]) == 0
    assert f.read_bytes() == orig
    _expect_hy_v4(out, p)
    assert _data(out) == _data(f)
    assert [(t.name, t.dims, t.type_id, t.offset) for t in read_layout(out).tensors] == \
           [(t.name, t.dims, t.type_id, t.offset) for t in read_layout(f).tensors]
    assert hyv4.main([str(f), "--write", "-o", str(out)]) == 2    # exists: never replaced without --force


def _refused(tmp_path, capsys, edit, *needles):
    f = tmp_path / "m.gguf"
    _write(f, 78, edit=edit)
    orig = f.read_bytes()
    assert hyv4.main([str(f), "--write"]) == 1
    err = capsys.readouterr().err
    assert str(f) in err
    for n in needles:
        assert n in err
    assert f.read_bytes() == orig
    assert not hyv4.backup_path_for(f).exists()


def test_unknown_key_refused(tmp_path, capsys):
    _refused(tmp_path, capsys, lambda kv, t: kv.__setitem__("hyv4.attention.new_thing", 3), "hyv4.attention.new_thing")


def test_missing_key_refused(tmp_path, capsys):
    _refused(tmp_path, capsys, lambda kv, t: kv.pop("hyv4.hyper_connection.count"), "hyv4.hyper_connection.count")


def test_missing_indexer_schedule_refused(tmp_path, capsys):
    _refused(tmp_path, capsys, lambda kv, t: kv.pop("hyv4.attention.indexer.is_full"), "hyv4.attention.indexer.is_full")


def test_bad_indexer_flags_refused(tmp_path, capsys):
    def edit(kv, t):
        a = kv["hyv4.attention.indexer.is_full"].copy()
        a[3] = 2
        kv["hyv4.attention.indexer.is_full"] = a
    _refused(tmp_path, capsys, edit, "hyv4.attention.indexer.is_full", "0 and 1")


def test_wrong_length_indexer_schedule_refused(tmp_path, capsys):
    def edit(kv, t):
        kv["hyv4.attention.indexer.is_full"] = kv["hyv4.attention.indexer.is_full"][:10]
    _refused(tmp_path, capsys, edit, "10 entries", "78")


def test_other_architecture_refused(tmp_path, capsys):
    f = tmp_path / "m.gguf"
    write_gguf(f, {"general.architecture": "llama", "llama.block_count": 1}, _tensors())
    orig = f.read_bytes()
    assert hyv4.main([str(f), "--write"]) == 1
    assert "'llama'" in capsys.readouterr().err
    assert f.read_bytes() == orig


def test_already_hy_v4_is_a_no_op(tmp_path, capsys):
    f = tmp_path / "m.gguf"
    _write(f, 4, dialect="hy_v4")
    orig = f.read_bytes()
    assert hyv4.main([str(f), "--write"]) == 0
    assert "already hy_v4" in capsys.readouterr().err
    assert f.read_bytes() == orig


def test_truncated_file_is_an_error(tmp_path, capsys):
    f = tmp_path / "m.gguf"
    _write(f, 78)
    f.write_bytes(f.read_bytes()[:200])
    assert hyv4.main([str(f), "--write"]) == 2
    assert "truncated" in capsys.readouterr().err


def test_later_split_part_is_left_alone(tmp_path, capsys):
    # gguf-split writes the model metadata into the first part only; later parts carry split.* keys
    f = tmp_path / "m-00002-of-00003.gguf"
    write_gguf(f, {"split.no": 1, "split.count": 3, "split.tensors.count": 4}, _tensors())
    orig = f.read_bytes()
    assert hyv4.main([str(f), "--write"]) == 0
    assert "split part 2" in capsys.readouterr().err
    assert f.read_bytes() == orig
