// grid-barrier.h - grid-wide barrier for persistent Metal kernels (MSL 3.2: -std=metal3.2)
//
// A persistent kernel keeps every threadgroup of its launch alive and separates phases with grid
// barriers instead of kernel launches. Two rules, both learnt on real Apple GPUs:
//
// 1. Every threadgroup of the launch must be co-resident: a barrier waits for all of them, and a
//    threadgroup that is not resident never starts while the resident ones spin. Size the grid from
//    the device's limits, never from the problem: on metal-emu emu_max_resident_threadgroups()
//    (ggml-metal/emu/emu-runtime.h), on a Mac the GPU core count times the threadgroups a core holds
//    at this threadgroup size and threadgroup memory. An oversubscribed launch hangs on a GPU;
//    metal-emu reports it as a deadlock naming the kernel.
// 2. MSL atomics are relaxed only: the arrive/spin orders nothing by itself. Device-scope fences on
//    both sides carry the data: before the arrival (this threadgroup's stores are published) and
//    after the spin (the other threadgroups' stores are seen). The naive barrier without them
//    returns stale data already at 2 threadgroups. Data that threadgroups exchange should also be
//    accessed through coherent(device) pointers (MSL 3.2; M1-class GPUs otherwise lose stores
//    across the threadgroups of a dispatch).
//
// State: two device atomic_uint, zero once when allocated and never reset between launches (each
// completed barrier leaves 'arrived' at 0; 'generation' counts barriers and may wrap):
//   bar[0] = threadgroups arrived at the current barrier, bar[1] = generation.
// Every thread of every threadgroup calls grid_barrier() in uniform control flow, with n_tg = the
// number of threadgroups in the grid.
#pragma once

static inline void grid_barrier(device atomic_uint * bar, uint n_tg, ushort tiitg) {
    // release: this thread's device stores are published before its threadgroup arrives
    atomic_thread_fence(mem_flags::mem_device, memory_order_seq_cst, thread_scope_device);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tiitg == 0) {
        // the generation is read before the arrival counts: it cannot move until this one arrives
        const uint gen = atomic_load_explicit(&bar[1], memory_order_relaxed);
        atomic_thread_fence(mem_flags::mem_device, memory_order_seq_cst, thread_scope_device);
        const uint arrived = atomic_fetch_add_explicit(&bar[0], 1u, memory_order_relaxed) + 1u;
        if (arrived == n_tg) {
            // last to arrive: reset the count for the next barrier, then release the others
            atomic_store_explicit(&bar[0], 0u, memory_order_relaxed);
            atomic_thread_fence(mem_flags::mem_device, memory_order_seq_cst, thread_scope_device);
            atomic_store_explicit(&bar[1], gen + 1u, memory_order_relaxed);
        } else {
            while (atomic_load_explicit(&bar[1], memory_order_relaxed) == gen) {
            }
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    // acquire: the other threadgroups' stores are seen by this thread's next loads
    atomic_thread_fence(mem_flags::mem_device, memory_order_seq_cst, thread_scope_device);
}
