// stq1_0_ref.h: the float64 reference of one STQ1_0 row (GGUF bytes) times int8 activations in the RP16 order
// (stq1_0_rp16_act_pos of ggml-cuda/stq1_0-rp16.cuh, included before) with one scale per 256 values: for the bulk-copy
// micro-benchmark on the GPU (bulk.cu) and its host emulation (tests/cuda_hostemu/stq1_0_bulk_emu.cpp), one definition.
// grid: the 32 patterns of stq1_0_grid (the caller's copy of the table: ggml-common.h's, or read back from the device);
// f16: the caller's fp16 -> float conversion of a block's scale.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

// the ternary weight (-1, 0 or 1) at place p (0..3) of 4-weight group G (0..63) of a GGUF block: the group's 4-bit code
// and its 5th bit select one of grid's 32 patterns, 2 bits per place; the weight is value index 64*(G/16) + G%16 + 16*p
static inline int stq1_0_ref_w(const uint8_t * blk, const uint8_t * grid, int G, int p) {
    const int code = (blk[G/2] >> (4*(G % 2))) & 0xF, sb = (blk[32 + G/8] >> (G % 8)) & 1;
    return ((grid[(sb << 4) | code] >> (2*p)) & 3) - 1;
}

// ref = sum_b d_w d_a sum(w q) over the nb blocks of row r, sabs = sum_b |d_w d_a| sum |w q|
static void stq1_0_ref_row(const uint8_t * w, int64_t r, int64_t nb, const int8_t * q, const float * d,
                           const uint8_t * grid, float (*f16)(uint16_t), double & ref, double & sabs) {
    ref = 0.0; sabs = 0.0;
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t * blk = w + (r*nb + b)*sizeof(block_stq1_0);
        uint16_t h; memcpy(&h, blk + offsetof(block_stq1_0, d), 2);
        const double dw = f16(h);
        int64_t is = 0, ia = 0;
        for (int G = 0; G < 64; ++G) {
            for (int p = 0; p < 4; ++p) {
                const int v = stq1_0_ref_w(blk, grid, G, p);
                if (!v) continue;
                const int qa = q[b*QK_K + stq1_0_rp16_act_pos((G/16)*64 + G % 16 + 16*p)];
                is += v*qa; ia += std::abs(qa);
            }
        }
        ref += dw*d[b]*(double) is; sabs += std::fabs(dw*d[b])*(double) ia;
    }
}
