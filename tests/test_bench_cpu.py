"""harness/bench_cpu.py: argument checks and one tiny real run (numbers are never asserted on)."""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import pytest

from harness import bench_cpu

REPO = Path(__file__).resolve().parent.parent


def test_parse_shape():
    assert bench_cpu.parse_shape("6144x2048") == (6144, 2048)
    assert bench_cpu.parse_shape("16384X16384") == (16384, 16384)
    for bad in ("6144x2000", "6144", "ax256", "0x256", "256x-256"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench_cpu.parse_shape(bad)


def test_help_and_bad_arguments():
    p = subprocess.run([sys.executable, str(REPO / "harness" / "bench_cpu.py"), "--help"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "--shapes" in p.stdout and "--threads" in p.stdout and "AB/BA" in p.stdout
    for args in (["--rounds", "1"], ["--types", "stq1_0"], ["--shapes", "100x100"]):
        p = subprocess.run([sys.executable, str(REPO / "harness" / "bench_cpu.py"), *args],
                           capture_output=True, text=True)
        assert p.returncode == 2, (args, p.stdout, p.stderr)


def test_tiny_run_reports_every_ratio(cpu_build, capsys):
    rc = bench_cpu.main(["--build", str(cpu_build), "--shapes", "512x512,64x1024", "--threads", "1",
                         "--rounds", "2", "--reps", "3"])
    assert rc == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| 512x512 ") or line.startswith("| 64x1024 ")]
    assert len(rows) == 2, out
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        # shape, threads, 4 times, 3 ratios
        assert len(cells) == 9, row
        for v in cells[2:]:
            x = float(v)
            assert math.isfinite(x) and x > 0, row


def test_unknown_type_is_a_clear_error(cpu_build):
    with pytest.raises(bench_cpu.HarnessError, match="unknown type 'nope'"):
        bench_cpu.main(["--build", str(cpu_build), "--shapes", "256x256", "--threads", "1",
                        "--rounds", "2", "--reps", "1", "--types", "stq1_0,nope"])


def test_buffers_both_reports_each_path(cpu_build, capsys):
    """--buffers both times every type as llama.cpp places it and in a plain buffer, and says where
    each went: on x86 with AVX2, STQ1_0 (rows a multiple of 16) goes to CPU_REPACK (patch 0042)."""
    import platform

    rc = bench_cpu.main(["--build", str(cpu_build), "--shapes", "64x512", "--threads", "1",
                         "--rounds", "2", "--reps", "2", "--types", "stq1_0,tq2_0", "--buffers", "both"])
    assert rc == 0
    out = capsys.readouterr().out
    line = next((l for l in out.splitlines() if l.startswith("buffers: ")), None)
    assert line, out
    paths = dict(item.split(" -> ") for item in line[len("buffers: "):].split(", "))
    assert set(paths) == {"stq1_0", "stq1_0:plain", "tq2_0", "tq2_0:plain"}, line
    assert paths["stq1_0:plain"] == paths["tq2_0:plain"] == paths["tq2_0"] == "CPU", line
    if platform.machine() in ("x86_64", "AMD64") and "avx2" in open("/proc/cpuinfo").read():
        assert paths["stq1_0"] == "CPU_REPACK", line
    row = next(l for l in out.splitlines() if l.startswith("| 64x512 "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 2 + 4 + 3, row  # shape, threads, 4 times, 3 ratios
