"""The STQ1_0 CUDA mat-vec kernel (ggml-cuda/mmv-stq1_0.cu, patch 0031), emulated on the host (CI has no GPU).

The kernel, its launch code and ggml_cuda_mul_mat_vec_stq1_0 are taken from the applied tree (or
STQ_CUDA_SRC_TREE, a tree with the series applied), PTX and __shared__ are rewritten into the fiber-based
emulation of cuda_hostemu/stq1_0_mmv_emu.cpp (each CUDA thread a fiber, real barriers and shuffles, cp.async
visible only at its wait_group), and the results are compared with ggml's CPU dequantization on random weights:
MUL_MAT 1..8 columns incl. odd row counts, channel/sample broadcasting and 6144x2048; MUL_MAT_ID with broadcast
and per-slot activations incl. 16 experts of 6144x2048 top-8; every column / token bit-identical to its
one-column / one-token product. A planted bug must make it fail. The dispatch: by default MUL_MAT takes the
kernel and MUL_MAT_ID keeps mmvq (GGML_CUDA_STQ1_0_MMV=id: both, 0: neither), for every column / token count.
"""
import os
import re
import subprocess
from pathlib import Path

import pytest

from stq_helpers import cxx, source_tree
from test_cuda_stq1_0_hostemu import emulate_asm, extract_device_code

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "cuda_hostemu" / "stq1_0_mmv_emu.cpp"

MMV_RULES = [
    (re.compile(r"__launch_bounds__\([^\n]*\)\n"), ""),
    (re.compile(r"static __global__ "), "static "),
    (re.compile(r"extern __shared__ int4 (\w+)\[\];"), r"int4 * \1 = (int4 *) emu_smem();"),
    (re.compile(r"__shared__ "), "static "),
    (re.compile(r'asm volatile\("cp\.async\.commit_group;"\);'), "emu_cp_async_commit();"),
    (re.compile(r'asm volatile\("cp\.async\.wait_group %0;" : : "n"\((\w+)\)\);'), r"emu_cp_async_wait(\1);"),
    (re.compile(r'asm volatile\("prefetch\.global\.L2 \[%0\];" : : "l"\((\w+)\)\);'), r"emu_prefetch(\1);"),
]


def cuda_src(cpu_build) -> Path:
    env = os.environ.get("STQ_CUDA_SRC_TREE")
    return Path(env) if env else source_tree(cpu_build)


def extract_mmv_code(mmv: Path) -> str:
    """mmv-stq1_0.cu from its first #define to the end (the kernel, the launch and the host function)."""
    text = mmv.read_text()
    start = text.find("#define STQ1_0_MMV_TILE_BLOCKS")
    if start < 0:
        pytest.fail(f"{mmv}: STQ1_0_MMV_TILE_BLOCKS not found (the kernel changed: update this test)")
    return emulate_asm(text[start:], MMV_RULES, mmv)


@pytest.fixture(scope="module")
def mmv_code(cpu_build):
    src = cuda_src(cpu_build)
    cu = src / "ggml" / "src" / "ggml-cuda"
    if not (cu / "mmv-stq1_0.cu").is_file():
        pytest.fail(f"{cu}/mmv-stq1_0.cu is missing (patch 0031 not applied?)")
    return src, extract_device_code(cu / "vecdotq.cuh"), extract_mmv_code(cu / "mmv-stq1_0.cu")


def _build(tmp_path: Path, name: str, vecdot: str, mmv: str, cpu_build: Path, src: Path) -> Path:
    (tmp_path / f"{name}.vecdot.inc").write_text(vecdot)
    (tmp_path / f"{name}.mmv.inc").write_text(mmv)
    exe = tmp_path / name
    lib = Path(cpu_build) / "bin"
    cmd = [cxx(), "-std=c++17", "-O2", "-w",
           f'-DSTQ_VECDOT_INC="{tmp_path / f"{name}.vecdot.inc"}"', f'-DSTQ_MMV_INC="{tmp_path / f"{name}.mmv.inc"}"',
           f"-I{src}/ggml/include", f"-I{src}/ggml/src", str(DRIVER), "-o", str(exe),
           f"-L{lib}", "-lggml-base", f"-Wl,-rpath,{lib}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"compiling the emulated STQ1_0 mat-vec failed:\n{' '.join(cmd)}\n{r.stderr[-6000:]}"
    return exe


def _run(exe: Path, what: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([str(exe), what], capture_output=True, text=True, timeout=900, env=env)


@pytest.fixture(scope="module")
def mmv_exe(tmp_path_factory, cpu_build, mmv_code):
    src, vecdot, mmv = mmv_code
    return _build(tmp_path_factory.mktemp("mmv"), "mmv", vecdot, mmv, cpu_build, src)


@pytest.mark.parametrize("eager", ["0", "1"])
def test_cuda_mmv_stq1_0_matches_cpu(mmv_exe, eager):
    r = _run(mmv_exe, "full" if eager == "0" else "quick", {"EMU_CP_EAGER": eager})
    print(r.stdout.strip())
    assert r.returncode == 0 and r.stdout.rstrip().splitlines()[-1].startswith("OK"), r.stdout + r.stderr


@pytest.mark.parametrize("variant", ["r2", "r8", "w2", "s2", "s8"])
def test_cuda_mmv_stq1_0_variants(mmv_exe, variant):
    r = _run(mmv_exe, "one", {"GGML_CUDA_STQ1_0_MMV": variant})
    print(r.stdout.strip())
    assert r.returncode == 0 and r.stdout.rstrip().splitlines()[-1].startswith("OK"), r.stdout + r.stderr


@pytest.mark.parametrize("mode", [None, "1", "id", "0", "r8", "s8", "bogus"])
def test_cuda_mmv_stq1_0_dispatch(mmv_exe, mode):
    env = {k: v for k, v in os.environ.items() if k != "GGML_CUDA_STQ1_0_MMV"}
    if mode is not None:
        env["GGML_CUDA_STQ1_0_MMV"] = mode
    r = subprocess.run([str(mmv_exe), "dispatch"], capture_output=True, text=True, timeout=120, env=env)
    print(r.stdout.strip())
    assert r.returncode == 0 and r.stdout.rstrip().splitlines()[-1].startswith("OK"), r.stdout + r.stderr


@pytest.mark.parametrize("mutation", [
    ("stq1_0_mmv_cp_async_wait<nstages - 1>()", "stq1_0_mmv_cp_async_wait<nstages>()"),  # waits one tile short
    ("+ blk*sizeof(block_stq1_0)", "+ blk*40"),                                             # wrong block offset
    ("const int kby = ((warp + i*nwarps)", "const int kby = ((i*nwarps)"),                 # activations of warp 0's tile
    ("if (lane == r && r <= last_row)", "if (lane == r && r < last_row)"),                  # drops the last row
    ("(yc->qs + 64*h)", "(yc->qs + 32*h)"),                                                 # wrong half of a q8_1 block
    ("a.stride_kb_y  = ne11;", "a.stride_kb_y  = 1;"),                                        # mmq layout stride lost
    ("src[n] = x + min(r, last_row)*stride_row_x", "src[n] = x + r*stride_row_x"),           # copies past the last row
    ("min(128*(k - r*nlines), nbytes - 1)", "128*(k - r*nlines)"),                            # prefetch past the tiles
    ("(mul_mat_id && mode == STQ1_0_MMV_MUL_MAT)", "(false)"),                               # MUL_MAT_ID takes it by default
])
def test_cuda_mmv_stq1_0_emulation_can_fail(tmp_path, cpu_build, mmv_code, mutation):
    src, vecdot, mmv = mmv_code
    old, new = mutation
    assert old in mmv, f"mutation target {old!r} not in the extracted kernel (update the test)"
    exe = _build(tmp_path, "mutant", vecdot, mmv.replace(old, new), cpu_build, src)
    env = {"GGML_CUDA_STQ1_0_MMV": "w2"} if "nwarps" in old else {}
    r = _run(exe, "one" if env else "quick", env)
    assert r.returncode != 0 and "FAIL" in r.stdout, f"planted bug {new!r} was not detected:\n{r.stdout}"
