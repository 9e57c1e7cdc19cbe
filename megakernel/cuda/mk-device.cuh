// mk-device.cuh: the CUDA spelling of the megakernel's primitives (stq-metal): the macros mk-kernel.cuh is written
// against, and the loads, asynchronous and bulk copies, atomics and clock it calls. Included by every module that
// compiles the kernel: mk.cu (the decode/verify kernel and the host side) and mk-draft.cu (the fused MTP draft kernel).
// The host emulation in CI spells the same names for the CPU (tests/mk_hostemu/cuda_emu.h).
#pragma once

#include "ggml-cuda/common.cuh"
#include "ggml-mk.h"

#define MK_DEVICE    static __device__ __forceinline__
#define MK_DEVICE_FN static __device__ __noinline__   // phases: own register allocation, no spills in hot loops
#define MK_HOSTDEV   static __host__ __device__ inline
#define MK_KERNEL    __global__ void __launch_bounds__(MK_THREADS)
#define MK_SHARED(T, name, n)   __shared__ T name[n]
#define MK_SHARED_DYN(T, name)  extern __shared__ T name[]
#define MK_UNROLL    _Pragma("unroll")
#define MK_TRAP()    __trap()

static __device__ __forceinline__ float mk_f16(uint16_t u) {
    return __half2float(__ushort_as_half(u));
}

// loads of data that other blocks wrote earlier in this launch: through L2 only (L1 is not coherent)
#if defined(__clang__)
// clang's CUDA headers lack the float/ushort __ldcg overloads: the same instruction, spelled out
static __device__ __forceinline__ float mk_ldcg(const float * p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
    return v;
}
#else
static __device__ __forceinline__ float          mk_ldcg(const float * p)          { return __ldcg(p); }
#endif
static __device__ __forceinline__ float4 mk_ldcg4(const float4 * p) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ uint4 mk_ldcg_u32x4(const uint4 * p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ uint2 mk_ldcg_u32x2(const uint2 * p) {
    uint2 v;
    asm volatile("ld.global.cg.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ unsigned mk_ldcg_u32(const unsigned * p) {
    unsigned v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// weights into shared memory without a register round trip (sm_80+), cached in L2 only and marked first to leave
// it: the weights stream through once per step (code, KV rows and activations stay)
// (sm_80+: ggml_backend_mk_create declines older devices; code built for them traps)
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define MK_ASYNC_ASM(...) asm volatile(__VA_ARGS__)
#else
#define MK_ASYNC_ASM(...) __trap()
#endif
static __device__ __forceinline__ void mk_cp_async16(void * dst, const void * src) {
    const unsigned s = (unsigned) __cvta_generic_to_shared(dst);
    unsigned long long pol = 0;
    (void) pol;
    MK_ASYNC_ASM("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    MK_ASYNC_ASM("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" :: "r"(s), "l"(src), "l"(pol) : "memory");
}
static __device__ __forceinline__ void mk_cp_async_commit() {
    MK_ASYNC_ASM("cp.async.commit_group;" ::: "memory");
}
template <int N>
static __device__ __forceinline__ void mk_cp_async_wait() {
    MK_ASYNC_ASM("cp.async.wait_group %0;" :: "n"(N) : "memory");
}

// the same weights through the bulk copy engine (TMA, sm_90+; mk_args.bulk, the host sets it on such devices unless
// variant GGML_MK_VAR_CP_ASYNC): one instruction copies a whole tile and completes on an mbarrier in shared memory
// (one per warp and stage, expecting one arrival). Measured 1.036x the whole step on E4B, 1.012x on Gemma 3 270M
// against the 16-byte cp.async (H200, NOTES.md session 10). Code for older devices traps: the kernel calls none of
// these unless mk_args.bulk
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define MK_BULK_ASM(...) asm volatile(__VA_ARGS__)
#else
#define MK_BULK_ASM(...) __trap()
#endif
static __device__ __forceinline__ void mk_mbar_init(unsigned long long * bar) {
    MK_BULK_ASM("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"((unsigned) __cvta_generic_to_shared(bar)) : "memory");
}
static __device__ __forceinline__ void mk_mbar_init_fence() {
    MK_BULK_ASM("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// bytes (a multiple of 16, src and dst 16-byte aligned) from global to shared memory; bar's phase completes when
// they have landed
static __device__ __forceinline__ void mk_bulk_copy(void * dst, const void * src, unsigned bytes, unsigned long long * bar) {
    const unsigned d = (unsigned) __cvta_generic_to_shared(dst);
    const unsigned b = (unsigned) __cvta_generic_to_shared(bar);
    unsigned long long pol = 0;
    (void) pol;
    MK_BULK_ASM("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    MK_BULK_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(b), "r"(bytes) : "memory");
    MK_BULK_ASM("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                :: "r"(d), "l"(src), "r"(bytes), "r"(b), "l"(pol) : "memory");
}
// wait until the phase of bar with this parity has completed
static __device__ __forceinline__ void mk_mbar_wait(unsigned long long * bar, unsigned parity) {
    const unsigned b = (unsigned) __cvta_generic_to_shared(bar);
    unsigned done = 0;
    do {
        MK_BULK_ASM("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done) : "r"(b), "r"(parity) : "memory");
    } while (!done);
}

// the grid barrier's arrival (release: the block's writes, ordered before it by __syncthreads, go first; acquire:
// the last arrival sees the others' writes) and poll (acquire: what the other blocks wrote before their arrivals is
// seen after it), GPU scope
static __device__ __forceinline__ unsigned mk_atomic_add_acq_rel(unsigned * p, unsigned v) {
    unsigned old;
    asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
static __device__ __forceinline__ unsigned mk_ld_acquire(const unsigned * p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// thread block clusters (sm_90+; unless GGML_MK_VAR_NO_CLUSTER_STAGE the host launches a verify batch's grid as clusters of
// 2 blocks, consecutive block indices, mk_step_cl): the blocks in this block's cluster (1 in a launch without clusters), this block's rank in it,
// the cluster barrier (every thread of every block of the cluster; release / acquire: the shared-memory stores made
// before it into any block of the cluster are seen after it), and a store of v to the place of shared variable p in
// block `rank` of the cluster (32-bit shared::cluster addresses: a 64-bit generic one costs the staging registers,
// and its callers, mk_mv_run, spills)
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define MK_CLUSTER_ASM(...) asm volatile(__VA_ARGS__)
#else
#define MK_CLUSTER_ASM(...) __trap()
#endif
static __device__ __forceinline__ int mk_cluster_size() {
    unsigned n = 1;
    MK_CLUSTER_ASM("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    return (int) n;
}
static __device__ __forceinline__ int mk_cluster_rank() {
    unsigned r = 0;
    MK_CLUSTER_ASM("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return (int) r;
}
static __device__ __forceinline__ void mk_cluster_sync() {
    MK_CLUSTER_ASM("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
static __device__ __forceinline__ unsigned mk_cluster_addr(const void * p, int rank) {
    unsigned r = 0;
    MK_CLUSTER_ASM("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"((unsigned) __cvta_generic_to_shared(p)), "r"(rank));
    return r;
}
static __device__ __forceinline__ void mk_cluster_st(float4 * p, int rank, float4 v) {
    MK_CLUSTER_ASM("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};"
                   :: "r"(mk_cluster_addr(p, rank)), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}
static __device__ __forceinline__ void mk_cluster_st(unsigned * p, int rank, unsigned v) {
    MK_CLUSTER_ASM("st.shared::cluster.u32 [%0], %1;" :: "r"(mk_cluster_addr(p, rank)), "r"(v) : "memory");
}
static __device__ __forceinline__ void mk_cluster_st(float * p, int rank, float v) {
    MK_CLUSTER_ASM("st.shared::cluster.f32 [%0], %1;" :: "r"(mk_cluster_addr(p, rank)), "f"(v) : "memory");
}

static __device__ __forceinline__ unsigned long long mk_clock_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

