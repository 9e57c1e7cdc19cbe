// emu_fibers.h: CUDA's keywords on the host and the threads of one CUDA block as fibers (emu-fiber.h: metal-emu's context switch), for the host
// emulations of CUDA kernels in this folder (CI has no GPU). Every thread is a fiber scheduled round-robin; __syncwarp, __syncthreads and
// __shfl_xor_sync are real barriers between the fibers (a warp barrier opens when every live lane of the warp waits
// at one, the block barrier when all threads do; threads waiting at different barriers are reported as a deadlock).
// A fiber also keeps the cp.async copies it issued (groups, open) for an emulation that makes them visible only at
// the wait that covers them; run_block reports copies never waited for. Failures count in g_fail.
#pragma once

#include "../../ggml-metal/emu/emu-fiber.h"

#include <cstdio>
#include <functional>
#include <utility>
#include <vector>

// CUDA's keywords on the host
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define WARP_SIZE 32

struct dim3 { unsigned x, y, z; dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {} };

struct fiber {
    void * sp = nullptr; // saved context (emu_ctx_switch)
    dim3 tid;
    int  wait = 0; // 0 runnable, 1 at a warp barrier, 2 at a block barrier
    bool done = false;
    std::vector<std::vector<std::pair<void *, const void *>>> groups; // committed cp.async groups
    std::vector<std::pair<void *, const void *>> open;                // copies not yet committed
};
static std::vector<fiber> g_fib;
static std::vector<std::vector<char>> g_stacks;
static int        g_cur;
static void *     g_sched_sp; // the scheduler's saved context
static dim3       g_block_idx;
static dim3       g_block_dim;
static std::function<void()> g_body;
static int   g_fail = 0;
static int   g_shfl[64][32];
static float g_shflf[64][32];
static bool  g_fiber_reverse = false; // schedule the fibers from the last to the first (an emulation's choice)

#define threadIdx (g_fib[g_cur].tid)
#define blockIdx  g_block_idx
#define blockDim  g_block_dim

static void emu_block_until(int kind) {
    g_fib[g_cur].wait = kind;
    emu_ctx_switch(&g_fib[g_cur].sp, g_sched_sp);
}
static void __syncwarp() { emu_block_until(1); }
static void __syncthreads() { emu_block_until(2); }

static int __shfl_xor_sync(unsigned, int v, int off, int = 32) {
    const int w = threadIdx.y, l = threadIdx.x;
    g_shfl[w][l] = v;
    __syncwarp();
    const int r = g_shfl[w][l ^ off];
    __syncwarp();
    return r;
}
static float __shfl_xor_sync(unsigned, float v, int off, int = 32) {
    const int w = threadIdx.y, l = threadIdx.x;
    g_shflf[w][l] = v;
    __syncwarp();
    const float r = g_shflf[w][l ^ off];
    __syncwarp();
    return r;
}

[[noreturn]] static void fiber_entry(void *) {
    g_body();
    g_fib[g_cur].done = true;
    emu_ctx_switch(&g_fib[g_cur].sp, g_sched_sp); // never resumed
    __builtin_trap();
}

// runs body as every thread of one block (blockIdx: g_block_idx, set by the caller)
static void run_block(const dim3 & bdim, const std::function<void()> & body) {
    const int n = bdim.x*bdim.y*bdim.z;
    g_block_dim = bdim;
    g_fib.assign(n, fiber());
    if ((int) g_stacks.size() < n) {
        g_stacks.resize(n, std::vector<char>(256*1024));
    }
    g_body = body;
    for (int i = 0; i < n; ++i) {
        fiber & f = g_fib[i];
        f.tid = dim3(i % bdim.x, (i / bdim.x) % bdim.y, i / (bdim.x*bdim.y));
        f.sp = emu_fiber_stack(g_stacks[i].data() + g_stacks[i].size(), fiber_entry, nullptr);
    }
    for (;;) {
        bool ran = false;
        for (int ii = 0; ii < n; ++ii) {
            const int i = g_fiber_reverse ? n - 1 - ii : ii;
            if (!g_fib[i].done && g_fib[i].wait == 0) {
                g_cur = i;
                emu_ctx_switch(&g_sched_sp, g_fib[i].sp);
                ran = true;
            }
        }
        if (ran) {
            continue;
        }
        bool all_done = true, released = false;
        for (int i = 0; i < n; ++i) all_done = all_done && g_fib[i].done;
        if (all_done) {
            break;
        }
        // a warp barrier opens when every live lane of the warp waits at one; the block barrier when all do
        for (int w = 0; w < (int) (bdim.y*bdim.z); ++w) {
            bool open = true, any = false;
            for (int l = 0; l < (int) bdim.x; ++l) {
                const fiber & f = g_fib[w*bdim.x + l];
                if (!f.done) { any = true; open = open && f.wait == 1; }
            }
            if (open && any) {
                for (int l = 0; l < (int) bdim.x; ++l) g_fib[w*bdim.x + l].wait = 0;
                released = true;
            }
        }
        if (!released) {
            bool open = true;
            for (int i = 0; i < n; ++i) open = open && (g_fib[i].done || g_fib[i].wait == 2);
            if (open) {
                for (int i = 0; i < n; ++i) g_fib[i].wait = 0;
                released = true;
            }
        }
        if (!released) {
            if (g_fail++ < 5) printf("FAIL: deadlock (threads wait at different barriers)\n");
            break;
        }
    }
    for (auto & f : g_fib) {
        if (!f.groups.empty() || !f.open.empty()) {
            // copies never waited for: harmless only if nothing read them; count them as a failure anyway
            size_t nc = f.open.size();
            for (auto & g : f.groups) nc += g.size();
            if (nc && g_fail++ < 5) printf("FAIL: %zu cp.async copies never waited for\n", nc);
        }
    }
}
