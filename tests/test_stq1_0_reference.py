"""The numpy STQ1_0 reference against the format facts (no build needed).

The expected weights here are computed from the *meaning* of a code as the fact sheet states it
(zero lane, first non-zero lane +1, tail bits = signs of the 2nd/3rd non-zero lanes, the sign bit
negates all), not from the codebook bytes, so a wrong codebook byte, nibble order, sign-bit order or
lane mapping fails.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from harness import stq1_0 as S


def lanes_from_meaning(sbit: int, code: int) -> list[int]:
    zero = code >> 2
    tail = code & 3
    lanes, k = [], 0
    for p in range(4):
        if p == zero:
            lanes.append(0)
            continue
        v = 1 if k == 0 else (-1 if (tail >> (k - 1)) & 1 else 1)
        lanes.append(-v if sbit else v)
        k += 1
    return lanes


def weight_index(g: int, p: int) -> int:
    return (g // 16) * 64 + (g % 16) + 16 * p


def hand_block(idx_of_group, d: float) -> bytes:
    b = bytearray(42)
    for g, idx in enumerate(idx_of_group):
        code, sbit = idx & 15, idx >> 4
        b[g // 2] |= code << (4 * (g % 2))
        b[32 + g // 8] |= sbit << (g % 8)
    b[40:42] = struct.pack("<e", d)
    return bytes(b)


def test_constants():
    assert (S.QK, S.BLOCK_BYTES, S.GROUPS, S.TYPE_ID, S.TYPE_NAME) == (256, 42, 64, 43, "stq1_0")
    assert S.row_bytes(6144) == 6144 // 256 * 42
    with pytest.raises(ValueError):
        S.row_bytes(100)


def test_codebook_matches_meaning():
    enc = {-1: 0, 0: 1, 1: 2}
    for idx in range(32):
        lanes = lanes_from_meaning(idx >> 4, idx & 15)
        expect = sum(enc[v] << (2 * p) for p, v in enumerate(lanes))
        assert S.CODEBOOK[idx] == expect, f"codebook[{idx}]"
        assert S.LANE_VALUES[idx].tolist() == lanes
    # the sign=1 half is byte-wise 0xAA - pattern of the sign=0 half
    assert ((0xAA - S.CODEBOOK[:16].astype(int)) == S.CODEBOOK[16:]).all()
    # 32 distinct patterns, each with exactly one zero lane
    assert len(set(S.CODEBOOK.tolist())) == 32
    assert ((S.LANE_VALUES == 0).sum(axis=1) == 1).all()


@pytest.mark.parametrize("d", [1.0, -0.75, 0.0009765625, 3.5e4])
def test_hand_built_blocks_every_pattern_nibble_and_sign_bit(d):
    # block k gives group g pattern (g + k) % 32: over 32 blocks every group (both nibbles of
    # every qs byte, every bit of every sign byte) carries every one of the 32 patterns
    blocks, expect = b"", []
    for k in range(32):
        idxs = [(g + k) % 32 for g in range(64)]
        blocks += hand_block(idxs, d)
        w = [None] * 256
        for g, idx in enumerate(idxs):
            for p, v in enumerate(lanes_from_meaning(idx >> 4, idx & 15)):
                w[weight_index(g, p)] = np.float32(v) * np.float32(np.float16(d))
        expect += w
    got = S.decode(blocks)
    assert got.dtype == np.float32 and got.shape == (32 * 256,)
    np.testing.assert_array_equal(got, np.array(expect, dtype=np.float32))
    # also from a uint8 array of any shape
    np.testing.assert_array_equal(S.decode(np.frombuffer(blocks, np.uint8).reshape(32, 42)), got)


def test_pack_unpack_roundtrip():
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 16, (9, 64))
    sbits = rng.integers(0, 2, (9, 64))
    d = rng.standard_normal(9).astype(np.float16)
    b = S.pack_blocks(codes, sbits, d)
    assert b.shape == (9, 42)
    c2, s2, d2 = S.unpack_blocks(b)
    assert (c2 == codes).all() and (s2 == sbits).all() and (d2.view(np.uint16) == d.view(np.uint16)).all()
    # ternary round trip
    t, dd = S.ternary_from_blocks(b)
    assert (S.blocks_from_ternary(t, dd) == b).all()


def test_blocks_from_ternary_rejects_bad_groups():
    t = np.ones((1, 256), dtype=np.int8)  # no zero lane anywhere
    with pytest.raises(ValueError, match="block 0 group 0"):
        S.blocks_from_ternary(t, [1.0])


def test_decode_rejects_partial_blocks():
    with pytest.raises(ValueError):
        S.decode(b"\0" * 43)


def group_lanes(y: np.ndarray) -> np.ndarray:
    """(nb, 64, 4) lanes of weights, by the fact-sheet index formula."""
    y = y.reshape(-1, 256)
    idx = np.array([[weight_index(g, p) for p in range(4)] for g in range(64)])
    return y[:, idx]


SHAPES = [(1, 256), (3, 768), (7, 512), (2, 2048), (5, 6144)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("use_imatrix", [False, True])
def test_encode_invariants(shape, use_imatrix):
    rng = np.random.default_rng(hash((shape, use_imatrix)) % 2**32)
    x = rng.standard_normal(shape).astype(np.float32) * rng.uniform(0.01, 10)
    im = rng.uniform(0.0, 4.0, shape[1]) ** 2 if use_imatrix else None
    b = S.encode(x, imatrix=im)
    assert b.shape == shape[:-1] + (shape[-1] // 256 * 42,) and b.dtype == np.uint8
    t, d = S.ternary_from_blocks(b)
    # exactly one zero lane per group, scales finite and positive for random data
    assert ((group_lanes(t) == 0).sum(axis=-1) == 1).all()
    assert np.isfinite(d.astype(np.float32)).all() and (d > 0).all()
    y = S.decode(b).reshape(shape)
    # re-encoding the decoded weights reproduces the bytes (with and without importance weights)
    assert (S.encode(y, imatrix=im) == b).all()
    assert (S.encode(y) == b).all()
    # PTQ beats d = amax in weighted error
    amax = np.abs(x.reshape(-1, 256)).max(axis=1)
    e_ptq = S.weighted_error(x, b, im)
    e_amax = S.weighted_error(x, S.encode_with_scale(x, amax, imatrix=im), im)
    assert e_ptq < e_amax


def test_uniform_weights_zero_the_smallest_lane_and_use_least_squares_scale():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 1024))
    b = S.encode(x)
    t, d = S.ternary_from_blocks(b)
    xl, tl = group_lanes(x), group_lanes(t)
    assert (np.argmin(np.abs(xl), axis=-1) == np.argmin(np.abs(tl), axis=-1)).all()
    nz = tl != 0
    assert (np.sign(xl[nz]) == tl[nz]).all()
    ls = (np.abs(xl) * nz).sum(axis=(1, 2)) / nz.sum(axis=(1, 2))
    np.testing.assert_array_equal(d, ls.astype(np.float16))


def test_scale_is_least_squares_optimal_among_fp16_neighbours():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 512))
    im = rng.uniform(0.1, 3.0, 512)
    b = S.encode(x, imatrix=im)
    t, d = S.ternary_from_blocks(b)
    t = t.astype(np.float64).reshape(x.shape[0], -1)
    dd = np.repeat(d.astype(np.float64), 256).reshape(x.shape)
    base = (im * (x - t * dd) ** 2).reshape(-1, 256).sum(axis=1)
    for step in (-1, 1):
        dn = (d.view(np.uint16).astype(np.int32) + step).astype(np.uint16).view(np.float16).astype(np.float64)
        other = (im * (x - t * np.repeat(dn, 256).reshape(x.shape)) ** 2).reshape(-1, 256).sum(axis=1)
        assert (base <= other).all()


def test_all_zero_block():
    x = np.zeros((2, 512), dtype=np.float32)
    b = S.encode(x)
    t, d = S.ternary_from_blocks(b)
    assert (d == 0).all()
    assert ((group_lanes(t) == 0).sum(axis=-1) == 1).all()
    assert (S.decode(b) == 0).all()
    assert (S.encode(S.decode(b).reshape(x.shape)) == b).all()
    assert (S.encode(x, imatrix=np.ones(512)) == b).all()


@pytest.mark.parametrize("big", [7.0, -300.0, 1e6])
def test_single_outlier_block(big):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(256) * 1e-3).astype(np.float32)
    x[77] = big
    b = S.encode(x)
    t, d = S.ternary_from_blocks(b)
    d = float(d[0])
    assert np.isfinite(d) and 0 < d <= 65504.0
    assert t[0, 77] == np.sign(big)
    y = S.decode(b)
    assert np.isfinite(y).all()
    assert S.weighted_error(x, b) < S.weighted_error(x, S.encode_with_scale(x, [abs(big)]))
    assert (S.encode(y) == b).all()
    # all-zero row with one outlier
    z = np.zeros(256)
    z[5] = big
    bz = S.encode(z)
    tz, dz = S.ternary_from_blocks(bz)
    assert tz[0, 5] == np.sign(big) and np.isfinite(float(dz[0]))


def test_encode_rejects_bad_input():
    with pytest.raises(ValueError, match="multiple of 256"):
        S.encode(np.zeros(300))
    with pytest.raises(ValueError, match="non-finite"):
        S.encode(np.full(256, np.nan))
    with pytest.raises(ValueError, match="imatrix"):
        S.encode(np.zeros(256), imatrix=np.ones(3))


def test_imatrix_with_zeros_and_rounds():
    rng = np.random.default_rng(13)
    x = rng.standard_normal((4, 512))
    # an all-zero importance falls back to uniform weights
    assert (S.encode(x, imatrix=np.zeros(512)) == S.encode(x)).all()
    # zero importance on some columns: still one zero lane per group, still a fixed point
    im = rng.uniform(0.5, 2.0, 512)
    im[::3] = 0.0
    b = S.encode(x, imatrix=im)
    t, _ = S.ternary_from_blocks(b)
    assert ((group_lanes(t) == 0).sum(axis=-1) == 1).all()
    assert (S.encode(S.decode(b).reshape(x.shape), imatrix=im) == b).all()
    # more alternation rounds never make the weighted error worse
    errs = [S.weighted_error(x, S.encode(x, imatrix=im, rounds=r), im) for r in (0, 1, 4)]
    assert errs[0] >= errs[1] >= errs[2]
    with pytest.raises(ValueError):
        S.encode(x, rounds=-1)
