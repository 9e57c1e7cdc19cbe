// Host emulation of the STQ1_0 CUDA vec_dot (CI has no GPU).
//
// tests/test_cuda_stq1_0_hostemu.py extracts the device code of vec_dot_stq1_0_q8_1 and its helpers from the
// applied tree's ggml/src/ggml-cuda/vecdotq.cuh, rewrites its inline PTX into calls of the emulations below
// and includes it here as STQ_VECDOT_INC. The result is compared with ggml's CPU dequantize_row_stq1_0 dotted
// with the dequantized q8_1 activations, for random blocks at both block alignments (0 and 2 mod 4).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>

extern "C" {
#include "ggml.h"
}
#define GGML_COMMON_DECL_CPP
#define GGML_COMMON_IMPL_CPP
#include "ggml-common.h"

#define __device__
#define __forceinline__ inline
#define __restrict__

#include "prmt_emu.h"
static int emu_dp4a_us(uint32_t a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int) ((a >> 8*i) & 0xFF) * (int8_t) (b >> 8*i);
    return c;
}
static int ggml_cuda_dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int8_t) (a >> 8*i) * (int8_t) (b >> 8*i);
    return c;
}
static uint32_t __umulhi(uint32_t a, uint32_t b) { return (uint32_t) (((uint64_t) a * b) >> 32); }
static uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, uint32_t sh) { return (uint32_t) ((((uint64_t) hi << 32) | lo) >> (sh & 31)); }
static int get_int_b4(const void * x, const int & i32) { int v; memcpy(&v, (const char *) x + 4*i32, 4); return v; }
struct float2 { float x, y; };
static float __half2float(ggml_half h) { return ggml_fp16_to_fp32(h); }
static float2 __half22float2(const uint32_t & h2) { return { ggml_fp16_to_fp32(h2 & 0xFFFF), ggml_fp16_to_fp32(h2 >> 16) }; }
static float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static float __fmul_rn(float a, float b) { return a*b; }
static float __fadd_rn(float a, float b) { return a + b; }
static float __fsub_rn(float a, float b) { return a - b; }
struct block_q8_1_emu { uint32_t ds; int8_t qs[32]; }; // ds: half2 (d, sum of the original floats)
#define block_q8_1 block_q8_1_emu

#include STQ_VECDOT_INC

int main(int argc, char ** argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 5000;
    std::mt19937 rng(20261129);
    int bad = 0;
    double maxrel = 0;
    alignas(8) static unsigned char buf[2*sizeof(block_stq1_0)];
    for (int it = 0; it < iters; ++it) {
        block_stq1_0 b;
        for (auto & x : b.qs)   x = rng();
        for (auto & x : b.sign) x = rng();
        b.d = ggml_fp32_to_fp16(0.25f + (rng() % 1000)*1e-3f);
        float w[QK_K];
        ggml_get_type_traits(GGML_TYPE_STQ1_0)->to_float(&b, w, QK_K);

        block_q8_1_emu y[QK_K/32];
        for (auto & yb : y) {
            const float d = 0.005f + (rng() % 100)*1e-4f;
            int s = 0;
            for (auto & q : yb.qs) { q = (int8_t) ((int) (rng() % 255) - 127); s += q; }
            yb.ds = ggml_fp32_to_fp16(d) | (uint32_t) ggml_fp32_to_fp16(d*s) << 16;
        }
        for (int iqs = 0; iqs < 4; ++iqs) {
            double ref = 0, mag = 0;
            for (int i = 0; i < 64; ++i) {
                const block_q8_1_emu & yb = y[2*iqs + i/32];
                const double x = ggml_fp16_to_fp32(yb.ds & 0xFFFF) * yb.qs[i % 32];
                ref += w[64*iqs + i]*x;
                mag += fabs(w[64*iqs + i]*x);
            }
            memset(buf, 0xA5, sizeof(buf));
            memcpy(buf, &b, sizeof(b));                        // block 0: 4-byte aligned
            const float got0 = vec_dot_stq1_0_q8_1(buf, y, 0, iqs);
            memcpy(buf + sizeof(block_stq1_0), &b, sizeof(b)); // block 1: 2 mod 4
            const float got1 = vec_dot_stq1_0_q8_1(buf, y, 1, iqs);
            // the only inexact input is the fp16 sum in ds.y, so the error is far below one weight's share
            const double rel = fabs(got1 - ref)/(mag + 1e-6);
            maxrel = rel > maxrel ? rel : maxrel;
            if (got0 != got1 || rel > 2e-3) {
                if (bad++ < 5) {
                    printf("block %d chunk %d: aligned %g, 2 mod 4 %g, reference %g\n", it, iqs, got0, got1, ref);
                }
            }
        }
    }
    printf("%s: %d of %d chunk dot products wrong, max relative error %.2e\n", bad ? "FAIL" : "OK", bad, 4*iters, maxrel);
    return bad != 0;
}
