// cuda_emu.h: just enough CUDA to run megakernel/cuda/mk-kernel.cuh on the CPU (tests only).
//
// Every GPU thread is a fiber (emu-fiber.h: metal-emu's context switch) on one OS thread; a launch starts all blocks at once
// (co-resident, like a cooperative launch); __syncthreads / __syncwarp are barriers that yield until
// the block or warp has arrived, __shfl_xor_sync exchanges through a per-warp slot array between two
// warp barriers, __nanosleep yields (the grid barrier's spin), atomics and fences are plain on one OS
// thread, block-shared arrays are per-block memory filled with a poison pattern. Slow (meant for tiny
// models) but it runs the kernel's own source: phases, barriers, lane mappings and reductions. A launch
// in which no fiber can move any more (e.g. a grid barrier that waits for a block that does not exist)
// is reported as a deadlock instead of hanging.
#pragma once

#include "ggml.h"

#include "../../ggml-metal/emu/emu-fiber.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#define WARP_SIZE 32

struct emu_dim3 { unsigned x = 0, y = 0, z = 0; };
inline emu_dim3 threadIdx;
inline emu_dim3 blockIdx;
inline emu_dim3 gridDim;

struct emu_bar {
    unsigned n = 0, count = 0, gen = 0;
};

struct emu_block {
    emu_bar bar;
    std::vector<emu_bar> warp_bar;
    std::vector<float> slot;
    std::map<int, std::vector<char>> shared;
    std::vector<char> dyn;
};

struct emu_fiber {
    void * sp = nullptr;   // saved context (emu_ctx_switch)
    std::vector<char> stack;
    unsigned tid = 0, bid = 0;
    emu_block * blk = nullptr;
    bool done = false;
    bool moved = false;   // did anything since this fiber's last yield
};

inline void *       emu_sched_sp;   // the scheduler's saved context
inline emu_fiber  * emu_cur_fiber;
inline emu_block  * emu_cur;
inline long         emu_progress;   // barrier arrivals and generations: deadlock detection
inline int          emu_slow_block = -1;   // a block that runs only every 8th scheduler pass (the others run ahead of
                                           // it between the barriers they share: a missing one shows)

inline void emu_yield() {
    emu_ctx_switch(&emu_cur_fiber->sp, emu_sched_sp);
    threadIdx.x = emu_cur_fiber->tid;
    blockIdx.x  = emu_cur_fiber->bid;
    emu_cur     = emu_cur_fiber->blk;
}

inline void emu_bar_wait(emu_bar & b) {
    const unsigned g = b.gen;
    ++emu_progress;
    if (++b.count == b.n) {
        b.count = 0;
        ++b.gen;
        return;
    }
    while (b.gen == g) {
        emu_yield();
    }
}

inline void __syncthreads() { emu_bar_wait(emu_cur->bar); }

inline void __syncwarp(unsigned = 0xffffffffu) { emu_bar_wait(emu_cur->warp_bar[threadIdx.x / WARP_SIZE]); }
inline float __shfl_xor_sync(unsigned, float v, int o) {
    const int w = threadIdx.x / WARP_SIZE, l = threadIdx.x % WARP_SIZE;
    emu_cur->slot[w*WARP_SIZE + l] = v;
    __syncwarp();
    const float r = emu_cur->slot[w*WARP_SIZE + (l ^ o)];
    __syncwarp();
    return r;
}
inline unsigned __shfl_sync(unsigned, unsigned v, int src) {
    const int w = threadIdx.x / WARP_SIZE, l = threadIdx.x % WARP_SIZE;
    float f; memcpy(&f, &v, 4);
    emu_cur->slot[w*WARP_SIZE + l] = f;
    __syncwarp();
    float r = emu_cur->slot[w*WARP_SIZE + src];
    __syncwarp();
    unsigned u; memcpy(&u, &r, 4);
    return u;
}
inline float __shfl_sync(unsigned mask, float v, int src) {
    unsigned u; memcpy(&u, &v, 4);
    u = __shfl_sync(mask, u, src);
    float r; memcpy(&r, &u, 4);
    return r;
}
inline unsigned atomicAdd(unsigned * p, unsigned v) { ++emu_progress; unsigned o = *p; *p = o + v; return o; }
inline unsigned atomicExch(unsigned * p, unsigned v) { ++emu_progress; unsigned o = *p; *p = v; return o; }
inline void __threadfence() {}
inline unsigned mk_atomic_add_acq_rel(unsigned * p, unsigned v) { return atomicAdd(p, v); }
inline unsigned mk_ld_acquire(const unsigned * p) { return *(const volatile unsigned *) p; }
inline void __nanosleep(unsigned) { emu_yield(); }
inline float __fmul_rn(float a, float b) { return a*b; }
inline float __fadd_rn(float a, float b) { return a + b; }
using std::min;
using std::max;

struct half { uint16_t bits; };
struct float4 { float x, y, z, w; };
struct int4 { int x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) {
        c += (int) (int8_t) (a >> 8*i) * (int) (int8_t) (b >> 8*i);
    }
    return c;
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned sh) { sh &= 31; return sh ? (lo >> sh) | (hi << (32 - sh)) : lo; }
inline unsigned __funnelshift_rc(unsigned lo, unsigned hi, unsigned sh) { sh = sh < 32 ? sh : 32; return sh == 32 ? hi : sh ? (lo >> sh) | (hi << (32 - sh)) : lo; }
inline int __float2int_rn(float f) { return (int) nearbyintf(f); }
inline float __fsub_rn(float a, float b) { return a - b; }
inline half  __float2half(float f) { ggml_fp16_t h = ggml_fp32_to_fp16(f); half r; memcpy(&r.bits, &h, 2); return r; }
inline float __half2float(half h) { ggml_fp16_t x; memcpy(&x, &h.bits, 2); return ggml_fp16_to_fp32(x); }
inline half  __ushort_as_half(unsigned short u) { half r; r.bits = u; return r; }

inline void * emu_shared(int id, size_t bytes) {
    auto & v = emu_cur->shared[id];
    if (v.empty()) {
        v.assign(bytes, (char) 0x7f); // poison: a read before the block wrote shows as a huge value
    }
    return v.data();
}

#define MK_DEVICE    static inline
#define MK_DEVICE_FN static
#define MK_HOSTDEV   static inline
#define MK_KERNEL    static void
#define MK_SHARED(T, name, n)  T * name = (T *) emu_shared(__COUNTER__, sizeof(T)*(n))
#define MK_SHARED_DYN(T, name) T * name = (T *) emu_cur->dyn.data()
#define MK_UNROLL
#define MK_TRAP()    abort()

static inline float mk_f16(uint16_t u) { half h; h.bits = u; return __half2float(h); }
// a vector load's address must be aligned as on the GPU (a misaligned one faults there)
static inline void mk_emu_aligned(const void * p, uintptr_t n, const char * what) {
    if ((uintptr_t) p % n != 0) {
        fprintf(stderr, "FAIL %s: address %p not %d-byte aligned\n", what, p, (int) n);
        printf("FAIL %s: address %p not %d-byte aligned\n", what, p, (int) n);
        abort();
    }
}
static inline float          mk_ldcg(const float * p)          { return *(const volatile float *) p; }
static inline unsigned long long mk_clock_ns() { return 0; }
static inline unsigned       mk_ldcg_u32(const unsigned * p)       { return *(const volatile unsigned *) p; }
static inline uint2          mk_ldcg_u32x2(const uint2 * p) { mk_emu_aligned(p, 8, "mk_ldcg_u32x2"); const volatile unsigned * q = (const volatile unsigned *) p; uint2 r; r.x = q[0]; r.y = q[1]; return r; }
static inline uint4          mk_ldcg_u32x4(const uint4 * p) { mk_emu_aligned(p, 16, "mk_ldcg_u32x4"); const volatile unsigned * q = (const volatile unsigned *) p; uint4 r; r.x = q[0]; r.y = q[1]; r.z = q[2]; r.w = q[3]; return r; }
static inline float4         mk_ldcg4(const float4 * p) { mk_emu_aligned(p, 16, "mk_ldcg4"); const volatile float * q = (const volatile float *) p; float4 r; r.x = q[0]; r.y = q[1]; r.z = q[2]; r.w = q[3]; return r; }
// asynchronous copies done at once (the emulation checks indexing, not the copy pipeline's timing)
static inline void mk_cp_async16(void * dst, const void * src) { mk_emu_aligned(dst, 16, "mk_cp_async16 (to)"); mk_emu_aligned(src, 16, "mk_cp_async16 (from)"); memcpy(dst, src, 16); }
static inline void mk_cp_async_commit() {}
template <int N> static inline void mk_cp_async_wait() {}
// bulk copies (mk_args.bulk) land only when a thread waits for their mbarrier phase: a read of a stage
// before its wait sees the old bytes, and a wait for the wrong parity deadlocks (reported) as it would hang on a GPU.
// An mbarrier expects one arrival per phase, which mk_bulk_copy makes (with its copy).
struct emu_mbar {
    unsigned long completed = 0;   // phases completed
    struct copy { void * dst; const void * src; unsigned bytes; };
    std::vector<copy> pending;     // copies issued, not landed yet (phase completed + i)
};
inline std::map<const void *, emu_mbar> emu_mbars;
// the emulated device has the bulk copy engine (sm_90+); the driver sets it as the host would mk_args.bulk. Without
// it, each of these instructions is code the kernel must never reach (on an sm_80..89 GPU it traps)
inline bool emu_bulk_engine = false;
static inline void emu_need_bulk(const char * what) {
    if (!emu_bulk_engine) {
        fprintf(stderr, "cuda_emu: %s on a device without the bulk copy engine (mk_args.bulk = 0): it traps there\n", what);
        abort();
    }
}
static inline void mk_mbar_init(unsigned long long * bar) { emu_need_bulk("mbarrier.init"); emu_mbars[bar] = emu_mbar(); }
static inline void mk_mbar_init_fence() { emu_need_bulk("fence.mbarrier_init"); }
static inline void mk_bulk_copy(void * dst, const void * src, unsigned bytes, unsigned long long * bar) {
    emu_need_bulk("cp.async.bulk");
    if (bytes % 16 != 0 || (uintptr_t) dst % 16 != 0 || (uintptr_t) src % 16 != 0) {
        fprintf(stderr, "cuda_emu: cp.async.bulk of %u bytes at %p -> %p: not 16-byte aligned\n", bytes, src, dst);
        abort();
    }
    emu_mbars.at(bar).pending.push_back({ dst, src, bytes });
    ++emu_progress;
}
static inline void mk_mbar_wait(unsigned long long * bar, unsigned parity) {
    emu_need_bulk("mbarrier.try_wait");
    emu_mbar & b = emu_mbars.at(bar);
    // phase k has parity k & 1; the wait returns once the phase with this parity is the last completed one
    while ((b.completed & 1) == parity) {
        if (!b.pending.empty()) {
            memcpy(b.pending.front().dst, b.pending.front().src, b.pending.front().bytes);
            b.pending.erase(b.pending.begin());
            ++b.completed;
            ++emu_progress;
            continue;
        }
        emu_yield();
    }
}

// thread block clusters (mk_args.cl): emu_launch's `cluster` consecutive blocks form one; the cluster barrier waits for
// every thread of them; mk_cluster_st stores to the same place in another block's dynamic shared memory (the kernel
// stores only into that region)
inline unsigned emu_cluster = 1;
inline std::vector<emu_block *> emu_blocks;
inline std::vector<emu_bar> emu_cluster_bars;
static inline int mk_cluster_size() { return (int) emu_cluster; }
static inline int mk_cluster_rank() { return (int) (blockIdx.x % emu_cluster); }
static inline void mk_cluster_sync() {
    if (emu_cluster < 2) {
        fprintf(stderr, "cuda_emu: cluster barrier in a launch without clusters (it traps on a GPU)\n");
        abort();
    }
    emu_bar_wait(emu_cluster_bars[blockIdx.x / emu_cluster]);
}
template <typename T>
static inline T * emu_cluster_map(T * p, int rank) {
    char * c = (char *) p;
    const std::vector<char> & d = emu_cur->dyn;
    if (emu_cluster < 2 || rank < 0 || rank >= (int) emu_cluster || c < d.data() || c >= d.data() + d.size()) {
        fprintf(stderr, "cuda_emu: mk_cluster_st(%p, rank %d) in block %u: cluster of %u, not in its dynamic shared memory\n",
                (void *) p, rank, blockIdx.x, emu_cluster);
        abort();
    }
    emu_block * o = emu_blocks[blockIdx.x/emu_cluster*emu_cluster + rank];
    return (T *) (o->dyn.data() + (c - d.data()));
}
template <typename T>
static inline void mk_cluster_st(T * p, int rank, T v) { *emu_cluster_map(p, rank) = v; }

// run kernel(args) on n_blocks blocks of n_threads threads, all co-resident, in clusters of `cluster` blocks; false on a
// deadlock
inline void (*emu_entry_fn)(const void *);
inline const void * emu_entry_args;

[[noreturn]] inline void emu_trampoline(void *) {
    emu_entry_fn(emu_entry_args);
    emu_cur_fiber->done = true;
    ++emu_progress;
    emu_ctx_switch(&emu_cur_fiber->sp, emu_sched_sp);   // never resumed
    __builtin_trap();
}

template <typename A>
bool emu_launch(void (*kernel)(const A), const A & args, unsigned n_blocks, unsigned n_threads, size_t dyn_bytes,
                const char * name = "kernel", unsigned cluster = 1) {
    static void (*k)(const A);
    k = kernel;
    emu_entry_fn = [](const void * p) { k(*(const A *) p); };
    emu_entry_args = &args;
    gridDim.x = n_blocks;
    std::vector<std::unique_ptr<emu_block>> blocks;
    std::vector<std::unique_ptr<emu_fiber>> fibers;
    for (unsigned b = 0; b < n_blocks; ++b) {
        auto blk = std::make_unique<emu_block>();
        blk->bar.n = n_threads;
        blk->warp_bar.resize(n_threads/WARP_SIZE);
        for (auto & w : blk->warp_bar) w.n = WARP_SIZE;
        blk->slot.assign(n_threads, 0.0f);
        blk->dyn.assign(dyn_bytes, (char) 0x7f);
        for (unsigned t = 0; t < n_threads; ++t) {
            auto f = std::make_unique<emu_fiber>();
            f->stack.resize(256*1024);
            f->tid = t;
            f->bid = b;
            f->blk = blk.get();
            f->sp = emu_fiber_stack(f->stack.data() + f->stack.size(), emu_trampoline, nullptr);
            fibers.push_back(std::move(f));
        }
        blocks.push_back(std::move(blk));
    }
    if (cluster < 1 || n_blocks % cluster != 0) {
        fprintf(stderr, "cuda_emu: %u blocks in clusters of %u\n", n_blocks, cluster);
        abort();
    }
    emu_cluster = cluster;
    emu_blocks.clear();
    for (auto & b : blocks) {
        emu_blocks.push_back(b.get());
    }
    emu_cluster_bars.assign(n_blocks/cluster, emu_bar());
    for (auto & b : emu_cluster_bars) {
        b.n = cluster*n_threads;
    }
    // skew: each pass leaves one random block out, so blocks drift apart as they may on a GPU and a
    // missing grid barrier shows up instead of hiding behind lock-step scheduling
    uint64_t rs = 0x9e3779b97f4a7c15ull;
    size_t left = fibers.size();
    int idle_passes = 0;
    unsigned long n_pass = 0;
    while (left > 0) {
        const long before = emu_progress;
        rs = rs*6364136223846793005ull + 1442695040888963407ull;
        const unsigned skip0 = n_blocks > 1 ? (unsigned) (rs >> 33) % (2*n_blocks) : n_blocks; // >= n_blocks: none
        const unsigned skip = (int) skip0 == emu_slow_block ? n_blocks : skip0;   // (the slow block is slow enough)
        ++n_pass;
        for (auto & f : fibers) {
            if (f->done || f->bid == skip || ((int) f->bid == emu_slow_block && n_pass % 8 != 0)) continue;
            emu_cur_fiber = f.get();
            threadIdx.x = f->tid;
            blockIdx.x = f->bid;
            emu_cur = f->blk;
            emu_ctx_switch(&emu_sched_sp, f->sp);
            if (f->done) --left;
        }
        // passes in which no barrier moved and no atomic changed anything: nothing ever will
        idle_passes = emu_progress == before ? idle_passes + 1 : 0;
        if (idle_passes >= 16 && left > 0) {
            fprintf(stderr, "cuda_emu: deadlock in %s: %zu of %zu threads can never continue\n", name, left, fibers.size());
            return false;
        }
    }
    return true;
}
