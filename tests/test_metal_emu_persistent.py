"""metal-emu runs persistent kernels honestly (issue 13, part 2).

Builds ggml-metal/emu/selftest/persistent.metal (a multi-round prefix sum across threadgroups whose
phases are separated by the grid barrier of ggml-metal/mk/grid-barrier.h) with the runtime and
persistent_driver.cpp, like test_metal_emu_planted.py builds planted.metal. The expected results come
from numpy. Planted bugs must fail: the barrier without its device-scope fences, no barrier, fences
without the arrive/spin, the barrier without its acquire fence (wrong results); a barrier that waits for one threadgroup more than launched
and an oversubscribed launch (deadlock reports naming the kernel); a spin on plain device memory
(watchdog report). The subprocess timeouts only turn a hang into a failure; no test measures time.
"""
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
EMU = ROOT / "ggml-metal" / "emu"
CXX = os.environ.get("STQ_CLANGXX", "clang++-19")
NTG = 64  # threads per threadgroup of the scan kernel
HANG = 120  # seconds after which a run counts as hung


def _build(tmp: Path, sanitize: bool) -> Path:
    if shutil.which(CXX) is None:
        pytest.skip(f"{CXX} not found (metal-emu needs clang >= 19)")
    tmp.mkdir(parents=True, exist_ok=True)
    gen = tmp / "persistent.cpp"
    subprocess.run(["python3", str(EMU / "msl2cpp.py"), "--source", str(EMU / "selftest" / "persistent.metal"),
                    "--out", str(gen)], check=True)
    exe = tmp / ("persistent_asan" if sanitize else "persistent")
    cmd = [CXX, "-std=c++20", "-O1", "-g", "-march=native", "-fmax-type-align=8", f"-I{EMU}", str(gen),
           str(EMU / "emu-runtime.cpp"), str(EMU / "selftest" / "persistent_driver.cpp"), "-o", str(exe), "-lpthread"]
    if sanitize:
        cmd[1:1] = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"building the metal-emu persistent self-test failed:\n{r.stderr[-4000:]}"
    return exe


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("emu_persistent"), sanitize=False)


@pytest.fixture(scope="module")
def driver_asan(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("emu_persistent_asan"), sanitize=True)


def _env(**kw):
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0", GGML_METAL_EMU_GPU_CORES="2")
    for k in ("GGML_METAL_EMU_RESIDENCY", "GGML_METAL_EMU_ORDER", "GGML_METAL_EMU_TG_SCHED", "GGML_METAL_EMU_WATCHDOG_S"):
        env.pop(k, None)
    env.update({f"GGML_METAL_EMU_{k}": str(v) for k, v in kw.items()})
    return env


def _residency(exe, **env) -> int:
    r = subprocess.run([str(exe), "residency", str(NTG)], capture_output=True, text=True, env=_env(**env), timeout=HANG)
    assert r.returncode == 0, r.stderr
    return int(r.stdout)


def _expected(x: np.ndarray, rounds: int):
    """what kernel_scan computes: each round dst = inclusive prefix sum (mod 2^32), x = dst reversed"""
    for _ in range(rounds):
        dst = np.cumsum(x, dtype=np.uint32)
        x = dst[::-1].copy()
    return dst, x


def _scan(exe, tmp: Path, kernel: str, n_tg: int, n_wait: int | None = None, rounds: int = 2, seed: int = 0, **env):
    """runs kernel on random input; returns (process, number of wrong dst + rev values or None)"""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 2**32, n_tg*NTG, dtype=np.uint32)
    fin, fout = tmp / f"in_{kernel}_{n_tg}.bin", tmp / f"out_{kernel}_{n_tg}.bin"
    x.tofile(fin)
    fout.unlink(missing_ok=True)
    r = subprocess.run([str(exe), "scan", kernel, str(n_tg), str(n_tg if n_wait is None else n_wait), str(rounds),
                        str(NTG), str(fin), str(fout)], capture_output=True, text=True, env=_env(**env), timeout=HANG)
    if r.returncode != 0:
        return r, None
    out = np.fromfile(fout, dtype=np.uint32)
    dst, rev = _expected(x, rounds)
    n = n_tg*NTG
    assert out.size == 2*n
    return r, int((out[:n] != dst).sum() + (out[n:] != rev).sum())


SCHEDULES = [("greedy", "fwd"), ("greedy", "rev"), ("greedy", "shuffle"), ("rr", "fwd"), ("random", "shuffle")]


def test_residency_from_device_limits(driver):
    # GPU cores x threadgroups per core; GGML_METAL_EMU_RESIDENCY overrides the total
    r2, r4 = _residency(driver, GPU_CORES=2), _residency(driver, GPU_CORES=4)
    assert r2 > 0 and r4 == 2*r2
    assert _residency(driver, RESIDENCY=5) == 5


@pytest.mark.parametrize("sched,order", SCHEDULES)
def test_scan_exact(driver, tmp_path, sched, order):
    n_tg = _residency(driver)  # the launch size comes from the device's co-residency limit
    for tg in (2, n_tg):
        r, bad = _scan(driver, tmp_path, "kernel_scan_ok", tg, rounds=3, seed=tg, TG_SCHED=sched, ORDER=order)
        assert r.returncode == 0, r.stdout + r.stderr
        assert bad == 0, f"{tg} threadgroups, {sched}/{order}: {bad} wrong values"


def test_scan_exact_default_residency(driver, tmp_path):
    # the default emulated GPU (8 cores): the largest launch it allows
    n_tg = _residency(driver, GPU_CORES=8)
    r, bad = _scan(driver, tmp_path, "kernel_scan_ok", n_tg, seed=7, GPU_CORES=8)
    assert r.returncode == 0, r.stdout + r.stderr
    assert bad == 0


def test_scan_exact_asan(driver_asan, tmp_path):
    # the store buffers' page protection coexists with ASan+UBSan
    r, bad = _scan(driver_asan, tmp_path, "kernel_scan_ok", 4, seed=3)
    assert r.returncode == 0, r.stdout + r.stderr
    assert bad == 0
    assert "runtime error" not in r.stderr


@pytest.mark.parametrize("sched,order", SCHEDULES)
@pytest.mark.parametrize("kernel", ["kernel_scan_nofence", "kernel_scan_nobarrier"])
def test_planted_barrier_bugs_caught(driver, tmp_path, kernel, sched, order):
    # the naive barrier fails at 2 threadgroups on real Apple GPUs: it must fail here too
    for n_tg in (2, 8):
        r, bad = _scan(driver, tmp_path, kernel, n_tg, seed=n_tg, TG_SCHED=sched, ORDER=order)
        assert r.returncode == 0, r.stdout + r.stderr
        assert bad > 0, f"{kernel} with {n_tg} threadgroups ({sched}/{order}) gave the right result"


@pytest.mark.parametrize("order", ["fwd", "rev", "shuffle"])
@pytest.mark.parametrize("kernel", ["kernel_scan_fenceonly", "kernel_scan_noacquire"])
def test_partial_barriers_caught(driver, tmp_path, kernel, order):
    # fenceonly: the fences publish, but nothing makes a threadgroup wait for the others' data;
    # noacquire: grid_barrier without its last fence, so loads after the spin may see data older than
    # the arrival of the others. Both need skew between threadgroups: the default (greedy) schedule;
    # the round-robin one keeps the threadgroups in lockstep and would let them pass.
    for n_tg in (2, 8):
        r, bad = _scan(driver, tmp_path, kernel, n_tg, seed=n_tg, ORDER=order)
        assert r.returncode == 0, r.stdout + r.stderr
        assert bad > 0, f"{kernel} with {n_tg} threadgroups ({order}) gave the right result"


@pytest.mark.parametrize("sched", ["greedy", "rr"])
def test_unreachable_barrier_is_a_deadlock(driver, tmp_path, sched):
    # every barrier waits for one threadgroup more than launched: reported, never a hang
    r, bad = _scan(driver, tmp_path, "kernel_scan_ok", 4, n_wait=5, TG_SCHED=sched)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "deadlock in kernel kernel_scan_ok" in r.stderr
    assert "spin on device atomics" in r.stderr
    assert "oversubscribes" not in r.stderr


def test_oversubscription_is_reported(driver, tmp_path):
    # one threadgroup more than co-resident: the last never starts while the others spin
    r, bad = _scan(driver, tmp_path, "kernel_scan_ok", 5, RESIDENCY=4)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "deadlock in kernel kernel_scan_ok" in r.stderr
    assert "oversubscribes the GPU: 5 threadgroups > 4 co-resident" in r.stderr
    # the same launch fits a device with room for it
    r, bad = _scan(driver, tmp_path, "kernel_scan_ok", 5, RESIDENCY=5)
    assert r.returncode == 0 and bad == 0, r.stdout + r.stderr


@pytest.mark.parametrize("order", ["fwd", "shuffle"])
def test_device_atomics(driver, tmp_path, order):
    # every thread of 3x the co-resident threadgroups (later ones start as earlier ones exit):
    # fetch_add (uint, float), fetch_max, an xor through a compare-exchange loop
    n_tg = 3*_residency(driver)
    x = np.random.default_rng(11).integers(0, 2**32, n_tg*NTG, dtype=np.uint32)
    fin, fout = tmp_path / "atomics_in.bin", tmp_path / "atomics_out.bin"
    x.tofile(fin)
    r = subprocess.run([str(driver), "atomics", str(n_tg), str(NTG), str(fin), str(fout)], capture_output=True,
                       text=True, env=_env(ORDER=order), timeout=HANG)
    assert r.returncode == 0, r.stdout + r.stderr
    out = np.fromfile(fout, dtype=np.uint32)
    assert np.array_equal(out[:16], np.bincount(x % 16, minlength=16))
    assert out[16:17].view(np.float32)[0] == float((x % 256).sum())  # < 2^24: exact in any order
    assert out[17:18].view(np.int32)[0] == int((x >> 1).max())
    assert out[18] == np.bitwise_xor.reduce(x)


def test_plain_spin_reported_by_watchdog(driver):
    r = subprocess.run([str(driver), "plain_spin"], capture_output=True, text=True, env=_env(WATCHDOG_S=2), timeout=HANG)
    assert r.returncode != 0
    assert "kernel kernel_plain_spin" in r.stderr and "no thread reached a scheduling point" in r.stderr


def test_translator_marks_persistent_kernels(tmp_path):
    # kernels that synchronise through device memory run co-resident; the others keep the thread pool
    out = tmp_path / "p.cpp"
    subprocess.run(["python3", str(EMU / "msl2cpp.py"), "--source", str(EMU / "selftest" / "persistent.metal"),
                    "--out", str(out)], check=True)
    text = out.read_text()
    for k in ("kernel_scan_ok", "kernel_scan_nofence", "kernel_scan_nobarrier", "kernel_scan_fenceonly",
              "kernel_scan_noacquire", "kernel_plain_spin", "kernel_atomics"):
        assert f'("{k}", ' in text and f'"persistent", true);' in text.split(f'("{k}", ')[1].split("\n")[0], k
    out2 = tmp_path / "q.cpp"
    subprocess.run(["python3", str(EMU / "msl2cpp.py"), "--source", str(EMU / "selftest" / "planted.metal"),
                    "--out", str(out2)], check=True)
    assert "true);" not in out2.read_text()
