// Host emulation of the STQ1_0 CUDA mat-vec kernel (ggml-cuda/mmv-stq1_0.cu; CI has no GPU).
//
// tests/test_cuda_stq1_0_mmv_hostemu.py takes the device helpers of vecdotq.cuh (STQ_VECDOT_INC) and the kernel
// and host code of mmv-stq1_0.cu (STQ_MMV_INC), rewrites inline PTX and __shared__ into the emulations below and
// includes them here. Every CUDA thread of a block is a fiber (emu_fibers.h) scheduled round-robin; __syncwarp,
// __syncthreads and __shfl_xor_sync are real barriers between the fibers; cp.async copies become visible only
// at the cp.async.wait_group that covers them (or at once with EMU_CP_EAGER=1), and shared memory starts as
// garbage. ggml_cuda_mul_mat_vec_stq1_0 runs on CPU ggml tensors and is compared with ggml's dequantized
// weights times the same q8_1 activations; MUL_MAT columns and MUL_MAT_ID tokens must also be bit-identical to
// the one-column / one-token results (batch invariance).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ggml.h"
#include "emu_fibers.h"
#define GGML_COMMON_DECL_CPP
#define GGML_COMMON_IMPL_CPP
#include "ggml-common.h"

#define CP_ASYNC_AVAILABLE
#define MMVQ_MAX_BATCH_SIZE 8
#define MATRIX_ROW_PADDING 512
#define GGML_LOG_WARN(...) fprintf(stderr, __VA_ARGS__)

// ---- CUDA types and math ----------------------------------------------------------------------------------
struct uint3 { uint32_t x, y, z; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct float2 { float x, y; };
typedef uint32_t half2;
typedef ggml_half half;
typedef int cudaStream_t;

#include "prmt_emu.h"
static int emu_dp4a_us(uint32_t a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int) ((a >> 8*i) & 0xFF) * (int8_t) (b >> 8*i);
    return c;
}
static int ggml_cuda_dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int8_t) (a >> 8*i) * (int8_t) (b >> 8*i);
    return c;
}
static uint32_t __umulhi(uint32_t a, uint32_t b) { return (uint32_t) (((uint64_t) a * b) >> 32); }
static int get_int_b4(const void * x, const int & i32) { int v; memcpy(&v, (const char *) x + 4*i32, 4); return v; }
static float __half2float(ggml_half h) { return ggml_fp16_to_fp32(h); }
static float2 __half22float2(const uint32_t & h2) { return { ggml_fp16_to_fp32(h2 & 0xFFFF), ggml_fp16_to_fp32(h2 >> 16) }; }
static constexpr int QK8_1_MMQ = 4*QK8_1;
static float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static float __fmul_rn(float a, float b) { return a*b; }
static float __fadd_rn(float a, float b) { return a + b; }
struct block_q8_1_emu { uint32_t ds; int8_t qs[32]; }; // ds: half2 (d, sum)
#define block_q8_1 block_q8_1_emu
struct alignas(16) block_q8_1_mmq { half2 ds4[4]; int8_t qs[QK8_1_MMQ]; }; // the DS4 layout of mmq
static_assert(sizeof(block_q8_1_mmq) == 144, "");
using std::min;

static uint3 init_fastdiv_values(uint64_t d) { return { 0, 0, (uint32_t) d }; }
static uint32_t fastdiv(uint32_t n, const uint3 v) { return n / v.z; }
static uint32_t fastmodulo(uint32_t n, const uint3 v) { return n % v.z; }

// ---- fibers: the threads of one CUDA block (emu_fibers.h) ----------------------------------------------------
static std::vector<unsigned char> g_smem;
static bool g_eager = false;

static void ggml_cuda_syncwarp() { emu_block_until(1); }
static void ggml_cuda_pdl_sync() {}
static void ggml_cuda_pdl_lc() {}

template<int width = WARP_SIZE>
static float warp_reduce_sum(float x) {
    for (int offset = width/2; offset > 0; offset >>= 1) {
        x += __shfl_xor_sync(0xffffffff, x, offset, width);
    }
    return x;
}

// the weights of the current call: cp.async and prefetch must stay inside them
static const char * g_w_lo = nullptr;
static const char * g_w_hi = nullptr;
static void emu_check_weights(const void * p, size_t n, const char * what) {
    if ((const char *) p < g_w_lo || (const char *) p + n > g_w_hi) {
        if (g_fail++ < 5) printf("FAIL: %s at %p outside the weights [%p, %p)\n", what, p, (const void *) g_w_lo, (const void *) g_w_hi);
    }
}
static void emu_prefetch(const void * p) { emu_check_weights(p, 1, "prefetch"); }

static void * emu_smem() { return g_smem.data(); }
static unsigned int ggml_cuda_cvta_generic_to_shared(void * p) { return (unsigned int) ((unsigned char *) p - g_smem.data()); }
template <int preload>
static void cp_async_cg_16(const unsigned int dst, const void * src) {
    if (dst % 16 != 0 || (uintptr_t) src % 16 != 0 || dst + 16 > g_smem.size()) {
        if (g_fail++ < 5) printf("FAIL: cp.async dst %u src %p not 16-byte aligned or outside shared memory\n", dst, src);
        return;
    }
    emu_check_weights(src, 16, "cp.async");
    if (g_eager) {
        memcpy(g_smem.data() + dst, src, 16);
    } else {
        g_fib[g_cur].open.push_back({ g_smem.data() + dst, src });
    }
}
static void emu_cp_async_commit() {
    fiber & f = g_fib[g_cur];
    f.groups.push_back(std::move(f.open));
    f.open.clear();
}
static void emu_cp_async_wait(int n) {
    fiber & f = g_fib[g_cur];
    while ((int) f.groups.size() > n) {
        for (auto & c : f.groups.front()) memcpy(c.first, c.second, 16);
        f.groups.erase(f.groups.begin());
    }
}

// ---- launch, context, q8_1 quantization -------------------------------------------------------------------
struct ggml_cuda_kernel_launch_params {
    dim3 block_nums, block_dims; size_t shmem; cudaStream_t stream;
    ggml_cuda_kernel_launch_params(const dim3 & bn, const dim3 & bd, const size_t sh, const cudaStream_t st)
        : block_nums(bn), block_dims(bd), shmem(sh), stream(st) {}
    ggml_cuda_kernel_launch_params(const dim3 & bn, const dim3 & bd, const int sh, const cudaStream_t st)
        : block_nums(bn), block_dims(bd), shmem((size_t) sh), stream(st) {}
};
static size_t g_launch_shmem = 0;
template <typename Kernel, typename... Args>
static void ggml_cuda_kernel_launch(Kernel kernel, const ggml_cuda_kernel_launch_params & p, Args &&... args) {
    g_launch_shmem = p.shmem;
    for (unsigned z = 0; z < p.block_nums.z; ++z)
    for (unsigned y = 0; y < p.block_nums.y; ++y)
    for (unsigned x = 0; x < p.block_nums.x; ++x) {
        g_block_idx = dim3(x, y, z);
        g_smem.assign(p.shmem + 16, 0xA5);
        run_block(p.block_dims, [&] { kernel(args...); });
    }
}

struct ggml_backend_cuda_context {
    void * pool() { return nullptr; }
    cudaStream_t stream() { return 0; }
};
template <typename T>
struct ggml_cuda_pool_alloc {
    std::vector<T> v;
    ggml_cuda_pool_alloc(void *, size_t n) : v(n + 64) {}
    T * get() { return v.data(); }
};
static bool cp_async_available(int cc) { return cc >= 800; } // NVIDIA Ampere and newer

// q8_1 of one 32-value block as mmq's quantizer computes it (d = 1/(127/amax), q = round(x*127/amax));
// ds.y = d*sum(q) instead of the float sum (exact up to fp16) so that the check can be tight
static void emu_quantize_q8_1(const float * x, int n_valid, int8_t * qs, uint32_t & ds) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, i < n_valid ? fabsf(x[i]) : 0.0f);
    const float d_inv = 127.0f / amax;
    const float d = 1.0f / d_inv;
    int s = 0;
    for (int i = 0; i < 32; ++i) {
        const float v = i < n_valid ? x[i] : 0.0f;
        qs[i] = (int8_t) (amax == 0 ? 0 : roundf(v*d_inv));
        s += qs[i];
    }
    ds = ggml_fp32_to_fp16(d) | (uint32_t) ggml_fp32_to_fp16(d*s) << 16;
}
// the mmq layout: channel z = i3*ne2 + i2, then 128-value block kb, then row i1
static void quantize_mmq_q8_1_cuda(const float * x, const int32_t * ids, void * vy, ggml_type, int64_t ne00,
        int64_t s01, int64_t s02, int64_t s03, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3, cudaStream_t) {
    if (ids || ne0 % QK8_1_MMQ != 0 || ne00 % 4 != 0) { printf("FAIL: mmq q8_1 arguments\n"); exit(1); }
    block_q8_1_mmq * y = (block_q8_1_mmq *) vy;
    const int64_t nkb = ne0/QK8_1_MMQ;
    for (int64_t i3 = 0; i3 < ne3; ++i3)
    for (int64_t i2 = 0; i2 < ne2; ++i2)
    for (int64_t i1 = 0; i1 < ne1; ++i1) {
        const float * row = x + i3*s03 + i2*s02 + i1*s01;
        for (int64_t kb = 0; kb < nkb; ++kb) {
            block_q8_1_mmq & b = y[((i3*ne2 + i2)*nkb + kb)*ne1 + i1];
            for (int k = 0; k < 4; ++k) {
                const int64_t i0 = kb*QK8_1_MMQ + 32*k;
                const int nv = (int) std::max<int64_t>(0, std::min<int64_t>(32, ne00 - i0));
                emu_quantize_q8_1(row + i0, nv, b.qs + 32*k, b.ds4[k]);
            }
        }
    }
}

#include STQ_VECDOT_INC
#include STQ_MMV_INC

static void emu_call(ggml_backend_cuda_context & cctx, const ggml_tensor * w, const ggml_tensor * x, const ggml_tensor * ids, ggml_tensor * d) {
    g_w_lo = (const char *) w->data;
    g_w_hi = (const char *) w->data + ggml_nbytes(w);
    ggml_cuda_mul_mat_vec_stq1_0(cctx, w, x, ids, d);
}

// ---- the checks --------------------------------------------------------------------------------------------
static std::mt19937 rng(20261130);

static void fill_stq1_0(ggml_tensor * t) {
    const size_t nb = ggml_nbytes(t) / sizeof(block_stq1_0);
    block_stq1_0 * b = (block_stq1_0 *) t->data;
    for (size_t i = 0; i < nb; ++i) {
        for (auto & x : b[i].qs)   x = rng();
        for (auto & x : b[i].sign) x = rng();
        b[i].d = ggml_fp32_to_fp16(0.01f + (rng() % 1000)*1e-5f);
    }
}
static void fill_f32(ggml_tensor * t) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    float * x = (float *) t->data;
    for (int64_t i = 0; i < ggml_nelements(t); ++i) x[i] = nd(rng);
}

// dequantized row of src0, q8_1-dequantized row of a src1 column
static std::vector<float> w_row(const ggml_tensor * w, int64_t row, int64_t i2, int64_t i3) {
    std::vector<float> r(w->ne[0]);
    const char * p = (const char *) w->data + row*w->nb[1] + i2*w->nb[2] + i3*w->nb[3];
    ggml_get_type_traits(GGML_TYPE_STQ1_0)->to_float(p, r.data(), w->ne[0]);
    return r;
}
static std::vector<double> x_col(const ggml_tensor * x, int64_t i1, int64_t i2, int64_t i3) {
    const float * p = (const float *) ((const char *) x->data + i1*x->nb[1] + i2*x->nb[2] + i3*x->nb[3]);
    std::vector<double> r(x->ne[0]);
    for (int64_t ib = 0; ib < x->ne[0]/32; ++ib) {
        int8_t qs[32];
        uint32_t ds;
        emu_quantize_q8_1(p + 32*ib, 32, qs, ds);
        const double d = ggml_fp16_to_fp32(ds & 0xFFFF);
        for (int i = 0; i < 32; ++i) r[32*ib + i] = d*qs[i];
    }
    return r;
}
static int n_checked = 0;
static void compare(const char * what, float got, double ref, double mag) {
    ++n_checked;
    if (!(fabs(got - ref) <= 2e-3*mag + 1e-6)) {
        if (g_fail++ < 8) printf("FAIL: %s: got %g, reference %g (magnitude %g)\n", what, got, ref, mag);
    }
}

static ggml_context * new_ctx(size_t mb) {
    ggml_init_params ip = { mb << 20, nullptr, false };
    return ggml_init(ip);
}

// MUL_MAT: src0 K x M x ne02 x ne03, src1 K x N x ne12 x ne13; every column also alone (batch invariance)
static void check_mul_mat(int64_t K, int64_t M, int64_t N, int64_t ne02 = 1, int64_t ne12 = 1, int64_t ne03 = 1, int64_t ne13 = 1) {
    ggml_context * ctx = new_ctx(16 + (size_t) (K*M*ne02*ne03/256*42 + 4*K*N*ne12*ne13*2 + 4*M*N*ne12*ne13*2) / (1 << 20) * 2);
    ggml_tensor * w = ggml_new_tensor_4d(ctx, GGML_TYPE_STQ1_0, K, M, ne02, ne03);
    ggml_tensor * x = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, K, N, ne12, ne13);
    ggml_tensor * d = ggml_mul_mat(ctx, w, x);
    fill_stq1_0(w);
    fill_f32(x);
    if (!ggml_cuda_should_use_mmv_stq1_0(w, x, false, 900)) { printf("FAIL: %lldx%lld not taken by the kernel\n", (long long) K, (long long) M); g_fail++; return; }
    ggml_backend_cuda_context cctx;
    emu_call(cctx, w, x, nullptr, d);
    char what[128];
    for (int64_t i3 = 0; i3 < ne13; ++i3)
    for (int64_t i2 = 0; i2 < ne12; ++i2)
    for (int64_t j = 0; j < N; ++j) {
        const std::vector<double> xc = x_col(x, j, i2, i3);
        for (int64_t m = 0; m < M; ++m) {
            const std::vector<float> wr = w_row(w, m, i2/(ne12/ne02), i3/(ne13/ne03));
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < K; ++k) { ref += wr[k]*xc[k]; mag += fabs(wr[k]*xc[k]); }
            const float got = ((const float *) d->data)[m + j*d->ne[0] + i2*d->ne[0]*d->ne[1] + i3*d->ne[0]*d->ne[1]*d->ne[2]];
            snprintf(what, sizeof(what), "MUL_MAT %lldx%lld n=%lld row %lld col %lld ch %lld s %lld", (long long) K,
                (long long) M, (long long) N, (long long) m, (long long) j, (long long) i2, (long long) i3);
            compare(what, got, ref, mag);
        }
    }
    if (N > 1) {
        // each column alone: bit-identical
        ggml_tensor * x1 = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, K, 1, ne12, ne13);
        ggml_tensor * d1 = ggml_mul_mat(ctx, w, x1);
        for (int64_t j = 0; j < N; ++j) {
            for (int64_t i3 = 0; i3 < ne13; ++i3)
            for (int64_t i2 = 0; i2 < ne12; ++i2) {
                memcpy((char *) x1->data + i2*x1->nb[2] + i3*x1->nb[3], (char *) x->data + j*x->nb[1] + i2*x->nb[2] + i3*x->nb[3], K*4);
            }
            emu_call(cctx, w, x1, nullptr, d1);
            for (int64_t i3 = 0; i3 < ne13; ++i3)
            for (int64_t i2 = 0; i2 < ne12; ++i2)
            for (int64_t m = 0; m < M; ++m) {
                const float a = ((const float *) d1->data)[m + i2*d1->ne[0] + i3*d1->ne[0]*d1->ne[2]];
                const float b = ((const float *) d->data)[m + j*d->ne[0] + i2*d->ne[0]*d->ne[1] + i3*d->ne[0]*d->ne[1]*d->ne[2]];
                ++n_checked;
                if (memcmp(&a, &b, 4) != 0 && g_fail++ < 8) {
                    printf("FAIL: MUL_MAT %lldx%lld n=%lld col %lld row %lld: %.9g alone, %.9g in the batch\n", (long long) K,
                        (long long) M, (long long) N, (long long) j, (long long) m, a, b);
                }
            }
        }
    }
    ggml_free(ctx);
}

// MUL_MAT_ID: n_exp experts of K x M, n_used per token, T tokens; src1 K x ne11 x T (ne11 = 1: broadcast).
// Calls the kernel's host function directly: on a GPU MUL_MAT_ID takes it only with GGML_CUDA_STQ1_0_MMV=id
// (or a variant), see check_dispatch
static void check_mul_mat_id(int64_t K, int64_t M, int64_t n_exp, int64_t n_used, int64_t T, int64_t ne11) {
    ggml_context * ctx = new_ctx(16 + (size_t) (K*M*n_exp/256*42 + 4*K*ne11*T*2 + 4*M*n_used*T*2) / (1 << 20) * 2);
    ggml_tensor * w   = ggml_new_tensor_3d(ctx, GGML_TYPE_STQ1_0, K, M, n_exp);
    ggml_tensor * x   = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, K, ne11, T);
    ggml_tensor * ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, n_used, T);
    ggml_tensor * d   = ggml_mul_mat_id(ctx, w, x, ids);
    fill_stq1_0(w);
    fill_f32(x);
    for (int64_t t = 0; t < T; ++t) {
        std::vector<int> e(n_exp);
        for (int i = 0; i < n_exp; ++i) e[i] = i;
        std::shuffle(e.begin(), e.end(), rng);
        for (int64_t s = 0; s < n_used; ++s) ((int32_t *) ids->data)[s + t*n_used] = e[s];
    }
    ggml_backend_cuda_context cctx;
    emu_call(cctx, w, x, ids, d);
    char what[160];
    for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < n_used; ++s) {
        const int e = ((int32_t *) ids->data)[s + t*n_used];
        const std::vector<double> xc = x_col(x, s % ne11, t, 0);
        for (int64_t m = 0; m < M; ++m) {
            const std::vector<float> wr = w_row(w, m, e, 0);
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < K; ++k) { ref += wr[k]*xc[k]; mag += fabs(wr[k]*xc[k]); }
            const float got = *(const float *) ((const char *) d->data + m*d->nb[0] + s*d->nb[1] + t*d->nb[2]);
            snprintf(what, sizeof(what), "MUL_MAT_ID %lldx%lld e%lld top-%lld T=%lld: token %lld slot %lld (expert %d) row %lld",
                (long long) K, (long long) M, (long long) n_exp, (long long) n_used, (long long) T, (long long) t, (long long) s, e, (long long) m);
            compare(what, got, ref, mag);
        }
    }
    if (T > 1) {
        ggml_tensor * x1   = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, K, ne11, 1);
        ggml_tensor * ids1 = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, n_used, 1);
        ggml_tensor * d1   = ggml_mul_mat_id(ctx, w, x1, ids1);
        for (int64_t t = 0; t < T; ++t) {
            memcpy(x1->data, (char *) x->data + t*x->nb[2], ggml_nbytes(x1));
            memcpy(ids1->data, (char *) ids->data + t*ids->nb[1], ggml_nbytes(ids1));
            emu_call(cctx, w, x1, ids1, d1);
            for (int64_t s = 0; s < n_used; ++s)
            for (int64_t m = 0; m < M; ++m) {
                const float a = *(const float *) ((const char *) d1->data + m*d1->nb[0] + s*d1->nb[1]);
                const float b = *(const float *) ((const char *) d->data + m*d->nb[0] + s*d->nb[1] + t*d->nb[2]);
                ++n_checked;
                if (memcmp(&a, &b, 4) != 0 && g_fail++ < 8) {
                    printf("FAIL: MUL_MAT_ID token %lld slot %lld row %lld: %.9g alone, %.9g in the batch\n",
                        (long long) t, (long long) s, (long long) m, a, b);
                }
            }
        }
    }
    ggml_free(ctx);
}

static void check_not_taken() {
    ggml_context * ctx = new_ctx(8);
    ggml_tensor * w  = ggml_new_tensor_2d(ctx, GGML_TYPE_STQ1_0, 2560, 4); // 10 blocks per row: not whole tiles
    ggml_tensor * w2 = ggml_new_tensor_2d(ctx, GGML_TYPE_STQ1_0, 2048, 4);
    ggml_tensor * v  = ggml_view_2d(ctx, w2, 2048, 2, w2->nb[1], w2->nb[1]/2 + 1); // misaligned data
    ggml_tensor * x  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 2048, 3);
    ggml_tensor * xv = ggml_view_2d(ctx, x, 2048, 2, x->nb[1] - 4, 4); // activations not 16-byte aligned
    if (ggml_cuda_should_use_mmv_stq1_0(w, x, false, 900) || ggml_cuda_should_use_mmv_stq1_0(v, x, false, 900) ||
        ggml_cuda_should_use_mmv_stq1_0(w2, xv, false, 900) || ggml_cuda_should_use_mmv_stq1_0(w, x, true, 900) ||
        ggml_cuda_should_use_mmv_stq1_0(w2, x, false, 700)) { // Volta: no cp.async
        printf("FAIL: ggml_cuda_should_use_mmv_stq1_0 takes 2560-wide rows, misaligned views or a GPU without cp.async\n");
        g_fail++;
    }
    ggml_free(ctx);
}

// which ops take the kernel for GGML_CUDA_STQ1_0_MMV (read once per process): unset/1 MUL_MAT only (MUL_MAT_ID
// keeps mmvq), id and the variants both, 0 neither; an unknown value is the default. The answer must not depend
// on the number of columns or tokens (batch invariance: decode and verify take the same kernel).
static void check_dispatch() {
    const char * e = getenv("GGML_CUDA_STQ1_0_MMV");
    const std::string mode = e ? e : "";
    const bool want_mm = mode != "0";
    const bool want_id = mode == "id" || mode == "r2" || mode == "r8" || mode == "w2" || mode == "s2" || mode == "s8";
    ggml_context * ctx = new_ctx(16);
    ggml_tensor * w = ggml_new_tensor_3d(ctx, GGML_TYPE_STQ1_0, 2048, 4, 6);
    for (int n = 1; n <= 8; ++n) {
        ggml_tensor * x   = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 2048, n);    // MUL_MAT: n columns
        ggml_tensor * xid = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 2048, 1, n); // MUL_MAT_ID: n tokens
        const bool mm = ggml_cuda_should_use_mmv_stq1_0(w, x, false, 900);
        const bool id = ggml_cuda_should_use_mmv_stq1_0(w, xid, true, 900);
        if (mm != want_mm || id != want_id) {
            printf("FAIL: GGML_CUDA_STQ1_0_MMV=%s n=%d: MUL_MAT %s, MUL_MAT_ID %s the kernel (expected %s, %s)\n",
                e ? e : "(unset)", n, mm ? "takes" : "skips", id ? "takes" : "skips",
                want_mm ? "takes" : "skips", want_id ? "takes" : "skips");
            g_fail++;
        }
    }
    ggml_free(ctx);
}

int main(int argc, char ** argv) {
    const std::string set = argc > 1 ? argv[1] : "quick";
    g_eager = getenv("EMU_CP_EAGER") && atoi(getenv("EMU_CP_EAGER"));
    check_dispatch();
    if (set == "dispatch") {
        printf("%s: %d failures (dispatch, GGML_CUDA_STQ1_0_MMV=%s)\n", g_fail ? "FAIL" : "OK", g_fail,
            getenv("GGML_CUDA_STQ1_0_MMV") ? getenv("GGML_CUDA_STQ1_0_MMV") : "(unset)");
        return g_fail != 0;
    }
    if (getenv("GGML_CUDA_STQ1_0_MMV") && strcmp(getenv("GGML_CUDA_STQ1_0_MMV"), "0") == 0) {
        printf("FAIL: the sets other than dispatch need the kernel (GGML_CUDA_STQ1_0_MMV=0)\n");
        return 1;
    }
    check_not_taken();
    if (set == "quick" || set == "full") {
        check_mul_mat(2048, 4, 1);
        check_mul_mat(4096, 7, 3);                // odd rows: the last block has rows past the end
        check_mul_mat(6144, 9, 8);                // 3 tiles, 8 columns
        check_mul_mat(2048, 6, 2, 2, 4);          // broadcast over channels (ne12 = 2 ne02)
        check_mul_mat(2048, 5, 2, 1, 2, 1, 3);    // channels and samples
        check_mul_mat_id(2048, 5, 6, 2, 3, 1);    // broadcast src1 (gate/up), 3 tokens
        check_mul_mat_id(4096, 6, 4, 3, 2, 3);    // one src1 row per slot (down)
    }
    if (set == "full") {
        check_mul_mat(16384, 5, 5);
        for (int n = 1; n <= 8; ++n) check_mul_mat(2048, 3, n);
        check_mul_mat(6144, 2048, 1);              // the Hy4 expert shape as one matrix
        check_mul_mat_id(6144, 2048, 16, 8, 2, 1); // Hy4 routed shape (16 of the 256 experts), top-8, 2 tokens
    }
    if (set == "one") { // one column and MUL_MAT_ID only (for the variants of GGML_CUDA_STQ1_0_MMV)
        check_mul_mat(2048, 4, 1);
        check_mul_mat(4096, 7, 1);
        check_mul_mat(6144, 9, 1);
        check_mul_mat(14336, 13, 1);
        check_mul_mat_id(2048, 5, 6, 2, 3, 1);
        check_mul_mat_id(6144, 17, 8, 4, 2, 4);
    }
    printf("%s: %d failures in %d checked values (%s, cp.async %s, shared memory %zu B per block)\n",
        g_fail ? "FAIL" : "OK", g_fail, n_checked, set.c_str(), g_eager ? "eager" : "deferred", g_launch_shmem);
    return g_fail != 0;
}
