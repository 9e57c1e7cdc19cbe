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


# a greedy megakernel server's timeline, made up: 100 steady steps, a prompt's batch of 4 seen twice (left out), and one
# pair outside every part; the expected parts below are worked out by hand from these numbers
_TL_GREEDY = ("llama_mk timeline: 812 points; step.launch>1 .. step<1: 100 x 4000 us median, 4100.0 mean; "
              "decode<1 .. decode>1: 99 x 200 us median, 230.5 mean; decode>4 .. step>4: 2 x 40000 us median, 40000.0 mean; "
              "decode>1 .. step>1: 100 x 30 us median, 31.0 mean; step>1 .. step.rows>1: 100 x 20 us median, 20.0 mean; "
              "step.rows>1 .. step.launch>1: 100 x 25 us median, 25.0 mean; step<1 .. sampling>1: 100 x 3 us median, 3.0 mean; "
              "sampling>1 .. sampling<1: 100 x 70 us median, 300.0 mean; sampling<1 .. decode<1: 100 x 2 us median, 2.0 mean; "
              "step.launch>4 .. step<4: 2 x 6000 us median, 6000.0 mean; step<1 .. step.launch>1: 50 x 10 us median, 10.0 mean")


def test_step_split_parts_of_a_greedy_step():
    sp = bench_mtp.step_split(_TL_GREEDY)
    assert sp["steps"] == 100                               # the batch of 4's launches (2 < 10 % of 100) are not steps
    assert sp["us"]["launch"] == pytest.approx(4000.0)
    assert sp["us"]["set-up"] == pytest.approx(30 + 20 + 25)
    assert sp["us"]["after"] == pytest.approx(3 + 70 + 2)   # medians, not the means (the odd slow sampling graph)
    assert sp["us"]["server"] == pytest.approx(99*200/100)
    assert sp["us"]["draft"] == 0.0
    assert sp["other_us"] == pytest.approx(50*10/100)       # a pair of no part is still counted, apart
    assert sp["total_us"] == pytest.approx(4000 + 75 + 75 + 198 + 5)
    assert sp["launch_share"] == pytest.approx(4000/4353)
    line = bench_mtp.format_split(sp)
    assert "4000 launch + 75 set-up + 75 after + 198 server + 5 other = 4353 us" in line, line
    assert "(the launch 91.9 %" in line and "100 steady steps" in line, line


def test_step_split_of_a_speculative_step_counts_the_draft():
    tl = ("llama_mk timeline: 600 points; step.launch>3 .. step<3: 50 x 6000 us median, 6100.0 mean; "
          "decode<3 .. draft>2: 50 x 400 us median, 410.0 mean; draft>2 .. draft.launch>2: 50 x 20 us median, 20.0 mean; "
          "draft.launch>2 .. draft<2: 50 x 500 us median, 500.0 mean; draft<2 .. decode>3: 50 x 40 us median, 40.0 mean; "
          "decode>3 .. step>3: 50 x 30 us median, 30.0 mean; step>3 .. step.rows>3: 50 x 20 us median, 20.0 mean; "
          "step.rows>3 .. step.launch>3: 50 x 50 us median, 50.0 mean; step<3 .. decode<3: 50 x 10 us median, 10.0 mean")
    sp = bench_mtp.step_split(tl)
    assert sp["steps"] == 50
    assert sp["us"] == pytest.approx({"launch": 6000.0, "set-up": 100.0, "after": 10.0, "draft": 520.0, "server": 440.0})
    assert sp["total_us"] == pytest.approx(7070.0)


def test_step_split_without_a_launch_or_a_timeline():
    assert bench_mtp.step_split("") is None
    assert bench_mtp.step_split("llama_mk timeline: 3 points; decode<1 .. decode>1: 2 x 200 us median, 200.0 mean") is None


def test_step_split_of_real_server_timelines_adds_up_to_their_speed():
    # session 38 on an H100 (bench/megakernel-h200-2026-12-06/s38: E4B-shaped pair, greedy and mtp k = 1 through
    # llama-server, with and without backend sampling): the timeline's step, from the host clock, against the server's
    # own timings (tokens / predicted_ms): a greedy step is a token, an mtp k = 1 step two (every draft accepted there)
    import json
    d = config.REPO_ROOT / "bench" / "megakernel-h200-2026-12-06" / "s38"
    seen = 0
    for f in ("s38E-e2e-bs.json", "s38E-e2e-host.json", "s38D-e2e.json"):
        for name, row in json.loads((d / f).read_text())["levels"][0]["configs"].items():
            if not row["host_profile"]:
                continue
            sp = bench_mtp.step_split(row["host_profile"])
            tokens = 1 if name.startswith("greedy") else 1 + row["accepted_per_draft"]
            assert sp["total_us"]/tokens == pytest.approx(1e6/row["tok_s"], rel=0.06), (f, name, sp)
            assert 0.6 < sp["launch_share"] < 0.95, (f, name, sp)
            seen += 1
    assert seen == 6


def test_bench_mtp_greedy_alone_needs_no_assistant(monkeypatch, tmp_path, capsys):
    names = [c.name for c in bench_mtp.configs(None, [0], True)]
    assert names == ["greedy-mk", "greedy-graph"]
    (tmp_path / "llama-server").write_text("")
    (tmp_path / "t.gguf").write_text("")
    ran = []
    monkeypatch.setattr(bench_mtp, "run_levels", lambda a, levels, prompts, results, set_noise: ran.append(a.k) or 0)
    assert bench_mtp.main(["--bin", str(tmp_path), "--target", str(tmp_path / "t.gguf"), "--k", "0"]) == 0
    assert ran == [[0]]
    for bad, msg in ((["--k", "2"], "--assistant is needed"), (["--k", "0", "--accept", "0.5", "--noise-grid", "1,2"],
                                                               "needs a draft count"), (["--k", "9"], "0..8")):
        with pytest.raises(SystemExit):
            bench_mtp.main(["--bin", str(tmp_path), "--target", str(tmp_path / "t.gguf"), *bad])
        assert msg in capsys.readouterr().err, bad


def test_step_parts_name_the_points_the_timeline_marks():
    # bench_mtp's table of step parts holds the point names a second time: they must be the llama_mk_tl_mark literals
    # of llama-mk.cpp and the patches, all of them, and its pattern must read the line llama-mk.cpp's format makes
    import re
    src = [config.MEGAKERNEL_DIR / "llama-mk.cpp", config.MEGAKERNEL_DIR / "llama-mk.h", *sorted(config.PATCHES_DIR.glob("*.patch"))]
    text = "".join(p.read_text(errors="replace") for p in src)
    marked = set(re.findall(r'llama_mk_tl_mark\("([^"]+)"', text))
    named = {pt for src_pts, dst_pts in bench_mtp.STEP_PARTS.values() for pt in (*src_pts, *dst_pts)}
    assert marked and named == marked, (sorted(named - marked), sorted(marked - named))
    fmt = re.search(r'"(; %s: %lld x %d us median, %\.1f mean)"', (config.MEGAKERNEL_DIR / "llama-mk.cpp").read_text())
    assert fmt, "llama-mk.cpp's timeline format changed: harness/bench_mtp.py's _TL_PAIR reads it"
    line = "llama_mk timeline: 9 points" + fmt[1].replace("%lld", "%d") % ("step.launch>3 .. step<3", 12, 6500, 6512.25)
    sp = bench_mtp.step_split(line)
    assert sp is not None and sp["steps"] == 12 and sp["us"]["launch"] == 6500.0
