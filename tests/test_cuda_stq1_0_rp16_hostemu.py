"""CUDA's STQ1_0 RP16 repack and mat-vec (ggml-cuda/stq1_0-rp16.cu{,h}, patch 0032), emulated on the host (CI has
no GPU).

stq1_0-rp16.cuh and stq1_0-rp16.cu are taken from the applied tree (or STQ_CUDA_SRC_TREE), their launches,
__global__ and __shared__ rewritten for the fiber emulation of cuda_hostemu/stq1_0_rp16_emu.cpp (each CUDA thread a
fiber; real barriers and shuffles), and checked on random STQ1_0 weights: the unpacked repack gives the GGUF bytes
back; MUL_MAT with 1..8 columns matches ggml's dequantized weights times the kernel's quantized activations
(tight) and the float activations (NMSE); every column is bit-identical to its one-column product; the K splits
4 and 8 agree; which matrices the layout supports and the default policy repacks. MUL_MAT_ID on expert stacks
(3, 5, 7, 33 experts, non-square, 1 or n_used columns per token, 1..8 tokens, ids with a padded row stride, and in
the full run Hy4's 256 experts of 2048 x 6144 top-8): the stack's repack equals its experts' 2-D repacks, the round
trip, float64 as above, every column bit-identical to its token alone and to the one-column product of its expert.
Planted bugs (an activation permutation off by one lane, a field of the weight layout moved, an expert stride one
tile short, the ids' row stride ignored; in the unpack kernel: shared memory staged without its swizzle, a CUDA block's
tiles all given the row group of its first, a straddling field's top bit dropped, one bit of a scale's high byte lost)
must make it fail. The real kernel runs on the lent H200
(tests/test_cuda_stq1_0_rp16.py).
"""
import os
import re
import subprocess
from pathlib import Path

import pytest

from stq_helpers import cxx, source_tree

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "cuda_hostemu" / "stq1_0_rp16_emu.cpp"

RULES = [
    (re.compile(r"#pragma once\n"), ""),
    (re.compile(r'#include "(common|stq1_0-rp16)\.cuh"\n'), ""),
    (re.compile(r"__launch_bounds__\([^\n]*\)\n"), ""),
    (re.compile(r"\b__global__ "), ""),
    (re.compile(r"\b__shared__ "), "static "),
]

# planted bugs: (what, old, new); each must make the emulation fail
PLANTS = [
    ("activation lane swap", "return 64*(kk/2) + 16*t + 4*(2*(kk % 2) + h) + p;",
     "return 64*(kk/2) + 16*t + 4*(2*(kk % 2) + h) + (p ^ 1);"),
    ("weight field row swap", "const int f  = 4*kk + 2*((G % 8) / 4) + r / 8;",
     "const int f  = 4*kk + 2*((G % 8) / 4) + (r / 8 ^ (G == 5));"),
    ("expert stride one tile short", "ida.expert_u4      = (int64_t) (src0->nb[2]/16);",
     "ida.expert_u4      = (int64_t) (src0->nb[2]/16) - STQ1_0_RP16_TILE_BYTES/16;"),
    ("ids row stride ignored", "ida.ids_stride     = (int64_t) (ids->nb[1]/sizeof(int32_t));",
     "ida.ids_stride     = ids->ne[0];"),
    # the unpack kernel (tiles staged in shared memory, rows written from shared memory)
    ("unpack staging without the swizzle", "tiles[stq1_0_rp16_unpack_swz(i)] = src[tile0*TU + min(i, nt*TU - 1)];",
     "tiles[i] = src[tile0*TU + min(i, nt*TU - 1)];"),
    ("unpack row group of the block's first tile", "out[threadIdx.x] = (tile / ntiles)*STQ1_0_RP16_ROWS*row_bytes",
     "out[threadIdx.x] = (tile0 / ntiles)*STQ1_0_RP16_ROWS*row_bytes"),
    ("unpack drops a straddling field's top bit", "if (bit % 32 > 27) {\n                        v |=",
     "if (bit % 32 > 28) {\n                        v |="),
    ("unpack scale byte bit", "d & 0xFFFF, 16);", "d & 0xFEFF, 16);"),
]


def _launches(code: str) -> str:
    """NAME<<<GRID, BLOCK, 0, STREAM>>>(ARGS); -> emu_launch(GRID, BLOCK, [&] { NAME(ARGS); });"""
    out, pos = [], 0
    while True:
        i = code.find("<<<", pos)
        if i < 0:
            out.append(code[pos:])
            return "".join(out)
        m = re.search(r"([A-Za-z_]\w*(?:<[^<>]*>)?)$", code[pos:i])
        name_start = pos + m.start(1)
        j = code.index(">>>", i)
        parts, depth, cur = [], 0, ""
        for ch in code[i + 3:j]:
            if ch == "," and depth == 0:
                parts.append(cur.strip())
                cur = ""
                continue
            depth += ch in "(["
            depth -= ch in ")]"
            cur += ch
        parts.append(cur.strip())
        assert code[j + 3] == "(", code[i:j + 20]
        k, depth = j + 3, 0
        while True:
            depth += code[k] == "("
            depth -= code[k] == ")"
            k += 1
            if depth == 0:
                break
        args = code[j + 4:k - 1]
        assert code[k] == ";", code[i:k + 5]
        out.append(code[pos:name_start])
        out.append(f"emu_launch({parts[0]}, {parts[1]}, [&] {{ {m.group(1)}({args}); }});")
        pos = k + 1


def rp16_code(tree: Path) -> str:
    cu = tree / "ggml" / "src" / "ggml-cuda"
    if not (cu / "stq1_0-rp16.cu").is_file():
        pytest.fail(f"{cu}/stq1_0-rp16.cu is missing (patch 0032 not applied?)")
    code = (cu / "stq1_0-rp16.cuh").read_text() + "\n" + (cu / "stq1_0-rp16.cu").read_text()
    for rx, repl in RULES:
        code = rx.sub(repl, code)
    code = _launches(code)
    left = re.findall(r".*(?:asm|<<<|__global__|__shared__).*", code)
    if left:
        pytest.fail(f"stq1_0-rp16: code without a host emulation in {__file__}: {left}")
    return code


@pytest.fixture(scope="module")
def tree(cpu_build):
    env = os.environ.get("STQ_CUDA_SRC_TREE")
    return Path(env) if env else source_tree(cpu_build)


def _build(tmp: Path, name: str, code: str, cpu_build: Path, tree: Path) -> Path:
    inc = tmp / f"{name}.inc"
    inc.write_text(code)
    exe = tmp / name
    lib = Path(cpu_build) / "bin"
    cmd = [cxx(), "-std=c++17", "-O2", "-w", f'-DSTQ_RP16_INC="{inc}"', f"-I{tree}/ggml/include",
           f"-I{tree}/ggml/src", str(DRIVER), "-o", str(exe), f"-L{lib}", "-lggml-base", f"-Wl,-rpath,{lib}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"compiling the emulated STQ1_0 RP16 code failed:\n{' '.join(cmd)}\n{r.stderr[-6000:]}"
    return exe


def _run(exe: Path, what: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GGML_CUDA_STQ1_0_REPACK"}  # the default policy is checked
    return subprocess.run([str(exe), what], capture_output=True, text=True, timeout=900, env=env)


def test_cuda_stq1_0_rp16_hostemu(tmp_path, cpu_build, tree):
    exe = _build(tmp_path, "rp16", rp16_code(tree), cpu_build, tree)
    r = _run(exe, "full")
    print(r.stdout.strip())
    assert r.returncode == 0 and r.stdout.rstrip().splitlines()[-1] == "OK", r.stdout + r.stderr


@pytest.mark.parametrize("plant", PLANTS, ids=[p[0] for p in PLANTS])
def test_cuda_stq1_0_rp16_hostemu_planted_bug_fails(tmp_path, cpu_build, tree, plant):
    what, old, new = plant
    code = rp16_code(tree)
    assert code.count(old) == 1, f"planted bug {what!r}: {old!r} not found once (the code changed: update the plant)"
    exe = _build(tmp_path, "rp16_plant", code.replace(old, new), cpu_build, tree)
    r = _run(exe, "quick")
    print(r.stdout.strip()[-2000:])
    assert r.returncode != 0 and "FAIL" in r.stdout, f"planted bug {what!r} was not caught:\n{r.stdout}"
