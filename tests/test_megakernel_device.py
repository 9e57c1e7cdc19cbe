"""megakernel/device.sh's A/B stages off the GPU: stage vcost runs test-mk --verify-cost in each process of
MK_VCOST_SIDES from the side's binaries (bin-a, bin-b under MK_WORK, as stage sides leaves them), with the variant a
side names, prints the kernel's us per step size, and fails when a process fails. The binaries here are stand-ins that
print what the real test-mk prints."""
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FAKE = """#!/bin/bash
echo "llama_mk profile: 73 steps of 1 token: kernel {k1} us, whole launch (upload, launch, results) 1.0 us"
echo "llama_mk profile: 18 steps of 3 tokens: kernel {k3} us, whole launch (upload, launch, results) 1.0 us"
echo "variant $LLAMA_MEGAKERNEL_VARIANT profile $LLAMA_MEGAKERNEL_PROFILE args $*"
echo "verify == decode (bitwise), M = 2..8: ok"
exit {rc}
"""


def _setup(tmp_path: Path, rc_b: int = 0) -> tuple[Path, dict]:
    here = tmp_path / "repo"
    (here / "megakernel").mkdir(parents=True)
    shutil.copy(ROOT / "megakernel" / "device.sh", here / "megakernel" / "device.sh")   # (no .dev: nothing to unpack)
    work = tmp_path / "work"
    for side, k1, k3, rc in (("a", "4031.5", "6272.0", 0), ("b", "4029.0", "6150.5", rc_b)):
        (work / f"bin-{side}").mkdir(parents=True)
        exe = work / f"bin-{side}" / "test-mk"
        exe.write_text(FAKE.format(k1=k1, k3=k3, rc=rc))
        exe.chmod(0o755)
    env = dict(os.environ, MK_WORK=str(work), OUT=str(tmp_path / "out"), MK_MODELS="e4b-mtp",
               MK_VCOST_SIDES="a b a+0x40000000")
    return here, env


def test_vcost_runs_each_side_with_its_variant(tmp_path):
    here, env = _setup(tmp_path)
    r = subprocess.run(["bash", "megakernel/device.sh", "vcost"], cwd=here, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if "vcost side" in ln]
    assert [ln.split("vcost side ")[1] for ln in lines] == [
        "a: M=1 4031.5 M=3 6272.0 ", "b: M=1 4029.0 M=3 6150.5 ", "a+0x40000000: M=1 4031.5 M=3 6272.0 "], lines
    log = (tmp_path / "out" / "vcost.log").read_text()
    runs = [ln for ln in log.splitlines() if ln.startswith("variant ")]
    assert [ln.split()[1] for ln in runs] == ["0", "0", "0x40000000"], runs
    assert all("profile 1 " in ln and "--verify-cost" in ln and "e4b-mtp.gguf" in ln for ln in runs), runs


def test_vcost_fails_when_a_process_fails(tmp_path):
    here, env = _setup(tmp_path, rc_b=1)
    r = subprocess.run(["bash", "megakernel/device.sh", "vcost"], cwd=here, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and "stage vcost failed" in r.stdout, r.stdout + r.stderr


def test_usage_lists_the_ab_stages(tmp_path):
    r = subprocess.run(["bash", str(ROOT / "megakernel" / "device.sh")], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, MK_WORK=str(tmp_path / "w"), OUT=str(tmp_path / "o")))
    assert r.returncode == 2 and "sides (" in r.stdout and "vcost (" in r.stdout and "set -uo" not in r.stdout, r.stdout
