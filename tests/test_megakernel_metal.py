"""The Metal Gemma decode megakernel on metal-emu (issue 13, helper metal-mk).

ggml-metal/mk/mk-kernel.metal is translated by metal-emu's msl2cpp.py and run by emu-runtime.cpp as a
persistent dispatch (all threadgroups co-resident, per-threadgroup store buffers published only by
device-scope fences: ggml-metal/emu/PERSISTENT.md), driven by tests/mk_hostemu/mk_metal_emu.cpp on the
tiny random Gemma-4-shaped model of tests/mk_hostemu/mk_ref.h (the same model builder and float64
reference as the CUDA kernel's host emulation), with the weight types the Metal kernel decodes (F32,
F16, BF16, Q4_0, Q5_0, Q8_0, Q4_K, Q6_K, STQ1_0), both KV layouts, a shared-KV layer, proportional rope,
per-layer inputs. Checks: one-token steps vs the reference (NMSE), verify steps of M = 2..8 tokens bitwise
equal to the one-token steps, under several schedules and grid sizes; planted bugs must fail (grid barrier
removed, barrier without its fences, column arithmetic that depends on M, a decoding bug); an
unsupported weight type is refused naming the tensor; an ASan+UBSan build runs clean.
The decoding alone (megakernel/mk-deq32.h through ggml-metal/mk/mk-deq.h, every type) is also run in a plain kernel
(tests/mk_hostemu/mk_deq_metal.metal) against ggml's CPU dequantizers, with planted decoding bugs.
Subprocess timeouts only turn a hang into a failure; no test measures time.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from stq_helpers import source_tree

ROOT = Path(__file__).resolve().parents[1]
EMU = ROOT / "ggml-metal" / "emu"
MKM = ROOT / "ggml-metal" / "mk"
KERNEL = MKM / "mk-kernel.metal"
DEQ = ROOT / "megakernel" / "mk-deq32.h"   # the decoding, shared with the CUDA kernel (ggml-metal/mk/mk-deq.h: its Metal side)
DRIVER = ROOT / "tests" / "mk_hostemu" / "mk_metal_emu.cpp"
DEQ_KERNEL = ROOT / "tests" / "mk_hostemu" / "mk_deq_metal.metal"
DEQ_DRIVER = ROOT / "tests" / "mk_hostemu" / "mk_deq_metal_emu.cpp"
CXX = os.environ.get("STQ_CLANGXX", "clang++-19")
HANG = 600


def _build(tmp: Path, cpu_build: Path, kernel: Path = KERNEL, sanitize: bool = False, driver: Path = DRIVER,
           name: str = "mk_kernel", first_inc: Path | None = None) -> Path:
    """kernel (MSL) translated by msl2cpp.py (includes: first_inc, e.g. a mutated mk-deq32.h, then ggml-metal/mk,
    megakernel/, and ggml's src/ for ggml-common.h), built with the emulator runtime and the driver"""
    if shutil.which(CXX) is None:
        pytest.skip(f"{CXX} not found (metal-emu needs clang >= 19)")
    tmp.mkdir(parents=True, exist_ok=True)
    gen = tmp / f"{name}.cpp"
    src = source_tree(cpu_build)
    inc = ([first_inc] if first_inc else []) + [MKM, ROOT / "megakernel", src / "ggml" / "src"]
    subprocess.run(["python3", str(EMU / "msl2cpp.py"), "--source", str(kernel), "--kernel", name,
                    *[a for d in inc for a in ("-I", str(d))], "--out", str(gen)], check=True)
    lib = cpu_build / "bin"
    exe = tmp / (driver.stem + ("_asan" if sanitize else ""))
    cmd = [CXX, "-std=c++20", "-O1", "-g", "-march=native", "-fmax-type-align=8", f"-I{EMU}", f"-I{MKM}",
           f"-I{ROOT / 'megakernel'}", f"-I{DRIVER.parent}", f"-I{src}/ggml/include", str(gen), str(EMU / "emu-runtime.cpp"),
           str(driver), "-o", str(exe), f"-L{lib}", "-lggml-base", f"-Wl,-rpath,{lib}", "-lpthread"]
    if sanitize:
        cmd[1:1] = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"building the Metal megakernel emulation failed:\n{' '.join(cmd)}\n{r.stderr[-4000:]}"
    return exe


def _run(exe: Path, *args: str, **env) -> subprocess.CompletedProcess:
    e = dict(os.environ, ASAN_OPTIONS="detect_leaks=0", GGML_METAL_EMU_GPU_CORES="2")
    for k in ("GGML_METAL_EMU_RESIDENCY", "GGML_METAL_EMU_ORDER", "GGML_METAL_EMU_TG_SCHED", "GGML_METAL_EMU_WATCHDOG_S"):
        e.pop(k, None)
    e.update({f"GGML_METAL_EMU_{k}": str(v) for k, v in env.items()})
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=e, timeout=HANG)


@pytest.fixture(scope="module")
def driver(tmp_path_factory, cpu_build) -> Path:
    return _build(tmp_path_factory.mktemp("mk_metal_emu"), cpu_build)


def _assert_ok(r: subprocess.CompletedProcess, verify: list[int]):
    print(r.stdout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = re.search(r"^OK one-token steps 0\.\.17 .*worst NMSE vs float64 reference (\S+)", r.stdout, re.M)
    assert m and float(m.group(1)) < 1e-8, r.stdout
    m = re.search(r"^OK hidden rows .*worst NMSE vs float64 reference (\S+)", r.stdout, re.M)
    assert m and float(m.group(1)) < 1e-8, r.stdout
    for M in verify:
        assert f"OK verify M={M}: 0 of {M} rows differ" in r.stdout, r.stdout
        assert f"OK verify M={M}: 0 of {M} hidden rows differ" in r.stdout, r.stdout


@pytest.mark.parametrize("plan", ["gemma4", "gemma3"])
def test_metal_megakernel_matches_reference_and_verify_equals_decode(driver, plan):
    # gemma3: no per-layer inputs, Q scaled after rope, no V norm, V = K and a linear rope scale on the
    # global layer, output scale after the FFN (mk_ref.h)
    r = _run(driver, *(["--gemma3"] if plan == "gemma3" else []), "--tg", "3", "--verify", "2,4,8")
    _assert_ok(r, [2, 4, 8])


@pytest.mark.parametrize("sched,order,tg", [("greedy", "rev", 2), ("rr", "fwd", 5), ("random", "shuffle", 8)])
def test_metal_megakernel_schedules_and_grid_sizes(driver, sched, order, tg):
    # the grid comes from the device (8 co-resident on the 2-core emulated GPU); results may not depend on it.
    # (one case with every step over all cells; by default n_kv grows with the sequence as in llama.cpp)
    r = _run(driver, "--tg", str(tg), "--verify", "3,8", *(["--full-kv"] if tg == 5 else []), TG_SCHED=sched, ORDER=order)
    _assert_ok(r, [3, 8])


def test_metal_megakernel_grid_from_device_limits(driver):
    # the launch never exceeds what the device keeps co-resident (an oversubscribed persistent launch hangs
    # on a GPU): on a device with room for 2, a request for 8 runs 2 and stays exact
    r = _run(driver, "--tg", "8", "--verify", "4", RESIDENCY=2)
    assert "kernel_mk_decode (gemma4 plan): 2 threadgroups" in r.stdout, r.stdout
    _assert_ok(r, [4])


@pytest.mark.parametrize("bug", ["nobarrier", "nofence"])
def test_metal_megakernel_planted_barrier_bugs_fail(driver, bug):
    # the grid barrier removed, or its arrive/spin without the device-scope fences (the naive barrier
    # that fails on real Apple GPUs at 2 threadgroups): stale or unwritten scratch must show
    for tg in ("2", "4"):
        r = _run(driver, "--planted", bug, "--tg", tg, "--verify", "4")
        assert r.returncode != 0 and re.search(r"^FAIL step \d+", r.stdout, re.M), \
            f"planted {bug} with {tg} threadgroups went unnoticed:\n" + r.stdout[-3000:]


def test_metal_megakernel_refuses_unsupported_types(driver):
    r = _run(driver, "--unsupported")
    assert r.returncode == 0 and "OK unsupported type refused: layer 1 ffn_down: weight type q4_1" in r.stdout, r.stdout


@pytest.mark.parametrize("old,new,expect,args", [
    # column arithmetic that depends on M: the verify steps must no longer equal decode bit for bit
    ("                x[i] = (x[i] + (h[i]*r)*w[i])*rs;", "                x[i] = (x[i] + (h[i]*r)*w[i])*rs*(1.0f + 1e-7f*(c.M - 1));",
     r"^FAIL verify M=\d+: [1-9]", []),
    # a decoding bug (Q6_K quarter -> nibble; in mk-deq32.h)
    ("const int lsh = (qd >> 1)*4;", "const int lsh = (qd & 1)*4;", r"^FAIL step \d+", []),
    # rope pairs one register apart instead of n_rot/2
    ("const int tp   = half_rot/32;", "const int tp   = half_rot/32 > 1 ? half_rot/32 - 1 : 1;", r"^FAIL step \d+", []),
    # Gemma 3's Q scale forgotten
    ("src[c.lane + 32*t] = v[t]*L.q_scale;", "src[c.lane + 32*t] = v[t];", r"^FAIL step \d+", ["--gemma3"]),
    # attention chunks sized from the step's n_kv instead of fixed for the context: a verify step sees more
    # cells than the one-token steps of its tokens did, so its chunks (and bits) differ
    (["    const int CH    = P.att_chunk;", "const int nch   = (S.n_kv[cache] + P.att_chunk - 1)/P.att_chunk;"],
     ["    const int CH    = max(P.att_chunk, n_kv/4);",
      "const int nch   = (S.n_kv[cache] + max(P.att_chunk, S.n_kv[cache]/4) - 1)/max(P.att_chunk, S.n_kv[cache]/4);"],
     r"^FAIL verify M=\d+: [1-9]", []),
], ids=["m-dependent", "q6_k", "rope", "q_scale", "n_kv-chunks"])
def test_metal_megakernel_planted_kernel_bugs_fail(tmp_path, cpu_build, old, new, expect, args):
    # a target in mk-kernel.metal, or else in the decoding it includes (mk-deq32.h, found first in tmp_path)
    text, deq = KERNEL.read_text(), DEQ.read_text()
    for o, n in zip(*((old, new) if isinstance(old, list) else ([old], [new]))):
        in_deq = text.count(o) == 0
        assert (deq if in_deq else text).count(o) == 1, f"mutation target not (once) in {KERNEL} or {DEQ} (update the test): {o}"
        if in_deq:
            deq = deq.replace(o, n, 1)
        else:
            text = text.replace(o, n, 1)
    mutant = tmp_path / "mk-kernel-mutant.metal"
    mutant.write_text(text)
    (tmp_path / DEQ.name).write_text(deq)
    exe = _build(tmp_path / "build", cpu_build, kernel=mutant, first_inc=tmp_path)
    r = _run(exe, *args, "--tg", "3", "--verify", "4,8")
    assert r.returncode != 0 and re.search(expect, r.stdout, re.M), f"planted bug went unnoticed:\n{r.stdout[-3000:]}"


def test_metal_megakernel_asan_ubsan(tmp_path, cpu_build):
    # the emulated persistent dispatch with the kernel's offsets into bound buffers under ASan+UBSan
    exe = _build(tmp_path, cpu_build, sanitize=True)
    for plan in ([], ["--gemma3"]):
        r = _run(exe, *plan, "--tg", "3", "--verify", "4")
        _assert_ok(r, [4])
        assert "runtime error" not in r.stderr, r.stderr[-3000:]


# ---------------------------------------------------------------------------------------------
# the decoding alone: mk-deq32.h's mk_deq32 in a plain kernel vs ggml's CPU dequantizers (cheap: no model)

DEQ_TYPES = ["f32", "f16", "bf16", "q4_0", "q5_0", "q8_0", "q4_K", "q6_K", "stq1_0"]


def _build_deq(tmp: Path, cpu_build: Path, first_inc: Path | None = None) -> Path:
    return _build(tmp, cpu_build, kernel=DEQ_KERNEL, driver=DEQ_DRIVER, name="mk_deq", first_inc=first_inc)


def test_metal_megakernel_decoding_matches_ggml(tmp_path, cpu_build):
    # every type the kernel reads (issue 13's list, plus Q5_0 for Gemma 3 270M's 640-wide rows): 7 rows of
    # 640 values (768 and 512 for 256-value blocks, 200 for float rows), from ggml's quantizer and from random
    # bytes with finite scales, row 0 at 2 mod 4 where the type allows it
    exe = _build_deq(tmp_path, cpu_build)
    r = _run(exe, "7")
    print(r.stdout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for t in DEQ_TYPES:
        assert re.search(rf"^OK {t}: \d+ values of 7 rows equal ggml's dequantizer", r.stdout, re.M), r.stdout


@pytest.mark.parametrize("old,new,bad", [
    # Q5_0: the fifth bit of value j + 16 taken from bit j
    ("const int h1 = (int) ((qh >> (j + 16)) & 1);", "const int h1 = (int) ((qh >> j) & 1);", "q5_0"),
    # STQ1_0: the lane pairs of a 64-value chunk swapped (values 16..31 from lane p0 + 2)
    ("w[gi + 16] = d*(float) (((pat >> (2*p0 + 2)) & 3) - 1);", "w[gi + 16] = d*(float) (((pat >> (2*p0 + 4)) & 3) - 1);",
     "stq1_0"),
    # STQ1_0: the sign bit of group gg taken from the next group
    ("const int sbit = (b[32 + gg/8] >> (gg % 8)) & 1;", "const int sbit = (b[32 + gg/8] >> ((gg + 1) % 8)) & 1;", "stq1_0"),
], ids=["q5_0-high-bit", "stq1_0-lanes", "stq1_0-sign"])
def test_metal_megakernel_planted_decoding_bugs_fail(tmp_path, cpu_build, old, new, bad):
    text = DEQ.read_text()
    assert text.count(old) == 1, f"mutation target not (once) in {DEQ} (update the test): {old}"
    mut = tmp_path / "inc"
    mut.mkdir()
    (mut / DEQ.name).write_text(text.replace(old, new, 1))
    exe = _build_deq(tmp_path / "build", cpu_build, first_inc=mut)
    r = _run(exe, "7")
    assert r.returncode != 0 and re.search(rf"^FAIL {bad}: \d+ of \d+ values differ", r.stdout, re.M), \
        f"planted {bad} decoding bug went unnoticed:\n{r.stdout[-3000:]}"
    # the other types still pass: the check names the type that is wrong
    assert all(re.search(rf"^OK {t}:", r.stdout, re.M) for t in DEQ_TYPES if t != bad), r.stdout
