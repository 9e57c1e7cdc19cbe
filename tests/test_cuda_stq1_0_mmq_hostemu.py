"""The STQ1_0 tile loader of CUDA's mmq (ggml_cuda_mmq_load_tiles_stq1_0), emulated on the host (CI has no GPU).

The loader is taken from the applied tree's ggml/src/ggml-cuda/mmq-load-tiles.cuh, the STQ1_0 decode helpers it
shares with vec_dot_stq1_0_q8_1 from vecdotq.cuh (their inline PTX emulated as in test_cuda_stq1_0_hostemu.py) and
the Q8_0 tile geometry it writes (the dp4a tile sizes, the MMA sram stride) from mmq.cuh;
cuda_hostemu/stq1_0_mmq_emu.cpp runs every thread of a block in turn and reads the tile back as
ggml_cuda_mmq_vec_dot_q8_0_q8_1_{mma,dp4a} do, comparing it bit for bit with ggml's CPU dequantization, in both
layouts and with the helpers' PTX and portable (HIP/MUSA) branches. Planted bugs must make the check fail. The real kernels run on the
lent H200 (tests/test_cuda_stq1_0_mmq.py).
"""
import re
import subprocess
from pathlib import Path

import pytest

from stq_helpers import cxx, source_tree
from test_cuda_stq1_0_hostemu import ASM_RULES, emulate_asm, function_end

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "cuda_hostemu" / "stq1_0_mmq_emu.cpp"
SIGNATURE = "static __device__ __forceinline__ void ggml_cuda_mmq_load_tiles_stq1_0("


def extract_loader(path: Path) -> str:
    text = path.read_text()
    at = text.find(SIGNATURE)
    if at < 0:
        pytest.fail(f"{path}: ggml_cuda_mmq_load_tiles_stq1_0 not found (the mmq STQ1_0 loader changed: update this test)")
    start = text.rfind("template <", 0, at)
    code = text[start:function_end(text, at)] + "\n"
    # the device converts the block's half d to float implicitly; on the host ggml_half is a uint16_t
    if code.count("= bxi->d;") != 1:
        pytest.fail(f"{path}: the loader's read of d changed (update this test)")
    return code.replace("= bxi->d;", "= ggml_fp16_to_fp32(bxi->d);")


def extract_helpers(path: Path) -> str:
    """stq1_0_gpu_grid4 .. stq1_0_byte_mask of vecdotq.cuh, inline PTX emulated."""
    text = path.read_text()
    first = text.find("static __device__ __forceinline__ uint32_t stq1_0_gpu_grid4(")
    last = text.find("static __device__ __forceinline__ uint32_t stq1_0_byte_mask(")
    if first < 0 or last < 0:
        pytest.fail(f"{path}: the STQ1_0 decode helpers were not found (update this test)")
    return emulate_asm(text[first:function_end(text, last)] + "\n", ASM_RULES, path)


def extract_geometry(path: Path) -> str:
    text = path.read_text()
    txs = re.search(r"^#define MMQ_DP4A_TXS_Q8_0 .*$", text, re.M)
    stride = re.search(r"case GGML_CUDA_MMQ_SRAM_LAYOUT_Q8_0:\s*return ([^;]+);", text)
    if not txs or not stride:
        pytest.fail(f"{path}: MMQ_DP4A_TXS_Q8_0 or the Q8_0 sram stride not found (update this test)")
    return f"{txs.group(0)}\nstatic constexpr int emu_sram_stride_q8_0() {{ return {stride.group(1)}; }}\n"


@pytest.fixture(scope="module")
def device_code(cpu_build):
    src = source_tree(cpu_build)
    cuda = src / "ggml" / "src" / "ggml-cuda"
    if not (cuda / "mmq-load-tiles.cuh").is_file():
        pytest.fail(f"{cuda}/mmq-load-tiles.cuh is missing")
    return dict(src=src, loader=extract_loader(cuda / "mmq-load-tiles.cuh"),
                helpers=extract_helpers(cuda / "vecdotq.cuh"), geom=extract_geometry(cuda / "mmq.cuh"))


def _build_and_run(tmp_path: Path, name: str, dc: dict, cpu_build: Path, mma: bool, portable: bool = False,
                   loader: str | None = None):
    incs = {}
    for key in ("loader", "helpers", "geom"):
        incs[key] = tmp_path / f"{name}.{key}.inc"
        incs[key].write_text(loader if key == "loader" and loader is not None else dc[key])
    exe = tmp_path / name
    lib = cpu_build / "bin"
    src = dc["src"]
    cmd = [cxx(), "-std=c++17", "-O1", f'-DSTQ_MMQ_LOAD_INC="{incs["loader"]}"',
           f'-DSTQ_MMQ_HELPERS_INC="{incs["helpers"]}"', f'-DSTQ_MMQ_GEOM_INC="{incs["geom"]}"',
           *(["-DSTQ_EMU_MMA"] if mma else []), *(["-DGGML_USE_HIP"] if portable else []),
           f"-I{src}/ggml/include", f"-I{src}/ggml/src", str(DRIVER),
           "-o", str(exe), f"-L{lib}", "-lggml-base", f"-Wl,-rpath,{lib}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"compiling the emulated mmq loader failed:\n{' '.join(cmd)}\n{r.stderr[-4000:]}"
    return subprocess.run([str(exe), "7"], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("layout, branch", [("mma", "ptx"), ("dp4a", "ptx"), ("mma", "portable")])
def test_cuda_mmq_stq1_0_tile_matches_cpu_dequantize(tmp_path, cpu_build, device_code, layout, branch):
    r = _build_and_run(tmp_path, f"mmq_{layout}_{branch}", device_code, cpu_build, layout == "mma", branch == "portable")
    print(r.stdout.strip())
    assert r.returncode == 0 and r.stdout.startswith("OK"), r.stdout + r.stderr


@pytest.mark.parametrize("mutation", [
    ("2*(kqsx % 2)", "(kqsx % 2)"),                  # the second half of a chunk at the wrong ints
    ("(s8 >> (4*m))", "(s8 >> (4*(m ^ 1)))"),        # the sign bits of the other 4 groups
    ("2*((p + 3) % 4)", "2*p"),                      # lanes taken from the wrong fields
    ("k0 + 4*p + m", "k0 + 4*m + p"),                # values in the wrong order within the 32
])
def test_cuda_mmq_stq1_0_emulation_can_fail(tmp_path, cpu_build, device_code, mutation):
    old, new = mutation
    assert old in device_code["loader"], f"mutation target {old!r} not in the extracted loader (update the test)"
    r = _build_and_run(tmp_path, "mmq_mutant", device_code, cpu_build, True,
                       loader=device_code["loader"].replace(old, new))
    assert r.returncode != 0 and "FAIL" in r.stdout, f"planted bug {new!r} was not detected:\n{r.stdout}"
