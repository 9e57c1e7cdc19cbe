"""The STQ1_0 CUDA dot product, emulated on the host (CI has no GPU).

The device code of `vec_dot_stq1_0_q8_1` and its helpers is taken from the applied tree's
ggml/src/ggml-cuda/vecdotq.cuh, its inline PTX (prmt with its sign-replicate mode, dp4a.u32.s32) is rewritten
into C emulations, and the result is compared with ggml's CPU dequantization (cuda_hostemu/). Both the PTX
branch and the portable (HIP/MUSA) branch are checked, and a planted bug must make the check fail. The real
kernels run on the lent H200 (tests/test_cuda_stq1_0.py, harness/cuda_device.sh).
"""
import re
import subprocess
from pathlib import Path

import pytest

from stq_helpers import cxx, source_tree

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "cuda_hostemu" / "stq1_0_vecdot_emu.cpp"

ASM_RULES = [
    # asm("prmt.b32 %0, %1, %2, %3;" : "=r"(X) : "r"(A), "r"(B), "r"(C));
    (re.compile(r'asm\("prmt\.b32 %0, %1, %2, %3;" : "=r"\((\w+)\) : "r"\((.*?)\), "r"\((.*?)\), "r"\((.*?)\)\);'),
     r"\1 = emu_prmt(\2, \3, \4);"),
    (re.compile(r'asm\("prmt\.b32 %0, %1, %1, (0x[0-9A-Fa-f]+);" : "=r"\((\w+)\) : "r"\((\w+)\)\);'),
     r"\2 = emu_prmt(\3, \3, \1);"),
    (re.compile(r'asm\("dp4a\.u32\.s32 %0, %1, %2, %3;" : "=r"\((\w+)\) : "r"\((\w+)\), "r"\((\w+)\), "r"\((\w+)\)\);'),
     r"\1 = emu_dp4a_us(\2, \3, \4);"),
]



def function_end(text: str, at: int) -> int:
    """The index just past the body of the function whose signature starts at `at` (braces matched)."""
    depth, i = 0, text.index("{", at)
    while True:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
        if depth == 0:
            return i


def emulate_asm(code: str, rules, where: Path) -> str:
    """Device code with its inline PTX replaced by the host emulation of `rules`; fails on PTX that has none."""
    for rx, repl in rules:
        code = rx.sub(repl, code)
    left = re.findall(r"\basm\b.*", code)   # (asm(...) and asm volatile(...))
    if left:
        pytest.fail(f"{where}: inline PTX without a host emulation: {left}")
    return code


def extract_device_code(vecdotq: Path) -> str:
    """From the comment block before stq1_0_gpu_grid4 to the end of vec_dot_stq1_0_q8_1, PTX emulated."""
    text = vecdotq.read_text()
    first = text.find("static __device__ __forceinline__ uint32_t stq1_0_gpu_grid4(")
    if first < 0:
        pytest.fail(f"{vecdotq}: stq1_0_gpu_grid4 not found (the STQ1_0 CUDA decode changed: update this test)")
    start = first
    while True:  # back over the comment lines that precede the first helper
        prev = text.rfind("\n", 0, start - 1)
        if not text[prev + 1:start].lstrip().startswith("//"):
            break
        start = prev + 1
    fn = text.find("float vec_dot_stq1_0_q8_1(", first)
    if fn < 0:
        pytest.fail(f"{vecdotq}: vec_dot_stq1_0_q8_1 not found")
    return emulate_asm(text[start:function_end(text, fn)] + "\n", ASM_RULES, vecdotq)



def _build_and_run(tmp_path: Path, name: str, code: str, cpu_build: Path, src: Path, defines=()) -> subprocess.CompletedProcess:
    inc = tmp_path / f"{name}.inc"
    inc.write_text(code)
    exe = tmp_path / name
    lib = cpu_build / "bin"
    cmd = [cxx(), "-std=c++17", "-O1", f'-DSTQ_VECDOT_INC="{inc}"', *defines,
           f"-I{src}/ggml/include", f"-I{src}/ggml/src", str(DRIVER), "-o", str(exe),
           f"-L{lib}", "-lggml-base", f"-Wl,-rpath,{lib}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"compiling the emulated CUDA vec_dot failed:\n{' '.join(cmd)}\n{r.stderr[-4000:]}"
    return subprocess.run([str(exe), "3000"], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def device_code(cpu_build):
    src = source_tree(cpu_build)
    vecdotq = src / "ggml" / "src" / "ggml-cuda" / "vecdotq.cuh"
    if not vecdotq.is_file():
        pytest.fail(f"{vecdotq} is missing")
    return src, extract_device_code(vecdotq)


@pytest.mark.parametrize("branch", ["ptx", "portable"])
def test_cuda_vec_dot_matches_cpu_dequantize(tmp_path, cpu_build, device_code, branch):
    src, code = device_code
    defines = ["-DGGML_USE_HIP"] if branch == "portable" else []
    r = _build_and_run(tmp_path, f"vecdot_{branch}", code, cpu_build, src, defines)
    print(r.stdout.strip())
    assert r.returncode == 0 and r.stdout.startswith("OK"), r.stdout + r.stderr


@pytest.mark.parametrize("mutation", [
    ("codes ^ 0x8888u", "codes ^ 0x0888u"),        # second table half selected wrongly for one group
    ("pat & 0x0C0C0C0C", "pat & 0x0C0C0C08"),      # one lane bit lost
    ("(s2 >> 2)", "(s2 >> 3)"),                     # a lane scaled wrongly
])
def test_cuda_vec_dot_emulation_can_fail(tmp_path, cpu_build, device_code, mutation):
    src, code = device_code
    old, new = mutation
    assert old in code, f"mutation target {old!r} not in the extracted device code (update the test)"
    r = _build_and_run(tmp_path, "vecdot_mutant", code.replace(old, new), cpu_build, src)
    assert r.returncode != 0 and "FAIL" in r.stdout, f"planted bug {new!r} was not detected:\n{r.stdout}"
