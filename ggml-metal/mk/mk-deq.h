// mk-deq.h: the Metal megakernel's weight decoding (MSL 3.2): 32 consecutive values of a row in any
// type the kernel reads (mk_mtl_type_supported in mk-plan.h), byte loads only (42-byte STQ1_0 and 22-byte
// Q5_0 blocks are only 2-byte aligned in a row). The formats are ggml's (ggml-quants.c dequantize_row_*);
// the STQ1_0 patterns are ggml-common.h's stq1_0_grid, included here as ggml's Metal kernels include it
// (one table for every backend). Included by mk-kernel.metal after mk-plan.h (MK_MTL_TYPE_*), and by the
// decoding test's kernel (tests/mk_hostemu/mk_deq_metal.metal), which compares it with ggml's CPU
// dequantizers. mk.cmake inlines this file and ggml-common.h into the source a Mac compiles.
#pragma once

#define GGML_COMMON_DECL_METAL
#define GGML_COMMON_IMPL_METAL
#include "ggml-common.h"

// group g = values 32g..32g+31 of the row; lim = how many of them exist (< 32 only at the end of a
// float row whose length is not a multiple of 32: quantized rows always hold whole blocks)

static inline float mk_h2f(device const uchar * p) {
    return (float) as_type<half>((ushort) (p[0] | (p[1] << 8)));
}

static void mk_deq32(device const uchar * row, int type, int g, int lim, thread float * w) {
    switch (type) {
        case MK_MTL_TYPE_F32: {
            device const float * r = (device const float *) row + 32*g;
            for (int j = 0; j < 32; ++j) {
                w[j] = j < lim ? r[j] : 0.0f;
            }
        } break;
        case MK_MTL_TYPE_F16: {
            device const half * r = (device const half *) row + 32*g;
            for (int j = 0; j < 32; ++j) {
                w[j] = j < lim ? (float) r[j] : 0.0f;
            }
        } break;
        case MK_MTL_TYPE_BF16: {
            device const ushort * r = (device const ushort *) row + 32*g;
            for (int j = 0; j < 32; ++j) {
                w[j] = j < lim ? as_type<float>((uint) r[j] << 16) : 0.0f;
            }
        } break;
        case MK_MTL_TYPE_Q4_0: { // 18 bytes: d, 16 x two nibbles (low: value j, high: value j + 16)
            device const uchar * b = row + 18*g;
            const float d = mk_h2f(b);
            for (int j = 0; j < 16; ++j) {
                const int q = b[2 + j];
                w[j]      = d*(float) ((q & 0xF) - 8);
                w[j + 16] = d*(float) ((q >>  4) - 8);
            }
        } break;
        case MK_MTL_TYPE_Q5_0: { // 22 bytes: d, 32 high bits (bit j: value j), 16 x two nibbles (low: j, high: j + 16)
            device const uchar * b = row + 22*g;
            const float d  = mk_h2f(b);
            const uint  qh = (uint) b[2] | ((uint) b[3] << 8) | ((uint) b[4] << 16) | ((uint) b[5] << 24);
            for (int j = 0; j < 16; ++j) {
                const int q  = b[6 + j];
                const int h0 = (int) ((qh >> j) & 1u);
                const int h1 = (int) ((qh >> (j + 16)) & 1u);
                w[j]      = d*(float) (((q & 0xF) | (h0 << 4)) - 16);
                w[j + 16] = d*(float) (((q >>  4) | (h1 << 4)) - 16);
            }
        } break;
        case MK_MTL_TYPE_Q8_0: { // 34 bytes: d, 32 x int8
            device const uchar * b = row + 34*g;
            const float d = mk_h2f(b);
            for (int j = 0; j < 32; ++j) {
                w[j] = d*(float) as_type<char>(b[2 + j]);
            }
        } break;
        case MK_MTL_TYPE_Q4_K: { // 144 bytes per 256: d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
            device const uchar * b  = row + 144*(g/8);
            const int            j  = g % 8;
            device const uchar * sc = b + 4;
            int s, mn;
            if (j < 4) {
                s  = sc[j] & 63;
                mn = sc[j + 4] & 63;
            } else {
                s  = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
                mn = (sc[j + 4] >>  4) | ((sc[j]     >> 6) << 4);
            }
            const float d  = mk_h2f(b)*(float) s;
            const float dm = mk_h2f(b + 2)*(float) mn;
            device const uchar * qs = b + 16 + 32*(j/2);
            const int sh = 4*(j % 2);
            for (int l = 0; l < 32; ++l) {
                w[l] = d*(float) ((qs[l] >> sh) & 0xF) - dm;
            }
        } break;
        case MK_MTL_TYPE_Q6_K: { // 210 bytes per 256: ql[128], qh[64], int8 scales[16], d
            device const uchar * b  = row + 210*(g/8);
            const int            j  = g % 8;
            const int            n  = j / 4;
            const int            qd = j % 4;
            device const uchar * ql = b + 64*n + (qd & 1)*32;
            device const uchar * qh = b + 128 + 32*n;
            device const uchar * sc = b + 192 + 8*n + 2*qd;
            const float d = mk_h2f(b + 208);
            const int lsh = (qd >> 1)*4;  // low nibble for quarters 0, 1; high for 2, 3
            const int hsh = 2*qd;
            for (int l = 0; l < 32; ++l) {
                const int q = ((ql[l] >> lsh) & 0xF) | (((qh[l] >> hsh) & 3) << 4);
                w[l] = d*(float) as_type<char>(sc[l/16])*(float) (q - 32);
            }
        } break;
        case MK_MTL_TYPE_STQ1_0: { // 42 bytes per 256: qs[32] 4-bit codes, sign[8] bits, d (ggml-common.h block_stq1_0)
            // 64 groups of 4 lanes; lane p of group gg is value (gg/16)*64 + gg%16 + 16p of the block, so the 32
            // values 32j..32j+31 are lanes p0, p0 + 1 of the 16 groups of 64-value chunk j/2
            device const uchar * b  = row + 42*(g/8);
            const int            j  = g % 8;
            const int            ch = j / 2;
            const int            p0 = 2*(j % 2);
            const float d = mk_h2f(b + 40);
            for (int gi = 0; gi < 16; ++gi) {
                const int gg   = 16*ch + gi;
                const int code = (b[gg/2] >> (4*(gg % 2))) & 0xF;
                const int sbit = (b[32 + gg/8] >> (gg % 8)) & 1;
                const int pat  = stq1_0_grid[(sbit << 4) | code];
                w[gi]      = d*(float) (((pat >> (2*p0))     & 3) - 1);
                w[gi + 16] = d*(float) (((pat >> (2*p0 + 2)) & 3) - 1);
            }
        } break;
        default: // the host refuses other types (mk_mtl_plan_make)
            for (int l = 0; l < 32; ++l) {
                w[l] = 0.0f;
            }
    }
}
