// CUDA types, intrinsics and the bits of ggml-cuda that the STQ1_0 RP16 kernels use, for their fiber emulations on the
// host (stq1_0_rp16_emu.cpp, stq1_0_bulk_emu.cpp; CI has no GPU). Include after emu_fibers.h and ggml-common.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

// fp16 -> fp32, exact (every fp16 value, subnormals included)
static float emu_fp16_to_fp32(uint16_t h) {
    const uint32_t s = (uint32_t) (h >> 15) << 31, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    uint32_t f;
    if (e == 0) {
        if (m == 0) { f = s; } else { float v = ldexpf((float) m, -24); memcpy(&f, &v, 4); f |= s; }
    } else if (e == 31) {
        f = s | 0x7F800000u | (m << 13);
    } else {
        f = s | ((e + 112) << 23) | (m << 13);
    }
    float r; memcpy(&r, &f, 4); return r;
}

// ---- CUDA types and intrinsics ----------------------------------------------------------------------------
struct alignas(16) uint4 { uint32_t x, y, z, w; };
struct alignas(8)  uint2 { uint32_t x, y; };
typedef uint32_t half2; // (low, high) fp16
typedef int cudaStream_t;
typedef int cudaError_t;
static cudaError_t cudaGetLastError() { return 0; }
#define CUDA_CHECK(x) (void) (x)
using std::min;

static float __low2float(half2 h)  { return emu_fp16_to_fp32(h & 0xFFFF); }
static float __high2float(half2 h) { return emu_fp16_to_fp32(h >> 16); }
static float __fmul_rn(float a, float b) { return a*b; }
static int __float2int_rn(float x) { return (int) nearbyintf(x); }
static uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, int s) { return (uint32_t) ((((uint64_t) hi << 32) | lo) >> (s & 31)); }
static int ggml_cuda_dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int8_t) (a >> 8*i) * (int8_t) (b >> 8*i);
    return c;
}

// loads (and the bulk emulation's copies) must stay inside the current weights [0] or activations [1]
static const char * g_lo[2];
static const char * g_hi[2];
static bool emu_in(const void * p, size_t n, int which) {
    return !g_lo[which] || ((const char *) p >= g_lo[which] && (const char *) p + n <= g_hi[which]);
}
static void emu_check(const void * p, size_t n, int which, const char * what) {
    if (!emu_in(p, n, which) && g_fail++ < 5) {
        printf("FAIL: %s load at %p outside [%p, %p)\n", what, p, (const void *) g_lo[which], (const void *) g_hi[which]);
    }
}
static uint4 __ldcs(const uint4 * p) { emu_check(p, 16, 0, "weight"); return *p; }
static uint4 __ldg(const uint4 * p)  { emu_check(p, 16, 1, "activation"); return *p; }
static float __ldg(const float * p)  { return *p; }

// ---- fibers: the threads of one CUDA block (emu_fibers.h) ----------------------------------------------------
static dim3 g_grid_dim;
#define gridDim g_grid_dim

template<int width = WARP_SIZE>
static float warp_reduce_max(float x) {
    for (int offset = width/2; offset > 0; offset >>= 1) {
        x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, offset, width));
    }
    return x;
}

// ---- ggml-cuda's launch helpers and pool (the includer defines emu_launch and ggml_cuda_kernel_launch) --------
#define GGML_CUDA_RESTRICT
static void ggml_cuda_pdl_sync() {}
static void ggml_cuda_pdl_lc() {}
struct ggml_cuda_kernel_launch_params {
    dim3 block_nums, block_dims; size_t shmem; cudaStream_t stream;
    ggml_cuda_kernel_launch_params(const dim3 & bn, const dim3 & bd, const size_t sh, const cudaStream_t st)
        : block_nums(bn), block_dims(bd), shmem(sh), stream(st) {}
    ggml_cuda_kernel_launch_params(const dim3 & bn, const dim3 & bd, const int sh, const cudaStream_t st)
        : block_nums(bn), block_dims(bd), shmem((size_t) sh), stream(st) {}
};
struct ggml_backend_cuda_context {
    void * pool() { return nullptr; }
    cudaStream_t stream() { return 0; }
};
template <typename T>
struct ggml_cuda_pool_alloc {
    std::vector<T> v;
    ggml_cuda_pool_alloc(void *, size_t n) : v(n) {}
    T * get() { return v.data(); }
};
