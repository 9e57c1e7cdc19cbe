// Host emulation of the bulk-copy STQ1_0 RP16 mat-vec candidates (bench/stq1_0_repack/bulk_kernel.cuh; CI has no GPU).
//
// tests/test_cuda_stq1_0_bulk_hostemu.py takes stq1_0-rp16.cuh/.cu of the applied tree and bulk_kernel.cuh (its CUDA
// primitives cut out), rewrites launches, __global__ and __shared__, and includes them here (STQ_RP16_INC,
// STQ_BULK_INC). Every CUDA thread is a fiber (emu_fibers.h). The copies into shared memory are emulated strictly:
// a cp.async.bulk or cp.async poisons its destination when issued and lands only at the mbarrier wait or
// cp.async.wait_group that covers it; a wait on a phase whose arrivals or bytes are missing, a copy out of bounds or
// misaligned, or a copy never waited for is a FAIL. So reading a stage before its wait, refilling it before every lane
// is done with it (no __syncwarp), a wrong parity or byte count, all show up as wrong results or FAIL lines.
// Checks per candidate and shape: n = 1..8 columns against a float64 reference with the kernel's own quantized
// activations, every column bit-identical to its one-column product, bit-identical to the RP16 kernel of the same
// K split (patch 0032); MUL_MAT_ID: tokens against float64, against each token alone, against the RP16 ids kernel.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <vector>

#include "ggml.h"
#include "emu_fibers.h"
#define GGML_COMMON_DECL_CPP
#define GGML_COMMON_IMPL_CPP
#include "ggml-common.h"
#include "cuda_intrin_emu.h"

// ---- what the included code needs from ggml (no library linked) ------------------------------------------------
extern "C" void ggml_abort(const char * file, int line, const char * fmt, ...) {
    printf("FAIL: abort at %s:%d (%s)\n", file, line, fmt);
    exit(3);
}
extern "C" bool ggml_is_contiguous(const struct ggml_tensor *) { return true; }

static uint16_t fp32_to_fp16_normal(float x) { // for the scales of the test data: normal fp16 values, round to nearest even
    uint32_t f; memcpy(&f, &x, 4);
    const uint32_t s = (f >> 16) & 0x8000, e = ((f >> 23) & 0xFF) - 112, m = f & 0x7FFFFF;
    uint32_t h = s | (e << 10) | (m >> 13);
    const uint32_t rest = m & 0x1FFF;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (uint16_t) h;
}

// ---- CUDA types and intrinsics: cuda_intrin_emu.h, and ---------------------------------------------------------
enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
template <typename K> static int cudaFuncSetAttribute(K, int, int) { return 0; }

// ---- shared memory copies -------------------------------------------------------------------------------------
static std::vector<uint4> g_dyn; // the dynamic shared memory of the running block
struct emu_copy { void * dst; const void * src; uint32_t n; };
struct emu_bar { int count = 0, pending = 0; uint32_t phase = 0; int64_t tx = 0; std::vector<emu_copy> copies; };
static std::map<const void *, emu_bar> g_bars;
static int g_nbulk = 0, g_ncp = 0; // copies issued (to show that the paths ran)
static int g_plant = 0;            // the planted bug chosen (tests/test_cuda_stq1_0_bulk_hostemu.py)

static void emu_poison(void * dst, size_t n) { memset(dst, 0xA5, n); }
static void emu_copy_check(void * dst, const void * src, uint32_t n, const char * what) {
    const char * d = (const char *) dst;
    const bool ok = (uintptr_t) dst % 16 == 0 && (uintptr_t) src % 16 == 0 && n % 16 == 0 && n > 0 &&
        d >= (const char *) g_dyn.data() && d + n <= (const char *) (g_dyn.data() + g_dyn.size()) &&
        (emu_in(src, n, 0) || emu_in(src, n, 1));
    if (!ok && g_fail++ < 5) printf("FAIL: %s of %u bytes %p -> %p misaligned or out of bounds\n", what, n, src, dst);
}

static uint4 * bk_dyn_smem() { return g_dyn.data(); }
static void bk_mbar_init(uint64_t * bar, int count) {
    emu_bar b; b.count = count; b.pending = count;
    g_bars[bar] = b;
}
static void bk_fence_mbar_init() {}
static void bk_fence_proxy_async() {}
static void bk_mbar_expect_tx(uint64_t * bar, uint32_t bytes) {
    auto it = g_bars.find(bar);
    if (it == g_bars.end()) { if (g_fail++ < 5) printf("FAIL: arrive on a barrier never initialized\n"); return; }
    it->second.tx += bytes;
    if (--it->second.pending < 0 && g_fail++ < 5) printf("FAIL: more arrivals than the barrier's count\n");
}
static uint64_t bk_policy_evict_first() { return 0x12345678; }
template <bool EF>
static void bk_bulk(void * dst, const void * src, uint32_t bytes, uint64_t * bar, uint64_t pol) {
    if (EF && pol != 0x12345678 && g_fail++ < 5) printf("FAIL: cache policy not made by createpolicy\n");
    emu_copy_check(dst, src, bytes, "cp.async.bulk");
    auto it = g_bars.find(bar);
    if (it == g_bars.end()) { if (g_fail++ < 5) printf("FAIL: bulk copy onto a barrier never initialized\n"); return; }
    emu_poison(dst, bytes);
    it->second.copies.push_back({dst, src, bytes});
    g_nbulk++;
}
static void emu_yield() { // back to the scheduler, still runnable
    g_fib[g_cur].wait = 0;
    emu_ctx_switch(&g_fib[g_cur].sp, g_sched_sp);
}
static void bk_mbar_wait(uint64_t * bar, uint32_t parity) {
    auto it = g_bars.find(bar);
    if (it == g_bars.end()) { if (g_fail++ < 5) printf("FAIL: wait on a barrier never initialized\n"); return; }
    emu_bar & b = it->second;
    if (b.phase != parity) {
        return; // the phase of that parity has completed
    }
    // the phase completes once its arrivals are in and the copies' bytes match the expected ones; until then the
    // waiting fiber yields (another lane may still have to issue), a bounded number of times
    for (int spin = 0;; ++spin) {
        int64_t got = 0;
        for (auto & c : b.copies) got += c.n;
        if (b.pending == 0 && got == b.tx) {
            break;
        }
        if (spin == 1000 || g_fail) { // (after a failure: no more spinning)
            if (g_fail++ < 5) printf("FAIL: wait on a phase that cannot complete (%d arrivals missing, %lld of %lld bytes)\n",
                b.pending, (long long) got, (long long) b.tx);
            return;
        }
        emu_yield();
        if (b.phase != parity) {
            return; // another lane completed it meanwhile
        }
    }
    for (auto & c : b.copies) memcpy(c.dst, c.src, c.n);
    b.copies.clear();
    b.phase ^= 1; b.pending = b.count; b.tx = 0;
}
static void bk_cp16(void * dst, const void * src) {
    emu_copy_check(dst, src, 16, "cp.async");
    emu_poison(dst, 16);
    g_fib[g_cur].open.push_back({dst, src});
    g_ncp++;
}
static void bk_cp_commit() {
    fiber & f = g_fib[g_cur];
    f.groups.push_back(f.open);
    f.open.clear();
}
template <int N>
static void bk_cp_wait() {
    fiber & f = g_fib[g_cur];
    while ((int) f.groups.size() > N) {
        for (auto & c : f.groups.front()) memcpy(c.first, c.second, 16);
        f.groups.erase(f.groups.begin());
    }
}

template <typename F>
static void emu_launch(const dim3 & grid, const dim3 & block, F && f, size_t shmem = 0) {
    g_grid_dim = grid;
    for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
    for (unsigned x = 0; x < grid.x; ++x) {
        g_block_idx = dim3(x, y, z);
        g_dyn.assign((shmem + 15)/16, uint4{0xDEADBEEF, 0xDEADBEEF, 0xDEADBEEF, 0xDEADBEEF});
        g_bars.clear();
        run_block(block, f);
        for (auto & kv : g_bars) {
            if (!kv.second.copies.empty() && g_fail++ < 5) printf("FAIL: %zu bulk copies never waited for\n", kv.second.copies.size());
        }
    }
}

template <typename Kernel, typename... Args>
static void ggml_cuda_kernel_launch(Kernel kernel, const ggml_cuda_kernel_launch_params & p, Args &&... args) {
    emu_launch(p.block_nums, p.block_dims, [&] { kernel(args...); }, p.shmem);
}

#include STQ_RP16_INC
#define BULK_HOSTEMU
#include STQ_BULK_INC
#include "stq1_0_ref.h"

// ---- the checks --------------------------------------------------------------------------------------------------
typedef void (*mv_fn)(const uint4 *, const uint4 *, const float *, float *, int, int, int64_t, cudaStream_t);
typedef void (*id_fn)(const uint4 *, const uint4 *, const float *, float *, int, int, int64_t, cudaStream_t,
                      const stq1_0_rp16_ids_args &, int);

template <int MT, int KS, int RPC, int S, int COPY, bool ACT, int N, bool WL = false>
static void bk_mv(const uint4 * W, const uint4 * A, const float * D, float * y, int nt, int nr, int64_t sd, cudaStream_t st) {
    stq1_0_bulk_launch<MT, KS, RPC, S, COPY, ACT, N, false, WL>(W, A, D, y, nt, nr, sd, st);
}
template <int MT, int KS, int RPC, int S, int COPY, bool ACT, bool WL = false>
static void bk_id(const uint4 * W, const uint4 * A, const float * D, float * y, int nt, int nr, int64_t sd, cudaStream_t st,
        const stq1_0_rp16_ids_args & ida, int ng) {
    stq1_0_bulk_launch<MT, KS, RPC, S, COPY, ACT, 1, true, WL>(W, A, D, y, nt, nr, sd, st, ida, ng);
}
template <int KS, int N>
static void rp_mv(const uint4 * W, const uint4 * A, const float * D, float * y, int nt, int nr, int64_t sd, cudaStream_t st) {
    mul_mat_vec_stq1_0_rp16_launch<N, KS, 1>(W, A, D, y, nt, nr, sd, st);
}
static mv_fn rp16_fn(int ks, int n) {
    static const mv_fn t2[9] = {nullptr, rp_mv<2, 1>, rp_mv<2, 2>, rp_mv<2, 3>, rp_mv<2, 4>, rp_mv<2, 5>, rp_mv<2, 6>, rp_mv<2, 7>, rp_mv<2, 8>};
    static const mv_fn t4[9] = {nullptr, rp_mv<4, 1>, rp_mv<4, 2>, rp_mv<4, 3>, rp_mv<4, 4>, rp_mv<4, 5>, rp_mv<4, 6>, rp_mv<4, 7>, rp_mv<4, 8>};
    static const mv_fn t8[9] = {nullptr, rp_mv<8, 1>, rp_mv<8, 2>, rp_mv<8, 3>, rp_mv<8, 4>, rp_mv<8, 5>, rp_mv<8, 6>, rp_mv<8, 7>, rp_mv<8, 8>};
    return ks == 2 ? t2[n] : ks == 4 ? t4[n] : ks == 8 ? t8[n] : nullptr;
}

struct cand { const char * name; int KS; mv_fn f[9]; id_fn fid; };
#define BK_ALLN(MT, KS, RPC, S, COPY, ACT) { bk_mv<MT, KS, RPC, S, COPY, ACT, 1>, bk_mv<MT, KS, RPC, S, COPY, ACT, 2>, \
    bk_mv<MT, KS, RPC, S, COPY, ACT, 3>, bk_mv<MT, KS, RPC, S, COPY, ACT, 4>, bk_mv<MT, KS, RPC, S, COPY, ACT, 5>, \
    bk_mv<MT, KS, RPC, S, COPY, ACT, 6>, bk_mv<MT, KS, RPC, S, COPY, ACT, 7>, bk_mv<MT, KS, RPC, S, COPY, ACT, 8> }
#define BK_N1(MT, KS, RPC, S, COPY, ACT) { bk_mv<MT, KS, RPC, S, COPY, ACT, 1> }

// the configurations of bulk.cu (and n = 1..8 for a few more: bulk+act MT4 S2 KS2, cpasync MT2 S3 KS4)
static std::vector<cand> cands() {
    std::vector<cand> v;
    auto add = [&](const char * name, int ks, std::initializer_list<mv_fn> fs, id_fn fid) {
        cand c = { name, ks, {}, fid };
        int n = 1;
        for (mv_fn f : fs) c.f[n++] = f;
        v.push_back(c);
    };
    add("bulk MT2 S3 KS4",        4, BK_ALLN(2, 4, 1, 3, BK_BULK, false), nullptr);
    add("bulk MT2 S2 KS4",        4, BK_N1(2, 4, 1, 2, BK_BULK, false), nullptr);
    add("bulk MT4 S2 KS4",        4, BK_N1(4, 4, 1, 2, BK_BULK, false), nullptr);
    add("bulk MT4 S2 KS2",        2, BK_N1(4, 2, 1, 2, BK_BULK, false), nullptr);
    add("bulk MT4 S3 KS2",        2, BK_N1(4, 2, 1, 3, BK_BULK, false), nullptr);
    add("bulk MT2 S4 KS2",        2, BK_N1(2, 2, 1, 4, BK_BULK, false), nullptr);
    add("bulkEF MT4 S2 KS2",      2, BK_N1(4, 2, 1, 2, BK_BULK_EF, false), nullptr);
    add("bulkEF MT2 S3 KS4",      4, BK_N1(2, 4, 1, 3, BK_BULK_EF, false), nullptr);
    add("bulk+act MT4 S2 KS2",    2, BK_ALLN(4, 2, 1, 2, BK_BULK, true), nullptr);
    add("bulk+act MT2 S3 KS4",    4, BK_N1(2, 4, 1, 3, BK_BULK, true), nullptr);
    add("cpasync MT4 S2 KS2",     2, BK_N1(4, 2, 1, 2, BK_CPASYNC, false), nullptr);
    add("cpasync MT2 S3 KS4",     4, BK_ALLN(2, 4, 1, 3, BK_CPASYNC, false), nullptr);
    add("bulk MT2 S3 KS4 WL",     4, { bk_mv<2, 4, 1, 3, BK_BULK, false, 1, true> }, nullptr);
    add("bulk MT4 S2 KS2 WL",     2, { bk_mv<4, 2, 1, 2, BK_BULK, false, 1, true> }, nullptr);
    add("bulk+act MT4 S2 KS2 WL", 2, { bk_mv<4, 2, 1, 2, BK_BULK, true, 1, true> }, nullptr);
    add("bulk MT2 S2 KS8",        8, BK_ALLN(2, 8, 1, 2, BK_BULK, false), nullptr);
    add("bulk+act MT2 S2 KS8",    8, BK_ALLN(2, 8, 1, 2, BK_BULK, true), nullptr);
    add("bulk MT4 S2 KS8",        8, BK_N1(4, 8, 1, 2, BK_BULK, false), nullptr);
    add("bulk MT2 S1 KS14",      14, BK_N1(2, 14, 1, 1, BK_BULK, false), nullptr);
    add("ids bulk MT2 S3 KS2 RPC2",     2, {}, bk_id<2, 2, 2, 3, BK_BULK, false>);
    add("ids bulk MT4 S3 KS2",          2, {}, bk_id<4, 2, 1, 3, BK_BULK, false>);
    add("ids bulk MT2 S2 KS3",          3, {}, bk_id<2, 3, 1, 2, BK_BULK, false>);
    add("ids bulk MT4 S2 KS3",          3, {}, bk_id<4, 3, 1, 2, BK_BULK, false>);
    add("ids bulk MT2 S1 KS6",          6, {}, bk_id<2, 6, 1, 1, BK_BULK, false>);
    add("ids bulk+act MT2 S3 KS2 RPC2", 2, {}, bk_id<2, 2, 2, 3, BK_BULK, true>);
    add("ids cpasync MT2 S3 KS2 RPC2",  2, {}, bk_id<2, 2, 2, 3, BK_CPASYNC, false>);
    add("ids bulk MT2 S3 KS2 RPC2 WL",  2, {}, bk_id<2, 2, 2, 3, BK_BULK, false, true>);
    add("ids bulk MT4 S3 KS2 WL",       2, {}, bk_id<4, 2, 1, 3, BK_BULK, false, true>);
    return v;
}

static std::mt19937 rng(20261202);

static void fill_w(std::vector<uint8_t> & w) {
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> scale(0.001f, 0.01f);
    for (auto & b : w) b = (uint8_t) byte(rng);
    for (size_t i = 0; i < w.size(); i += sizeof(block_stq1_0)) {
        const uint16_t h = fp32_to_fp16_normal((byte(rng) & 1 ? -1.0f : 1.0f)*scale(rng));
        memcpy(&w[i + offsetof(block_stq1_0, d)], &h, 2);
    }
}

// float64 product of GGUF row r with quantized activations q (RP16 order) and their scales d (stq1_0_ref.h)
static void ref_row(const uint8_t * w, int64_t r, int64_t nb, const int8_t * q, const float * d, double & ref, double & sabs) {
    stq1_0_ref_row(w, r, nb, q, d, stq1_0_grid, emu_fp16_to_fp32, ref, sabs);
}

static void quantize(const std::vector<float> & x, int64_t k, int ncol, std::vector<int8_t> & q, std::vector<float> & d) {
    q.assign(k*ncol, 0); d.assign(k/QK_K*ncol, 0.0f);
    g_lo[0] = g_lo[1] = nullptr;
    emu_launch(dim3(k/QK_K, ncol, 1), dim3(32), [&] { stq1_0_rp16_quantize_kernel(x.data(), q.data(), d.data(), k, k, 0); });
}

static int check_2d(const std::vector<cand> & cs, int64_t m, int64_t k, bool quick) {
    const int64_t nb = k/QK_K;
    const int ntiles = k/STQ1_0_RP16_K_ALIGN, nrg = m/STQ1_0_RP16_ROWS;
    std::vector<uint8_t> w(m*nb*sizeof(block_stq1_0)), rp(w.size());
    fill_w(w);
    g_lo[0] = g_lo[1] = nullptr;
    ggml_cuda_stq1_0_rp16_repack(w.data(), rp.data(), m, k, 0);
    const int NX = 8;
    std::vector<float> x(k*NX);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto & v : x) v = nd(rng);
    std::vector<int8_t> q; std::vector<float> d;
    quantize(x, k, NX, q, d);
    std::vector<double> ref(m*NX), sabs(m*NX);
    for (int64_t r = 0; r < m; ++r)
        for (int c = 0; c < NX; ++c) ref_row(w.data(), r, nb, &q[c*k], &d[c*nb], ref[c*m + r], sabs[c*m + r]);

    const uint4 * W = (const uint4 *) rp.data();
    auto run = [&](mv_fn f, const int8_t * qa, const float * da, int n) {
        std::vector<float> y(m*n, NAN);
        g_lo[0] = (const char *) rp.data(); g_hi[0] = g_lo[0] + rp.size();
        g_lo[1] = (const char *) qa; g_hi[1] = g_lo[1] + n*k;
        f(W, (const uint4 *) qa, da, y.data(), ntiles, nrg, m, 0);
        return y;
    };
    int fails = 0;
    for (const cand & c : cs) {
        if (!c.f[1] || c.KS > 2*ntiles) continue;
        const int g0 = g_fail;
        // one-column products
        std::vector<float> one(m*NX);
        for (int col = 0; col < NX; ++col) {
            if (quick && col > 1 && col < NX - 1) continue;
            const std::vector<float> y = run(c.f[1], &q[col*k], &d[col*nb], 1);
            std::copy(y.begin(), y.end(), one.begin() + col*m);
        }
        double worst = 0; int nonfinite = 0, diff = 0, nonid = 0, nbid = 0, nmax = 1;
        for (int n = 1; n <= NX; ++n) {
            if (!c.f[n] || (quick && n > 2 && n < NX)) continue;
            nmax = n;
            const std::vector<float> y = run(c.f[n], q.data(), d.data(), n);
            for (int col = 0; col < n; ++col) {
                const bool have_one = !(quick && col > 1 && col < NX - 1);
                for (int64_t r = 0; r < m; ++r) {
                    const float v = y[col*m + r];
                    if (!std::isfinite(v)) { nonfinite++; continue; }
                    worst = std::max(worst, std::fabs(v - ref[col*m + r])/std::max(sabs[col*m + r], 1e-30));
                }
                if (have_one) diff += memcmp(&y[col*m], &one[col*m], m*4) != 0;
            }
            if (mv_fn fb = rp16_fn(c.KS, n)) {
                const std::vector<float> yb = run(fb, q.data(), d.data(), n);
                nonid += memcmp(y.data(), yb.data(), m*n*4) != 0; nbid++;
            }
        }
        const bool ok = worst <= 1e-5 && nonfinite == 0 && diff == 0 && nonid == 0 && g_fail == g0;
        printf("%s %" PRId64 "x%" PRId64 " %-24s n=1..%d: max |y-ref|/sum|wq| %.1e, non-finite %d, columns differing from "
            "n=1: %d, differing from rp16 KS%d: %d of %d\n", ok ? "ok  " : "FAIL", m, k, c.name, nmax, worst, nonfinite, diff,
            c.KS, nonid, nbid);
        fails += !ok;
    }
    return fails;
}

// E experts of m x k, top-U, T tokens (one activation column per token)
static int check_id(const std::vector<cand> & cs, int64_t m, int64_t k, int64_t E, int64_t U, int64_t T) {
    const int64_t nb = k/QK_K;
    const int ntiles = k/STQ1_0_RP16_K_ALIGN, nrg = m/STQ1_0_RP16_ROWS;
    const size_t es = m*nb*sizeof(block_stq1_0);
    std::vector<uint8_t> w(E*es), rp(w.size());
    fill_w(w);
    g_lo[0] = g_lo[1] = nullptr;
    ggml_cuda_stq1_0_rp16_repack(w.data(), rp.data(), m*E, k, 0);
    std::vector<float> x(k*T);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto & v : x) v = nd(rng);
    std::vector<int8_t> q; std::vector<float> d;
    quantize(x, k, T, q, d);
    const int64_t ids_stride = U + 1; // a padded row stride, as top-k's view gives
    std::vector<int32_t> ids(T*ids_stride, -1);
    for (int64_t t = 0; t < T; ++t) {
        std::vector<int32_t> perm(E);
        for (int64_t e = 0; e < E; ++e) perm[e] = e;
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int64_t u = 0; u < U; ++u) ids[t*ids_stride + u] = perm[u];
    }
    ids[0] = E - 1; // the last expert (a repeated id in a token is harmless here)
    auto ida_of = [&](const int32_t * idp) {
        stq1_0_rp16_ids_args a = {};
        a.ids = idp; a.expert_u4 = (int64_t) (es/16); a.ids_stride = ids_stride; a.stride_tok_dst = m*U; a.n_used = U; a.ne11 = 1;
        return a;
    };
    auto run = [&](id_fn f, int64_t t0, int64_t nt) {
        std::vector<float> y(m*U*nt, NAN);
        g_lo[0] = (const char *) rp.data(); g_hi[0] = g_lo[0] + rp.size();
        g_lo[1] = (const char *) &q[t0*k]; g_hi[1] = g_lo[1] + nt*k;
        f((const uint4 *) rp.data(), (const uint4 *) &q[t0*k], &d[t0*nb], y.data(), ntiles, nrg, m, 0, ida_of(&ids[t0*ids_stride]), U*nt);
        return y;
    };
    const id_fn rp16_id = [](const uint4 * W_, const uint4 * A, const float * D, float * y, int nt, int nr, int64_t sd,
            cudaStream_t st, const stq1_0_rp16_ids_args & a, int ng) {
        mul_mat_vec_stq1_0_rp16_launch<1, STQ1_0_RP16_ID_KS, STQ1_0_RP16_ID_RPC, true>(W_, A, D, y, nt, nr, sd, st, a, ng); };
    int fails = 0;
    for (const cand & c : cs) {
        if (!c.fid || c.KS > 2*ntiles) continue;
        const int g0 = g_fail;
        const std::vector<float> y = run(c.fid, 0, T);
        double worst = 0; int nonfinite = 0, diff = 0;
        for (int64_t t = 0; t < T; ++t)
            for (int64_t u = 0; u < U; ++u)
                for (int64_t r = 0; r < m; ++r) {
                    const float v = y[(t*U + u)*m + r];
                    if (!std::isfinite(v)) { nonfinite++; continue; }
                    double rf, sa;
                    ref_row(w.data() + ids[t*ids_stride + u]*es, r, nb, &q[t*k], &d[t*nb], rf, sa);
                    worst = std::max(worst, std::fabs(v - rf)/std::max(sa, 1e-30));
                }
        for (int64_t t = 0; t < T; ++t) {
            const std::vector<float> y1 = run(c.fid, t, 1);
            for (int64_t u = 0; u < U; ++u) diff += memcmp(&y[(t*U + u)*m], &y1[u*m], m*4) != 0;
        }
        int nonid = -1;
        if (c.KS == STQ1_0_RP16_ID_KS) {
            const std::vector<float> yb = run(rp16_id, 0, T);
            nonid = memcmp(y.data(), yb.data(), y.size()*4) != 0;
        }
        const bool ok = worst <= 1e-5 && nonfinite == 0 && diff == 0 && nonid <= 0 && g_fail == g0;
        printf("%s %" PRId64 "x(%" PRId64 "x%" PRId64 ") top-%" PRId64 " %-28s %" PRId64 " tokens: max |y-ref|/sum|wq| %.1e, "
            "non-finite %d, columns differing from the token alone: %d, differs from rp16 ids: %s\n", ok ? "ok  " : "FAIL",
            E, m, k, U, c.name, T, worst, nonfinite, diff, nonid < 0 ? "n/a" : nonid ? "YES" : "no");
        fails += !ok;
    }
    return fails;
}

int main(int argc, char ** argv) {
    const bool quick = argc > 1 && !strcmp(argv[1], "quick");
    g_plant = argc > 2 ? atoi(argv[2]) : 0;
    const std::vector<cand> cs = cands();
    int fails = 0;
    // rows: 16 x 2, 4, 6, 10 row groups (MT 4: a CUDA block with dead row groups); K tiles 2, 3, 5, 9, 14
    // (K splits with uneven and empty shares; stage rings that wrap)
    // rows: 16 x 2, 4, 6, 10 row groups (MT 4: a CUDA block with dead row groups); K tiles 2, 3, 5, 9, 14
    // (K splits with uneven and empty shares; stage rings that wrap). Then the fibers in reverse order (a lane that
    // reads data another lane copies runs before it; a waiting lane before the one that issues): 96 x 5120 and a
    // small MUL_MAT_ID
    if (!quick) {
        fails += check_2d(cs, 64, 2048, false); // every n = 1..8 and every one-column product
        const int64_t shapes[][2] = { {96, 9216}, {32, 5120}, {160, 3072}, {32, 14336} };
        for (const auto & s : shapes) {
            fails += check_2d(cs, s[0], s[1], true); // n = 1, 2, 8
        }
        fails += check_id(cs, 96, 6144, 5, 3, 3);
    }
    // (quick: only this part, which the planted bugs are run with)
    g_fiber_reverse = true;
    printf("-- fibers in reverse order\n");
    fails += check_2d(cs, 96, 5120, true);
    fails += check_id(cs, 32, 3072, 3, 2, 2);
    g_fiber_reverse = false;
    printf("copies issued: %d bulk, %d cp.async (16 bytes)\n", g_nbulk, g_ncp);
    if (g_fail) printf("FAIL: %d failure(s) in the emulation itself\n", g_fail);
    printf("%s\n", fails || g_fail ? "FAILED" : "OK");
    return fails || g_fail ? 1 : 0;
}
