// STQ1_0 RP16 mat-vec with whole 2688-byte tiles copied into shared memory (issue 17, "bulk" candidate).
//
// Needs stq1_0-rp16.cuh and stq1_0-rp16.cu of the applied tree before it (the RP16 layout, stq1_0_rp16_off,
// stq1_0_rp16_ids_args, stq1_0_grid, ggml_cuda_pdl_*). Used by bench/stq1_0_repack/bulk.cu on the GPU and by
// tests/cuda_hostemu/stq1_0_bulk_emu.cpp on the host (BULK_HOSTEMU: the copy and barrier primitives below are then
// defined by the emulation; the code between BK_CUDA_BEGIN and BK_CUDA_END is cut out by the test).
//
// Each warp owns MT row groups (16 MT rows) and a ring of S stages in shared memory; a stage holds the MT tiles
// (2688 contiguous bytes each in RP16) of one K tile and, with ACT, the ncols x 1024 int8 activations of that K tile.
// Copies: COPY = BK_BULK: lane 0 issues one cp.async.bulk (TMA 1-D) per tile onto the stage's mbarrier (arrive +
// expect_tx of the stage's bytes), every lane waits on the barrier's phase; BK_BULK_EF: the same with an L2
// evict-first hint; BK_CPASYNC: every lane issues 16-byte cp.async copies, one commit group per stage, wait_group +
// __syncwarp. A stage is refilled only after __syncwarp (every lane done reading it). No CUDA-block-wide barrier in
// the main loop: every warp runs its own pipeline.
//
// The arithmetic per column is the RP16 kernel's (patch 0032): the K split KS gives warp ks the tiles ks, ks + KS,
// ... (in that order), per block the 4 lanes' integer sums of rows g, g + 8 added as integers (16-bit halves), then
// one fmaf((float) s, d_w*d_a, acc) per block and row, the KS partial sums added in the order 0..KS-1. So a column's
// bits do not depend on ncols (batch invariant) and, for equal KS, equal the RP16 kernel's bits (the one difference:
// a warp with no tile left skips it instead of adding it with weight 0, which changes nothing unless acc is -0.0).
#pragma once

#define BK_TILE_U4 (STQ1_0_RP16_TILE_BYTES/16)   // 168 x 16 bytes: the MT tiles of a stage are 2688 bytes apart
#define BK_ACT_U4  (STQ1_0_RP16_K_ALIGN/16)      // 64 x 16 bytes: one column's activations of one K tile

#define BK_BULK    0
#define BK_BULK_EF 1
#define BK_CPASYNC 2

#ifndef BULK_HOSTEMU
// BK_CUDA_BEGIN
static __device__ __forceinline__ uint32_t bk_smem(const void * p) {
    return (uint32_t) __cvta_generic_to_shared(p);
}
static __device__ __forceinline__ void bk_mbar_init(uint64_t * bar, const int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bk_smem(bar)), "r"(count) : "memory");
}
// makes the initialized barriers visible to the async proxy (the bulk copies)
static __device__ __forceinline__ void bk_fence_mbar_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// orders this thread's earlier generic-proxy accesses of shared memory before the next bulk copy's writes
static __device__ __forceinline__ void bk_fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
static __device__ __forceinline__ void bk_mbar_expect_tx(uint64_t * bar, const uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bk_smem(bar)), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void bk_mbar_wait(uint64_t * bar, const uint32_t parity) {
    uint32_t done, spins = 0;
    do {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
            : "=r"(done) : "r"(bk_smem(bar)), "r"(parity) : "memory");
        if (!done && ++spins == (1u << 26)) {
            __trap(); // a phase that never completes: fail the launch instead of hanging the device
        }
    } while (!done);
}
static __device__ __forceinline__ uint64_t bk_policy_evict_first() {
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}
template <bool EF>
static __device__ __forceinline__ void bk_bulk(void * dst, const void * src, const uint32_t bytes, uint64_t * bar,
        const uint64_t pol) {
    if constexpr (EF) {
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
            :: "r"(bk_smem(dst)), "l"(src), "r"(bytes), "r"(bk_smem(bar)), "l"(pol) : "memory");
    } else {
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
            :: "r"(bk_smem(dst)), "l"(src), "r"(bytes), "r"(bk_smem(bar)) : "memory");
    }
}
static __device__ __forceinline__ void bk_cp16(void * dst, const void * src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(bk_smem(dst)), "l"(src) : "memory");
}
static __device__ __forceinline__ void bk_cp_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
static __device__ __forceinline__ void bk_cp_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
static __device__ __forceinline__ uint4 * bk_dyn_smem() {
    extern __shared__ uint4 bk_dsm[];
    return bk_dsm;
}
// BK_CUDA_END
#endif // BULK_HOSTEMU

// the 16-byte cp.async copies of one lane are visible to the others of the warp after its wait_group and this
static __device__ __forceinline__ void bk_cp_visible() {
    __syncwarp();
}

// the 5 words of lane `lane` for block bl (0..3) of a tile in shared memory (words 5bl .. 5bl+4 of the lane's 20;
// word j is component j%4 of the lane's 16 bytes in chunk j/4): 2 or 3 loads of 4, 8 or 16 bytes
static __device__ __forceinline__ void bk_words(const uint4 * tile, const int lane, const int bl, uint32_t * w) {
    const uint4 * c = tile + lane; // chunk q of this lane: c[32*q]
    if (bl == 0) {
        const uint4 a = c[0];
        w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
        w[4] = ((const uint32_t *) (c + 32))[0];
    } else if (bl == 1) {
        const uint32_t * c1 = (const uint32_t *) (c + 32);
        const uint2 a = ((const uint2 *) (c + 32))[1];
        const uint2 b = ((const uint2 *) (c + 64))[0];
        w[0] = c1[1]; w[1] = a.x; w[2] = a.y; w[3] = b.x; w[4] = b.y;
    } else if (bl == 2) {
        const uint2 a = ((const uint2 *) (c + 64))[1];
        const uint2 b = ((const uint2 *) (c + 96))[0];
        w[0] = a.x; w[1] = a.y; w[2] = b.x; w[3] = b.y;
        w[4] = ((const uint32_t *) (c + 96))[2];
    } else {
        const uint4 a = c[128];
        w[0] = ((const uint32_t *) (c + 96))[3];
        w[1] = a.x; w[2] = a.y; w[3] = a.z; w[4] = a.w;
    }
}

// component c (0..3) of v
static __device__ __forceinline__ uint32_t bk_u4c(const uint4 & v, const int c) {
    return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}

template <int MT, int KS, int RPC, int S, int COPY, bool ACT, int ncols>
static constexpr size_t stq1_0_bulk_smem_bytes() {
    return (size_t) 16*KS*RPC*S*(MT*BK_TILE_U4 + (ACT ? ncols*BK_ACT_U4 : 0));
}

// CUDA blocks per SM that the shared memory allows (at most 64 warps per SM, and no fewer than 64 + 24 ncols
// registers per thread): given to __launch_bounds__ so that the registers are capped only where they would limit
// the occupancy further (without it ptxas chose 56-80 registers with spills for some n = 1 kernels)
template <int MT, int KS, int RPC, int S, int COPY, bool ACT, int ncols>
static constexpr int stq1_0_bulk_min_blocks() {
    constexpr size_t per_sm = 227*1024;
    constexpr size_t need   = stq1_0_bulk_smem_bytes<MT, KS, RPC, S, COPY, ACT, ncols>() + 8*KS*RPC*S + 128 + 1024;
    constexpr int by_smem   = (int) (per_sm/need);
    constexpr int by_warps  = 64/(KS*RPC);
    constexpr int by_regs   = 65536/((64 + 24*ncols)*32*KS*RPC); // at least 64 + 24 ncols registers per thread
    constexpr int b = by_smem < by_warps ? by_smem : by_warps;
    return b < by_regs ? (b < 1 ? 1 : b) : (by_regs < 1 ? 1 : by_regs);
}

// W: RP16 weights; Aq/Ad: ncols columns of activations (k int8 each, RP16 order) and their scales (k/256 each); dst:
// column c at dst + c*stride_col_dst; has_ids: MUL_MAT_ID as in mul_mat_vec_stq1_0_rp16 (ncols = 1); WL: a lane's 80
// bytes of each tile read as 5 loads of 16 bytes per stage (20 registers per row group) instead of 2-3 smaller
// loads per block (fewer shared-memory wavefronts: a 4- or 8-byte load at a 16-byte lane stride costs as many as
// a 16-byte one). FLOOR: a diagnostic without the decode (wrong results; the floor of the copies alone)
template <int MT, int KS, int RPC, int S, int COPY, bool ACT, int ncols, bool has_ids, bool WL = false, bool FLOOR = false>
__launch_bounds__(32*KS*RPC, (stq1_0_bulk_min_blocks<MT, KS, RPC, S, COPY, ACT, ncols>()))
static __global__ void stq1_0_bulk_mv(const uint4 * W, const uint4 * Aq, const float * Ad, float * dst,
        const int ntiles, const int nrg, const int64_t stride_col_dst, const stq1_0_rp16_ids_args ida) {
    static_assert(!has_ids || ncols == 1, "MUL_MAT_ID: one column per CUDA block");
    static_assert(!(ACT && COPY == BK_CPASYNC), "activations in shared memory only with bulk copies");
    static_assert(S >= 1, "stages");
    constexpr int      STAGE_U4    = MT*BK_TILE_U4 + (ACT ? ncols*BK_ACT_U4 : 0);
    constexpr uint32_t STAGE_BYTES = 16*STAGE_U4;
    constexpr bool     EF          = COPY == BK_BULK_EF;

    __shared__ int      tab[32];
    __shared__ uint64_t bar[KS*RPC][S];

    const int lane = threadIdx.x;
    const int wy   = threadIdx.y;
    const int ks   = wy % KS;
    const int rgl  = wy / KS;
    const int g    = lane / 4;
    const int t    = lane % 4;
    const int rg_base = (blockIdx.x*RPC + rgl)*MT;
    uint4 * sw = bk_dyn_smem() + wy*S*STAGE_U4; // this warp's stages

    int64_t acol = 0;
    if constexpr (has_ids) {
        ggml_cuda_pdl_sync(); // the expert ids come from a previous kernel
        const int i = blockIdx.y / ida.n_used;
        const int u = blockIdx.y % ida.n_used;
        W    += ida.ids[i*ida.ids_stride + u]*ida.expert_u4;
        acol  = (int64_t) i*ida.ne11 + u % ida.ne11;
        dst  += u*stride_col_dst + i*ida.stride_tok_dst;
    }
    const int     nb     = ntiles*STQ1_0_RP16_TILE_BLOCKS;
    const int64_t col_u4 = (int64_t) nb*QK_K/16;

    // this warp's K tiles: ks, ks + KS, ... (none for a warp past the last row group or the last tile)
    const int nt_w = rg_base < nrg && ks < ntiles ? (ntiles - ks + KS - 1)/KS : 0;
    const uint4 * wrow[MT]; // tile 0 of each row group (a row group past the last re-reads the last, writes nothing)
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        wrow[m] = W + (int64_t) min(rg_base + m, nrg - 1)*ntiles*BK_TILE_U4;
    }
    uint64_t pol = 0;
    if constexpr (EF) {
        pol = bk_policy_evict_first();
    }

    // the weight copies of iteration j into stage j % S (and, COPY != BK_CPASYNC, the barrier's expected bytes)
    auto issue_w = [&](const int j) {
        const int i = ks + j*KS;
        uint4 * st = sw + (j % S)*STAGE_U4;
        if constexpr (COPY == BK_CPASYNC) {
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                for (int q = lane; q < BK_TILE_U4; q += 32) {
                    bk_cp16(st + m*BK_TILE_U4 + q, wrow[m] + (int64_t) i*BK_TILE_U4 + q);
                }
            }
        } else if (lane == 0) {
            uint64_t * b = &bar[wy][j % S];
            bk_mbar_expect_tx(b, STAGE_BYTES);
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                bk_bulk<EF>(st + m*BK_TILE_U4, wrow[m] + (int64_t) i*BK_TILE_U4, 16*BK_TILE_U4, b, pol);
            }
        }
    };
    // the activation copies of iteration j (ACT; after the activations are written: ggml_cuda_pdl_sync)
    auto issue_a = [&](const int j) {
        if constexpr (ACT) {
            if (lane == 0) {
                const int i = ks + j*KS;
                uint4 * st = sw + (j % S)*STAGE_U4 + MT*BK_TILE_U4;
                uint64_t * b = &bar[wy][j % S];
#pragma unroll
                for (int c = 0; c < ncols; ++c) {
                    bk_bulk<EF>(st + c*BK_ACT_U4, Aq + (acol + c)*col_u4 + (int64_t) i*BK_ACT_U4, 16*BK_ACT_U4, b, pol);
                }
            }
        }
    };

    if constexpr (COPY != BK_CPASYNC) {
        if (lane == 0) {
            for (int s = 0; s < S; ++s) {
                bk_mbar_init(&bar[wy][s], 1);
            }
            bk_fence_mbar_init();
        }
        __syncwarp();
    }
    // the weights do not depend on the previous kernel: the first S tiles are requested before waiting for it
    for (int j = 0; j < S; ++j) {
        if (j < nt_w) {
            issue_w(j);
        }
        if constexpr (COPY == BK_CPASYNC) {
            bk_cp_commit();
        }
    }

    if (threadIdx.y == 0) {
        // table entry i: the 4 values of pattern i as int8x4 (from stq1_0_grid: lane p stores value + 1)
        const uint32_t pat = stq1_0_grid[lane];
        uint32_t v = 0;
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            v |= (uint32_t) (uint8_t) (int8_t) (((pat >> (2*p)) & 3) - 1) << (8*p);
        }
        tab[lane] = (int) v;
    }
    __syncthreads();
    const char * tb = (const char *) tab;
    if constexpr (!has_ids) {
        ggml_cuda_pdl_sync();
    }
    for (int j = 0; j < S && j < nt_w; ++j) {
        issue_a(j);
    }

    float acc[MT][2][ncols];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int c = 0; c < ncols; ++c) {
            acc[m][0][c] = 0.0f;
            acc[m][1][c] = 0.0f;
        }
    }

    for (int j = 0; j < nt_w; ++j) {
        const int i = ks + j*KS;
        const uint4 * st = sw + (j % S)*STAGE_U4;
        if constexpr (COPY == BK_CPASYNC) {
            // this lane's copies of stage j are done, then every lane's
            bk_cp_wait<S - 1>();
            bk_cp_visible();
        } else {
            bk_mbar_wait(&bar[wy][j % S], (j / S) & 1);
        }
        if constexpr (FLOOR) {
            // diagnostic: the copies and waits alone (one word read per lane and stage), no decode
            acc[0][0][0] += (float) (st[lane].x & 1u);
        } else {
        uint4 ch[MT][WL ? 5 : 1];
        if constexpr (WL) {
#pragma unroll
            for (int m = 0; m < MT; ++m) {
#pragma unroll
                for (int q = 0; q < 5; ++q) {
                    ch[m][q] = st[m*BK_TILE_U4 + 32*q + lane];
                }
            }
        }
#pragma unroll
        for (int bl = 0; bl < STQ1_0_RP16_TILE_BLOCKS; ++bl) {
            const int b = i*STQ1_0_RP16_TILE_BLOCKS + bl;
            uint32_t w[MT][5];
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                if constexpr (WL) {
#pragma unroll
                    for (int e = 0; e < 5; ++e) {
                        w[m][e] = bk_u4c(ch[m][(5*bl + e)/4], (5*bl + e) % 4);
                    }
                } else {
                    bk_words(st + m*BK_TILE_U4, lane, bl, w[m]);
                }
            }
            int s[MT][2][ncols];
#pragma unroll
            for (int m = 0; m < MT; ++m) {
#pragma unroll
                for (int c = 0; c < ncols; ++c) {
                    s[m][0][c] = 0;
                    s[m][1][c] = 0;
                }
            }
#pragma unroll
            for (int k4 = 0; k4 < 4; ++k4) {
                // activation words 4*k4 .. 4*k4 + 3 of lane t (16 bytes of one 64-byte piece) per column
                uint4 a4[ncols];
#pragma unroll
                for (int c = 0; c < ncols; ++c) {
                    if constexpr (ACT) {
                        a4[c] = st[MT*BK_TILE_U4 + c*BK_ACT_U4 + 16*bl + 4*k4 + t];
                    } else {
                        a4[c] = __ldg(Aq + (acol + c)*col_u4 + (int64_t) b*16 + 4*k4 + t);
                    }
                }
#pragma unroll
                for (int m = 0; m < MT; ++m) {
#pragma unroll
                    for (int h2 = 0; h2 < 2; ++h2) {
                        const int kk = 2*k4 + h2;
                        const int a0 = *(const int *) (tb + stq1_0_rp16_off(w[m], 4*kk + 0));
                        const int a1 = *(const int *) (tb + stq1_0_rp16_off(w[m], 4*kk + 1));
                        const int a2 = *(const int *) (tb + stq1_0_rp16_off(w[m], 4*kk + 2));
                        const int a3 = *(const int *) (tb + stq1_0_rp16_off(w[m], 4*kk + 3));
#pragma unroll
                        for (int c = 0; c < ncols; ++c) {
                            const int x0 = h2 ? (int) a4[c].z : (int) a4[c].x;
                            const int x1 = h2 ? (int) a4[c].w : (int) a4[c].y;
                            s[m][0][c] = ggml_cuda_dp4a(a0, x0, s[m][0][c]);
                            s[m][1][c] = ggml_cuda_dp4a(a1, x0, s[m][1][c]);
                            s[m][0][c] = ggml_cuda_dp4a(a2, x1, s[m][0][c]);
                            s[m][1][c] = ggml_cuda_dp4a(a3, x1, s[m][1][c]);
                        }
                    }
                }
            }
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                // scales of rows g, g + 8 of block bl
                const half2 dw  = *(const half2 *) ((const char *) (st + m*BK_TILE_U4) + 2560 + 16*g + 4*bl);
                const float dw0 = __low2float(dw);
                const float dw1 = __high2float(dw);
#pragma unroll
                for (int c = 0; c < ncols; ++c) {
                    int pk = s[m][0][c] + (s[m][1][c] << 16);
                    pk += __shfl_xor_sync(0xFFFFFFFF, pk, 1);
                    pk += __shfl_xor_sync(0xFFFFFFFF, pk, 2);
                    const int s0 = (int) (int16_t) (pk & 0xFFFF);
                    const int s1 = (pk - s0) >> 16;
                    const float da = __ldg(Ad + (acol + c)*nb + b);
                    acc[m][0][c] = fmaf((float) s0, __fmul_rn(dw0, da), acc[m][0][c]);
                    acc[m][1][c] = fmaf((float) s1, __fmul_rn(dw1, da), acc[m][1][c]);
                }
            }
        }
        } // !FLOOR
        __syncwarp(); // every lane is done with stage j % S: it may be refilled
        if (j + S < nt_w) {
            if constexpr (COPY != BK_CPASYNC) {
                if (lane == 0) {
                    bk_fence_proxy_async();
                }
            }
            issue_w(j + S);
            issue_a(j + S);
        }
        if constexpr (COPY == BK_CPASYNC) {
            bk_cp_commit();
        }
    }

    ggml_cuda_pdl_lc();

    // K-split partial sums through the first bytes of each warp's own stages (every copy of the warp has landed and
    // been read: the loop ended with __syncwarp)
    float * red = (float *) sw;
    if (t == 0) {
#pragma unroll
        for (int m = 0; m < MT; ++m) {
#pragma unroll
            for (int c = 0; c < ncols; ++c) {
                red[c*16*MT + 16*m + g]     = acc[m][0][c];
                red[c*16*MT + 16*m + g + 8] = acc[m][1][c];
            }
        }
    }
    __syncthreads();
    if (ks == 0) {
        for (int e = lane; e < 16*MT*ncols; e += 32) {
            const int c = e / (16*MT), r = e % (16*MT);
            const int rg = rg_base + r/16;
            if (rg >= nrg) {
                continue;
            }
            float sum = red[e];
#pragma unroll
            for (int k = 1; k < KS; ++k) {
                sum += ((const float *) (sw + k*S*STAGE_U4))[e];
            }
            dst[c*stride_col_dst + (int64_t) rg*16 + r % 16] = sum;
        }
    }
}

template <int MT, int KS, int RPC, int S, int COPY, bool ACT, int ncols, bool has_ids = false, bool WL = false,
          bool FLOOR = false>
static void stq1_0_bulk_launch(const uint4 * W, const uint4 * Aq, const float * Ad, float * dst, const int ntiles,
        const int nrg, const int64_t stride_col_dst, cudaStream_t stream, const stq1_0_rp16_ids_args & ida = {},
        const int ncols_grid = 1) {
    constexpr size_t shmem = stq1_0_bulk_smem_bytes<MT, KS, RPC, S, COPY, ACT, ncols>();
    static const bool attr_set = [] {
        CUDA_CHECK(cudaFuncSetAttribute(stq1_0_bulk_mv<MT, KS, RPC, S, COPY, ACT, ncols, has_ids, WL, FLOOR>,
            cudaFuncAttributeMaxDynamicSharedMemorySize, (int) shmem));
        return true;
    }();
    (void) attr_set;
    const int per_block = MT*RPC;
    const dim3 grid((nrg + per_block - 1)/per_block, ncols_grid);
    const dim3 block(32, KS*RPC);
    ggml_cuda_kernel_launch(stq1_0_bulk_mv<MT, KS, RPC, S, COPY, ACT, ncols, has_ids, WL, FLOOR>,
        ggml_cuda_kernel_launch_params(grid, block, shmem, stream), W, Aq, Ad, dst, ntiles, nrg, stride_col_dst, ida);
}
