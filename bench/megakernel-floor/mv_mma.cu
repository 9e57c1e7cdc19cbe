// mv_mma.cu: the int8 MMA lever for the megakernel's verify mat-vecs, measured apart from the kernel (session 38).
//
// A verify step of M tokens costs the megakernel 1.38 / 1.50 / 1.60x a one-token step for M = 2 / 3 / 4 (E4B-shaped,
// H100): each extra column costs the mat-vecs a record load and 8 dp4a per 32 weights, about what decoding the block
// costs, so they are issue-bound. mma.m16n8k32 (u8 x s8 -> s32) takes 16 rows x one 32-value block x 8 columns per
// instruction. This program streams Q4_0 matrices (GGUF layout, the E4B widths) against M columns of 8-bit records
// in shared memory (the megakernel's 48-byte records in their mk_rec_slot places) several ways, in one persistent grid of
// one 512-thread block per SM like the megakernel's:
//   dp4a  the megakernel's own one-token and verify code: mk_pairs (two rows a warp, a lane per block pair, records
//         per column) and a warp tree per row and column
//   (session 38's way "mma", a warp per 16 rows with direct 4-byte loads of each row, ~1080 / 800 GB/s in its call H,
//   was dropped in session 39; its code is in git history)
//   mma-s a warp per 16 rows: per block one mma.sync.m16n8k32.row.col.s32.u8.s8.s32 (A: the rows' unsigned nibbles;
//         B: the records of columns 0..7), then the same float step per row, column and block as mk_dot_rec
//         (sf = si - 8*sum, fmaf(dw*dx, sf, acc)); each lane keeps rows g, g+8 x columns 2t, 2t+1: no tree. The 16
//         rows' blocks staged through shared memory by row-contiguous 16-byte loads, as dp4a's are, the next step held
//         in registers (call J)
//   mma-a the same by cp.async into a ring of 4 areas a warp (steps of 4 block pairs, 3 in flight), per unit (call K)
//   mma-c the ring running across the warp's units (session 39)
//   mma-x mma-c summing in dp4a's order: every output bit for bit the dp4a way's (checked), so a verify could take
//         the MMA while the one-token step keeps dp4a (session 39; mv_mma_ring's comment)
//   mma-o mma-x's order of strips with mma-c's sums: what mma-x's walk costs the stream, apart from its merges
//   mma-b mma-c with the strips copied by the bulk copy engine (a cp.async.bulk a row, on an mbarrier an area), as the
//         megakernel's tiles are
//   mma-i mma-c without its float step: the blocks' integer sums added in the mma's accumulator (checked as such, not a
//         mat-vec): the stream's rate where the per (row, column, block) float work is gone
//   mma-q mma-x's walk and bits with a float step for M <= 4 columns only (each quad lane a leaf; mv_quad_step),
//         checked bit for bit against dp4a at min(cols, 4) columns; written in session 39, first run in session 40
// --cols 4 keeps records for 4 columns only (M = 1..4; down's 10240-value rows leave too little shared memory for
// 8 columns and the ring)
// The integer sums are exact, so all give each (row, column, block) the same si; only the order the blocks' float
// terms are added in differs. Every way is checked against a float64 reference (mma-i against the exact integer
// sums), mma-x and mma-q also bit for bit against dp4a. Prints, per M = 1..cols, the median time of a pass over the
// matrices (launches in alternating order), its ratio to M = 1 and the GB/s of the weights.
//
//   nvcc -std=c++17 -O3 -arch=sm_90 -I$SRC/ggml/src -I$SRC/ggml/include -Imegakernel -Imegakernel/cuda \
//        bench/megakernel-floor/mv_mma.cu -o mv_mma && ./mv_mma [--rows 10240 --k 2560] [--mats 8] [--reps 15] [--cols 8]
//   (K/64 a multiple of MV_STEP_PAIRS: the staged way's steps; -DMV_STEP_PAIRS=20 for 720-byte strips; the ring ways'
//   knobs MV_AP_PAIRS, MV_RING, MV_WARPS, MV_L2PF below. On the lent GPU: mv_mma-device.sh, several builds at once)
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
    __device__ explicit mv_warp(const mv_args & a, int W = MK_WARPS)   // (W: the warps of a block that work)
        : lane(threadIdx.x % WARP_SIZE), wb(threadIdx.x / WARP_SIZE), warp(wb*gridDim.x + blockIdx.x),
          nw(gridDim.x*W), rb((size_t) a.nb*BQ), cs((size_t) a.nb*MK_XQ_REC) {}
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

// one mma.m16n8k32 of a block, added to d: A the 16 rows' weights as bytes (unsigned nibbles, or S8: signed
// 16*(n - 8)), B the 8 columns' 8-bit records
template <bool S8>
static __device__ __forceinline__ void mv_mma_k32(int (&d)[4], const unsigned (&av)[4], unsigned b0, unsigned b1) {
    if constexpr (S8) {
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                     "{%0, %1, %2, %3};"
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                     : "r"(av[0]), "r"(av[1]), "r"(av[2]), "r"(av[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                     "{%0, %1, %2, %3};"
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                     : "r"(av[0]), "r"(av[1]), "r"(av[2]), "r"(av[3]), "r"(b0), "r"(b1));
    }
}

// this lane's (g, t) A fragment of block h of a block pair, rows g (its 9 words at p0) and g + 8 (p1): the words are
// (d0 | q0[0..1], q0[2..13], q0[14..15] | d1, q1[0..15]); the lane's quant bytes 4t..4t+3 of block 0 sit 2 bytes into
// word t, of block 1 in word 5 + t; their low nibbles are values 4t.., their high ones 16 + 4t.. (unsigned, or S8:
// 16*(n - 8) as signed bytes: ((n ^ 8) << 4))
template <bool S8>
static __device__ __forceinline__ void mv_afrag(const unsigned * p0, const unsigned * p1, int t, int h, unsigned (&av)[4]) {
    const unsigned qa = h ? p0[5 + t] : __funnelshift_r(p0[t], p0[t + 1], 16);
    const unsigned qb = h ? p1[5 + t] : __funnelshift_r(p1[t], p1[t + 1], 16);
    if constexpr (S8) {
        av[0] = ((qa << 4) & 0xF0F0F0F0) ^ 0x80808080;
        av[1] = ((qb << 4) & 0xF0F0F0F0) ^ 0x80808080;
        av[2] = (qa & 0xF0F0F0F0) ^ 0x80808080;
        av[3] = (qb & 0xF0F0F0F0) ^ 0x80808080;
    } else {
        av[0] = qa & 0x0F0F0F0F;
        av[1] = qb & 0x0F0F0F0F;
        av[2] = (qa >> 4) & 0x0F0F0F0F;
        av[3] = (qb >> 4) & 0x0F0F0F0F;
    }
}

// block pair p of rows g (its 9 words at p0) and g + 8 (p1), this lane (g, t) of the warp's mma. One mma a block
// (A: the rows' nibbles, mv_afrag; B: column g's records), then mk_dot_rec's
// float step per (row, column, block) into acc: (row g, column 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1); the words in
// shared memory. Columns past cols read column (c % cols): unused
static __device__ __forceinline__ void mv_mma_pair(const unsigned * p0, const unsigned * p1, int p, const uint8_t * xq,
                                                   size_t cs, int cols, float (&acc)[4]) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int g = lane / 4, t = lane % 4, c0 = 2*t, c1 = 2*t + 1;
    const unsigned x00 = p0[0], x04 = p0[4], y00 = p1[0], y04 = p1[4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const size_t slot = (size_t) mk_rec_slot(2*p + h)*MK_XQ_REC;
        const uint8_t * rg = xq + (size_t) (g % cols)*cs + slot;
        unsigned av[4];
        mv_afrag<false>(p0, p1, t, h, av);
        int c[4] = {0, 0, 0, 0};
        mv_mma_k32<false>(c, av, *(const unsigned *) (rg + 4*t), *(const unsigned *) (rg + 16 + 4*t));
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

// mma-i: mv_mma_pair's integer part alone, the blocks' sums added up in the mma's accumulator (no scales, no float
// step: not the mat-vec's values, the stream's rate without the per (row, column, block) float work)
static __device__ __forceinline__ void mv_mma_pair_i(const unsigned * p0, const unsigned * p1, int p, const uint8_t * xq,
                                                     size_t cs, int cols, int (&ci)[4]) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const uint8_t * rg = xq + (size_t) (g % cols)*cs + (size_t) mk_rec_slot(2*p + h)*MK_XQ_REC;
        unsigned av[4];
        mv_afrag<false>(p0, p1, t, h, av);
        mv_mma_k32<false>(ci, av, *(const unsigned *) (rg + 4*t), *(const unsigned *) (rg + 16 + 4*t));
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
                mv_mma_pair(ra + 9*pp, rbw + 9*pp, s*MV_CP + pp, xq, w.cs, a.cols, acc);
            }
        }
        mv_mma_store(a, mat, r0, acc);
    }
}

// the mma way with the rows' strips copied by cp.async into a ring of MV_RING areas per warp: steps of MV_AP block
// pairs (16 rows x 144 bytes), MV_RING - 1 steps in flight, no registers held for them. Three ways:
//   mma-a (call K) the ring filled per unit: its first steps wait out a whole load latency (gate/up's rows are 10 steps)
//   mma-c the ring running across the warp's units: the next unit's first strips fly during this unit's last
//   mma-x mma-c's stream in another order, each (row, column) summed in the dp4a way's order bit for bit (below)
// mma-x: the dp4a way (mk_pairs, then mk_warp_sum) gives lane l the chain P_l over its pairs l, l + 32, ... (each
// pair's blocks in order), then the butterfly: P_l + P_(l^16), then ^8, ^4, ^2, ^1. Float addition commutes bit for
// bit, so that is one fixed tree. With l = 4k + c, the subtree of c (its 8 leaves k = 0..7) is complete after the
// ^16, ^8, ^4 steps (k^4, k^2, k^1), and the sum is (S_0 + S_2) + (S_1 + S_3). A step of mma-x is strip q = k + 8r
// (pairs 4q .. 4q + 3: one per c, round r of leaf k), the k in the tree's order 0, 4, 2, 6, 1, 5, 3, 7 (3 bits
// reversed), each k's rounds in order; after a k's last round, each c's leaf joins a stack of pending sums (a binary
// counter: 3 levels), so a lane keeps 4 floats a (c, output) instead of 32 leaves. The same walk splits a row across
// warps exactly (c = 0, 2 in one, 1, 3 in the other: one add joins them), a freedom the megakernel's wide rows want
static constexpr int NMODE    = 9;   // dp4a, mma-s, mma-a, mma-c, mma-x, mma-o, mma-b, mma-i, mma-q
#ifndef MV_AP_PAIRS
#define MV_AP_PAIRS 4   // block pairs a step (mma-x: 4, one a subtree; -DMV_AP_PAIRS=8 for 288-byte strips, mma-x left out)
#endif
#ifndef MV_L2PF
#define MV_L2PF 0       // the copies' L2 prefetch hint (cp.async's .L2::128B / .L2::256B), 0: none
#endif
static constexpr int MV_AP    = MV_AP_PAIRS;
static constexpr int MV_ASEG  = MV_AP*36;          // 144 bytes of a row a step
static constexpr int MV_ASC   = MV_ASEG/16;        // 9 chunks
static constexpr int MV_AROW  = mv_srow(MV_ASEG);  // 144 (36 words: 4 mod 8)
#ifndef MV_RING
#define MV_RING 4
#endif
#ifndef MV_WARPS
#define MV_WARPS MK_WARPS   // the warps of a block that stream (the rest wait): fewer leave room for longer strips
#endif
static constexpr int MV_AAREA = 16*MV_AROW;

static __device__ __forceinline__ void mv_cp16(void * dst, const void * src) {
    const unsigned d = (unsigned) __cvta_generic_to_shared(dst);
#if MV_L2PF == 256
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" :: "r"(d), "l"(src) : "memory");
#elif MV_L2PF == 128
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;" :: "r"(d), "l"(src) : "memory");
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(d), "l"(src) : "memory");
#endif
}
static __device__ __forceinline__ void mv_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void mv_cp_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

// leaf i of a subtree's walk (value v) onto its stack of pending sums a, b, c (a binary counter's 3 levels: the
// butterfly's ^16, ^8, ^4 steps); true after the last leaf (i == 7), with the subtree's sum in s
static __device__ __forceinline__ bool mv_push_leaf(int i, float v, float & a, float & b, float & c, float & s) {
    if (i % 2 == 0) {
        a = v;
        return false;
    }
    const float l1 = a + v;
    if (i % 4 == 1) {
        b = l1;
        return false;
    }
    const float l2 = b + l1;
    if (i == 3) {
        c = l2;
        return false;
    }
    s = c + l2;
    return true;
}

// the 8 leaves k of a subtree in the butterfly's order: i's 3 bits reversed
static __device__ __forceinline__ int mv_kord(int i) {
    return ((i & 1) << 2) | (i & 2) | ((i >> 2) & 1);
}

// mma-x's step s of a row of nq strips (nq >= 8): its strip q = k + 8r, the walk's place i of k, and whether it is k's
// last round
static __device__ __forceinline__ int mv_xstrip(int s, int nq, int & i, bool & last) {
    for (i = 0; i < 8; ++i) {
        const int k = mv_kord(i), R = (nq - k + 7)/8;
        if (s < R) {
            last = s == R - 1;
            return k + 8*s;
        }
        s -= R;
    }
    last = false;
    return 0;   // (not reached: s < nq)
}

// mma-q (session 39; not yet run on a GPU): mma-x's walk and bits with a float step that grows with M (M <= 4) instead
// of running for all 8 columns. Lane (g, t) takes leaf c = t of each strip (pair 4q + t): after the 4 mma of a block
// (pairs 4q .. 4q + 3), the lanes holding columns 0..3 (t = 0, 1) put them in the warp's shared memory as
// [row][c][column], and lane (g, t) reads its pair's rows g, g + 8 back (two 16-byte loads); its float steps are then
// 2 rows x M columns a block, not 2 x 2 for 8 columns over the quad. Its stack (3 levels, as mma-x's) is its own
// leaf's only (8 outputs, nothing spills), and the quad's butterfly (^2, ^1) ends each sum as dp4a's does. The mma
// takes the nibbles as signed 16*(n - 8) (((n ^ 8) << 4) as a byte), so its sum is 16*(si - 8*sum of q): shifted
// down 4, that is exactly the integer whose float dp4a's mk_dot_rec makes (__fsub_rn((float) si, 8*sum): exact, all
// below 2^24); one shift and one convert an output instead of a convert, a multiply and a subtract
static constexpr int MV_QBUF = 16*4*4*4;   // bytes of a warp's transpose area: [16 rows][4 pairs][4 columns] ints

// step q of mma-q for this lane: leaf (k, c = t)'s chain over its pair 4q + t, rows g, g + 8 (P[0], P[1]) x columns
// m < M; first: round 0 of its leaf (the chain starts at zero); qb: the warp's transpose area
static __device__ __forceinline__ void mv_quad_step(const unsigned * ra, const unsigned * rbw, int q, bool first,
                                                    const uint8_t * xq, size_t cs, int cols, int M, int * qb,
                                                    float (&P)[2][4]) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int g = lane / 4, t = lane % 4;
    if (first) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
            for (int m = 0; m < 4; ++m) P[r][m] = 0.0f;
        }
    }
    const unsigned * own0 = ra + 9*t, * own1 = rbw + 9*t;   // this lane's pair, rows g and g + 8: its scales
    const unsigned x00 = own0[0], x04 = own0[4], y00 = own1[0], y04 = own1[4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            unsigned av[4];
            mv_afrag<true>(ra + 9*c, rbw + 9*c, t, h, av);
            const uint8_t * rg = xq + (size_t) (g % cols)*cs + (size_t) mk_rec_slot(2*(4*q + c) + h)*MK_XQ_REC;
            int cv[4] = {0, 0, 0, 0};
            mv_mma_k32<true>(cv, av, *(const unsigned *) (rg + 4*t), *(const unsigned *) (rg + 16 + 4*t));
            if (t < 2) {   // columns 2t, 2t + 1 of rows g, g + 8: [row][c][column]
                *(int2 *) (qb + (g*4 + c)*4 + 2*t)       = make_int2(cv[0], cv[1]);
                *(int2 *) (qb + ((g + 8)*4 + c)*4 + 2*t) = make_int2(cv[2], cv[3]);
            }
        }
        __syncwarp();
        const int4 s0 = *(const int4 *) (qb + (g*4 + t)*4);         // row g, pair 4q + t, columns 0..3
        const int4 s1 = *(const int4 *) (qb + ((g + 8)*4 + t)*4);   // row g + 8
        __syncwarp();   // (the area is rewritten by the next block's)
        const float dwa = mk_f16((uint16_t) (h ? (x04 >> 16) : (x00 & 0xffff)));
        const float dwb = mk_f16((uint16_t) (h ? (y04 >> 16) : (y00 & 0xffff)));
        const size_t slot = (size_t) mk_rec_slot(2*(4*q + t) + h)*MK_XQ_REC;
        const int v0[4] = { s0.x, s0.y, s0.z, s0.w }, v1[4] = { s1.x, s1.y, s1.z, s1.w };
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            if (m < M) {
                const float dx = *(const float *) (xq + (size_t) (m % cols)*cs + slot + 32);
                P[0][m] = fmaf(__fmul_rn(dwa, dx), (float) (v0[m] >> 4), P[0][m]);
                P[1][m] = fmaf(__fmul_rn(dwb, dx), (float) (v1[m] >> 4), P[1][m]);
            }
        }
    }
}

// MODE 2: mma-a, 3: mma-c, 4: mma-x, 5: mma-o (mma-x's order of strips, mma-c's sums: what the walk costs the stream),
// 6: mma-b (mma-c's ring filled by the bulk copy engine as the megakernel's tiles are: per step lane 0 expects the
// strip's bytes on the area's mbarrier, lanes 0..15 copy a row's piece each with cp.async.bulk), 7: mma-i (mma-c
// with mv_mma_pair_i: no float step), 8: mma-q (mma-x's walk, mv_quad_step; M <= 4)
static __device__ __forceinline__ void mv_bulk_row(void * dst, const void * src, unsigned bytes, unsigned long long * bar) {
    const unsigned d = (unsigned) __cvta_generic_to_shared(dst), b = (unsigned) __cvta_generic_to_shared(bar);
    unsigned long long pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 :: "r"(d), "l"(src), "r"(bytes), "r"(b), "l"(pol) : "memory");
}
static __device__ __forceinline__ void mv_expect(unsigned long long * bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"((unsigned) __cvta_generic_to_shared(bar)), "r"(bytes) : "memory");
}
template <int MODE>
__global__ void __launch_bounds__(MK_THREADS) mv_mma_ring(const mv_args a) {
    const uint8_t * xq = mv_stage(a);
    extern __shared__ __align__(16) uint8_t sm[];
    const mv_warp w(a, MV_WARPS);
    if (w.wb >= MV_WARPS) {
        return;
    }
    const int g = w.lane / 4;
    uint8_t * ring  = sm + a.cols*w.cs + (size_t) w.wb*MV_RING*MV_AAREA;
    // mma-b: this warp's mbarriers, one an area (after every warp's ring)
    unsigned long long * bar = (unsigned long long *) (sm + a.cols*w.cs + (size_t) MV_WARPS*MV_RING*MV_AAREA) + w.wb*MV_RING;
    if (MODE == 6) {
        if (w.lane == 0) {
            for (int j = 0; j < MV_RING; ++j) {
                mk_mbar_init(&bar[j]);
            }
            mk_mbar_init_fence();
        }
        __syncwarp();
    }
    const int nq    = a.nb/2/MV_AP;   // strips (steps) of a unit
    const int units = a.mats*a.rows/16;
    const int mine  = w.warp < units ? (units - w.warp + w.nw - 1)/w.nw : 0;   // this warp's units
    // flat step f = this warp's unit f / nq, its step f % nq: the 16 x 9 chunks into area f % MV_RING (a group committed
    // for every step, empty past the last; mma-a: only within the unit of step `within`)
    auto issue = [&](int f, int within) {
        if (f < mine*nq && (MODE != 2 || f/nq == within)) {
            int i;
            bool last;
            const int s = f % nq;
            const int q = MODE == 4 || MODE == 5 || MODE == 8 ? mv_xstrip(s, nq, i, last) : s;
            int mat, r0;
            const uint8_t * w16 = w.unit(a, w.warp + (f/nq)*w.nw, 16, mat, r0);
            uint8_t * area = ring + (f % MV_RING)*MV_AAREA;
            if constexpr (MODE == 6) {
                if (w.lane == 0) {
                    mv_expect(&bar[f % MV_RING], 16*MV_ASEG);
                }
                __syncwarp();
                if (w.lane < 16) {
                    mv_bulk_row(area + w.lane*MV_AROW, w16 + (size_t) w.lane*w.rb + (size_t) q*MV_ASEG, MV_ASEG, &bar[f % MV_RING]);
                }
                return;
            }
            for (int c = w.lane; c < 16*MV_ASC; c += WARP_SIZE) {
                mv_cp16(area + (c/MV_ASC)*MV_AROW + 16*(c % MV_ASC),
                        w16 + (size_t) (c/MV_ASC)*w.rb + (size_t) q*MV_ASEG + 16*(c % MV_ASC));
            }
        }
        if constexpr (MODE != 6) {
            mv_cp_commit();
        }
    };
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int   ci[4]  = {0, 0, 0, 0};   // (mma-i)
    // mma-x: leaf chains P and the stacks' pending sums (pair c, output o); mma-q: its one leaf's chain Q and stack
    // A, B, C [0..1][m] (rows g, g + 8, column m), then A its sums
    float P[MV_AP][4], A[MV_AP][4], B[MV_AP][4], C[MV_AP][4], Q[2][4];
    int * qb = (int *) (sm + a.cols*w.cs + (size_t) MV_WARPS*MV_RING*(MV_AAREA + 8) + (size_t) w.wb*MV_QBUF);   // (mma-q)
    for (int f = 0; f < mine*nq; ++f) {
        const int s = f % nq;
        if (MODE == 2 ? s == 0 : f == 0) {
            for (int j = 0; j < MV_RING - 1; ++j) {
                issue(f + j, f/nq);
            }
        }
        if constexpr (MODE == 6) {
            mk_mbar_wait(&bar[f % MV_RING], (unsigned) (f/MV_RING) & 1u);   // (area f % MV_RING's use f / MV_RING)
        } else {
            mv_cp_wait<MV_RING - 2>();   // step f landed (this lane's copies)
        }
        __syncwarp();                // (every lane's; and every lane done with step f - 1's area)
        issue(f + MV_RING - 1, f/nq);
        const uint8_t * area = ring + (f % MV_RING)*MV_AAREA;
        const unsigned * ra  = (const unsigned *) (area + g*MV_AROW);
        const unsigned * rbw = (const unsigned *) (area + (g + 8)*MV_AROW);
        if constexpr (MODE == 8) {
            int i;
            bool last;
            const int q = mv_xstrip(s, nq, i, last);
            mv_quad_step(ra, rbw, q, q < 8, xq, w.cs, a.cols, a.M, qb, Q);
            if (last) {
#pragma unroll
                for (int r = 0; r < 2; ++r) {
#pragma unroll
                    for (int m = 0; m < 4; ++m) {
                        float S;
                        if (mv_push_leaf(i, Q[r][m], A[r][m], B[r][m], C[r][m], S)) {
                            // the lane's c summed: the quad's butterfly, ^2 then ^1 (dp4a's last steps), into A
                            S += __shfl_xor_sync(0xffffffff, S, 2);
                            S += __shfl_xor_sync(0xffffffff, S, 1);
                            A[r][m] = S;
                        }
                    }
                }
            }
        } else if constexpr (MODE == 4) {
            int i;
            bool last;
            const int q = mv_xstrip(s, nq, i, last);
            const bool first = q < 8;   // (round 0 of k)
#pragma unroll
            for (int c = 0; c < MV_AP; ++c) {
                if (first) {
#pragma unroll
                    for (int o = 0; o < 4; ++o) P[c][o] = 0.0f;
                }
                mv_mma_pair(ra + 9*c, rbw + 9*c, MV_AP*q + c, xq, w.cs, a.cols, P[c]);
            }
            if (last) {
#pragma unroll
                for (int o = 0; o < 4; ++o) {
#pragma unroll
                    for (int c = 0; c < MV_AP; ++c) {
                        float S;
                        if (mv_push_leaf(i, P[c][o], A[c][o], B[c][o], C[c][o], S)) {
                            P[c][o] = S;   // (i == 7: S_c)
                        }
                    }
                    if (i == 7) {
                        acc[o] = (P[0][o] + P[2][o]) + (P[1][o] + P[3][o]);
                    }
                }
            }
        } else {
            int i;
            bool last;
            const int q = MODE == 5 ? mv_xstrip(s, nq, i, last) : s;   // (mma-b, mma-i: mma-c's order)
#pragma unroll
            for (int pp = 0; pp < MV_AP; ++pp) {
                if constexpr (MODE == 7) {
                    mv_mma_pair_i(ra + 9*pp, rbw + 9*pp, q*MV_AP + pp, xq, w.cs, a.cols, ci);
                } else {
                    mv_mma_pair(ra + 9*pp, rbw + 9*pp, q*MV_AP + pp, xq, w.cs, a.cols, acc);
                }
            }
        }
        if (s == nq - 1) {
            if (MODE == 2) {
                mv_cp_wait<0>();
                __syncwarp();   // (the ring is refilled by the next unit)
            }
            int mat, r0;
            w.unit(a, w.warp + (f/nq)*w.nw, 16, mat, r0);
            if constexpr (MODE == 7) {
#pragma unroll
                for (int o = 0; o < 4; ++o) {
                    acc[o] = (float) ci[o];
                    ci[o]  = 0;
                }
            }
            if constexpr (MODE == 8) {   // (the quad's lane 0: rows g, g + 8, columns < M; A holds the sums)
                if (w.lane % 4 == 0) {
                    float * y = a.y + (size_t) mat*a.M*a.rows + r0;
#pragma unroll
                    for (int m = 0; m < 4; ++m) {
                        if (m < a.M) {
                            y[(size_t) m*a.rows + g]     = A[0][m];
                            y[(size_t) m*a.rows + g + 8] = A[1][m];
                        }
                    }
                }
            } else {
                mv_mma_store(a, mat, r0, acc);
            }
#pragma unroll
            for (int o = 0; o < 4; ++o) acc[o] = 0.0f;
        }
    }
    mv_cp_wait<0>();
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
    printf("mv_mma: %s, %d SMs; %d matrices of %d x %d Q4_0 (%.1f MB), columns M = 1..%d; ring ways: strips of %d pairs "
           "(%d bytes a row), a ring of %d, %d warps a block\n", prop.name, prop.multiProcessorCount, mats, rows, K, wbytes/1e6,
           cols, MV_AP, MV_ASEG, MV_RING, MV_WARPS);

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
    // (mma-b's mbarriers after the rings, then mma-q's transpose areas)
    const size_t smem_a = rec.size() + (size_t) MV_WARPS*MV_RING*(MV_AAREA + 8) + (size_t) MV_WARPS*MV_QBUF;
    CK(cudaFuncSetAttribute(mv_dp4a<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem));
    CK(cudaFuncSetAttribute(mv_dp4a<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem));
    CK(cudaFuncSetAttribute(mv_dp4a<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem));
    // a way whose shared memory does not fit this shape and column count is left out, said once; mma-x needs rows of
    // at least 8 strips (every leaf of the tree a strip: K >= 2048)
    const bool fa = smem_a <= prop.sharedMemPerBlockOptin;
    const bool fx = fa && MV_AP == 4 && nb/2/MV_AP >= 8;
    bool on[NMODE] = { true, smem_s <= prop.sharedMemPerBlockOptin, fa, fa, fx, fx, fa, fa, fx };
    auto runs = [&](int mode, int M) { return on[mode] && (mode != 8 || M <= 4); };   // (mma-q: up to 4 columns)
    if (on[1]) CK(cudaFuncSetAttribute(mv_mma_s, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem_s));
    // the ring ways' kernels by mode (mv_mma_ring<MODE>)
    void (* const ring[NMODE])(const mv_args) = { nullptr, nullptr, mv_mma_ring<2>, mv_mma_ring<3>, mv_mma_ring<4>,
                                                  mv_mma_ring<5>, mv_mma_ring<6>, mv_mma_ring<7>, mv_mma_ring<8> };
    for (int i = 0; i < NMODE; ++i) {
        if (ring[i] != nullptr && fa) {
            CK(cudaFuncSetAttribute(ring[i], cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem_a));
        }
    }
    const int grid = prop.multiProcessorCount;

    static const char * const names[NMODE] = { "dp4a", "mma-s", "mma-a", "mma-c", "mma-x", "mma-o", "mma-b", "mma-i", "mma-q" };
    for (int i = 0; i < NMODE; ++i) {
        if (!on[i] && (i == 4 || i == 5 || i == 8) && fa) {
            printf("%s left out: it takes strips of 4 pairs (this build: %d) and rows of at least 8 (K >= 2048)\n", names[i], MV_AP);
        } else if (!on[i]) {
            printf("%s left out: its shared memory (%zu bytes) is more than a block may have (%zu; try --cols 4)\n", names[i],
                   i == 1 ? smem_s : smem_a, (size_t) prop.sharedMemPerBlockOptin);
        }
    }
    auto launch = [&](int mode, int M) {
        const mv_args a = { dw, drec, dy, rows, nb, mats, M, cols };
        if (mode == 1) {
            mv_mma_s<<<grid, MK_THREADS, smem_s>>>(a);
        } else if (ring[mode] != nullptr) {
            ring[mode]<<<grid, MK_THREADS, smem_a>>>(a);
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
    std::vector<float> y0;   // the dp4a way's outputs: mma-x must give them bit for bit
    auto outputs = [&](int mode, int M) {   // (NaN first: an output never written shows)
        CK(cudaMemset(dy, 0xff, (size_t) mats*cols*rows*sizeof(float)));
        launch(mode, M);
        CK(cudaDeviceSynchronize());
        std::vector<float> y((size_t) mats*M*rows);
        CK(cudaMemcpy(y.data(), dy, y.size()*sizeof(float), cudaMemcpyDeviceToHost));
        return y;
    };
    // a way that sums in dp4a's order (mma-x, mma-q): all its outputs bit for bit dp4a's
    auto bitwise = [&](int mode, const std::vector<float> & y, const std::vector<float> & yd, int M) {
        size_t ndiff = 0, first = 0;
        for (size_t i = 0; i < y.size(); ++i) {
            if (memcmp(&y[i], &yd[i], 4) != 0 && ndiff++ == 0) first = i;
        }
        bad += ndiff != 0;
        printf("check %-5s: all %zu outputs (M = %d) vs dp4a's bit for bit: %zu differ%s", names[mode], y.size(), M, ndiff,
               ndiff ? "" : " ok\n");
        if (ndiff) {
            printf(" (first: output %zu, %.9g vs %.9g) FAIL\n", first, y[first], yd[first]);
        }
    };
    for (int mode = 0; mode < NMODE; ++mode) {
        if (!on[mode]) continue;
        if (mode == 8) {   // mma-q: its columns (up to 4) against dp4a's at the same count
            const int Mq = std::min(cols, 4);
            bitwise(mode, outputs(8, Mq), outputs(0, Mq), Mq);
            continue;
        }
        const std::vector<float> y = outputs(mode, cols);
        if (mode == 0) {
            y0 = y;
        } else if (mode == 4) {
            bitwise(mode, y, y0, cols);
        }
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
                    const int o8 = mode == 7 ? 0 : 8;   // (mma-i: the unsigned nibbles' sums, no scales)
                    for (int j = 0; j < 16; ++j) {
                        si += (long) ((blk[2 + j] & 15) - o8)*xqv[m][32*b + j] + (long) ((blk[2 + j] >> 4) - o8)*xqv[m][32*b + 16 + j];
                    }
                    const double sc = mode == 7 ? 1.0 : (double) h2f(d)*xd[m][b];
                    ref += sc*(double) si;
                    mag += fabs(sc*(double) si);
                }
                const double got = y[((size_t) mat*cols + m)*rows + r];
                worst = std::max(worst, fabs(got - ref)/std::max(mag, 1e-30));
            }
        }
        const bool ok = worst < 1e-5;
        bad += !ok;
        printf("check %-5s: every column of 64 rows vs float64%s, worst |error| / sum|terms| = %.2e %s\n", names[mode],
               mode == 7 ? " (the integer sums of the unsigned nibbles: mma-i has no float step)" : "", worst, ok ? "ok" : "FAIL");
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
                if (runs(k, M)) launch(k, M);
            }
        }
        for (int r = 0; r < reps; ++r) {
            for (int k = 0; k < NMODE; ++k) {
                const int mode = r % 2 == 0 ? k : NMODE - 1 - k;   // ABC.., ..CBA, ...
                if (!runs(mode, M)) continue;
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
            if (!runs(i, M)) {
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
