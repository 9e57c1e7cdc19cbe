"""A float32 model of the accumulation order of the STQ1_0 Metal mat-vec kernels.

kernel_mul_mv_stq1_0_f32_impl (patch 0020, kernels/mul_mv.metal) documents its order; this module
computes the same thing in numpy with one IEEE float32 rounding per operation, so a kernel run on
metal-emu (no fast math) must reproduce it bit for bit.  ``perturb`` computes the same dot product
with a different (equally valid) order, which must NOT reproduce it: that shows the bitwise tests
are able to see an accumulation-order change.

Order per src1 column (lane = 8*ix + il, ix = block of the iteration, il = 8 groups of the block):
  group  t = ((+-y_a) + (+-y_b)) + (+-y_c)          the three non-zero lanes of the group
  half   h = (t_0 + t_1) + (t_2 + t_3)              groups 8*il + 4*h' + 0..3
  block  b = h_0 + h_1
  lane   s = fma(d, b, s)                           blocks ix, ix + 4, ix + 8, ...
  row      = shuffle-down tree over the 32 lanes (offsets 16, 8, 4, 2, 1), lane 0
"""

from __future__ import annotations

import numpy as np

from harness import stq1_0

F32 = np.float32
PERTURBATIONS = ("group_right_assoc", "half_sequential", "lane_plain_mul_add", "tree_xor")


def fma_f32(a, b, c) -> np.ndarray:
    """Correctly rounded float32 fma(a, b, c) (a*b is exact in float64; the sum is rounded once
    to float64 and the double rounding to float32 is repaired with the exact error of that sum)."""
    a64, b64, c64 = (np.asarray(v, dtype=np.float32).astype(np.float64) for v in (a, b, c))
    p = a64 * b64
    s = p + c64
    bb = s - p
    e = (p - (s - bb)) + (c64 - bb)  # s + e == p + c exactly
    r = s.astype(np.float32)
    r64 = r.astype(np.float64)
    toward = np.where(s > r64, np.float32(np.inf), np.float32(-np.inf)).astype(np.float32)
    nxt = np.nextafter(r, toward).astype(np.float64)
    tie = (s != r64) & (s == (r64 + nxt) / 2) & (e != 0)
    # at an exact float32 midpoint of s the sign of e decides; away from r when e points there
    away = np.sign(e) == np.sign(s - r64)
    fixed = np.where(tie & away, nxt, np.where(tie, r64, r64))
    return fixed.astype(np.float32)


def _signed(y, m):
    return np.where(m, -y, y).astype(F32)


def model(blocks, x, perturb: str | None = None) -> np.ndarray:
    """y[r] = sum_k W[r, k] * x[k] for STQ1_0 rows ``blocks`` ((M, nb*42) uint8), ``x`` (K,) float32,
    in the kernel's order (or a perturbed one).  Returns (M,) float32."""
    if perturb is not None and perturb not in PERTURBATIONS:
        raise ValueError(f"unknown perturbation {perturb!r}")
    blocks = np.asarray(blocks, dtype=np.uint8)
    M = blocks.shape[0]
    nb = blocks.shape[1] // stq1_0.BLOCK_BYTES
    codes, sbits, d = stq1_0.unpack_blocks(blocks.reshape(-1))
    codes = codes.reshape(M, nb, 8, 2, 4).astype(np.int32)   # [row, block, il, h, k]: group 8*il + 4*h + k
    sbits = sbits.reshape(M, nb, 8, 2, 4).astype(bool)
    d = d.astype(F32).reshape(M, nb)

    x = np.asarray(x, dtype=F32).reshape(nb, 256)
    il = np.arange(8)[:, None, None, None]
    h = np.arange(2)[None, :, None, None]
    k = np.arange(4)[None, None, :, None]
    p = np.arange(4)[None, None, None, :]
    pos = 64 * (il // 2) + 8 * (il % 2) + 4 * h + k + 16 * p        # (8, 2, 4, 4)
    y = x[:, pos]                                                    # (nb, 8, 2, 4, 4) lanes p last
    y = np.broadcast_to(y, (M,) + y.shape)

    z = codes >> 2
    ya = np.where(z == 0, y[..., 1], y[..., 0])
    yb = np.where(z <= 1, y[..., 2], y[..., 1])
    yc = np.where(z <= 2, y[..., 3], y[..., 2])
    ya = _signed(ya, sbits)
    yb = _signed(yb, sbits ^ ((codes & 1) == 1))
    yc = _signed(yc, sbits ^ (((codes >> 1) & 1) == 1))

    if perturb == "group_right_assoc":
        t = ya + (yb + yc)
    else:
        t = (ya + yb) + yc                                            # (M, nb, 8, 2, 4)
    if perturb == "half_sequential":
        hs = ((t[..., 0] + t[..., 1]) + t[..., 2]) + t[..., 3]
    else:
        hs = (t[..., 0] + t[..., 1]) + (t[..., 2] + t[..., 3])      # (M, nb, 8, 2)
    bs = hs[..., 0] + hs[..., 1]                                      # (M, nb, 8)

    lanes = np.zeros((M, 4, 8), dtype=F32)                            # [row, ix, il]
    for ib in range(nb):
        ix = ib % 4
        if perturb == "lane_plain_mul_add":
            lanes[:, ix, :] = (d[:, ib, None] * bs[:, ib, :]).astype(F32) + lanes[:, ix, :]
        else:
            lanes[:, ix, :] = fma_f32(d[:, ib, None], bs[:, ib, :], lanes[:, ix, :])
    v = lanes.reshape(M, 32)                                          # lane = 8*ix + il
    if perturb == "tree_xor":
        for off in (1, 2, 4, 8, 16):
            v = (v + v[:, np.arange(32) ^ off]).astype(F32)
    else:
        for off in (16, 8, 4, 2, 1):
            src = np.minimum(np.arange(32) + off, 31)
            shifted = np.where(np.arange(32) + off < 32, v[:, src], v)
            v = (v + shifted).astype(F32)
    return v[:, 0].copy()
