"""`stq-metal bench mtp` and synth_gpu's --set-noise, without a GPU: the in-place noise rescale on a small GGUF, and
the bench's rounds (alternating order), medians, paired ratios and lossless check on a fake server."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from harness import bench_mtp, config


def _synth_gpu():
    s = importlib.util.spec_from_file_location("synth_gpu_t", config.MEGAKERNEL_DIR / "synth_gpu.py")
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    return mod


def _write(path: Path, noise: float | None, norms: dict[str, np.ndarray], others: dict[str, np.ndarray]) -> None:
    import gguf
    w = gguf.GGUFWriter(str(path), "gemma4")
    if noise is not None:
        w.add_float32("stq_metal.synth.noise", noise)
    for k, v in {**norms, **others}.items():
        w.add_tensor(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _read(path: Path) -> tuple[float | None, dict[str, np.ndarray]]:
    import gguf
    r = gguf.GGUFReader(str(path))
    f = r.fields.get("stq_metal.synth.noise")
    return (float(f.parts[f.data[0]][0]) if f else None), {t.name: np.array(t.data) for t in r.tensors}


def test_set_noise_rescales_only_the_post_norms(tmp_path):
    sg = _synth_gpu()
    rng = np.random.default_rng(3)
    norms = {f"blk.{i}.{n}.weight": (1.5 * (0.5 + rng.random(96))).astype(np.float32)
             for i in (0, 1, 13) for n in sg.NOISE_NORMS}
    others = {"blk.0.attn_norm.weight": rng.random(96).astype(np.float32),
              "blk.0.ffn_norm.weight": rng.random(96).astype(np.float32),
              "post_norm.weight": rng.random(96).astype(np.float32),   # not a layer's: left alone
              "token_embd.weight": rng.standard_normal((7, 96)).astype(np.float32)}
    p = tmp_path / "t.gguf"
    _write(p, 1.5, norms, others)
    assert sg.set_noise(p, 6.0) == 1.5
    noise, got = _read(p)
    assert noise == 6.0
    for k, v in norms.items():
        np.testing.assert_allclose(got[k], v * 4.0, rtol=1e-6)
    for k, v in others.items():
        assert np.array_equal(got[k], v), k
    assert sg.set_noise(p, None) == 6.0   # (reads only)
    sg.set_noise(p, 1.5)   # and back
    noise, got = _read(p)
    assert noise == 1.5
    for k, v in norms.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-6)


def test_set_noise_refuses_a_file_without_the_key_and_leaves_it(tmp_path):
    sg = _synth_gpu()
    p = tmp_path / "plain.gguf"
    _write(p, None, {"blk.0.post_norm.weight": np.ones(32, np.float32)}, {})
    before = p.read_bytes()
    with pytest.raises(SystemExit, match="stq_metal.synth.noise"):
        sg.set_noise(p, 2.0)
    assert p.read_bytes() == before
    bad = tmp_path / "not.gguf"
    bad.write_bytes(b"not a gguf file at all" * 4)
    with pytest.raises(SystemExit, match="not.gguf"):
        sg.set_noise(bad, 2.0)
    assert bad.read_bytes() == b"not a gguf file at all" * 4


class _FakeServers:
    """measure() stand-in: tok/s per configuration, greedy ids, a speculative configuration's ids possibly wrong."""

    def __init__(self, tok_s: dict[str, list[float]], wrong: str = ""):
        self.tok_s = {k: list(v) for k, v in tok_s.items()}
        self.wrong = wrong
        self.order: list[str] = []

    def measure(self, info, prompts, n_predict):
        name = info["name"]
        self.order.append(name)
        ids = [[1, 2, 3, 4]] * len(prompts)
        if name == self.wrong:
            ids = [[1, 2, 9, 4]] * len(prompts)
        return {"ids": ids, "tok_s": self.tok_s[name].pop(0), "draft_n": 10 if "mtp" in name else 0,
                "draft_accepted": 6 if "mtp" in name else 0, "mk_on": name.endswith("-mk"), "fused": True, "fallback": 0,
                "lines": [], "prof": ""}


def _args(rounds):
    class A:
        pass
    a = A()
    a.rounds, a.n_predict, a.serial = rounds, 16, False
    return a


@pytest.mark.parametrize("wrong", ["", "mtp-k2-mk", "mtp-k2-graph"])
def test_bench_rounds_alternate_and_ratios_are_paired_medians(monkeypatch, wrong):
    cfgs = bench_mtp.configs(Path("a.gguf"), [2], graph=True)
    assert [c.name for c in cfgs] == ["greedy-mk", "mtp-k2-mk", "greedy-graph", "mtp-k2-graph"]
    assert [c.greedy for c in cfgs] == ["", "greedy-mk", "", "greedy-graph"]
    assert "--spec-draft-n-max" in cfgs[1].args and cfgs[1].args[cfgs[1].args.index("--spec-draft-n-max") + 1] == "2"
    assert cfgs[2].env == {"LLAMA_MEGAKERNEL": "0"} and cfgs[0].env == {"LLAMA_MEGAKERNEL": "1"}
    prof = bench_mtp.configs(Path("a.gguf"), [2], graph=True, mk_profile=True)
    assert [c.env.get("LLAMA_MEGAKERNEL_PROFILE") for c in prof] == ["1", "1", None, None]
    assert not any("LLAMA_MEGAKERNEL_TIMELINE" in c.env for c in prof)
    tl = bench_mtp.configs(Path("a.gguf"), [2], graph=True, mk_timeline=True)
    assert [c.env.get("LLAMA_MEGAKERNEL_TIMELINE") for c in tl] == ["1", "1", None, None]
    assert not any("LLAMA_MEGAKERNEL_PROFILE" in c.env for c in tl)
    fake = _FakeServers({"greedy-mk": [100, 110, 90], "mtp-k2-mk": [150, 154, 171],
                         "greedy-graph": [50, 50, 50], "mtp-k2-graph": [60, 66, 45]}, wrong)
    monkeypatch.setattr(bench_mtp, "measure", fake.measure)
    res = {c.name: bench_mtp.Result() for c in cfgs}
    fails = bench_mtp.rounds(_args(3), cfgs, {c.name: {"name": c.name} for c in cfgs}, ["p"], res)
    rows, fails = bench_mtp.summarize(cfgs, res, fails)
    names = [c.name for c in cfgs]
    assert fake.order == names + names[::-1] + names          # AB.., ..BA, AB..
    assert rows["mtp-k2-mk"]["tok_s"] == 154                  # median of 150, 154, 171
    # paired ratios per round 1.5, 1.4, 1.9 -> 1.5 (not 154/100)
    assert rows["mtp-k2-mk"]["vs_greedy-mk"] == pytest.approx(1.5)
    assert rows["mtp-k2-mk"]["vs_greedy-graph"] == pytest.approx(3.08)
    assert rows["mtp-k2-graph"]["accepted_per_draft"] == pytest.approx(0.6)
    assert rows["greedy-mk"]["accepted_per_draft"] is None
    assert rows["mtp-k2-mk"]["ids_equal_greedy"] is (wrong != "mtp-k2-mk")
    assert rows["mtp-k2-graph"]["ids_equal_greedy"] is (wrong != "mtp-k2-graph")
    if wrong:
        assert rows[wrong]["first_diff"] == [2]
    # only the megakernel's speculation is judged lossless; upstream's graph is reported
    assert fails == (1 if wrong == "mtp-k2-mk" else 0)
    assert all(r["ids_stable_over_rounds"] for r in rows.values())


def test_bench_judges_ids_that_change_between_rounds(monkeypatch):
    cfgs = bench_mtp.configs(Path("a.gguf"), [3], graph=False)
    fake = _FakeServers({"greedy-mk": [100, 100], "mtp-k3-mk": [150, 150]})
    calls = {"n": 0}
    real = fake.measure

    def flaky(info, prompts, n_predict):
        r = real(info, prompts, n_predict)
        if info["name"] == "mtp-k3-mk":
            calls["n"] += 1
            if calls["n"] == 2:
                r["ids"] = [[1, 2, 3, 5]]
        return r
    monkeypatch.setattr(bench_mtp, "measure", flaky)
    res = {c.name: bench_mtp.Result() for c in cfgs}
    fails = bench_mtp.rounds(_args(2), cfgs, {c.name: {"name": c.name} for c in cfgs}, ["p"], res)
    rows, fails = bench_mtp.summarize(cfgs, res, fails)
    assert rows["mtp-k3-mk"]["ids_stable_over_rounds"] is False
    assert rows["mtp-k3-mk"]["ids_equal_greedy"] is True   # (its first round's)
    assert fails == 1


def test_bench_mtp_help_and_argument_errors(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        bench_mtp.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--accept", "--noise-grid", "--noise", "--no-graph", "--rounds", "--k"):
        assert flag in out
    with pytest.raises(SystemExit) as e:
        bench_mtp.main(["--bin", str(tmp_path), "--target", "t", "--assistant", "a", "--accept", "0.5"])
    assert e.value.code == 2
    assert "--noise-grid" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        bench_mtp.main(["--bin", str(tmp_path), "--target", "t", "--assistant", "a"])
    assert "no such file" in capsys.readouterr().err


def test_bench_gives_the_target_its_noise_back(monkeypatch, tmp_path):
    """--noise rescales the (synthetic) target in place; after the bench, even a failing one, it has its first noise."""
    calls = []

    def fake_set_noise(path, y):
        calls.append(y)
        return 1.0
    monkeypatch.setattr(bench_mtp, "load_set_noise", lambda: fake_set_noise)

    def boom(a, levels, prompts, results, set_noise):
        set_noise(a.target, levels[0])
        raise RuntimeError("a server failed")
    monkeypatch.setattr(bench_mtp, "run_levels", boom)
    for name in ("llama-server", "t.gguf", "a.gguf"):
        (tmp_path / name).write_bytes(b"x")
    with pytest.raises(RuntimeError):
        bench_mtp.main(["--bin", str(tmp_path), "--target", str(tmp_path / "t.gguf"), "--assistant",
                        str(tmp_path / "a.gguf"), "--noise", "40,48"])
    assert calls == [None, 40.0, 1.0]


def test_last_line_takes_the_last_marked_line_from_its_marker():
    log = ("srv  x: llama_mk timeline: 256 calls; step 1: 128 x 4300.0 us\n"
           "other line\n"
           "0.12.003 I llama_mk timeline: 512 calls; step 1: 256 x 4310.5 us\n")
    assert bench_mtp.last_line(log, bench_mtp.TL_LINE) == "llama_mk timeline: 512 calls; step 1: 256 x 4310.5 us"
    assert bench_mtp.last_line(log, "llama_mk profile:") == ""
