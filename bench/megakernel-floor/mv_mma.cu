// mv_mma.cu: the int8 MMA lever for the megakernel's verify mat-vecs, measured apart from the kernel (session 38).
//
// A verify step of M tokens costs the megakernel 1.38 / 1.50 / 1.60x a one-token step for M = 2 / 3 / 4 (E4B-shaped,
// H100): each extra column costs the mat-vecs a record load and 8 dp4a per 32 weights, about what decoding the block
// costs, so they are issue-bound. mma.m16n8k32 (u8 x s8 -> s32) takes 16 rows x one 32-value block x 8 columns per
// instruction. This program streams Q4_0 matrices (GGUF layout, the E4B widths) against M columns of 8-bit records
// in shared memory (the megakernel's 48-byte records in their mk_rec_slot places) two ways, in one persistent grid of
// one 512-thread block per SM like the megakernel's:
//   dp4a  the megakernel's own one-token and verify code: mk_pairs (two rows a warp, a lane per block pair, records
//         per column) and a warp tree per row and column
//   mma   a warp per 16 rows: per block one mma.sync.m16n8k32.row.col.s32.u8.s8.s32 (A: the rows' unsigned nibbles,
//         one 4-byte load per lane and row; B: the records of columns 0..7), then the same float step per row, column
//         and block as mk_dot_rec (sf = si - 8*sum, fmaf(dw*dx, sf, acc)); each lane keeps rows g, g+8 x columns 2t,
//         2t+1: no tree
//   mma-s the same with the 16 rows' blocks staged through shared memory: row-contiguous 16-byte copies, as dp4a's
//         loads are (the mma way's direct loads touch 16 rows at once and stream at ~1080 / 800 GB/s, call H), the
//         next step held in registers (call J)
//   mma-a the same by cp.async into a ring of 4 areas a warp (steps of 4 block pairs, 3 in flight, no registers)
// --cols 4 keeps records for 4 columns only (M = 1..4; down's 10240-value rows leave too little shared memory for
// 8 columns and mma-a's ring)
// The integer sums are exact, so all give each (row, column, block) the same si; only the order the blocks' float
// terms are added in differs (checked against a float64 reference). Prints, per M = 1..8, the median time of a pass
// over the matrices (launches in alternating order), its ratio to M = 1 and the GB/s of the weights.
//
//   nvcc -std=c++17 -O3 -arch=sm_90 -I$SRC/ggml/src -I$SRC/ggml/include -Imegakernel -Imegakernel/cuda \
//        bench/megakernel-floor/mv_mma.cu -o mv_mma && ./mv_mma [--rows 10240 --k 2560] [--mats 8] [--reps 15]
//   (K/64 a multiple of MV_STEP_PAIRS: the staged way's steps; -DMV_STEP_PAIRS=20 for 720-byte strips)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "mk-device.cuh"
#include "mk-kernel.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifndef MV_UNROLL
#define MV_UNROLL 2   // pairs of blocks in flight per warp in the mma way (call H: 2; -DMV_UNROLL=8 for more loads in flight)
#endif
static constexpr int mv_unroll = MV_UNROLL;

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static constexpr int BQ = 18;   // bytes of a Q4_0 block

struct mv_args {
    const uint8_t * w;      // [mats][rows] rows of nb Q4_0 blocks
    const uint8_t * rec;    // [8][KG] records (global; every block copies them to shared memory first)
    float         * y;      // [mats][M][rows]
    int rows, nb, mats, M;
    int cols;               // columns of records (8, or 4 where 8 of a long row's leave too little shared memory); M <= cols
};

// every block: the records of the 8 columns into shared memory
static __device__ uint8_t * mv_stage(const mv_args & a) {
    extern __shared__ __align__(16) uint8_t sm[];
    const int n16 = a.cols*a.nb*MK_XQ_REC/16;
    for (int i = threadIdx.x; i < n16; i += blockDim.x) {
        ((int4 *) sm)[i] = ((const int4 *) a.rec)[i];
    }
    __syncthreads();
    return sm;
}

// a warp's place in the grid and the sizes every way shares: warps dealt SM-first (as the megakernel deals its units),
// a unit being R consecutive rows of one matrix
struct mv_warp {
    int    lane, wb, warp, nw;
    size_t rb, cs;   // bytes of a weight row, of a column's records
    __device__ explicit mv_warp(const mv_args & a)
        : lane(threadIdx.x % WARP_SIZE), wb(threadIdx.x / WARP_SIZE), warp(wb*gridDim.x + blockIdx.x),
          nw(gridDim.x*MK_WARPS), rb((size_t) a.nb*BQ), cs((size_t) a.nb*MK_XQ_REC) {}
    // unit u of R rows: its matrix, its first row, and that row's weights
    __device__ const uint8_t * unit(const mv_args & a, int u, int R, int & mat, int & r0) const {
        mat = u / (a.rows/R);
        r0  = R*(u % (a.rows/R));
        return a.w + ((size_t) mat*a.rows + r0)*rb;
    }
};

template <int MC>
__global__ void __launch_bounds__(MK_THREADS) mv_dp4a(const mv_args a) {
    const uint8_t * xq = mv_stage(a);
    const mv_warp w(a);
    for (int u = w.warp; u < a.mats*a.rows/2; u += w.nw) {
        int mat, r0;
        const uint8_t * w0 = w.unit(a, u, 2, mat, r0);
        float acc0[MC], acc1[MC];
#pragma unroll
        for (int m = 0; m < MC; ++m) {
            acc0[m] = 0.0f;
            acc1[m] = 0.0f;
        }
        mk_pairs<true, true, MC>(w0, w0 + w.rb, a.nb, xq, 0, a.M, w.cs, acc0, acc1, false);
#pragma unroll
        for (int m = 0; m < MC; ++m) {
            if (m < a.M) {
                const float s0 = mk_warp_sum(acc0[m]);
                const float s1 = mk_warp_sum(acc1[m]);
                if (w.lane == 0) {
                    a.y[((size_t) mat*a.M + m)*a.rows + r0]     = s0;
                    a.y[((size_t) mat*a.M + m)*a.rows + r0 + 1] = s1;
                }
            }
        }
    }
}

static __device__ __forceinline__ void mv_mma_u8s8(int (&c)[4], const unsigned (&av)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %11, %12, %13};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(av[0]), "r"(av[1]), "r"(av[2]), "r"(av[3]), "r"(b0), "r"(b1), "r"(0), "r"(0), "r"(0), "r"(0));
}

template <bool G>
static __device__ __forceinline__ unsigned mv_word(const unsigned * p) {
    if constexpr (G) {
        return __ldg(p);
    } else {
        return *p;
    }
}

// block pair p of rows g (its 9 words at p0) and g + 8 (p1), this lane (g, t) of the warp's mma: the words are
// (d0 | q0[0..1], q0[2..13], q0[14..15] | d1, q1[0..15]); the lane's quant bytes 4t..4t+3 of block 0 sit 2 bytes into
// word t, of block 1 in word 5 + t. One mma a block (A: the rows' nibbles, B: column g's records), then mk_dot_rec's
// float step per (row, column, block) into acc: (row g, column 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1). G: the words
// in global memory (read-only loads), else in shared memory. Columns past cols read column (c % cols): unused
template <bool G>
static __device__ __forceinline__ void mv_mma_pair(const unsigned * p0, const unsigned * p1, int p, const uint8_t * xq,
                                                   size_t cs, int cols, float (&acc)[4]) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int g = lane / 4, t = lane % 4, c0 = 2*t, c1 = 2*t + 1;
    const unsigned x00 = mv_word<G>(p0), x04 = mv_word<G>(p0 + 4), y00 = mv_word<G>(p1), y04 = mv_word<G>(p1 + 4);
    const unsigned q00 = __funnelshift_r(mv_word<G>(p0 + t), mv_word<G>(p0 + t + 1), 16), q01 = mv_word<G>(p0 + 5 + t);
    const unsigned q10 = __funnelshift_r(mv_word<G>(p1 + t), mv_word<G>(p1 + t + 1), 16), q11 = mv_word<G>(p1 + 5 + t);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const size_t slot = (size_t) mk_rec_slot(2*p + h)*MK_XQ_REC;
        const uint8_t * rg = xq + (size_t) (g % cols)*cs + slot;
        const unsigned b0 = *(const unsigned *) (rg + 4*t);
        const unsigned b1 = *(const unsigned *) (rg + 16 + 4*t);
        const unsigned qa = h ? q01 : q00, qb = h ? q11 : q10;
        const unsigned av[4] = { qa & 0x0F0F0F0F, qb & 0x0F0F0F0F, (qa >> 4) & 0x0F0F0F0F, (qb >> 4) & 0x0F0F0F0F };
        int c[4];
        mv_mma_u8s8(c, av, b0, b1);
        const float dwa = mk_f16((uint16_t) (h ? (x04 >> 16) : (x00 & 0xffff)));
        const float dwb = mk_f16((uint16_t) (h ? (y04 >> 16) : (y00 & 0xffff)));
        const float2 dq0 = *(const float2 *) (xq + (size_t) (c0 % cols)*cs + slot + 32);   // d, sum of q
        const float2 dq1 = *(const float2 *) (xq + (size_t) (c1 % cols)*cs + slot + 32);
        acc[0] = fmaf(__fmul_rn(dwa, dq0.x), __fsub_rn((float) c[0], __fmul_rn(8.0f, dq0.y)), acc[0]);
        acc[1] = fmaf(__fmul_rn(dwa, dq1.x), __fsub_rn((float) c[1], __fmul_rn(8.0f, dq1.y)), acc[1]);
        acc[2] = fmaf(__fmul_rn(dwb, dq0.x), __fsub_rn((float) c[2], __fmul_rn(8.0f, dq0.y)), acc[2]);
        acc[3] = fmaf(__fmul_rn(dwb, dq1.x), __fsub_rn((float) c[3], __fmul_rn(8.0f, dq1.y)), acc[3]);
    }
}

// a 16-row unit's sums (mv_mma_pair's acc) to y, the columns below M
static __device__ __forceinline__ void mv_mma_store(const mv_args & a, int mat, int r0, const float (&acc)[4]) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int g = lane / 4, c0 = 2*(lane % 4), c1 = c0 + 1;
    float * y = a.y + (size_t) mat*a.M*a.rows + r0;
    if (c0 < a.M) {
        y[(size_t) c0*a.rows + g]     = acc[0];
        y[(size_t) c0*a.rows + g + 8] = acc[2];
    }
    if (c1 < a.M) {
        y[(size_t) c1*a.rows + g]     = acc[1];
        y[(size_t) c1*a.rows + g + 8] = acc[3];
    }
}

__global__ void __launch_bounds__(MK_THREADS) mv_mma(const mv_args a) {
    const uint8_t * xq = mv_stage(a);
    const mv_warp w(a);
    const int g = w.lane / 4;   // mma's groupID: rows g, g + 8 of A and C (mv_mma_pair)
    for (int u = w.warp; u < a.mats*a.rows/16; u += w.nw) {
        int mat, r0;
        const uint8_t * w16 = w.unit(a, u, 16, mat, r0);
        const unsigned * wr0 = (const unsigned *) (w16 + g*w.rb);         // row g
        const unsigned * wr1 = (const unsigned *) (w16 + (g + 8)*w.rb);   // row g + 8
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};   // (row g, c0), (g, c1), (g + 8, c0), (g + 8, c1)
#pragma unroll mv_unroll
        for (int p = 0; p < a.nb/2; ++p) {   // (MV_UNROLL pairs' read-only loads in flight)
            mv_mma_pair<true>(wr0 + 9*p, wr1 + 9*p, p, xq, w.cs, a.cols, acc);
        }
        mv_mma_store(a, mat, r0, acc);
    }
}

// the mma way with the rows' blocks staged through shared memory (mma-s): per step a warp copies CP block pairs of
// its 16 rows (16 x 288 bytes) with 16-byte loads, each row's segment contiguous across lanes (as dp4a's loads are),
// into its own area (rows MV_SROW bytes apart: 76 words, so the lanes' (g, t) fragment words hit 32 banks), the next
// step's loads in registers while the MMAs read this one's
#ifndef MV_STEP_PAIRS
#define MV_STEP_PAIRS 8   // (call J: 8; 20 = gate/up rows in 2 steps spills: the next step is held in registers)
#endif
static constexpr int MV_CP   = MV_STEP_PAIRS;      // block pairs a step
static constexpr int MV_SEG  = MV_CP*36;           // bytes of a row a step (16-byte aligned: MV_CP a multiple of 4)
static constexpr int MV_SC   = MV_SEG/16;          // 16-byte chunks of a row a step
// a row's stride in the warp's area: its words an odd multiple of 4 mod 32 (304 bytes = 76 words for 8 pairs, 720 = 180
// for 20), so the lanes' (g, t) fragment words fall on 32 banks
static constexpr int mv_srow(int seg) { return (seg/4) % 8 == 4 ? seg : mv_srow(seg + 16); }
static constexpr int MV_SROW = mv_srow(MV_SEG);
static constexpr int MV_NLD  = (16*MV_SC + 31)/32; // 16-byte loads a lane a step (9 for 8 pairs)
static_assert(MV_CP % 4 == 0, "a step's strip: whole 16-byte chunks");

__global__ void __launch_bounds__(MK_THREADS) mv_mma_s(const mv_args a) {
    const uint8_t * xq = mv_stage(a);
    extern __shared__ __align__(16) uint8_t sm[];
    const mv_warp w(a);
    const int g = w.lane / 4;
    uint8_t * area  = sm + a.cols*w.cs + (size_t) w.wb*16*MV_SROW;   // (after the records)
    const int steps = a.nb/2/MV_CP;
    for (int u = w.warp; u < a.mats*a.rows/16; u += w.nw) {
        int mat, r0;
        const uint8_t * w16 = w.unit(a, u, 16, mat, r0);   // the 16 rows
        uint4 ld[MV_NLD];
        auto fetch = [&](int s) {
#pragma unroll
            for (int i = 0; i < MV_NLD; ++i) {
                const int c = i*WARP_SIZE + w.lane;   // 16-byte chunk c: row c/MV_SC, its chunk c%MV_SC
                if (c < 16*MV_SC) ld[i] = __ldg((const uint4 *) (w16 + (size_t) (c/MV_SC)*w.rb + (size_t) s*MV_SEG) + c % MV_SC);
            }
        };
        fetch(0);
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int s = 0; s < steps; ++s) {
            __syncwarp();   // (the area's last step read)
#pragma unroll
            for (int i = 0; i < MV_NLD; ++i) {
                const int c = i*WARP_SIZE + w.lane;
                if (c < 16*MV_SC) *(uint4 *) (area + (c/MV_SC)*MV_SROW + 16*(c % MV_SC)) = ld[i];
            }
            __syncwarp();
            if (s + 1 < steps) {
                fetch(s + 1);
            }
            const unsigned * ra = (const unsigned *) (area + g*MV_SROW);
            const unsigned * rbw = (const unsigned *) (area + (g + 8)*MV_SROW);
#pragma unroll
            for (int pp = 0; pp < MV_CP; ++pp) {
                mv_mma_pair<false>(ra + 9*pp, rbw + 9*pp, s*MV_CP + pp, xq, w.cs, a.cols, acc);
            }
        }
        mv_mma_store(a, mat, r0, acc);
    }
}

// the mma way with the rows' strips copied by cp.async into a ring of MV_RING areas per warp (mma-a): steps of
// MV_AP block pairs (16 rows x 144 bytes), MV_RING - 1 steps in flight, no registers held for them
static constexpr int NMODE    = 4;   // dp4a, mma, mma-s, mma-a
static constexpr int MV_AP    = 4;
static constexpr int MV_ASEG  = MV_AP*36;          // 144 bytes of a row a step
static constexpr int MV_ASC   = MV_ASEG/16;        // 9 chunks
static constexpr int MV_AROW  = mv_srow(MV_ASEG);  // 144 (36 words: 4 mod 8)
static constexpr int MV_RING  = 4;
static constexpr int MV_AAREA = 16*MV_AROW;

static __device__ __forceinline__ void mv_cp16(void * dst, const void * src) {
    const unsigned d = (unsigned) __cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(d), "l"(src) : "memory");
}
static __device__ __forceinline__ void mv_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void mv_cp_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

__global__ void __launch_bounds__(MK_THREADS) mv_mma_a(const mv_args a) {
    const uint8_t * xq = mv_stage(a);
    extern __shared__ __align__(16) uint8_t sm[];
    const mv_warp w(a);
    const int g = w.lane / 4;
    uint8_t * ring  = sm + a.cols*w.cs + (size_t) w.wb*MV_RING*MV_AAREA;
    const int steps = a.nb/2/MV_AP;
    for (int u = w.warp; u < a.mats*a.rows/16; u += w.nw) {
        int mat, r0;
        const uint8_t * w16 = w.unit(a, u, 16, mat, r0);
        // step s's 16 x 9 chunks into area s % MV_RING (a group committed for every step, empty past the last)
        auto issue = [&](int s) {
            if (s < steps) {
                uint8_t * area = ring + (s % MV_RING)*MV_AAREA;
                for (int c = w.lane; c < 16*MV_ASC; c += WARP_SIZE) {
                    mv_cp16(area + (c/MV_ASC)*MV_AROW + 16*(c % MV_ASC),
                            w16 + (size_t) (c/MV_ASC)*w.rb + (size_t) s*MV_ASEG + 16*(c % MV_ASC));
                }
            }
            mv_cp_commit();
        };
        for (int s = 0; s < MV_RING - 1; ++s) {
            issue(s);
        }
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int s = 0; s < steps; ++s) {
            mv_cp_wait<MV_RING - 2>();   // step s landed (this lane's copies)
            __syncwarp();                // (every lane's; and every lane done with step s - 1's area)
            issue(s + MV_RING - 1);
            const uint8_t * area = ring + (s % MV_RING)*MV_AAREA;
            const unsigned * ra  = (const unsigned *) (area + g*MV_AROW);
            const unsigned * rbw = (const unsigned *) (area + (g + 8)*MV_AROW);
#pragma unroll
            for (int pp = 0; pp < MV_AP; ++pp) {
                mv_mma_pair<false>(ra + 9*pp, rbw + 9*pp, s*MV_AP + pp, xq, w.cs, a.cols, acc);
            }
        }
        mv_cp_wait<0>();
        __syncwarp();   // (the ring is refilled by the next unit)
        mv_mma_store(a, mat, r0, acc);
    }
}

static uint16_t f2h(float f) {
    __half h = __float2half(f);
    return *(uint16_t *) &h;
}
static float h2f(uint16_t u) {
    __half h;
    memcpy(&h, &u, 2);
    return __half2float(h);
}

int main(int argc, char ** argv) {
    int rows = 10240, K = 2560, mats = 8, reps = 15, cols = 8;
    if (argc % 2 == 0) {
        fprintf(stderr, "%s: every option takes a value (--rows N --k N --mats N --reps N --cols N)\n", argv[argc - 1]);
        return 2;
    }
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string o = argv[i];
        const int v = atoi(argv[i + 1]);
        if (o == "--rows") rows = v; else if (o == "--k") K = v; else if (o == "--mats") mats = v; else if (o == "--reps") reps = v; else if (o == "--cols") cols = v;
        else { fprintf(stderr, "unknown option %s\n", o.c_str()); return 2; }
    }
    if (rows % 16 || K % 64 || (K/64) % MV_CP || (K/64) % MV_AP || !mk_rec_fits(K) || cols < 1 || cols > 8) {
        fprintf(stderr, "rows must be a multiple of 16, K of 64 with K/64 a multiple of %d (the staged way's steps)\n", MV_CP);
        return 2;
    }
    const int nb = K/32;
    const size_t rb = (size_t) nb*BQ, wbytes = (size_t) mats*rows*rb;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("mv_mma: %s, %d SMs; %d matrices of %d x %d Q4_0 (%.1f MB), columns M = 1..8\n", prop.name,
           prop.multiProcessorCount, mats, rows, K, wbytes/1e6);

    // random weights (scales 0.01..0.03, random nibbles) and records (q in -127..127, d 0.001..0.01, sum of q)
    srand(1234);
    auto rnd = [] { return (unsigned) rand(); };
    std::vector<uint8_t> w(wbytes);
    for (size_t r = 0; r < (size_t) mats*rows; ++r) {
        for (int b = 0; b < nb; ++b) {
            uint8_t * blk = w.data() + r*rb + (size_t) b*BQ;
            const uint16_t d = f2h(0.01f + 0.02f*(rnd() % 1000)/1000.0f);
            memcpy(blk, &d, 2);
            for (int j = 0; j < 16; ++j) blk[2 + j] = (uint8_t) rnd();
        }
    }
    std::vector<uint8_t> rec((size_t) cols*nb*MK_XQ_REC, 0);
    std::vector<std::vector<int8_t>> xqv(cols, std::vector<int8_t>((size_t) K));
    std::vector<std::vector<float>>  xd(cols, std::vector<float>(nb));
    for (int m = 0; m < cols; ++m) {
        for (int b = 0; b < nb; ++b) {
            uint8_t * rp = rec.data() + ((size_t) m*nb + mk_rec_slot(b))*MK_XQ_REC;
            int s = 0;
            for (int j = 0; j < 32; ++j) {
                const int8_t q = (int8_t) ((int) (rnd() % 255) - 127);
                xqv[m][32*b + j] = q;
                rp[j] = (uint8_t) q;
                s += q;
            }
            const float d = 0.001f + 0.009f*(rnd() % 1000)/1000.0f, sf = (float) s;
            xd[m][b] = d;
            memcpy(rp + 32, &d, 4);
            memcpy(rp + 36, &sf, 4);
        }
    }
    uint8_t * dw, * drec;
    float * dy;
    CK(cudaMalloc(&dw, wbytes));
    CK(cudaMalloc(&drec, rec.size()));
    CK(cudaMalloc(&dy, (size_t) mats*cols*rows*sizeof(float)));
    CK(cudaMemcpy(dw, w.data(), wbytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(drec, rec.data(), rec.size(), cudaMemcpyHostToDevice));
    const size_t smem = rec.size(), smem_s = rec.size() + (size_t) MK_WARPS*16*MV_SROW;
    const size_t smem_a = rec.size() + (size_t) MK_WARPS*MV_RING*MV_AAREA;
    CK(cudaFuncSetAttribute(mv_dp4a<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem));
    CK(cudaFuncSetAttribute(mv_dp4a<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem));
    CK(cudaFuncSetAttribute(mv_dp4a<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem));
    CK(cudaFuncSetAttribute(mv_mma, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem));
    // a way whose shared memory does not fit this shape and column count is left out, said once
    bool on[4] = { true, true, smem_s <= prop.sharedMemPerBlockOptin, smem_a <= prop.sharedMemPerBlockOptin };
    if (on[2]) CK(cudaFuncSetAttribute(mv_mma_s, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem_s));
    if (on[3]) CK(cudaFuncSetAttribute(mv_mma_a, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem_a));
    const int grid = prop.multiProcessorCount;

    static const char * const names[NMODE] = { "dp4a", "mma", "mma-s", "mma-a" };
    for (int i = 0; i < NMODE; ++i) {
        if (!on[i]) {
            printf("%s left out: its shared memory (%zu bytes) is more than a block may have (%zu; try --cols 4)\n", names[i],
                   i == 2 ? smem_s : smem_a, (size_t) prop.sharedMemPerBlockOptin);
        }
    }
    auto launch = [&](int mode, int M) {
        const mv_args a = { dw, drec, dy, rows, nb, mats, M, cols };
        if (mode == 1) {
            mv_mma<<<grid, MK_THREADS, smem>>>(a);
        } else if (mode == 2) {
            mv_mma_s<<<grid, MK_THREADS, smem_s>>>(a);
        } else if (mode == 3) {
            mv_mma_a<<<grid, MK_THREADS, smem_a>>>(a);
        } else if (M == 1) {
            mv_dp4a<1><<<grid, MK_THREADS, smem>>>(a);
        } else if (M <= 4) {   // (the megakernel's verify code for 2..4 columns, MK_MC_SMALL)
            mv_dp4a<4><<<grid, MK_THREADS, smem>>>(a);
        } else {
            mv_dp4a<8><<<grid, MK_THREADS, smem>>>(a);
        }
        CK(cudaGetLastError());
    };

    // correctness: every column of a sample of rows against a float64 reference, both ways
    int bad = 0;
    for (int mode = 0; mode < NMODE; ++mode) {
        if (!on[mode]) continue;
        launch(mode, cols);
        CK(cudaDeviceSynchronize());
        std::vector<float> y((size_t) mats*cols*rows);
        CK(cudaMemcpy(y.data(), dy, y.size()*sizeof(float), cudaMemcpyDeviceToHost));
        double worst = 0.0;
        for (int s = 0; s < 64; ++s) {
            const int mat = s % mats, r = (int) ((s*7919L) % rows);
            for (int m = 0; m < cols; ++m) {
                double ref = 0.0, mag = 0.0;
                for (int b = 0; b < nb; ++b) {
                    const uint8_t * blk = w.data() + ((size_t) mat*rows + r)*rb + (size_t) b*BQ;
                    uint16_t d;
                    memcpy(&d, blk, 2);
                    long si = 0;
                    for (int j = 0; j < 16; ++j) {
                        si += (long) ((blk[2 + j] & 15) - 8)*xqv[m][32*b + j] + (long) ((blk[2 + j] >> 4) - 8)*xqv[m][32*b + 16 + j];
                    }
                    ref += (double) h2f(d)*xd[m][b]*(double) si;
                    mag += fabs((double) h2f(d)*xd[m][b]*(double) si);
                }
                const double got = y[((size_t) mat*cols + m)*rows + r];
                worst = std::max(worst, fabs(got - ref)/std::max(mag, 1e-30));
            }
        }
        const bool ok = worst < 1e-5;
        bad += !ok;
        printf("check %-5s: every column of 64 rows vs float64, worst |error| / sum|terms| = %.2e %s\n", names[mode],
               worst, ok ? "ok" : "FAIL");
    }

    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double base[NMODE] = {};
    printf("%3s", "M");
    for (int i = 0; i < NMODE; ++i) {
        printf(" %7s us %6s %6s", names[i], "/M=1", "GB/s");
    }
    printf("\n");
    for (int M = 1; M <= cols; ++M) {
        std::vector<float> t[NMODE];
        for (int i = 0; i < 2; ++i) {
            for (int k = 0; k < NMODE; ++k) {
                if (on[k]) launch(k, M);
            }
        }
        for (int r = 0; r < reps; ++r) {
            for (int k = 0; k < NMODE; ++k) {
                const int mode = r % 2 == 0 ? k : NMODE - 1 - k;   // ABCD, DCBA, ...
                if (!on[mode]) continue;
                CK(cudaEventRecord(e0));
                launch(mode, M);
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                t[mode].push_back(1000.0f*ms);
            }
        }
        printf("%3d", M);
        for (int i = 0; i < NMODE; ++i) {
            if (!on[i]) {
                printf(" %10s %6s %6s", "-", "-", "-");
                continue;
            }
            std::sort(t[i].begin(), t[i].end());
            const double med = t[i][t[i].size()/2];
            if (M == 1) base[i] = med;
            printf(" %10.1f %6.3f %6.0f", med, med/base[i], wbytes/med/1e3);
        }
        printf("\n");
    }
    printf("mv_mma: %s\n", bad ? "FAILED" : "done");
    return bad ? 1 : 0;
}
