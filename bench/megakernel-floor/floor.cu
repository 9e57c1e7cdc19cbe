// floor.cu: the latency floor of the megakernel's design (one grid barrier between dependent phases) on this GPU.
//
// A persistent grid shaped like the megakernel's (one block of MK_THREADS per SM) runs a decode step's phases with the
// megakernel's own grid barrier (mk_grid_arrive_wait) and block sums (mk_block_sums), but none of its arithmetic:
//   mode 0  barriers only
//   mode 1  + the staging's dependency: every block loads the K-float vector the previous phase wrote (through L2) and
//           reduces its sum of squares over the block, then writes its slice of the next vector
//   mode 2  + each phase streams its weight bytes once (16-byte loads spread over every warp, UNROLL in flight per
//           thread), no staging
//   mode 3  both: the floor of a step with this phase list
// and two weight pipelines that carry the stream across the barriers (session 31), each with and without the staging
// dependency:
//   tiles   the megakernel's own: every warp streams its share of a phase in tiles of TB bytes (one bulk copy each,
//           completing on the stage's mbarrier) through NS stages of shared memory, the tiles dealt to the grid's warps
//           SM-first; the next phase's first NS - 1 tiles are issued before the grid barrier (mk_mv_begin)
//   ring    a decoupled stream: one producer warp per SM copies the SM's share of every phase, phase after phase, into
//           a ring of R slots of CB bytes and waits only for free slots, never for a grid barrier; the other 15 warps
//           consume the slots (and do the staging and the barriers), so the stream runs ahead across the barriers by up
//           to the ring's size (the "No Bubbles" form of a megakernel)
// and (--stage, session 35, only that) a study of the staging: every block staging a phase's inputs with the kernel's own
// functions against the inputs staged once for the grid (floor_stage_kernel, below).
// The phase list (bytes per phase, in the kernel body's order) comes from a file (bench/megakernel-floor/phases.py makes
// it from a GGUF); a last run streams every byte in one phase (the bandwidth reference). Prints the median time of a
// step over --reps launches, per phase, and the tokens per second it allows.
//
//   nvcc -std=c++17 -O3 -arch=sm_90 -I$SRC/ggml/src -I$SRC/ggml/include -Imegakernel -Imegakernel/cuda \
//        bench/megakernel-floor/floor.cu -o floor && ./floor --phases phases.txt [--reps 20] [--k 2560] [--quick]
//   ./floor --phases phases.txt --stage [--k 2560 --k-ff 10240]   (the study uses only the list's length)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "mk-device.cuh"
#include "mk-kernel.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#ifndef FLOOR_UNROLL
#define FLOOR_UNROLL 8
#endif

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "floor: %s failed: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)

__global__ void __launch_bounds__(MK_THREADS) floor_kernel(const uint4 * w, const long long * units, int n_phases,
                                                          float * vec, int K, int mode, unsigned * bar,
                                                          unsigned long long * sink) {
    __shared__ float red[MK_WARPS*MK_M];
    const int lane = threadIdx.x % WARP_SIZE;
    // warps SM-first, as the megakernel deals its units
    const long long gw = (long long) (threadIdx.x / WARP_SIZE)*gridDim.x + blockIdx.x;
    const long long nt = (long long) gridDim.x*MK_THREADS;   // threads in the grid
    long long off = 0;
    unsigned acc = 0;
    for (int p = 0; p < n_phases; ++p) {
        const float * in  = vec + (size_t) (p % 2)*K;
        float       * out = vec + (size_t) ((p + 1) % 2)*K;
        float ss[1] = { 0.0f };
        if (mode & 1) {
            for (int i = threadIdx.x; i < K/4; i += MK_THREADS) {
                const float4 v = mk_ldcg4((const float4 *) in + i);
                ss[0] += v.x*v.x + v.y*v.y + v.z*v.z + v.w*v.w;
            }
            mk_block_sums<1>(ss, 1, red);
        }
        if (mode & 2) {
            const long long n = units[p];
            const uint4 * base = w + off;
            for (long long u0 = gw*WARP_SIZE + lane; u0 < n; u0 += nt*FLOOR_UNROLL) {
                uint4 v[FLOOR_UNROLL];
#pragma unroll
                for (int k = 0; k < FLOOR_UNROLL; ++k) {
                    const long long u = u0 + k*nt;
                    v[k] = u < n ? mk_ldcg_u32x4(base + u) : make_uint4(0, 0, 0, 0);
                }
#pragma unroll
                for (int k = 0; k < FLOOR_UNROLL; ++k) {
                    acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
                }
            }
            off += n;
        }
        // the block's slice of the next phase's vector
        const int per = (K + gridDim.x - 1)/gridDim.x;
        for (int i = blockIdx.x*per + threadIdx.x; i < min(K, (blockIdx.x + 1)*per); i += MK_THREADS) {
            out[i] = ss[0]*1e-30f + (float) (acc & 1) + 1.0f;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            mk_grid_arrive_wait(bar, nullptr, 0, 0);
        }
        __syncthreads();
    }
    if (acc == 0x12345678u) {
        sink[0] = acc;   // (keeps the loads)
    }
}

// a wait on an mbarrier phase that gives up (a bug in the pipelines below ends the run with an error instead of holding
// the device until the call's time runs out)
__device__ __forceinline__ void floor_mbar_wait(unsigned long long * bar, unsigned parity, int what) {
    const unsigned b = (unsigned) __cvta_generic_to_shared(bar);
    for (long long n = 0;; ++n) {
        unsigned done;
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done) : "r"(b), "r"(parity) : "memory");
        if (done) {
            return;
        }
        if (n > (1ll << 22)) {
            printf("floor: block %d thread %d: mbarrier wait (%s) never completed\n", blockIdx.x, threadIdx.x,
                   what == 0 ? "tile" : what == 1 ? "ring slot full" : what == 2 ? "ring slot empty" : "staged records");
            __trap();
        }
    }
}

__device__ __forceinline__ void floor_mbar_arrive(unsigned long long * bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"((unsigned) __cvta_generic_to_shared(bar)) : "memory");
}

// a read of a landed tile or slot by the warp's lanes (16 bytes a lane at a time)
__device__ __forceinline__ unsigned floor_touch(const uint8_t * p, long long nb, unsigned acc) {
    for (long long o = 16*(threadIdx.x % WARP_SIZE); o < nb; o += 16*WARP_SIZE) {
        const uint4 v = *(const uint4 *) (p + o);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    return acc;
}

// the pieces of a phase of nb bytes in units of PB bytes (the last one shorter), and the bytes of piece t
__host__ __device__ inline long long floor_pieces(long long nb, int PB) { return (nb + PB - 1)/PB; }
__host__ __device__ inline long long floor_piece_bytes(long long nb, int PB, long long t) { return nb - t*PB < PB ? nb - t*PB : PB; }

#define FLOOR_NS_MAX 8

// the tiles pipeline (see the top of the file); bytes[p]: phase p's weight bytes (multiples of 16)
__global__ void __launch_bounds__(MK_THREADS) floor_tiles_kernel(const uint8_t * w, const long long * bytes, int n_phases,
                                                                float * vec, int K, int staging, int NS, int TB,
                                                                unsigned * bar, unsigned long long * sink) {
    MK_SHARED_DYN(float4, floor_dyn);   // (16-byte aligned: the bulk copies' destinations)
    uint8_t * smem = (uint8_t *) floor_dyn;
    __shared__ float red[MK_WARPS*MK_M];
    __shared__ unsigned long long mbar[MK_WARPS][FLOOR_NS_MAX];
    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    const long long NW = (long long) gridDim.x*MK_WARPS;
    const long long gw = (long long) warp*gridDim.x + blockIdx.x;   // SM-first, as the megakernel deals its units
    uint8_t * st = smem + (size_t) warp*NS*TB;
    if (lane == 0) {
        for (int s = 0; s < NS; ++s) {
            mk_mbar_init(&mbar[warp][s]);
        }
    }
    mk_mbar_init_fence();
    __syncthreads();
    unsigned acc = 0;
    unsigned c_i = 0, c_d = 0;   // this warp's tiles issued, consumed (stage c % NS, its mbarrier's parity (c / NS) & 1)
    long long off = 0;
    auto n_mine = [&](int p) {   // this warp's tiles of phase p
        const long long T = floor_pieces(bytes[p], TB);
        return T > gw ? (T - gw - 1)/NW + 1 : 0;
    };
    auto issue = [&](int p, long long poff, long long j) {   // tile j of this warp in phase p (at byte offset poff)
        if (lane == 0) {
            const long long t = gw + j*NW;
            const int s = (int) (c_i % NS);
            mk_bulk_copy(st + (size_t) s*TB, w + poff + t*TB, (unsigned) floor_piece_bytes(bytes[p], TB, t), &mbar[warp][s]);
        }
        ++c_i;
    };
    for (long long j = 0; j < NS - 1 && j < n_mine(0); ++j) {
        issue(0, 0, j);
    }
    for (int p = 0; p < n_phases; ++p) {
        const float * in  = vec + (size_t) (p % 2)*K;
        float       * out = vec + (size_t) ((p + 1) % 2)*K;
        float ss[1] = { 0.0f };
        if (staging) {
            for (int i = threadIdx.x; i < K/4; i += MK_THREADS) {
                ss[0] = mk_sq4(mk_ldcg4((const float4 *) in + i), ss[0]);
            }
            mk_block_sums<1>(ss, 1, red);
        }
        const long long n = n_mine(p);
        for (long long j = 0; j < n; ++j) {
            if (j + NS - 1 < n) {
                issue(p, off, j + NS - 1);   // into the stage the tile before this one left
            }
            const int s = (int) (c_d % NS);
            floor_mbar_wait(&mbar[warp][s], (c_d / NS) & 1u, 0);
            acc = floor_touch(st + (size_t) s*TB, floor_piece_bytes(bytes[p], TB, gw + j*NW), acc);
            ++c_d;
            __syncwarp();   // (every lane has read the stage before lane 0 refills it)
        }
        off += bytes[p];
        const int per = (K + gridDim.x - 1)/gridDim.x;
        for (int i = blockIdx.x*per + threadIdx.x; i < min(K, (blockIdx.x + 1)*per); i += MK_THREADS) {
            out[i] = ss[0]*1e-30f + (float) (acc & 1) + 1.0f;
        }
        __syncthreads();
        if (p + 1 < n_phases) {   // the next phase's first tiles before the barrier (mk_mv_begin)
            for (long long j = 0; j < NS - 1 && j < n_mine(p + 1); ++j) {
                issue(p + 1, off, j);
            }
        }
        if (threadIdx.x == 0) {
            mk_grid_arrive_wait(bar, nullptr, 0, 0);
        }
        __syncthreads();
    }
    if (acc == 0x12345678u) {
        sink[0] = acc;
    }
}

// the ring pipeline (see the top of the file): warp MK_WARPS - 1 produces, the others consume; they synchronise among
// themselves with named barrier 1 (the producer never joins a block barrier)
#define FLOOR_NC ((MK_WARPS - 1)*WARP_SIZE)
__device__ __forceinline__ void floor_consumers_sync() {
    asm volatile("bar.sync 1, %0;" :: "n"(FLOOR_NC) : "memory");
}

__host__ __device__ inline size_t floor_ring_head(int R) { return ((size_t) 2*R*sizeof(unsigned long long) + 127)/128*128; }

__global__ void __launch_bounds__(MK_THREADS) floor_ring_kernel(const uint8_t * w, const long long * bytes, int n_phases,
                                                               float * vec, int K, int staging, int R, int CB,
                                                               unsigned * bar, unsigned long long * sink) {
    MK_SHARED_DYN(float4, floor_dyn);   // (16-byte aligned: the bulk copies' destinations)
    uint8_t * smem = (uint8_t *) floor_dyn;
    __shared__ float red[MK_WARPS];
    __shared__ float tot;
    unsigned long long * full  = (unsigned long long *) smem;   // slot r holds a piece
    unsigned long long * empty = full + R;                       // slot r was read
    uint8_t * ring = smem + floor_ring_head(R);
    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (threadIdx.x == 0) {
        for (int r = 0; r < R; ++r) {
            mk_mbar_init(&full[r]);
            mk_mbar_init(&empty[r]);
        }
    }
    mk_mbar_init_fence();
    __syncthreads();
    // this block's pieces of phase p: t = blockIdx.x, blockIdx.x + grid, ... (pieces of CB bytes); entry i of the
    // block's sequence (all phases in order) goes to slot i % R, its (i / R)-th use of the slot, and is read by consumer
    // warp i % (MK_WARPS - 1). R is a multiple of the consumer warps, so each slot has one reader, which waits for the
    // slot's uses in order: a waiter on an mbarrier's parity must never be a phase ahead of it (a warp waiting for the
    // second use of a slot whose first has not landed would see the parity as completed)
    auto n_mine = [&](int p) {
        const long long T = floor_pieces(bytes[p], CB);
        return T > blockIdx.x ? (T - blockIdx.x - 1)/gridDim.x + 1 : 0;
    };
    if (warp == MK_WARPS - 1) {
        if (lane == 0) {
            long long off = 0;
            unsigned i = 0;
            for (int p = 0; p < n_phases; ++p) {
                const long long n = n_mine(p);
                for (long long e = 0; e < n; ++e, ++i) {
                    const unsigned r = i % R, k = i / R;
                    if (k > 0) {
                        floor_mbar_wait(&empty[r], (k - 1) & 1u, 2);
                    }
                    const long long t = blockIdx.x + e*gridDim.x;
                    mk_bulk_copy(ring + (size_t) r*CB, w + off + t*CB, (unsigned) floor_piece_bytes(bytes[p], CB, t), &full[r]);
                }
                off += bytes[p];
            }
        }
        return;
    }
    unsigned acc = 0;
    unsigned i0 = 0;   // the block's first entry of phase p
    for (int p = 0; p < n_phases; ++p) {
        const float * in  = vec + (size_t) (p % 2)*K;
        float       * out = vec + (size_t) ((p + 1) % 2)*K;
        float ss = 0.0f;
        if (staging) {
            for (int i = threadIdx.x; i < K/4; i += FLOOR_NC) {
                ss = mk_sq4(mk_ldcg4((const float4 *) in + i), ss);
            }
            ss = mk_warp_sum(ss);
            if (lane == 0) {
                red[warp] = ss;
            }
            floor_consumers_sync();
            if (threadIdx.x == 0) {
                float t = 0.0f;
                for (int k = 0; k < MK_WARPS - 1; ++k) {
                    t += red[k];
                }
                tot = t;
            }
            floor_consumers_sync();
            ss = tot;
        }
        const long long n = n_mine(p);
        const int NCW = MK_WARPS - 1;
        for (long long e = (warp - (int) (i0 % NCW) + NCW) % NCW; e < n; e += NCW) {   // (i0 + e) % NCW == warp
            const unsigned i = i0 + (unsigned) e, r = i % R, k = i / R;
            floor_mbar_wait(&full[r], k & 1u, 1);
            acc = floor_touch(ring + (size_t) r*CB, floor_piece_bytes(bytes[p], CB, blockIdx.x + e*gridDim.x), acc);
            __syncwarp();
            if (lane == 0) {
                floor_mbar_arrive(&empty[r]);
            }
        }
        i0 += (unsigned) n;
        const int per = (K + gridDim.x - 1)/gridDim.x;
        for (int i = blockIdx.x*per + threadIdx.x; i < min(K, (blockIdx.x + 1)*per); i += FLOOR_NC) {
            out[i] = ss*1e-30f + (float) (acc & 1) + 1.0f;
        }
        floor_consumers_sync();
        if (threadIdx.x == 0) {
            mk_grid_arrive_wait(bar, nullptr, 0, 0);
        }
        floor_consumers_sync();
    }
    if (acc == 0x12345678u) {
        sink[0] = acc;
    }
}


// The staging study (session 35, --stage): a phase's inputs staged by every block with the kernel's own functions
// (mk_stage<1>, mk_stage_cols<4>: each block loads every column's K floats, takes the block sums, rounds every 32-value
// group to its 8-bit record; the launch here is not clustered, so M >= 2 is the kernel's unclustered staging) against
// the same inputs staged once for the grid (block b rounds only its slice of the groups into records in global memory;
// after a grid barrier every block pulls the records with one bulk copy). No weights: each phase is the staging, the
// producing phase's slice writes and the grid barriers. Two kinds of input, as in the kernel:
//   res    E4B's normed inputs (Q/K/V, gate/up, LM head): a' = (a + h*rms(h)*res_nw)*res_scale, then rmsnorm(a')*nw.
//          Staged once it costs a second grid barrier a phase: rms(h) comes from per-block partial sums of squares the
//          producing phase writes, and rms(a') is known only after every slice is done, so the records are of a'*nw
//          unscaled (its 1/rms would scale d where the records are used: other bits than the kernel's, the same for
//          every M)
//   plain  down's input (gelu(gate)*up, rounded straight from registers): staged once, the producing phase rounds its
//          own slice before its barrier, so no barrier is added
// What the values are does not matter here (the times do); every wait is the kernel's.
struct floor_st {
    float         * a;      // 2 x MK_MC_SMALL x K: the phase's input, written by the phase before (its slices; two
                            // buffers by phase parity)
    float         * h;      // the same for the pending residual (res)
    const float   * res_nw; // K
    const float   * nw;     // K
    float         * res_out;
    float         * part;   // 3 x gridDim.x x MK_M: per-block sums of squares: h's (written by the producing phase, two
                            // buffers by phase parity), a''s
    uint8_t       * rec;    // 2 x M x KG records of MK_XQ_REC bytes (staged once; two buffers by phase parity)
};

__global__ void __launch_bounds__(MK_THREADS) floor_stage_kernel(floor_st s, int n_phases, int K, int M, int res, int once,
                                                                unsigned * bar, unsigned long long * sink) {
    MK_SHARED_DYN(float4, floor_dyn);
    const int KG = K/32;
    float   * xs = (float *) floor_dyn;                                            // M x KG groups of MK_XS_GROUP
    uint8_t * xq = (uint8_t *) floor_dyn + (res ? (size_t) M*KG*MK_XS_GROUP : 0);  // M x KG records
    __shared__ unsigned long long mbar;
    __shared__ float red[MK_WARPS*MK_M];
    const int t = threadIdx.x, warp = t / WARP_SIZE, lane = t % WARP_SIZE;
    const int nb = gridDim.x, b = blockIdx.x;
    const float eps = 1e-6f;
    if (t == 0) {
        mk_mbar_init(&mbar);
    }
    mk_mbar_init_fence();
    __syncthreads();
    unsigned acc = 0, parity = 0;
    // block b's groups of each column (staged once), and its slice of each column's values (the producing phase)
    const int g0 = (int) ((long long) KG*b/nb), g1 = (int) ((long long) KG*(b + 1)/nb);
    auto sum_parts = [&](const float * pp, float (&r)[MK_MC_SMALL]) {   // the blocks' partial sums, in block order
        for (int m = 0; m < MK_MC_SMALL; ++m) {
            float v = 0.0f;
            if (m < M) {
                for (int i = lane; i < nb; i += WARP_SIZE) {
                    v += pp[i*MK_M + m];
                }
            }
            r[m] = 1.0f/sqrtf(mk_warp_sum(v)/K + eps);
        }
    };
    for (int p = 0; p < n_phases; ++p) {
        float   * hp = s.part + (size_t) (p % 2)*nb*MK_M;         // h's sums, written by the phase before
        float   * hn = s.part + (size_t) ((p + 1) % 2)*nb*MK_M;   // the next phase's
        float   * ap = s.part + (size_t) 2*nb*MK_M;                // a''s sums, this phase
        uint8_t * rc = s.rec + (size_t) (p % 2)*M*KG*MK_XQ_REC;    // this phase's records
        uint8_t * rn = s.rec + (size_t) ((p + 1) % 2)*M*KG*MK_XQ_REC;
        const size_t SB = (size_t) MK_MC_SMALL*K;                   // the inputs: two buffers by phase parity
        const float * ain = s.a + (p % 2)*SB, * hin = s.h + (p % 2)*SB;
        float * aout = s.a + ((p + 1) % 2)*SB, * hout = s.h + ((p + 1) % 2)*SB;
        if (!once) {
            mk_xin x = { MK_X_PLAIN, ain, K, nullptr, 0, res ? hin : nullptr, res ? s.res_nw : nullptr, 1.0f,
                         res ? s.res_out : nullptr, res ? s.nw : nullptr, nullptr };
            if (M == 1) {
                mk_stage<1>(x, K, 0, 1, eps, xs, xq, true, !res, nullptr);
            } else {
                mk_stage_cols<MK_MC_SMALL>(x, K, 0, M, eps, xs, xq, true, !res, true, nullptr);
            }
            acc ^= ((const unsigned *) xq)[t % (KG*MK_XQ_REC/4)];
        } else if (res) {
            // this block's slice: rms(h) from the partial sums, a', its sum of squares, the records of a'*nw
            float rh[MK_MC_SMALL];
            sum_parts(hp, rh);
            const int items = (g1 - g0)*8*M;   // slots: 8 a group
            float ss[MK_MC_SMALL] = { 0.0f, 0.0f, 0.0f, 0.0f };
            for (int i0 = 0; i0 < items; i0 += MK_THREADS) {   // (every lane of a warp calls mk_q8_slot)
                const int i = i0 + t, m = i / ((g1 - g0)*8), f = g0*8 + i % ((g1 - g0)*8);
                const bool ok = i < items;
                float4 va, vb;
                mk_stage_ld({ MK_X_PLAIN, ain, K, nullptr, 0, hin, s.res_nw, 1.0f, nullptr, s.nw, nullptr },
                            (size_t) (ok ? m : 0), f, ok, va, vb);
                const float4 vw = ok ? ((const float4 *) s.res_nw)[f] : mk_f4(0.0f, 0.0f, 0.0f, 0.0f);
                const float4 vn = ok ? ((const float4 *) s.nw)[f] : mk_f4(0.0f, 0.0f, 0.0f, 0.0f);
                mk_xin x = { MK_X_PLAIN, ain, K, nullptr, 0, hin, s.res_nw, 1.0f, nullptr, s.nw, nullptr };
                const float4 v = mk_stage_val(x, va, vb, vw, ok ? rh[m] : 0.0f);
                if (ok) {
                    ((float4 *) (s.res_out + (size_t) m*K))[f] = v;
                }
                MK_UNROLL
                for (int c = 0; c < MK_MC_SMALL; ++c) {
                    ss[c] = ok && c == m ? mk_sq4(v, ss[c]) : ss[c];
                }
                mk_q8_slot(mk_mul4(v, vn), f, ok, rc + ((size_t) (ok ? m : 0)*KG + mk_rec_slot(f/8))*MK_XQ_REC);
            }
            mk_block_sums<MK_MC_SMALL>(ss, M, red);
            if (t < M) {
                ap[b*MK_M + t] = t == 0 ? ss[0] : t == 1 ? ss[1] : t == 2 ? ss[2] : ss[3];
            }
            __syncthreads();
            if (t == 0) {
                mk_grid_arrive_wait(bar, nullptr, 0, 0);
            }
            __syncthreads();
        }
        if (once) {
            // every block: the records by one bulk copy (after the generic stores of the other blocks: a proxy fence),
            // the norm's 1/rms from the partial sums meanwhile (res)
            if (t == 0) {
                asm volatile("fence.proxy.async.global;" ::: "memory");
                mk_bulk_copy(xq, rc, (unsigned) (M*KG*MK_XQ_REC), &mbar);
            }
            if (res && warp == 0) {
                float r[MK_MC_SMALL];
                sum_parts(ap, r);
                if (lane == 0) {
                    red[0] = r[0];   // (kept: a consumer would scale its records' d by it)
                }
            }
            floor_mbar_wait(&mbar, parity, 3);
            parity ^= 1u;
            acc ^= ((const unsigned *) xq)[t % (KG*MK_XQ_REC/4)];
        }
        // the producing phase: this block's slice of the next inputs (and, for res staged once, its sums of squares of
        // h; for plain staged once, the records of its groups, rounded before the barrier)
        __syncthreads();
        const float val = (float) (acc & 1) + 1.0f;
        for (int m = 0; m < M; ++m) {
            for (int i = g0*32 + t; i < g1*32; i += MK_THREADS) {
                aout[(size_t) m*K + i] = val;
                if (res) {
                    hout[(size_t) m*K + i] = val;
                }
            }
        }
        if (once && res && t < M) {
            hn[b*MK_M + t] = val*(g1 - g0)*32;   // (the slice's sums of squares, as a producing phase would add them up)
        }
        if (once && !res) {
            const int items = (g1 - g0)*8*M;
            for (int i0 = 0; i0 < items; i0 += MK_THREADS) {
                const int i = i0 + t, m = i / ((g1 - g0)*8), f = g0*8 + i % ((g1 - g0)*8);
                const bool ok = i < items;
                mk_q8_slot(mk_f4(val, val, val, val), f, ok, rn + ((size_t) (ok ? m : 0)*KG + mk_rec_slot(f/8))*MK_XQ_REC);
            }
        }
        __syncthreads();
        if (t == 0) {
            mk_grid_arrive_wait(bar, nullptr, 0, 0);
        }
        __syncthreads();
    }
    if (acc == 0x12345678u) {
        sink[0] = acc;
    }
}

int main(int argc, char ** argv) {
    std::string phases_path;
    int reps = 20, K = 2560, KF = 10240, first = 0;
    bool quick = false, stage = false;
    const char * usage =
        "usage: %s --phases FILE [--reps R] [--k K] [--first N] [--quick] [--stage [--k-ff KF]]\n"
        "  --phases FILE  one phase per line, \"BYTES NAME\" (bench/megakernel-floor/phases.py makes it from a GGUF)\n"
        "  --reps R       timed launches per configuration (the median is printed; default 20)\n"
        "  --k K          the staged vector's length (the model's hidden size; default 2560)\n"
        "  --first N      only the first N phases of the list\n"
        "  --quick        a smoke test: 3 launches of each configuration (first 40 phases unless --first)\n"
        "  --stage        only the staging study: a phase's inputs staged by every block (the kernel's mk_stage /\n"
        "                 mk_stage_cols) against staged once for the grid, M = 1..4 columns, as many phases as the\n"
        "                 list has, no weights: normed inputs of K floats (res) and down's plain inputs of KF (plain)\n"
        "  --k-ff KF      the plain inputs' length (the FFN's width; default 10240)\n";
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&]() { if (i + 1 >= argc) { fprintf(stderr, "floor: missing value for %s\n", a.c_str()); exit(2); } return std::string(argv[++i]); };
        if (a == "--phases") phases_path = next();
        else if (a == "--reps") reps = std::stoi(next());
        else if (a == "--k") K = std::stoi(next());
        else if (a == "--first") first = std::stoi(next());
        else if (a == "--quick") quick = true;
        else if (a == "--stage") stage = true;
        else if (a == "--k-ff") KF = std::stoi(next());
        else { fprintf(stderr, usage, argv[0]); return 2; }
    }
    if (quick) {
        reps = 3;
        first = first > 0 ? first : 40;
    }
    if (K < 4 || K % 4 != 0 || reps < 1 || (stage && (K % 32 != 0 || KF < 32 || KF % 32 != 0))) {
        fprintf(stderr, "floor: --k must be a positive multiple of 4 (of 32 with --stage, as --k-ff) and --reps positive\n");
        return 2;
    }
    std::ifstream f(phases_path);
    if (!f) {
        fprintf(stderr, "floor: cannot read the phase list %s\n", phases_path.c_str());
        return 2;
    }
    std::vector<long long> units;
    std::string line;
    long long total = 0;
    while (std::getline(f, line)) {
        std::istringstream ls(line);
        long long b;
        if (ls >> b && (first <= 0 || (int) units.size() < first)) {
            units.push_back((b + 15)/16);
            total += units.back();
        }
    }
    const int np = (int) units.size();
    if (np == 0) {
        fprintf(stderr, "floor: no phases in %s\n", phases_path.c_str());
        return 2;
    }
    std::vector<long long> bytes(np);
    for (int p = 0; p < np; ++p) {
        bytes[p] = 16*units[p];
    }
    int dev = 0, sms = 0, smem_optin = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, floor_kernel, MK_THREADS, 0));
    if (per_sm < 1) {
        fprintf(stderr, "floor: the kernel does not fit on an SM\n");
        return 1;
    }
    uint4 * w = nullptr; long long * d_units = nullptr; long long * d_bytes = nullptr; float * vec = nullptr;
    unsigned * bar = nullptr; unsigned long long * sink = nullptr; long long * d_one = nullptr;
    CK(cudaMalloc(&w, (size_t) total*16));
    CK(cudaMemset(w, 1, (size_t) total*16));
    CK(cudaMalloc(&d_units, np*sizeof(long long)));
    CK(cudaMemcpy(d_units, units.data(), np*sizeof(long long), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&d_bytes, np*sizeof(long long)));
    CK(cudaMemcpy(d_bytes, bytes.data(), np*sizeof(long long), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&d_one, sizeof(long long)));
    CK(cudaMemcpy(d_one, &total, sizeof(long long), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&vec, 2*K*sizeof(float)));
    CK(cudaMemset(vec, 0, 2*K*sizeof(float)));
    CK(cudaMalloc(&bar, sizeof(unsigned)));
    CK(cudaMalloc(&sink, sizeof(unsigned long long)));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("floor: %d SMs, one block of %d threads each, %d phases, %.3f GB of weights per step, K %d, %d loads in flight per thread\n",
           sms, MK_THREADS, np, total*16/1e9, K, FLOOR_UNROLL);
    // the median of reps timed launches (after 2 untimed ones) of kernel with args and dyn bytes of shared memory
    auto time_launch = [&](const void * kernel, void ** args, size_t dyn) {
        std::vector<float> t;
        for (int r = 0; r < reps + 2; ++r) {
            CK(cudaMemset(bar, 0, sizeof(unsigned)));
            CK(cudaEventRecord(e0));
            CK(cudaLaunchCooperativeKernel(kernel, dim3(sms), dim3(MK_THREADS), args, dyn, nullptr));
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (r >= 2) {
                t.push_back(ms*1000.0f);
            }
        }
        std::sort(t.begin(), t.end());
        return t[t.size()/2];
    };
    auto run = [&](const long long * u, int n, int mode) {
        void * args[] = { &w, (void *) &u, &n, &vec, &K, &mode, &bar, &sink };
        return time_launch((const void *) floor_kernel, args, 0);
    };
    auto report = [&](const char * what, float us, bool weights) {
        printf("%s: %.1f us per step, %.2f us per phase, %.0f tok/s", what, us, us/np, 1e6/us);
        if (weights) {
            printf(", %.0f GB/s", total*16/(us*1e3));
        }
        printf("\n");
        fflush(stdout);
    };
    // a pipeline's configuration, if its shared memory fits one block per SM: false (and a line) if not
    auto fits = [&](const void * kernel, size_t dyn, const char * what) {
        if ((int) dyn > smem_optin || cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) dyn) != cudaSuccess) {
            (void) cudaGetLastError();
            printf("%s: %zu bytes of shared memory do not fit (at most %d)\n", what, dyn, smem_optin);
            return false;
        }
        int b = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, MK_THREADS, dyn));
        if (b < 1) {
            printf("%s: no block fits on an SM\n", what);
            return false;
        }
        return true;
    };
    if (stage) {
        // the staging study (floor_stage_kernel): per kind, M and way, the median step and its time per phase
        const int KM = std::max(K, KF), MM = MK_MC_SMALL;
        floor_st st = {};
        float * res_nw = nullptr; float * nw = nullptr;
        CK(cudaMalloc(&st.a, (size_t) 2*MM*KM*sizeof(float)));
        CK(cudaMalloc(&st.h, (size_t) 2*MM*KM*sizeof(float)));
        CK(cudaMalloc(&st.res_out, (size_t) MM*KM*sizeof(float)));
        CK(cudaMalloc(&res_nw, (size_t) KM*sizeof(float)));
        CK(cudaMalloc(&nw, (size_t) KM*sizeof(float)));
        CK(cudaMalloc(&st.part, (size_t) 3*sms*MK_M*sizeof(float)));
        CK(cudaMalloc(&st.rec, (size_t) 2*MM*(KM/32)*MK_XQ_REC));
        CK(cudaMemset(st.a, 0, (size_t) 2*MM*KM*sizeof(float)));
        CK(cudaMemset(st.h, 0, (size_t) 2*MM*KM*sizeof(float)));
        CK(cudaMemset(res_nw, 0, (size_t) KM*sizeof(float)));
        CK(cudaMemset(nw, 0, (size_t) KM*sizeof(float)));
        CK(cudaMemset(st.part, 0, (size_t) 3*sms*MK_M*sizeof(float)));
        CK(cudaMemset(st.rec, 0, (size_t) 2*MM*(KM/32)*MK_XQ_REC));
        st.res_nw = res_nw;
        st.nw = nw;
        const void * kst = (const void *) floor_stage_kernel;
        printf("staging study: %d phases a step, no weights; every block: the kernel's staging; once: block b rounds its slice, "
               "one bulk copy of the records each block (res: a grid barrier more a phase)\n", np);
        for (int res = 1; res >= 0; --res) {
            int KK = res ? K : KF;
            for (int M = 1; M <= MM; ++M) {
                float us[2] = { 0.0f, 0.0f };
                for (int once = 0; once <= 1; ++once) {
                    const size_t dyn = (size_t) M*(KK/32)*((res ? MK_XS_GROUP : 0) + MK_XQ_REC);
                    char buf[160];
                    snprintf(buf, sizeof(buf), "stage %s K %d M %d %s", res ? "res" : "plain", KK, M, once ? "once" : "every block");
                    if (!fits(kst, dyn, buf)) {
                        continue;
                    }
                    void * args[] = { &st, (void *) &np, &KK, &M, &res, &once, &bar, &sink };
                    us[once] = time_launch(kst, args, dyn);
                    printf("%s: %.1f us per step, %.2f us per phase\n", buf, us[once], us[once]/np);
                    fflush(stdout);
                }
                if (us[0] > 0.0f && us[1] > 0.0f) {
                    printf("stage %s K %d M %d: once / every block %.3f\n", res ? "res" : "plain", KK, M, us[1]/us[0]);
                }
            }
        }
        return 0;
    }
    const char * what[4] = { "barriers only", "barriers + staging dependency", "barriers + weights", "barriers + staging + weights" };
    for (int mode = 0; mode < 4; ++mode) {
        char buf[128];
        snprintf(buf, sizeof(buf), "mode %d (%s)", mode, what[mode]);
        report(buf, run(d_units, np, mode), mode & 2);
    }
    // the pipelines that carry the stream across the barriers, with the staging dependency, then without
    const void * ktiles = (const void *) floor_tiles_kernel;
    const void * kring  = (const void *) floor_ring_kernel;
    for (int staging = 1; staging >= 0; --staging) {
        const int tiles[][2] = { { 3, 2048 }, { 6, 2048 }, { 3, 4096 } };   // NS, TB (3 x 2048: the megakernel's default)
        for (const auto & c : tiles) {
            int NS = c[0], TB = c[1];
            const size_t dyn = (size_t) MK_WARPS*NS*TB;
            char buf[160];
            snprintf(buf, sizeof(buf), "tiles NS %d TB %d (%zu KB a block)%s", NS, TB, dyn/1024, staging ? " + staging" : "");
            if (!fits(ktiles, dyn, buf)) {
                continue;
            }
            void * args[] = { &w, &d_bytes, (void *) &np, &vec, &K, &staging, &NS, &TB, &bar, &sink };
            report(buf, time_launch(ktiles, args, dyn), true);
        }
        // R, CB (R a multiple of the 15 consumer warps: floor_ring_kernel)
        const int rings[][2] = { { 15, 4096 }, { 30, 4096 }, { 45, 4096 }, { 15, 8192 } };
        for (const auto & c : rings) {
            int R = c[0], CB = c[1];
            const size_t dyn = floor_ring_head(R) + (size_t) R*CB;
            char buf[160];
            snprintf(buf, sizeof(buf), "ring R %d CB %d (%zu KB a block)%s", R, CB, dyn/1024, staging ? " + staging" : "");
            if (R % (MK_WARPS - 1) != 0) {
                printf("%s: R is not a multiple of the %d consumer warps (skipped)\n", buf, MK_WARPS - 1);
                continue;
            }
            if (!fits(kring, dyn, buf)) {
                continue;
            }
            void * args[] = { &w, &d_bytes, (void *) &np, &vec, &K, &staging, &R, &CB, &bar, &sink };
            report(buf, time_launch(kring, args, dyn), true);
        }
    }
    const float one = run(d_one, 1, 2);
    printf("one phase, every byte: %.1f us, %.0f GB/s (the streaming loop's bandwidth)\n", one, total*16/(one*1e3));
    return 0;
}
