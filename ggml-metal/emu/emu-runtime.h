// emu-runtime.h - fiber scheduler behind the metal-emu kernels (C++ interface)
#pragma once

#include <stddef.h>
#include <stdint.h>

#define EMU_SIMD_SLOT_BYTES 32
#define EMU_MAX_BUFFERS     32
#define EMU_MAX_TGMEM       8
#define EMU_MAX_FC          512

// --- used by translated kernels ---------------------------------------------------------------
void   emu_tg_barrier(void);
void   emu_simd_sync(void);
void   emu_simd_lockstep(void);   // lockstep point before/after a lane-dependent branch
void * emu_simd_exchange_raw(const void * v, size_t n);
uint32_t emu_simd_active_mask(void);
int    emu_lane(void);
bool   emu_simd_leader(void);
void * emu_simd_collective_begin(void);
void * emu_simd_collective_slot(void);
void   emu_simd_collective_done(void);
void   emu_mma_f32(float * d, const void * a, int ta, const void * b, int tb, const void * c, int tc);
void * emu_tg_alloc(const void * key, size_t size, size_t align);
void   emu_report_misaligned(const void * p, size_t align, const char * where);

// device-scope synchronisation (persistent dispatches, see PERSISTENT.md): every atomic operation on
// device memory is bracketed by begin/end; begin is a scheduling point (the other co-resident
// threadgroups run), end reports whether the operation changed memory. A device-scope fence is a
// scheduling point that publishes the threadgroup's plain device stores (publish = false: a fence
// that orders nothing, e.g. memory_order_relaxed or threadgroup scope).
void   emu_atomic_begin(const void * p);
void   emu_atomic_end(const void * p, size_t n, bool changed);
void   emu_device_fence(bool publish);

// kernel argument kinds (parameter order of the kernel function)
enum emu_arg_kind : uint8_t {
    EMU_ARG_BUFFER = 0,   // [[buffer(n)]] or implicit: idx = buffer index
    EMU_ARG_TGMEM,        // [[threadgroup(n)]]
    EMU_ARG_TGPIG,        // threadgroup_position_in_grid
    EMU_ARG_TPITG,        // thread_position_in_threadgroup
    EMU_ARG_TIITG,        // thread_index_in_threadgroup
    EMU_ARG_TIISG,        // thread_index_in_simdgroup
    EMU_ARG_SGITG,        // simdgroup_index_in_threadgroup
    EMU_ARG_NSG,          // simdgroups_per_threadgroup
    EMU_ARG_NTG,          // threads_per_threadgroup
    EMU_ARG_NTGPG,        // threadgroups_per_grid
    EMU_ARG_TPIG,         // thread_position_in_grid
    EMU_ARG_NTPSG,        // threads_per_simdgroup
};

struct emu_arg_desc {
    emu_arg_kind kind;
    uint8_t      idx;
};

// the values a kernel argument can take for the current fiber
void * emu_arg_ptr(emu_arg_kind kind, int idx);                // buffers and threadgroup memory
void   emu_arg_u3 (emu_arg_kind kind, uint32_t out[3]);        // thread position builtins

typedef void (*emu_kernel_fn)(void);

// registration (called from the generated per-file registration functions)
// coresident: the kernel synchronises threadgroups through device memory (device atomics or
// device-scope fences, found by msl2cpp.py); its dispatches run as persistent dispatches
void emu_register_kernel(const char * name, emu_kernel_fn fn, const char * file, bool coresident);
void emu_register_fc(int idx, void * ptr, size_t size);

// --- used by the device layer ------------------------------------------------------------------
struct emu_kernel_info {
    const char *  name;
    emu_kernel_fn fn;
    const char *  file;
    bool          coresident;
};

const emu_kernel_info * emu_find_kernel(const char * name);
int  emu_n_kernels(void);
bool emu_have_file(const char * file); // were the kernels of kernels/<file>.metal translated?

struct emu_fc_value {
    int     idx;
    int     size;
    uint8_t bytes[8];
};

struct emu_dispatch {
    const emu_kernel_info * kernel;
    void *   bufs[EMU_MAX_BUFFERS];
    size_t   buf_size[EMU_MAX_BUFFERS]; // 0 = unknown
    size_t   tgmem[EMU_MAX_TGMEM];
    int      ntgpg[3];                 // threadgroups per grid
    int      ntg[3];                   // threads per threadgroup
    const emu_fc_value * fcs;
    int      n_fcs;
};

// runs all threadgroups of a dispatch (blocking); returns false on an emulation error
bool emu_run_dispatch(const emu_dispatch * d);

// co-residency limit of the emulated GPU: how many threadgroups of this size can be resident at
// once (GPU cores x threadgroups per core; env GGML_METAL_EMU_GPU_CORES, default 8, and
// GGML_METAL_EMU_RESIDENCY = total override). A persistent kernel must launch at most this many.
int  emu_max_resident_threadgroups(int threads_per_threadgroup, size_t threadgroup_memory_bytes);

// device memory whose plain stores persistent dispatches buffer per threadgroup (page-aligned
// ranges; the emulated device registers its buffers, test drivers register theirs)
void emu_device_memory_register(void * p, size_t size);
void emu_device_memory_unregister(void * p);

// all kernels of all translated files (generated: emu-kernels-index.cpp)
void emu_register_all_kernels(void);
