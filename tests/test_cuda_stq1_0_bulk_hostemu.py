"""The bulk-copy candidates of the STQ1_0 RP16 mat-vec (bench/stq1_0_repack/bulk_kernel.cuh, issue 17), emulated on
the host (CI has no GPU).

bulk_kernel.cuh (its CUDA primitives cut out between BK_CUDA_BEGIN and BK_CUDA_END) and stq1_0-rp16.cu{h,} of the
applied tree (or STQ_CUDA_SRC_TREE) are rewritten as for tests/test_cuda_stq1_0_rp16_hostemu.py and run under the fiber
emulation of cuda_hostemu/stq1_0_bulk_emu.cpp, whose cp.async.bulk / mbarrier / cp.async copies poison their
destination when issued and land only at the wait that covers them. Every candidate configuration of bench/stq1_0_repack/bulk.cu:
n = 1..8 columns against float64 with the kernel's quantized activations, bit-identical to its one-column products
and to the RP16 kernel (patch 0032) of the same K split; MUL_MAT_ID tokens against float64, each token alone and the
RP16 ids kernel. Planted bugs (no __syncwarp between cp.async.wait_group and the reads, a wrong barrier parity, a wrong
transaction byte count, one cp.async group too few waited for, the activation lane of the shared-memory copy off by
one, a weight word of block 1 taken from the wrong place) must make it fail. The real kernels run on the lent H200 (bulk.cu).
No library is linked: only the applied tree's headers and sources are needed.
"""
import os
import re
import subprocess
from pathlib import Path

import pytest

from stq_helpers import cxx
from test_cuda_stq1_0_rp16_hostemu import RULES, rp16_code

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DRIVER = HERE / "cuda_hostemu" / "stq1_0_bulk_emu.cpp"
KERNEL = ROOT / "bench" / "stq1_0_repack" / "bulk_kernel.cuh"

# planted bugs: (what, old statement, new statement); all are built into one binary, the statement chosen at run time
# (`quick K` runs plant K). Not plantable here: a missing __syncwarp before a stage is refilled (the shuffles of the
# emulated warp already order the lanes; on the GPU the __syncwarp + fence.proxy.async are needed, see bulk_kernel.cuh).
PLANTS = [
    ("no __syncwarp after cp.async.wait_group", "bk_cp_visible();", ";"),
    ("wrong barrier parity", "bk_mbar_wait(&bar[wy][j % S], (j / S) & 1);", "bk_mbar_wait(&bar[wy][j % S], (j / S + 1) & 1);"),
    ("wrong transaction bytes", "bk_mbar_expect_tx(b, STAGE_BYTES);", "bk_mbar_expect_tx(b, STAGE_BYTES - 16);"),
    ("one cp.async group too few waited for", "bk_cp_wait<S - 1>();", "bk_cp_wait<S>();"),
    ("activation lane in shared memory", "a4[c] = st[MT*BK_TILE_U4 + c*BK_ACT_U4 + 16*bl + 4*k4 + t];",
     "a4[c] = st[MT*BK_TILE_U4 + c*BK_ACT_U4 + 16*bl + 4*k4 + (t ^ 1)];"),
    ("weight word of block 1", "w[0] = c1[1];", "w[0] = c1[2];"),
]


def bulk_code() -> str:
    code = KERNEL.read_text()
    code, n = re.subn(r"// BK_CUDA_BEGIN\n.*?// BK_CUDA_END\n", "", code, flags=re.S)
    assert n == 1, f"{KERNEL}: the BK_CUDA_BEGIN/BK_CUDA_END section is missing"
    for rx, repl in RULES:
        code = rx.sub(repl, code)
    left = re.findall(r".*(?:asm|<<<|__global__|__shared__).*", code)
    assert not left, f"bulk_kernel.cuh: code without a host emulation: {left}"
    return code


@pytest.fixture(scope="module")
def tree(request):
    env = os.environ.get("STQ_CUDA_SRC_TREE")
    if env:
        return Path(env)
    from stq_helpers import source_tree
    return source_tree(request.getfixturevalue("cpu_build"))


def _build(tmp: Path, name: str, rp16: str, bulk: str, tree: Path) -> Path:
    inc_r, inc_b = tmp / f"{name}.rp16.inc", tmp / f"{name}.bulk.inc"
    inc_r.write_text(rp16)
    inc_b.write_text(bulk)
    exe = tmp / name
    cmd = [cxx(), "-std=c++17", "-O1", "-w", f'-DSTQ_RP16_INC="{inc_r}"', f'-DSTQ_BULK_INC="{inc_b}"',
           f"-I{tree}/ggml/include", f"-I{tree}/ggml/src", f"-I{HERE / 'cuda_hostemu'}", f"-I{KERNEL.parent}", str(DRIVER), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"compiling the emulated bulk kernels failed:\n{' '.join(cmd)}\n{r.stderr[-6000:]}"
    return exe


def _run(exe: Path, what: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), what], capture_output=True, text=True, timeout=900)


def test_cuda_stq1_0_bulk_hostemu(tmp_path, tree):
    exe = _build(tmp_path, "bulk", rp16_code(tree), bulk_code(), tree)
    r = _run(exe, "full")
    print(r.stdout.strip())
    assert r.returncode == 0 and r.stdout.rstrip().splitlines()[-1] == "OK", r.stdout + r.stderr


@pytest.fixture(scope="module")
def planted(tmp_path_factory, tree):
    code = bulk_code()
    for k, (what, old, new) in enumerate(PLANTS, 1):
        assert code.count(old) == 1, f"planted bug {what!r}: {old!r} not found once (the code changed: update the plant)"
        code = code.replace(old, f"if (g_plant == {k}) {{ {new} }} else {{ {old} }}")
    return _build(tmp_path_factory.mktemp("plant"), "bulk_plant", rp16_code(tree), code, tree)


@pytest.mark.parametrize("k", range(1, len(PLANTS) + 1), ids=[p[0] for p in PLANTS])
def test_cuda_stq1_0_bulk_hostemu_planted_bug_fails(planted, k):
    r = subprocess.run([str(planted), "quick", str(k)], capture_output=True, text=True, timeout=900)
    print(r.stdout.strip()[-3000:])
    assert r.returncode != 0 and "FAIL" in r.stdout, f"planted bug {PLANTS[k - 1][0]!r} was not caught:\n{r.stdout}"


def test_cuda_stq1_0_bulk_hostemu_plant_off_passes(planted):
    """The planted binary with no plant chosen passes (the plants are what fails)."""
    r = subprocess.run([str(planted), "quick", "0"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and r.stdout.rstrip().splitlines()[-1] == "OK", r.stdout + r.stderr
