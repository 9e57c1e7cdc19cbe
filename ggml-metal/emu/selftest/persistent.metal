// Persistent test kernel for metal-emu: a multi-round prefix sum across threadgroups, phases
// separated by grid barriers (ggml-metal/mk/grid-barrier.h). Data written by one threadgroup is read
// by others after each barrier. Variants with planted bugs: the naive barrier without device-scope
// fences, no barrier at all. Apple's compiler must accept this file as is (-std=metal3.2).
#include <metal_stdlib>
using namespace metal;

#include "../../mk/grid-barrier.h"

// planted bug: the arrive/spin of grid_barrier() without its device-scope fences (the naive barrier)
static inline void grid_barrier_nofence(device atomic_uint * bar, uint n_tg, ushort tiitg) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tiitg == 0) {
        const uint gen = atomic_load_explicit(&bar[1], memory_order_relaxed);
        const uint arrived = atomic_fetch_add_explicit(&bar[0], 1u, memory_order_relaxed) + 1u;
        if (arrived == n_tg) {
            atomic_store_explicit(&bar[0], 0u, memory_order_relaxed);
            atomic_store_explicit(&bar[1], gen + 1u, memory_order_relaxed);
        } else {
            while (atomic_load_explicit(&bar[1], memory_order_relaxed) == gen) {
            }
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
}

// planted bug: grid_barrier() without its last fence (the acquire side after the spin)
static inline void grid_barrier_noacquire(device atomic_uint * bar, uint n_tg, ushort tiitg) {
    atomic_thread_fence(mem_flags::mem_device, memory_order_seq_cst, thread_scope_device);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tiitg == 0) {
        const uint gen = atomic_load_explicit(&bar[1], memory_order_relaxed);
        atomic_thread_fence(mem_flags::mem_device, memory_order_seq_cst, thread_scope_device);
        const uint arrived = atomic_fetch_add_explicit(&bar[0], 1u, memory_order_relaxed) + 1u;
        if (arrived == n_tg) {
            atomic_store_explicit(&bar[0], 0u, memory_order_relaxed);
            atomic_thread_fence(mem_flags::mem_device, memory_order_seq_cst, thread_scope_device);
            atomic_store_explicit(&bar[1], gen + 1u, memory_order_relaxed);
        } else {
            while (atomic_load_explicit(&bar[1], memory_order_relaxed) == gen) {
            }
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
}

struct scan_args {
    uint n_rounds;
    uint n_wait;   // threadgroups a barrier waits for (the grid size unless a test plants a bug)
};

// MODE 0: grid_barrier, 1: the planted barrier without fences, 2: no barrier, 3: the fences of
// grid_barrier without its arrive/spin, 4: grid_barrier without the acquire fence
template<int MODE>
static inline void scan_sync(device atomic_uint * bar, uint n_wait, ushort tiitg) {
    if (MODE == 0) {
        grid_barrier(bar, n_wait, tiitg);
    } else if (MODE == 1) {
        grid_barrier_nofence(bar, n_wait, tiitg);
    } else if (MODE == 4) {
        grid_barrier_noacquire(bar, n_wait, tiitg);
    } else if (MODE == 3) {
        atomic_thread_fence(mem_flags::mem_device, memory_order_seq_cst, thread_scope_device);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        atomic_thread_fence(mem_flags::mem_device, memory_order_seq_cst, thread_scope_device);
    }
}

// each round: dst = inclusive prefix sum of x over the whole grid, then x = dst reversed (rev)
template<int MODE>
kernel void kernel_scan(
        constant scan_args & args,
        device const uint * src,
        coherent(device) device uint * dst,
        coherent(device) device uint * part,
        coherent(device) device uint * rev,
        device atomic_uint * bar,
        threadgroup uint * sh [[threadgroup(0)]],
        ushort tiitg [[thread_index_in_threadgroup]],
        ushort ntg   [[threads_per_threadgroup]],
        uint   tgpig [[threadgroup_position_in_grid]],
        uint   ntgpg [[threadgroups_per_grid]]) {
    const uint n = ntg*ntgpg;
    const uint i = tgpig*ntg + tiitg;
    uint x = src[i];
    for (uint r = 0; r < args.n_rounds; ++r) {
        // phase 1: prefix sum within the threadgroup; the last thread publishes the partial sum
        sh[tiitg] = x;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (ushort o = 1; o < ntg; o *= 2) {
            const uint v = tiitg >= o ? sh[tiitg - o] : 0u;
            threadgroup_barrier(mem_flags::mem_threadgroup);
            sh[tiitg] += v;
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
        const uint local = sh[tiitg];
        if (tiitg == ntg - 1) {
            part[tgpig] = local;
        }
        scan_sync<MODE>(bar, args.n_wait, tiitg);
        // phase 2: add the partial sums of the threadgroups before this one
        uint off = 0;
        for (uint g = 0; g < tgpig; ++g) {
            off += part[g];
        }
        dst[i] = local + off;
        scan_sync<MODE>(bar, args.n_wait, tiitg);
        // phase 3: the next round's input comes from the mirrored threadgroup
        x = dst[n - 1 - i];
        rev[i] = x;
        scan_sync<MODE>(bar, args.n_wait, tiitg);
    }
}

typedef decltype(kernel_scan<0>) kernel_scan_t;

template [[host_name("kernel_scan_ok")]]        kernel kernel_scan_t kernel_scan<0>;
template [[host_name("kernel_scan_nofence")]]   kernel kernel_scan_t kernel_scan<1>;
template [[host_name("kernel_scan_nobarrier")]] kernel kernel_scan_t kernel_scan<2>;
template [[host_name("kernel_scan_fenceonly")]] kernel kernel_scan_t kernel_scan<3>;
template [[host_name("kernel_scan_noacquire")]] kernel kernel_scan_t kernel_scan<4>;

// planted bug: a flag polled with plain (non-atomic) loads; the thread never reaches a scheduling
// point, the emulator's watchdog reports it
kernel void kernel_plain_spin(
        device const uint * flag,
        device       uint * dst,
        uint tgpig [[threadgroup_position_in_grid]]) {
    if (tgpig == 0) {
        while (((volatile device const uint *) flag)[0] == 0u) {
        }
        atomic_thread_fence(mem_flags::mem_device, memory_order_seq_cst, thread_scope_device);
    }
    dst[tgpig] = 1u;
}

// device atomics from every thread of every threadgroup: a histogram (fetch_add), a float sum
// (atomic_float), a maximum (fetch_max) and an xor through a compare-exchange loop
kernel void kernel_atomics(
        device const uint  * src,
        device atomic_uint * hist,
        device atomic_float * fsum,
        device atomic_int  * imax,
        device atomic_uint * xr,
        uint tpig [[thread_position_in_grid]]) {
    const uint v = src[tpig];
    atomic_fetch_add_explicit(&hist[v % 16u], 1u, memory_order_relaxed);
    atomic_fetch_add_explicit(fsum, float(v % 256u), memory_order_relaxed);
    atomic_fetch_max_explicit(imax, int(v >> 1), memory_order_relaxed);
    uint old = atomic_load_explicit(xr, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(xr, &old, old ^ v, memory_order_relaxed, memory_order_relaxed)) {
    }
}
