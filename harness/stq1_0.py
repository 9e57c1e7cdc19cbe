"""Independent numpy reference of the STQ1_0 quantization type.

Written from the format facts only (shared/reference/FACTS.md, "STQ1_0"), not from any C code,
so that it can serve as a second oracle for the ggml implementation.

Format summary (all numbers are facts of the published format):

* a block holds 256 weights in 42 bytes: ``qs[32]`` (one 4-bit code per group of 4 weights,
  low nibble = even group), ``sign[8]`` (one bit per group, LSB first), ``fp16 d`` at byte 40;
* 64 groups per block; lane ``p`` (0..3) of group ``g`` is weight
  ``(g // 16) * 64 + g % 16 + 16 * p`` of the block (stride 16 inside each 64-weight chunk);
* ``CODEBOOK[(sign_bit << 4) | code]`` is a pattern byte whose bits ``2p..2p+1`` hold lane ``p``
  as ``0b00 = -1``, ``0b01 = 0``, ``0b10 = +1``; weight = lane value * d.

Every group has exactly one zero lane.  The encoder (:func:`encode`) is a post-training
quantizer: for a fixed scale it zeroes, per group, the lane whose zeroing costs least and gives the
other lanes the sign of the input; for a fixed selection it takes the weighted least-squares scale
``d = sum(w*q*x) / sum(w*q*q)``; it alternates the two a few rounds and keeps the best (by
weighted squared error) of everything it tried.  ``w`` are optional per-column importance weights
(an imatrix row), all ones by default.

The codebook is defined once, here, for the Python side; every other table below is derived from
it.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "QK",
    "BLOCK_BYTES",
    "GROUPS",
    "TYPE_ID",
    "TYPE_NAME",
    "CODEBOOK",
    "LANE_VALUES",
    "GROUP_INDEX",
    "row_bytes",
    "pack_blocks",
    "unpack_blocks",
    "blocks_from_ternary",
    "ternary_from_blocks",
    "decode",
    "encode",
    "encode_with_scale",
    "weighted_error",
]

#: weights per block
QK = 256
#: bytes per block: 32 code bytes + 8 sign bytes + fp16 scale
BLOCK_BYTES = 42
#: groups of 4 weights per block
GROUPS = QK // 4
#: ggml type id (GGML_TYPE_STQ1_0) and name
TYPE_ID = 43
TYPE_NAME = "stq1_0"

_QS_OFF, _SIGN_OFF, _D_OFF = 0, 32, 40

#: the 32-byte codebook, index (sign_bit << 4) | code
CODEBOOK = np.frombuffer(
    bytes.fromhex(
        "a9 89 29 09 a6 86 26 06 9a 92 1a 12 6a 62 4a 42"  # sign bit 0
        "01 21 81 a1 04 24 84 a4 10 18 90 98 40 48 60 68"  # sign bit 1
    ),
    dtype=np.uint8,
)
CODEBOOK.flags.writeable = False


def _derive_lane_values() -> np.ndarray:
    p = np.arange(4)
    v = ((CODEBOOK[:, None].astype(np.int16) >> (2 * p)) & 3) - 1
    return v.astype(np.int8)


#: (32, 4) int8: lane values in {-1, 0, +1} of each codebook entry
LANE_VALUES = _derive_lane_values()
LANE_VALUES.flags.writeable = False


def _derive_group_index() -> np.ndarray:
    g = np.arange(GROUPS)[:, None]
    p = np.arange(4)[None, :]
    return ((g // 16) * 64 + (g % 16) + 16 * p).astype(np.intp)


#: (64, 4): position inside the block of lane p of group g
GROUP_INDEX = _derive_group_index()
GROUP_INDEX.flags.writeable = False
_GROUP_INDEX_FLAT = GROUP_INDEX.reshape(-1)


def _derive_pattern_to_index() -> np.ndarray:
    # pattern byte (lane p = v+1 at bits 2p) -> codebook index, -1 where not a valid pattern
    inv = np.full(256, -1, dtype=np.int16)
    inv[CODEBOOK] = np.arange(CODEBOOK.size, dtype=np.int16)
    return inv


_PATTERN_TO_INDEX = _derive_pattern_to_index()
_LANE_SHIFTS = (2 * np.arange(4)).astype(np.uint8)

_FP16_MAX = float(np.finfo(np.float16).max)


def row_bytes(n: int) -> int:
    """Bytes of ``n`` weights stored as STQ1_0 (``n`` must be a multiple of 256)."""
    if n % QK:
        raise ValueError(f"STQ1_0 needs a multiple of {QK} weights, got {n}")
    return n // QK * BLOCK_BYTES


def _as_blocks(blocks) -> np.ndarray:
    if isinstance(blocks, (bytes, bytearray, memoryview)):
        a = np.frombuffer(blocks, dtype=np.uint8)
    else:
        a = np.asarray(blocks)
        if a.dtype != np.uint8:
            raise TypeError(f"STQ1_0 blocks must be uint8 bytes, got dtype {a.dtype}")
        a = a.reshape(-1)
    if a.size % BLOCK_BYTES:
        raise ValueError(f"STQ1_0 data of {a.size} bytes is not a whole number of {BLOCK_BYTES}-byte blocks")
    return a.reshape(-1, BLOCK_BYTES)


# ---------------------------------------------------------------------------------------------
# block packing


def pack_blocks(codes, sign_bits, d) -> np.ndarray:
    """Build blocks from per-group fields.

    ``codes``: (nb, 64) ints 0..15; ``sign_bits``: (nb, 64) 0/1; ``d``: (nb,) scales (anything
    convertible to fp16; an array of dtype float16 is taken bit for bit).  Returns (nb, 42) uint8.
    """
    codes = np.asarray(codes)
    sign_bits = np.asarray(sign_bits)
    if codes.ndim != 2 or codes.shape[1] != GROUPS or sign_bits.shape != codes.shape:
        raise ValueError(f"codes and sign_bits must be (nb, {GROUPS}), got {codes.shape} and {sign_bits.shape}")
    if codes.size and (codes.min() < 0 or codes.max() > 15):
        raise ValueError("codes must be in 0..15")
    if sign_bits.size and (sign_bits.min() < 0 or sign_bits.max() > 1):
        raise ValueError("sign bits must be 0 or 1")
    nb = codes.shape[0]
    d = np.asarray(d)
    d16 = d.astype(np.float16) if d.dtype != np.float16 else d
    d16 = np.broadcast_to(d16.reshape(-1) if d16.ndim else d16, (nb,))
    out = np.empty((nb, BLOCK_BYTES), dtype=np.uint8)
    c = codes.astype(np.uint8)
    out[:, _QS_OFF:_SIGN_OFF] = c[:, 0::2] | (c[:, 1::2] << 4)
    out[:, _SIGN_OFF:_D_OFF] = np.packbits(sign_bits.astype(np.uint8), axis=1, bitorder="little")
    out[:, _D_OFF:] = np.ascontiguousarray(d16, dtype="<f2").view(np.uint8).reshape(nb, 2)
    return out


def unpack_blocks(blocks):
    """Inverse of :func:`pack_blocks`: returns ``(codes (nb,64) uint8, sign_bits (nb,64) uint8,
    d (nb,) float16)``."""
    b = _as_blocks(blocks)
    qs = b[:, _QS_OFF:_SIGN_OFF]
    codes = np.stack([qs & 0x0F, qs >> 4], axis=-1).reshape(-1, GROUPS)
    sign_bits = np.unpackbits(b[:, _SIGN_OFF:_D_OFF], axis=1, bitorder="little")
    d = np.ascontiguousarray(b[:, _D_OFF:]).view("<f2").reshape(-1)
    return codes, sign_bits, d


def blocks_from_ternary(t, d) -> np.ndarray:
    """Blocks from ternary weights ``t`` ((nb, 256) or (nb*256,) values in {-1, 0, +1}, in weight
    order, exactly one zero per group) and scales ``d`` (nb,).  Raises ValueError for groups that
    the codebook cannot express."""
    t = np.asarray(t).reshape(-1, QK)
    lanes = t[:, GROUP_INDEX].astype(np.int16)  # (nb, 64, 4)
    if lanes.size and (lanes.min() < -1 or lanes.max() > 1):
        raise ValueError("ternary values must be -1, 0 or +1")
    pattern = ((lanes + 1).astype(np.uint8) << _LANE_SHIFTS).sum(axis=-1, dtype=np.uint8)
    idx = _PATTERN_TO_INDEX[pattern]
    if (idx < 0).any():
        blk, grp = np.argwhere(idx < 0)[0]
        raise ValueError(
            f"block {blk} group {grp}: lanes {lanes[blk, grp].tolist()} do not have exactly one zero lane"
        )
    idx = idx.astype(np.uint8)
    return pack_blocks(idx & 0x0F, idx >> 4, d)


def ternary_from_blocks(blocks):
    """(nb, 256) int8 ternary weights in weight order, and the (nb,) float16 scales."""
    codes, sign_bits, d = unpack_blocks(blocks)
    lanes = LANE_VALUES[(sign_bits << 4) | codes]  # (nb, 64, 4)
    t = np.empty((lanes.shape[0], QK), dtype=np.int8)
    t[:, _GROUP_INDEX_FLAT] = lanes.reshape(-1, QK)
    return t, d


# ---------------------------------------------------------------------------------------------
# decode


def decode(blocks) -> np.ndarray:
    """Dequantize STQ1_0 data (bytes or uint8 array, a whole number of blocks) to a flat float32
    array of ``nb * 256`` weights.  ``weight = float32(lane) * float32(d)``."""
    t, d = ternary_from_blocks(blocks)
    return (t.astype(np.float32) * d.astype(np.float32)[:, None]).reshape(-1)


# ---------------------------------------------------------------------------------------------
# encode


def _fp16_scale(d: np.ndarray) -> np.ndarray:
    return np.minimum(d, _FP16_MAX).astype(np.float16)


class _Lanes:
    """One chunk of blocks in lane-major layout: ``ax[p, b*64 + g]`` is |x| of lane p of group g
    of block b (so that per-lane work is element-wise on contiguous arrays)."""

    def __init__(self, xb: np.ndarray, wb: np.ndarray | None):
        nb = xb.shape[0]
        self.nb = nb
        xl = xb[:, GROUP_INDEX].transpose(2, 0, 1).reshape(4, nb * GROUPS)  # (4, G)
        self.neg = xl < 0
        self.ax = np.abs(xl)
        if wb is None:
            self.w = None
            self.wax = self.ax
            self.wsum = None
            a = (self.ax * self.ax).reshape(4, nb, GROUPS).sum(axis=(0, 2))
        else:
            self.w = wb[:, GROUP_INDEX].transpose(2, 0, 1).reshape(4, nb * GROUPS)
            self.wax = self.w * self.ax
            a = (self.wax * self.ax).reshape(4, nb, GROUPS).sum(axis=(0, 2))
        self.sq = a  # per block sum of w*x^2

    def select(self, d: np.ndarray) -> np.ndarray:
        """Zero lane of every group for per-block scales ``d`` >= 0: the lane whose zeroing costs
        least, cost(zero z) - cost(z = sign*d) = w_z * d * (2|x_z| - d); ties go to the smaller
        |x|, then to the lower lane (so the choice does not depend on d where costs tie)."""
        dg = np.repeat(d, GROUPS)
        ax = self.ax
        cost = (2.0 * ax - dg) * dg
        if self.w is not None:
            cost *= self.w
        z = np.zeros(ax.shape[1], dtype=np.int8)
        bc, ba = cost[0].copy(), ax[0].copy()
        for p in range(1, 4):
            better = (cost[p] < bc) | ((cost[p] == bc) & (ax[p] < ba))
            z[better] = p
            np.copyto(bc, cost[p], where=better)
            np.copyto(ba, ax[p], where=better)
        return z

    def sums(self, z: np.ndarray):
        """Per block: sum(w*q*x) and sum(w*q*q) for the selection ``z`` (q = +-1 off the zero lane)."""
        nz = np.arange(4, dtype=np.int8)[:, None] != z[None, :]
        num = np.where(nz, self.wax, 0.0).reshape(4, self.nb, GROUPS).sum(axis=(0, 2))
        if self.w is None:
            den = np.full(self.nb, 3.0 * GROUPS)
        else:
            den = np.where(nz, self.w, 0.0).reshape(4, self.nb, GROUPS).sum(axis=(0, 2))
        return num, den

    def scale_and_error(self, z: np.ndarray):
        """Least-squares fp16 scale for selection ``z`` and the weighted error it gives."""
        num, den = self.sums(z)
        with np.errstate(invalid="ignore", divide="ignore"):
            d = np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)
        d16 = _fp16_scale(np.maximum(d, 0.0))
        dd = d16.astype(np.float64)
        return d16, self.sq - 2.0 * dd * num + dd * dd * den

    def blocks(self, z: np.ndarray, d16: np.ndarray) -> np.ndarray:
        # lane code (q + 1): 1 on the zero lane, 0 / 2 for negative / positive lanes
        lane = np.where(self.neg, 0, 2).astype(np.uint8)
        lane[z, np.arange(z.size)] = 1
        pattern = (lane << _LANE_SHIFTS[:, None]).sum(axis=0, dtype=np.uint8)
        idx = _PATTERN_TO_INDEX[pattern].astype(np.uint8).reshape(self.nb, GROUPS)
        return pack_blocks(idx & 0x0F, idx >> 4, d16)


def _grouped(x: np.ndarray, imatrix, name: str = "x"):
    x = np.asarray(x)
    if x.ndim == 0:
        raise ValueError(f"{name} must have at least one dimension")
    n_per_row = x.shape[-1]
    if n_per_row % QK:
        raise ValueError(f"STQ1_0 rows must be a multiple of {QK} weights, got rows of {n_per_row}")
    xf = x.reshape(-1, n_per_row)
    if not np.isfinite(xf).all():
        raise ValueError(f"{name} contains non-finite values")
    if imatrix is None:
        w = None
    else:
        w = np.asarray(imatrix, dtype=np.float64).reshape(-1)
        if w.size != n_per_row:
            raise ValueError(f"imatrix has {w.size} values, rows have {n_per_row}")
        if not np.isfinite(w).all() or (w < 0).any():
            raise ValueError("imatrix must be finite and non-negative")
    return x.shape, xf, w


def _chunks(xf: np.ndarray, w, max_blocks: int = 1 << 13):
    """(x blocks float64 (nb, 256), weight blocks or None) in chunks of whole rows."""
    nrows, n_per_row = xf.shape
    rows_per = max(1, max_blocks * QK // n_per_row)
    for r0 in range(0, nrows, rows_per):
        r1 = min(nrows, r0 + rows_per)
        xb = xf[r0:r1].astype(np.float64).reshape(-1, QK)
        if w is None:
            yield xb, None
            continue
        wb = np.broadcast_to(w, (r1 - r0, n_per_row)).reshape(-1, QK)
        # a block whose importance is all zero falls back to uniform weights
        dead = wb.sum(axis=1) <= 0
        if dead.any():
            wb = wb.copy()
            wb[dead] = 1.0
        yield xb, wb


def _out_shape(shape):
    return tuple(shape[:-1]) + (shape[-1] // QK * BLOCK_BYTES,)


def encode(x, imatrix=None, rounds: int = 4) -> np.ndarray:
    """Quantize ``x`` (..., n_per_row), n_per_row a multiple of 256, to STQ1_0.

    ``imatrix``: optional non-negative importance of each column (n_per_row values).
    ``rounds``: alternations of (selection for fixed scale, least-squares scale for fixed
    selection) after the initial selection; the best (weighted squared error, fp16 scale) of
    all candidates is kept.  Returns uint8 of shape (..., n_per_row/256*42).
    """
    if rounds < 0:
        raise ValueError("rounds must be >= 0")
    shape, xf, w = _grouped(x, imatrix)
    parts = []
    for xb, wb in _chunks(xf, w):
        L = _Lanes(xb, wb)
        # initial selection: the limit d -> 0+, i.e. zero the lane of smallest w*|x|
        z = L.select(np.full(L.nb, 1e-30))
        d16, err = L.scale_and_error(z)
        best_z, best_d, best_err = z, d16, err
        for _ in range(rounds):
            z = L.select(d16.astype(np.float64))
            d16, err = L.scale_and_error(z)
            better = err < best_err
            if not better.any():
                break
            bg = np.repeat(better, GROUPS)
            best_z = np.where(bg, z, best_z)
            best_d = np.where(better, d16, best_d)
            best_err = np.where(better, err, best_err)
        parts.append(L.blocks(best_z, best_d))
    out = np.concatenate(parts) if parts else np.empty((0, BLOCK_BYTES), np.uint8)
    return out.reshape(_out_shape(shape))


def encode_with_scale(x, d, imatrix=None) -> np.ndarray:
    """Quantize with given per-block scales ``d`` (one per 256 weights, >= 0, rounded to fp16);
    only the selection is optimized.  ``encode_with_scale(x, amax)`` is the naive baseline."""
    shape, xf, w = _grouped(x, imatrix)
    d16 = _fp16_scale(np.abs(np.asarray(d, dtype=np.float64)).reshape(-1))
    if d16.size != xf.size // QK:
        raise ValueError(f"need one scale per block ({xf.size // QK}), got {d16.size}")
    parts, ob = [], 0
    for xb, wb in _chunks(xf, w):
        L = _Lanes(xb, wb)
        dd = d16[ob:ob + L.nb]
        parts.append(L.blocks(L.select(dd.astype(np.float64)), dd))
        ob += L.nb
    out = np.concatenate(parts) if parts else np.empty((0, BLOCK_BYTES), np.uint8)
    return out.reshape(_out_shape(shape))


def weighted_error(x, blocks, imatrix=None) -> float:
    """Sum over all weights of ``imatrix[col] * (x - decode(blocks))**2`` in float64."""
    x = np.asarray(x, dtype=np.float64)
    y = decode(blocks).astype(np.float64).reshape(x.shape)
    r2 = (x - y) ** 2
    if imatrix is not None:
        r2 = r2 * np.asarray(imatrix, dtype=np.float64)
    return float(r2.sum())
