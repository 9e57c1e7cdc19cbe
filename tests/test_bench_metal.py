"""Argument handling of the Metal A/B benchmark (harness/bench_metal.py); runs on any OS.

The benchmark itself needs a Mac (Apple GPU + pyobjc-framework-Metal); here only its pure parts are
exercised: kernel specs, shapes, the balanced order schedule, the ratio summary, struct and constant
lookup in a real ggml-metal-impl.h, source assembly, and a clean refusal without Metal.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest

from harness import bench_metal as bm
from harness import config

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def tree(cpu_build, llama_tree) -> Path:
    """The applied llama.cpp tree (the CPU build the rest of the suite needs anyway makes it)."""
    if not (llama_tree / "ggml" / "src" / "ggml-metal" / "ggml-metal-impl.h").is_file():
        pytest.fail(f"{llama_tree}: applied tree without ggml/src/ggml-metal/ggml-metal-impl.h")
    return llama_tree


def test_help_runs_as_script_and_module():
    for cmd in ([sys.executable, str(REPO / "harness" / "bench_metal.py"), "--help"],
                [sys.executable, "-m", "harness.bench_metal", "--help"]):
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "--candidate" in r.stdout and "--thrash-mb" in r.stdout and "routed" in r.stdout


def test_import_does_not_need_metal():
    assert "Metal" not in sys.modules or sys.platform == "darwin"


@pytest.mark.parametrize("text, tree, name, nsg, ext, r1", [
    ("kernel_mul_mv_stq1_0_f32", "default", "kernel_mul_mv_stq1_0_f32", None, False, 1),
    ("kernel_mul_mv_stq1_0_f32_r0_4:nsg=4", "default", "kernel_mul_mv_stq1_0_f32_r0_4", 4, False, 1),
    ("old=kernel_mul_mv_ext_stq1_0_f32_r1_5:nsg=2", "old", "kernel_mul_mv_ext_stq1_0_f32_r1_5", 2, True, 5),
    ("kernel_mul_mv_q1_0_f32", "default", "kernel_mul_mv_q1_0_f32", None, False, 1),
])
def test_kernel_spec_ok(text, tree, name, nsg, ext, r1):
    s = bm.parse_kernel_spec(text)
    assert (s.tree, s.name, s.nsg, s.ext, s.r1ptg) == (tree, name, nsg, ext, r1)


@pytest.mark.parametrize("text, why", [
    ("kernel_mul_mm_stq1_0_f32", "not a mat-vec kernel"),
    ("kernel_mul_mv_ext_stq1_0_f32", "ext kernels end in _r1_"),
    ("kernel_mul_mv_stq1_0_f32_r1_2", "decode kernels do not"),
    ("kernel_mul_mv_ext_stq1_0_f32_r1_6", "not a mat-vec kernel"),
    ("kernel_mul_mv_q8_0_f32", "weight type"),
    ("kernel_mul_mv_ext_q4_0_f32_r1_2", "share the decode dispatch"),
    ("kernel_mul_mv_stq1_0_f32:nsg=3", "power of two"),
    ("kernel_mul_mv_stq1_0_f32:nr0=4", "nsg=N"),
    ("bad tree=kernel_mul_mv_stq1_0_f32", "bad tree name"),
])
def test_kernel_spec_rejected(text, why):
    with pytest.raises(ValueError, match=why):
        bm.parse_kernel_spec(text)


def test_shapes():
    assert bm.parse_shape("square") == (16384, 16384, 1)
    assert bm.parse_shape("routed") == (6144, 2048, 8)
    assert bm.parse_shape("512x100x3") == (512, 100, 3)
    for bad in ("100x100", "0x5", "256x0", "big", "256x4x0"):
        with pytest.raises(ValueError):
            bm.parse_shape(bad)


@pytest.mark.parametrize("pairs", [2, 6, 20])
def test_balanced_orders(pairs):
    o = bm.balanced_orders(pairs, seed=3)
    assert len(o) == pairs and o.count("AB") == o.count("BA") == pairs // 2
    assert o == bm.balanced_orders(pairs, seed=3)  # deterministic
    assert set(o) == {"AB", "BA"}


@pytest.mark.parametrize("pairs", [0, 1, 3])
def test_balanced_orders_rejects_odd(pairs):
    with pytest.raises(ValueError, match="even"):
        bm.balanced_orders(pairs, seed=0)


def test_summarize():
    orders = ["AB", "BA", "AB", "BA"]
    s = bm.summarize([1.0, 2.0, 1.0, 1.0], [2.0, 2.0, 4.0, 2.0], orders, nbytes=10**9)
    assert s["ratio_median"] == pytest.approx(0.5)
    assert s["ratio_median_ab"] == pytest.approx(0.375) and s["ratio_median_ba"] == pytest.approx(0.75)
    assert s["candidate_wins"] == 3 and s["pairs"] == 4 and s["order_consistent"]
    assert s["gbps_candidate"] == pytest.approx(1.0) and s["gbps_baseline"] == pytest.approx(0.5)
    # a direction that flips with the order is flagged
    s = bm.summarize([1.0, 3.0], [2.0, 2.0], ["AB", "BA"], nbytes=1)
    assert not s["order_consistent"]
    with pytest.raises(ValueError):
        bm.summarize([1.0], [1.0, 2.0], ["AB"], nbytes=1)


def test_parse_args_defaults_and_errors(tmp_path, capsys):
    a = bm.parse_args([])
    assert a.shape == (6144, 2048, 8) and a.pairs == 20 and a.batch == 1 and a.thrash_mb == 0
    assert a.candidate.name == a.baseline.name == "kernel_mul_mv_stq1_0_f32"
    assert a.trees["default"] == config.default_tree()
    a = bm.parse_args(["--tree", f"old={tmp_path}", "--baseline", "old=kernel_mul_mv_stq1_0_f32",
                       "--shape", "square", "--thrash-mb", "256", "--pairs", "8"])
    assert a.trees["old"] == tmp_path and a.baseline.tree == "old" and a.thrash_mb == 256
    a = bm.parse_args(["--batch", "4", "--candidate", "kernel_mul_mv_ext_stq1_0_f32_r1_4",
                       "--baseline", "kernel_mul_mv_ext_stq1_0_f32_r1_2"])
    assert a.batch == 4
    bad = [
        ["--pairs", "3"],
        ["--pairs", "0"],
        ["--inner", "0"],
        ["--batch", "9"],
        ["--batch", "2"],                                                  # decode specs at batch 2
        ["--candidate", "kernel_mul_mv_ext_stq1_0_f32_r1_2"],              # ext spec at batch 1
        ["--batch", "2", "--candidate", "kernel_mul_mv_ext_stq1_0_f32_r1_4",
         "--baseline", "kernel_mul_mv_ext_stq1_0_f32_r1_2"],               # 4 columns per tg > batch
        ["--baseline", "old=kernel_mul_mv_stq1_0_f32"],                    # tree not given
        ["--tree", "nodir"],
        ["--shape", "7x7"],
        ["--candidate", "kernel_mul_mv_f16_f32"],
    ]
    for argv in bad:
        with pytest.raises(SystemExit) as e:
            bm.parse_args(argv)
        assert e.value.code == 2, argv
    assert "error" in capsys.readouterr().err


def test_main_refuses_cleanly_without_metal(tree, tmp_path, capsys):
    if sys.platform == "darwin":
        pytest.skip("on macOS main() would run the benchmark")
    rc = bm.main(["--tree", f"default={tree}", "--pairs", "2"])
    assert rc == 2
    assert "pyobjc-framework-Metal" in capsys.readouterr().err
    rc = bm.main(["--tree", f"default={tmp_path}"])
    assert rc == 2
    assert "not a llama.cpp tree" in capsys.readouterr().err


def test_structs_and_constants_from_a_real_tree(tree):
    impl = (tree / "ggml" / "src" / "ggml-metal" / "ggml-metal-impl.h").read_text()
    K = bm.kargs_struct(impl, bm.KARGS_MUL_MV)
    names = [f for f, _ in K._fields_]
    assert names[:4] == ["ne00", "ne01", "ne02", "nb00"] and "nr0" in names
    assert ctypes.sizeof(K) % 8 == 0 and K.nb00.offset == 16  # int32 x3, padded before uint64
    E = bm.kargs_struct(impl, bm.KARGS_MUL_MV_EXT)
    assert "nr0" not in [f for f, _ in E._fields_]
    assert bm.impl_define(impl, "FC_MUL_MV") > 0
    assert bm.rows_per_simdgroup(bm.parse_kernel_spec("kernel_mul_mv_q4_0_f32"), impl) == bm.impl_define(impl, "N_R0_Q4_0")
    assert bm.rows_per_simdgroup(bm.parse_kernel_spec("kernel_mul_mv_stq1_0_f32_r0_4"), impl) == 4
    if "N_R0_STQ1_0" in impl:
        assert bm.rows_per_simdgroup(bm.parse_kernel_spec("kernel_mul_mv_stq1_0_f32"), impl) == bm.impl_define(impl, "N_R0_STQ1_0")
        assert bm.rows_per_simdgroup(bm.parse_kernel_spec("kernel_mul_mv_ext_stq1_0_f32_r1_3"), impl) == bm.impl_define(impl, "N_R0_STQ1_0_EXT")
    with pytest.raises(bm.HarnessError, match="not found"):
        bm.kargs_struct(impl, "no_such_struct")


def test_assemble_source_like_the_embed_step(tree):
    src = bm.assemble_source(tree)
    assert "__embed_ggml-common.h__" not in src and '#include "ggml-metal-impl.h"' not in src
    assert '#include "common.h"' not in src and "#pragma once" not in src
    assert "typedef struct" in src and "kernel_mul_mv_q4_0_f32" in src
    with pytest.raises(bm.HarnessError, match="no such kernel source"):
        bm.assemble_source(tree, "no_such_kind")


def test_random_weights_have_finite_scales():
    import numpy as np
    rng = np.random.default_rng(0)
    for t, (qk, bs, doff) in bm.WEIGHT_TYPES.items():
        w = bm.random_weights(t, 512, 3, rng)
        assert w.nbytes == 3 * 512 // qk * bs
        d = w.reshape(-1, bs)[:, doff:doff + 2].copy().view(np.float16).astype(np.float32)
        assert np.isfinite(d).all() and (d > 0).all()
