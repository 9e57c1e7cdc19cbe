// Host emulation of ggml_cuda_mmq_load_tiles_stq1_0 (the STQ1_0 tile loader of mmq; CI has no GPU).
//
// tests/test_cuda_stq1_0_mmq_hostemu.py extracts the loader from the applied tree's
// ggml/src/ggml-cuda/mmq-load-tiles.cuh (STQ_MMQ_LOAD_INC), the STQ1_0 decode helpers it calls from vecdotq.cuh
// (STQ_MMQ_HELPERS_INC, inline PTX rewritten into the emulations below) and the Q8_0 tile geometry from mmq.cuh
// (STQ_MMQ_GEOM_INC: the dp4a tile sizes and the MMA sram stride), and includes them here. Every thread of one
// CUDA block runs the loader in turn (it has no barriers or shuffles) for a tile of I rows at an odd block offset
// kbx0 (2-mod-4 aligned blocks) with the row clamp of the fallback variant (rows 0..i_max are checked), in the
// layout of the MMA kernels (STQ_EMU_MMA) or of the dp4a kernels. The tile is read back the way
// ggml_cuda_mmq_vec_dot_q8_0_q8_1_{mma,dp4a} read it (int8 x_qs times the float scale of each 32 values) and
// compared, bit for bit, with ggml's CPU dequantize_row_stq1_0.
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
#include "ggml.h"
}
#define GGML_COMMON_DECL_CPP
#define GGML_COMMON_IMPL_CPP
#include "ggml-common.h"
#ifndef QI8_0 // ggml-common.h declares it for the GPU backends only
#define QI8_0 (QK8_0/4)
#endif

#define __device__
#define __forceinline__ inline
#define __restrict__

#ifdef STQ_EMU_MMA
#define TURING_MMA_AVAILABLE
#endif

struct emu_dim3 { int x, y, z; };
static emu_dim3 threadIdx;

static constexpr int EMU_WARP    = 32;
static constexpr int EMU_THREADS = 256;
static constexpr int EMU_I       = 128;

#define MMQ_TILE_NE_K 32
struct tile_x_sizes { int qs; int dm; int sc; };
#include STQ_MMQ_GEOM_INC // defines MMQ_DP4A_TXS_Q8_0 (uses I) and emu_sram_stride_q8_0()

static constexpr int ggml_cuda_get_physical_warp_size() { return EMU_WARP; }
static constexpr int ggml_cuda_mmq_get_nthreads(ggml_type, int, bool) { return EMU_THREADS; }
static constexpr int ggml_cuda_mmq_get_I(ggml_type, int, bool) { return EMU_I; }
static constexpr int ggml_cuda_mmq_get_sram_stride(ggml_type, int, bool) { return emu_sram_stride_q8_0(); }
static constexpr tile_x_sizes mmq_get_dp4a_tile_x_sizes(ggml_type type, int I) {
    return type == GGML_TYPE_STQ1_0 ? MMQ_DP4A_TXS_Q8_0 : tile_x_sizes{0, 0, 0};
}

static int get_int_b2(const void * x, const int & i32) {
    if ((uintptr_t) x % 2 != 0) {
        printf("FAIL: get_int_b2 on an odd address\n");
        exit(1);
    }
    const uint16_t * x16 = (const uint16_t *) x;
    return (int) ((uint32_t) x16[2*i32 + 0] | ((uint32_t) x16[2*i32 + 1] << 16));
}
#include "prmt_emu.h"
// per-byte subtraction without borrows between bytes
static int __vsub4(int a, int b) {
    uint32_t r = 0;
    for (int k = 0; k < 4; ++k) {
        r |= (uint32_t) (uint8_t) (((uint32_t) a >> 8*k) - ((uint32_t) b >> 8*k)) << 8*k;
    }
    return (int) r;
}
using std::min;

#include STQ_MMQ_HELPERS_INC // the STQ1_0 decode helpers of vecdotq.cuh (inline PTX emulated)
#include STQ_MMQ_LOAD_INC

int main(int argc, char ** argv) {
    const int nblk_row = 3;                    // blocks per row
    const int nrows    = EMU_I + 5;            // rows in the matrix
    const int kbx0     = 1;                    // an odd block: 2-mod-4 aligned
    const int i_max    = EMU_I - 7;            // the last row of the tile in the matrix (fallback)
    const int seed     = argc > 1 ? atoi(argv[1]) : 1;

    std::mt19937 rng(seed);
    std::vector<block_stq1_0> w(nrows*nblk_row);
    for (auto & b : w) {
        for (auto & q : b.qs)   q = rng() & 0xFF;
        for (auto & s : b.sign) s = rng() & 0xFF;
        b.d = ggml_fp32_to_fp16(std::ldexp((float) (rng() % 2000 + 1) / 1000.0f, (int) (rng() % 9) - 8) * (rng() % 2 ? 1 : -1));
    }

#ifdef STQ_EMU_MMA
    const int stride_row = emu_sram_stride_q8_0(); // ints per row, x_df at +2*MMQ_TILE_NE_K
    std::vector<int> tile(EMU_I*stride_row, 0x7F7F7F7F);
#else
    const int I = EMU_I;
    const tile_x_sizes txs = MMQ_DP4A_TXS_Q8_0;
    std::vector<int> tile(txs.qs + txs.dm + txs.sc, 0x7F7F7F7F);
#endif

    for (int y = 0; y < EMU_THREADS/EMU_WARP; ++y) {
        for (int x = 0; x < EMU_WARP; ++x) {
            threadIdx = {x, y, 0};
            ggml_cuda_mmq_load_tiles_stq1_0<GGML_TYPE_STQ1_0, 64, true>((const char *) w.data(), tile.data(), kbx0, i_max, nblk_row);
        }
    }

    const ggml_type_traits * tt = ggml_get_type_traits(GGML_TYPE_STQ1_0);
    std::vector<float> ref(QK_K);
    long bad = 0, checked = 0;
    // rows past i_max are clamped to it (they rewrite row i_max; the kernel never uses their results)
    for (int i = 0; i <= i_max; ++i) {
        tt->to_float(&w[kbx0 + i*nblk_row], ref.data(), QK_K);
        for (int k = 0; k < QK_K; ++k) {
            const int k0 = k/4; // the int of x_qs, as the vec_dot indexes it
#ifdef STQ_EMU_MMA
            const int   q  = tile[i*stride_row + k0];
            const float df = ((const float *) tile.data())[i*stride_row + 2*MMQ_TILE_NE_K + k0/QI8_0];
#else
            const int   q  = tile[i*(2*MMQ_TILE_NE_K + 1) + k0];
            const float df = ((const float *) tile.data())[txs.qs + i*(2*MMQ_TILE_NE_K/QI8_0) + i/(QI8_0/2) + k0/QI8_0];
#endif
            const int8_t v = (int8_t) ((uint32_t) q >> 8*(k % 4));
            const float got = v*df;
            ++checked;
            if (!(v >= -1 && v <= 1) || got != ref[k]) {
                if (bad < 10) {
                    printf("FAIL: row %d weight %d: tile %d * %g = %g, CPU %g\n", i, k, v, df, got, ref[k]);
                }
                ++bad;
            }
        }
    }
    if (bad) {
        printf("FAIL: %ld of %ld values differ\n", bad, checked);
        return 1;
    }
    printf("OK: %ld values of %d rows (%s layout) equal the CPU dequantization\n", checked, i_max + 1,
#ifdef STQ_EMU_MMA
        "MMA"
#else
        "dp4a"
#endif
    );
    return 0;
}
