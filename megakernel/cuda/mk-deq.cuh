// mk-deq.cuh: the megakernel's weight decoding: 32 consecutive values of a row in any supported type.
//
// Byte-level code with no CUDA-only types, so that the host emulation test (tests/test_megakernel.py)
// compiles this very file for the CPU and compares it with ggml's own dequantizers. The includer
// defines MK_DEVICE (CUDA: static __device__ __forceinline__) and provides
//   float mk_f16(uint16_t bits)    IEEE half -> float
//   stq1_0_grid[32]                the STQ1_0 pattern table of ggml-common.h
//   MK_UNROLL                      an unroll pragma (or nothing)
//   MK_TRAP()                      what an unsupported type does

MK_DEVICE uint16_t mk_u16(const uint8_t * p) {
    return (uint16_t) (p[0] | (p[1] << 8));
}

MK_DEVICE float mk_h2f(const uint8_t * p) {
    return mk_f16(mk_u16(p));
}

// group g = values 32g..32g+31 of the row; lim = how many of them exist (< 32 only at the end of a
// float row whose length is not a multiple of 32: quantized rows always hold whole blocks)
MK_DEVICE void mk_deq32(const uint8_t * row, int type, int g, int lim, float w[32]) {
    switch (type) {
        case GGML_TYPE_F32: {
            const float * r = (const float *) row + 32*g;
            MK_UNROLL
            for (int j = 0; j < 32; ++j) w[j] = j < lim ? r[j] : 0.0f;
        } break;
        case GGML_TYPE_F16: {
            const uint16_t * r = (const uint16_t *) row + 32*g;
            MK_UNROLL
            for (int j = 0; j < 32; ++j) w[j] = j < lim ? mk_f16(r[j]) : 0.0f;
        } break;
        case GGML_TYPE_BF16: {
            const uint16_t * r = (const uint16_t *) row + 32*g;
            MK_UNROLL
            for (int j = 0; j < 32; ++j) {
                const uint32_t u = (uint32_t) r[j] << 16;
                float f;
                memcpy(&f, &u, sizeof(f));
                w[j] = j < lim ? f : 0.0f;
            }
        } break;
        case GGML_TYPE_Q4_0: { // 18 bytes: d, 16 x two nibbles (low: value j, high: value j + 16)
            const uint8_t * b = row + 18*g;
            const float d = mk_h2f(b);
            MK_UNROLL
            for (int j = 0; j < 16; ++j) {
                const int q = b[2 + j];
                w[j]      = d*(float) ((q & 0xF) - 8);
                w[j + 16] = d*(float) ((q >>  4) - 8);
            }
        } break;
        case GGML_TYPE_Q5_0: { // 22 bytes: d, 32 high bits, 16 x two nibbles
            const uint8_t * b = row + 22*g;
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
        case GGML_TYPE_Q8_0: { // 34 bytes: d, 32 x int8
            const uint8_t * b = row + 34*g;
            const float d = mk_h2f(b);
            MK_UNROLL
            for (int j = 0; j < 32; ++j) w[j] = d*(float) (int8_t) b[2 + j];
        } break;
        case GGML_TYPE_Q4_K: { // 144 bytes per 256: d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
            const uint8_t * b  = row + 144*(g/8);
            const int       j  = g % 8;
            const uint8_t * sc = b + 4;
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
            const uint8_t * qs = b + 16 + 32*(j/2);
            const int sh = 4*(j % 2);
            MK_UNROLL
            for (int l = 0; l < 32; ++l) w[l] = d*(float) ((qs[l] >> sh) & 0xF) - dm;
        } break;
        case GGML_TYPE_Q6_K: { // 210 bytes per 256: ql[128], qh[64], int8 scales[16], d
            const uint8_t * b  = row + 210*(g/8);
            const int       j  = g % 8;
            const int       n  = j / 4;
            const int       qd = j % 4;
            const uint8_t * ql = b + 64*n + (qd & 1)*32;
            const uint8_t * qh = b + 128 + 32*n;
            const int8_t  * sc = (const int8_t *) (b + 192) + 8*n + 2*qd;
            const float d = mk_h2f(b + 208);
            const int lsh = (qd >> 1)*4;  // low nibble for quarters 0, 1; high for 2, 3
            const int hsh = 2*qd;
            MK_UNROLL
            for (int l = 0; l < 32; ++l) {
                const int q = ((ql[l] >> lsh) & 0xF) | (((qh[l] >> hsh) & 3) << 4);
                w[l] = d*(float) sc[l/16]*(float) (q - 32);
            }
        } break;
        case GGML_TYPE_STQ1_0: { // 42 bytes per 256: 4-bit codes, sign bits, d (FACTS.md layout)
            const uint8_t * b  = row + 42*(g/8);
            const int       j  = g % 8;
            const int       c  = j / 2;        // 64-value chunk
            const int       p0 = 2*(j % 2);    // lanes p0, p0 + 1 of the chunk's 16 groups
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
            MK_TRAP();
    }
}
