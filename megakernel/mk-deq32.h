// mk-deq32.h: the megakernel's weight decoding, one source for the CUDA kernel, the Metal kernel and their host
// tests: 32 consecutive values of a row in any supported type (F32, F16, BF16, Q4_0, Q5_0, Q8_0, Q4_K, Q6_K,
// STQ1_0), byte loads only (42-byte STQ1_0 and 22-byte Q5_0 blocks are only 2-byte aligned in a row). The formats
// are ggml's (ggml-quants.c dequantize_row_*). Written in the subset of C++ that CUDA, MSL 3.2 and the host
// compilers all take; the includer defines
//   MK_DEQ_FN            qualifiers of these functions (CUDA: static __device__ __forceinline__; MSL: static inline)
//   MK_DEQ_DEV           the address space of the weights (MSL: device; else empty)
//   MK_DEQ_OUT           the type of the output pointer (MSL: thread float *; else float *)
//   MK_DEQ_T(NAME)       the type number of GGML_TYPE_NAME (MSL: MK_MTL_TYPE_NAME, the same numbers)
//   MK_DEQ_UNSUPPORTED(w) what another type does (a trap, or zeros where the host already refused it)
//   MK_UNROLL            an unroll pragma, or nothing
//   float mk_f16(uint16_t), float mk_bf16(uint16_t)   bits -> float
//   int mk_i8(uint8_t)   the byte as int8
// and provides stq1_0_grid (ggml-common.h, the one STQ1_0 pattern table of every backend).
// Users: megakernel/cuda/mk-deq.cuh (CUDA and the host tests of tests/test_megakernel.py), ggml-metal/mk/mk-deq.h.
#pragma once

MK_DEQ_FN float mk_h2f(MK_DEQ_DEV const uint8_t * p) {
    return mk_f16((uint16_t) (p[0] | (p[1] << 8)));
}

// the 6-bit scale and min of sub-block j (0..7) of a Q4_K super-block from its 12 scale bytes sc (ggml's
// get_scale_min_k4), as scale | min << 8: one copy of the packing for the float decoding below and the CUDA kernel's
// integer dot products (mk_q4k_unit)
MK_DEQ_FN int mk_q4k_scale_min(MK_DEQ_DEV const uint8_t * sc, int j) {
    if (j < 4) {
        return (sc[j] & 63) | (sc[j + 4] & 63) << 8;
    }
    return ((sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4)) | ((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)) << 8;
}

// group g = values 32g..32g+31 of the row; lim = how many of them exist (< 32 only at the end of a
// float row whose length is not a multiple of 32: quantized rows always hold whole blocks)
MK_DEQ_FN void mk_deq32(MK_DEQ_DEV const uint8_t * row, int type, int g, int lim, MK_DEQ_OUT w) {
    switch (type) {
        case MK_DEQ_T(F32): {
            MK_DEQ_DEV const float * r = (MK_DEQ_DEV const float *) row + 32*g;
            MK_UNROLL
            for (int j = 0; j < 32; ++j) w[j] = j < lim ? r[j] : 0.0f;
        } break;
        case MK_DEQ_T(F16): {
            MK_DEQ_DEV const uint16_t * r = (MK_DEQ_DEV const uint16_t *) row + 32*g;
            MK_UNROLL
            for (int j = 0; j < 32; ++j) w[j] = j < lim ? mk_f16(r[j]) : 0.0f;
        } break;
        case MK_DEQ_T(BF16): {
            MK_DEQ_DEV const uint16_t * r = (MK_DEQ_DEV const uint16_t *) row + 32*g;
            MK_UNROLL
            for (int j = 0; j < 32; ++j) w[j] = j < lim ? mk_bf16(r[j]) : 0.0f;
        } break;
        case MK_DEQ_T(Q4_0): { // 18 bytes: d, 16 x two nibbles (low: value j, high: value j + 16)
            MK_DEQ_DEV const uint8_t * b = row + 18*g;
            const float d = mk_h2f(b);
            MK_UNROLL
            for (int j = 0; j < 16; ++j) {
                const int q = b[2 + j];
                w[j]      = d*(float) ((q & 0xF) - 8);
                w[j + 16] = d*(float) ((q >>  4) - 8);
            }
        } break;
        case MK_DEQ_T(Q5_0): { // 22 bytes: d, 32 high bits (bit j: value j), 16 x two nibbles (low: j, high: j + 16)
            MK_DEQ_DEV const uint8_t * b = row + 22*g;
            const float d = mk_h2f(b);
            const uint32_t qh = (uint32_t) b[2] | ((uint32_t) b[3] << 8) | ((uint32_t) b[4] << 16) | ((uint32_t) b[5] << 24);
            MK_UNROLL
            for (int j = 0; j < 16; ++j) {
                const int q = b[6 + j];
                const int h0 = (int) ((qh >> j) & 1);          // int: qh is unsigned, and q - 16 must not wrap
                const int h1 = (int) ((qh >> (j + 16)) & 1);
                w[j]      = d*(float) (((q & 0xF) | (h0 << 4)) - 16);
                w[j + 16] = d*(float) (((q >>  4) | (h1 << 4)) - 16);
            }
        } break;
        case MK_DEQ_T(Q8_0): { // 34 bytes: d, 32 x int8
            MK_DEQ_DEV const uint8_t * b = row + 34*g;
            const float d = mk_h2f(b);
            MK_UNROLL
            for (int j = 0; j < 32; ++j) w[j] = d*(float) mk_i8(b[2 + j]);
        } break;
        case MK_DEQ_T(Q4_K): { // 144 bytes per 256: d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
            MK_DEQ_DEV const uint8_t * b  = row + 144*(g/8);
            const int                  j  = g % 8;
            const int                  sm = mk_q4k_scale_min(b + 4, j);
            const float d  = mk_h2f(b)*(float) (sm & 0xff);
            const float dm = mk_h2f(b + 2)*(float) (sm >> 8);
            MK_DEQ_DEV const uint8_t * qs = b + 16 + 32*(j/2);
            const int sh = 4*(j % 2);
            MK_UNROLL
            for (int l = 0; l < 32; ++l) w[l] = d*(float) ((qs[l] >> sh) & 0xF) - dm;
        } break;
        case MK_DEQ_T(Q6_K): { // 210 bytes per 256: ql[128], qh[64], int8 scales[16], d
            MK_DEQ_DEV const uint8_t * b  = row + 210*(g/8);
            const int                  j  = g % 8;
            const int                  n  = j / 4;
            const int                  qd = j % 4;
            MK_DEQ_DEV const uint8_t * ql = b + 64*n + (qd & 1)*32;
            MK_DEQ_DEV const uint8_t * qh = b + 128 + 32*n;
            MK_DEQ_DEV const uint8_t * sc = b + 192 + 8*n + 2*qd;
            const float d = mk_h2f(b + 208);
            const int lsh = (qd >> 1)*4;  // low nibble for quarters 0, 1; high for 2, 3
            const int hsh = 2*qd;
            MK_UNROLL
            for (int l = 0; l < 32; ++l) {
                const int q = ((ql[l] >> lsh) & 0xF) | (((qh[l] >> hsh) & 3) << 4);
                w[l] = d*(float) mk_i8(sc[l/16])*(float) (q - 32);
            }
        } break;
        case MK_DEQ_T(STQ1_0): { // 42 bytes per 256: qs[32] 4-bit codes, sign[8] bits, d (ggml-common.h block_stq1_0)
            // 64 groups of 4 lanes; lane p of group gg is value (gg/16)*64 + gg%16 + 16p of the block, so the 32
            // values 32j..32j+31 are lanes p0, p0 + 1 of the 16 groups of 64-value chunk j/2
            MK_DEQ_DEV const uint8_t * b  = row + 42*(g/8);
            const int                  j  = g % 8;
            const int                  c  = j / 2;        // 64-value chunk
            const int                  p0 = 2*(j % 2);    // lanes p0, p0 + 1 of the chunk's 16 groups
            const float d = mk_h2f(b + 40);
            MK_UNROLL
            for (int gi = 0; gi < 16; ++gi) {
                const int gg   = 16*c + gi;
                const int code = (b[gg/2] >> (4*(gg % 2))) & 0xF;
                const int sbit = (b[32 + gg/8] >> (gg % 8)) & 1;
                const int pat  = stq1_0_grid[(sbit << 4) | code];
                w[gi]      = d*(float) (((pat >> (2*p0))     & 3) - 1);
                w[gi + 16] = d*(float) (((pat >> (2*p0 + 2)) & 3) - 1);
            }
        } break;
        default:
            MK_DEQ_UNSUPPORTED(w);
    }
}
