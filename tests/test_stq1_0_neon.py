"""STQ1_0's NEON vec_dot: cross-build ggml for aarch64 (Debian's cross compiler) and run an exactness check
under qemu-user (tests/neon/). `./RUNBOOK.sh setup` installs g++-aarch64-linux-gnu and qemu-user; without
them this test skips and says so."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness import build as buildmod
from harness import source

HERE = Path(__file__).resolve().parent
CHECK = HERE / "neon" / "stq1_0_vec_dot_check.c"
SYSROOT = Path("/usr/aarch64-linux-gnu")
CC, CXX, QEMU = "aarch64-linux-gnu-gcc", "aarch64-linux-gnu-g++", "qemu-aarch64"

# armv8.2-a+dotprod: the sdot path; the NEON kernel also has a fallback without dotprod (checked by hand,
# NOTES.md), which one more 3-minute cross build would cover.
NEON_FLAGS = ["-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
              f"-DCMAKE_C_COMPILER={CC}", f"-DCMAKE_CXX_COMPILER={CXX}",
              "-DCMAKE_FIND_ROOT_PATH_MODE_PROGRAM=NEVER", "-DCMAKE_FIND_ROOT_PATH_MODE_LIBRARY=ONLY",
              "-DCMAKE_FIND_ROOT_PATH_MODE_INCLUDE=ONLY", f"-DCMAKE_FIND_ROOT_PATH={SYSROOT}",
              "-DGGML_NATIVE=OFF", "-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod", "-DGGML_OPENMP=OFF",
              "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF"]


@pytest.fixture(scope="module")
def neon_build(pytestconfig):
    missing = [t for t in (CC, CXX, QEMU) if not shutil.which(t)]
    if missing or not SYSROOT.is_dir():
        pytest.skip(f"aarch64 cross tools missing ({', '.join(missing) or SYSROOT}); `./RUNBOOK.sh setup` installs them")
    capman = pytestconfig.pluginmanager.getplugin("capturemanager")
    if capman:
        capman.suspend_global_capture(in_=False)
    try:
        return buildmod.ensure_build("cpu", ("ggml",), extra=NEON_FLAGS)
    finally:
        if capman:
            capman.resume_global_capture()


def test_neon_build_is_aarch64_with_dotprod(neon_build):
    lib = neon_build / "bin" / "libggml-cpu.so"
    assert lib.is_file(), f"{lib} was not built"
    head = lib.read_bytes()[:20]
    assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 183, f"{lib} is not an aarch64 ELF"
    objdump = shutil.which("aarch64-linux-gnu-objdump")
    if objdump:  # the STQ1_0 kernel must have been compiled with the dot-product instructions
        asm = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(lib)], capture_output=True, text=True).stdout
        start = asm.find("<ggml_vec_dot_stq1_0_q8_K>:")
        assert start >= 0, "ggml_vec_dot_stq1_0_q8_K not found in the NEON build"
        body = asm[start:asm.find("\n\n", start)]
        assert "sdot" in body, "the NEON STQ1_0 vec_dot has no sdot instruction"


def test_neon_vec_dot_exact_under_qemu(neon_build, tmp_path):
    src = Path(subprocess.run(["git", "-C", str(source.ensure_tree()), "rev-parse", "--show-toplevel"],
                              capture_output=True, text=True, check=True).stdout.strip())
    exe = tmp_path / "stq1_0_vec_dot_check"
    lib = neon_build / "bin"
    cmd = [CC, "-O1", "-std=c11", f"-I{src}/ggml/include", str(CHECK), "-o", str(exe),
           f"-L{lib}", "-lggml-cpu", "-lggml-base", f"-Wl,-rpath-link,{lib}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"cross-compiling the check failed:\n{' '.join(cmd)}\n{r.stderr[-3000:]}"
    env = dict(os.environ, LD_LIBRARY_PATH=str(lib))
    r = subprocess.run([QEMU, "-L", str(SYSROOT), str(exe)], capture_output=True, text=True, env=env, timeout=600)
    print(r.stdout.strip())
    assert r.returncode == 0 and r.stdout.startswith("OK"), r.stdout + r.stderr[-2000:]
