"""Compare a build's STQ1_0 quantizer/dequantizer with the numpy reference and print the figures.

    python -m harness.stq1_0_check BUILD_DIR [--rows 6144 --cols 2048 --seed 1 --repeat 3]

Prints times (median of --repeat), the share of bit-identical blocks, RMSE of both quantizers and
of the d = amax baseline, and the same agreement with a random importance matrix.  The tests
(tests/test_stq1_0_ctypes.py) assert on the same quantities; this reports them for NOTES.md.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from . import stq1_0 as S
from .ggml import GGML


def _median_time(f, n):
    ts, r = [], None
    for _ in range(n):
        t = time.perf_counter()
        r = f()
        ts.append(time.perf_counter() - t)
    return r, sorted(ts)[len(ts) // 2]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="stq1_0_check", description=__doc__.split("\n")[0])
    p.add_argument("build", help="llama.cpp build dir with the STQ1_0 patches (shared libs under bin/)")
    p.add_argument("--rows", type=int, default=6144, help="matrix rows (default 6144)")
    p.add_argument("--cols", type=int, default=2048, help="matrix columns, a multiple of 256 (default 2048)")
    p.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    p.add_argument("--repeat", type=int, default=3, help="timing repetitions, the median is printed (default 3)")
    a = p.parse_args(argv)
    lib = GGML(a.build)
    if not lib.has_stq1_0():
        p.error(f"{a.build}: this build has no STQ1_0")
    t = S.TYPE_ID
    rng = np.random.default_rng(a.seed)
    x = rng.standard_normal((a.rows, a.cols)).astype(np.float32)
    qn, tn = _median_time(lambda: S.encode(x), a.repeat)
    qc, tc = _median_time(lambda: lib.quantize(t, x), a.repeat)
    _, td = _median_time(lambda: S.decode(qn), a.repeat)
    _, tdc = _median_time(lambda: lib.dequantize(t, qn), a.repeat)
    same = (qn.reshape(-1, S.BLOCK_BYTES) == qc.reshape(-1, S.BLOCK_BYTES)).all(axis=1)
    print(f"{a.rows}x{a.cols} N(0,1) seed {a.seed}")
    print(f"time: encode numpy {tn:.2f} s, C {tc:.3f} s; decode numpy {td:.3f} s, C {tdc:.3f} s")
    print(f"plain: identical blocks {same.sum()}/{same.size}; RMSE numpy "
          f"{np.sqrt(S.weighted_error(x, qn) / x.size):.5f}, C {np.sqrt(S.weighted_error(x, qc) / x.size):.5f}")
    amax = np.abs(x.reshape(-1, S.QK)).max(axis=1)
    print(f"baseline d = amax: RMSE {np.sqrt(S.weighted_error(x, S.encode_with_scale(x, amax)) / x.size):.5f}")
    w = rng.uniform(0.05, 5.0, a.cols)
    qn, qc = S.encode(x, w), lib.quantize(t, x, w)
    same = (qn.reshape(-1, S.BLOCK_BYTES) == qc.reshape(-1, S.BLOCK_BYTES)).all(axis=1)
    en, ec = S.weighted_error(x, qn, w), S.weighted_error(x, qc, w)
    print(f"imatrix U(0.05,5): identical blocks {same.sum()}/{same.size}; weighted error C/numpy - 1 = {ec / en - 1:.2e}")
    lib.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
