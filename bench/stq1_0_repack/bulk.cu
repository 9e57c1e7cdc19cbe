// Issue 17, "bulk" micro-benchmark: the RP16 mat-vec of patches 0032/0033 (stq1_0-rp16.cu of the applied tree,
// called through its entry point and its launch templates) against candidate kernels that copy whole 2688-byte RP16
// tiles into shared memory (bulk_kernel.cuh: cp.async.bulk + mbarrier, with or without an L2 evict-first hint and
// with or without the activations in the same stage, or 16-byte cp.async), on the same repacked weights.
//
//   nvcc -std=c++17 -O3 -arch=sm_90 -DGGML_USE_CUDA -I<tree>/ggml/src/ggml-cuda -I<tree>/ggml/src -I<tree>/ggml/include \
//        bulk.cu -o bulk && ./bulk [rounds=15] [name filter]
//
// Cases: 32768x16384 n=1, 4096x14336 n=1..8, 2048x6144 n=1, routed 256 x (2048x6144) top-8 (MUL_MAT_ID, 1 token).
// Checks (before timing; FAIL lines, exit 1): every candidate against a float64 reference computed from the GGUF
// bytes with the kernel's own quantized activations (read back from the GPU), |y - ref| <= 1e-5 sum|w q| per output
// on sampled rows, every output written (NaN-poisoned before each run); columns of n = 1..8 bit-identical to the
// one-column products (batch invariance); bit-identical to the RP16 kernel with the same K split (same arithmetic).
// Routed: 3 tokens against float64, against each token alone, and against the RP16 ids kernel (K split 2).
// Timing: CUDA events around `reps` back-to-back calls, weights rotated over copies of > 256 MB in all (routed: 16
// id sets over the 528 MB stack), variants in alternating order over the rounds (AB/BA), medians; ratio = median
// over rounds of the per-round ratio to the baseline of the same kind (mat-vec alone vs the RP16 mat-vec alone,
// entry = activation quantization + mat-vec vs the RP16 entry point). Every copy and launch on one stream.
#include "stq1_0-rp16.cu"
#include "bulk_kernel.cuh"
#include "stq1_0_ref.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <functional>
#include <string>
#include <vector>

#include "ggml_cuda_stubs.h"

// ---- kernels under test -------------------------------------------------------------------------------------------
typedef void (*mv_fn)(const uint4 *, const uint4 *, const float *, float *, int, int, int64_t, cudaStream_t);
typedef void (*id_fn)(const uint4 *, const uint4 *, const float *, float *, int, int, int64_t, cudaStream_t,
                      const stq1_0_rp16_ids_args &, int);

template <int MT, int KS, int RPC, int S, int COPY, bool ACT, int N, bool WL = false, bool FL = false>
static void bk_mv(const uint4 * W, const uint4 * A, const float * D, float * y, int nt, int nr, int64_t sd, cudaStream_t st) {
    stq1_0_bulk_launch<MT, KS, RPC, S, COPY, ACT, N, false, WL, FL>(W, A, D, y, nt, nr, sd, st);
}
template <int MT, int KS, int RPC, int S, int COPY, bool ACT, bool WL = false, bool FL = false>
static void bk_id(const uint4 * W, const uint4 * A, const float * D, float * y, int nt, int nr, int64_t sd, cudaStream_t st,
        const stq1_0_rp16_ids_args & ida, int ng) {
    stq1_0_bulk_launch<MT, KS, RPC, S, COPY, ACT, 1, true, WL, FL>(W, A, D, y, nt, nr, sd, st, ida, ng);
}
template <int KS, int N>
static void rp_mv(const uint4 * W, const uint4 * A, const float * D, float * y, int nt, int nr, int64_t sd, cudaStream_t st) {
    mul_mat_vec_stq1_0_rp16_launch<N, KS, 1>(W, A, D, y, nt, nr, sd, st);
}

// registers, local memory, shared memory and resident warps per SM of one instantiation
template <int MT, int KS, int RPC, int S, int COPY, bool ACT, int N, bool ID, bool WL, bool FL>
static std::string kinfo() {
    const auto kern = stq1_0_bulk_mv<MT, KS, RPC, S, COPY, ACT, N, ID, WL, FL>;
    constexpr size_t sh = stq1_0_bulk_smem_bytes<MT, KS, RPC, S, COPY, ACT, N>();
    CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) sh));
    cudaFuncAttributes a = {};
    CUDA_CHECK(cudaFuncGetAttributes(&a, kern));
    int nblk = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nblk, kern, 32*KS*RPC, sh));
    char buf[200];
    snprintf(buf, sizeof(buf), "%3d regs, %zu B local, %zu + %zu B shared per block, %2d warps per SM", a.numRegs,
        (size_t) a.localSizeBytes, (size_t) a.sharedSizeBytes, sh, nblk*KS*RPC);
    return buf;
}

struct cand {
    std::string name;
    int KS = 0, MT = 0;
    bool floor = false;  // diagnostic without decode: timed, not checked
    mv_fn f[9] = {};    // f[n]: n columns (nullptr: not built)
    id_fn fid = nullptr; // MUL_MAT_ID
    std::string (*info)() = nullptr;
};

// ALLN: built for n = 1..8 (else n = 1); MV: MUL_MAT; ID: MUL_MAT_ID
template <int MT, int KS, int RPC, int S, int COPY, bool ACT, bool MV, bool ALLN, bool ID, bool WL = false, bool FL = false>
static cand make_cand() {
    cand c;
    static const char * cn[] = {"bulk", "bulkEF", "cpasync"};
    c.name = std::string(cn[COPY]) + (ACT ? "+act" : "") + " MT" + std::to_string(MT) + " S" + std::to_string(S) +
        " KS" + std::to_string(KS) + (RPC > 1 ? " RPC" + std::to_string(RPC) : "") + (WL ? " WL" : "");
    if (FL) c.name = "floor " + c.name;
    c.KS = KS; c.MT = MT; c.floor = FL;
    if constexpr (MV) {
        c.f[1] = bk_mv<MT, KS, RPC, S, COPY, ACT, 1, WL, FL>;
        if constexpr (ALLN) {
            static_assert(!WL && !FL, "WL, floor: n = 1 only");
            c.f[2] = bk_mv<MT, KS, RPC, S, COPY, ACT, 2>; c.f[3] = bk_mv<MT, KS, RPC, S, COPY, ACT, 3>;
            c.f[4] = bk_mv<MT, KS, RPC, S, COPY, ACT, 4>; c.f[5] = bk_mv<MT, KS, RPC, S, COPY, ACT, 5>;
            c.f[6] = bk_mv<MT, KS, RPC, S, COPY, ACT, 6>; c.f[7] = bk_mv<MT, KS, RPC, S, COPY, ACT, 7>;
            c.f[8] = bk_mv<MT, KS, RPC, S, COPY, ACT, 8>;
        }
    }
    if constexpr (ID) {
        c.fid = bk_id<MT, KS, RPC, S, COPY, ACT, WL, FL>;
        c.info = kinfo<MT, KS, RPC, S, COPY, ACT, 1, true, WL, FL>;
    } else {
        c.info = kinfo<MT, KS, RPC, S, COPY, ACT, 1, false, WL, FL>;
    }
    return c;
}

static std::vector<cand> all_cands() {
    std::vector<cand> v;
    // MUL_MAT, K split 4 / 2 (32768 rows: the RP16 kernel's split is 4)
    v.push_back(make_cand<2, 4, 1, 3, BK_BULK,    false, true, true,  false>());
    v.push_back(make_cand<2, 4, 1, 2, BK_BULK,    false, true, false, false>());
    v.push_back(make_cand<4, 4, 1, 2, BK_BULK,    false, true, false, false>());
    v.push_back(make_cand<4, 2, 1, 2, BK_BULK,    false, true, false, false>());
    v.push_back(make_cand<4, 2, 1, 3, BK_BULK,    false, true, false, false>());
    v.push_back(make_cand<2, 2, 1, 4, BK_BULK,    false, true, false, false>());
    v.push_back(make_cand<4, 2, 1, 2, BK_BULK_EF, false, true, false, false>());
    v.push_back(make_cand<2, 4, 1, 3, BK_BULK_EF, false, true, false, false>());
    v.push_back(make_cand<4, 2, 1, 2, BK_BULK,    true,  true, false, false>());
    v.push_back(make_cand<2, 4, 1, 3, BK_BULK,    true,  true, false, false>());
    v.push_back(make_cand<4, 2, 1, 2, BK_CPASYNC, false, true, false, false>());
    v.push_back(make_cand<2, 4, 1, 3, BK_CPASYNC, false, true, false, false>());
    v.push_back(make_cand<2, 4, 1, 3, BK_BULK,    false, true, false, false, true>());
    v.push_back(make_cand<4, 2, 1, 2, BK_BULK,    false, true, false, false, true>());
    v.push_back(make_cand<4, 2, 1, 2, BK_BULK,    true,  true, false, false, true>());
    // diagnostics: the copies alone (no decode), the floor of each pipeline shape
    v.push_back(make_cand<2, 4, 1, 3, BK_BULK,    false, true, false, false, false, true>());
    v.push_back(make_cand<4, 2, 1, 2, BK_BULK,    false, true, false, false, false, true>());
    v.push_back(make_cand<4, 2, 1, 3, BK_BULK,    false, true, false, false, false, true>());
    v.push_back(make_cand<2, 2, 1, 4, BK_BULK,    false, true, false, false, false, true>());
    v.push_back(make_cand<2, 8, 1, 2, BK_BULK,    false, true, false, false, false, true>());
    // MUL_MAT, K split 8 / 14 (4096 and 2048 rows: the RP16 kernel's split is 8); n = 1..8 for the first two
    v.push_back(make_cand<2, 8, 1, 2, BK_BULK,    false, true, true,  false>());
    v.push_back(make_cand<2, 8, 1, 2, BK_BULK,    true,  true, true,  false>());
    v.push_back(make_cand<4, 8, 1, 2, BK_BULK,    false, true, false, false>());
    v.push_back(make_cand<2, 14, 1, 1, BK_BULK,   false, true, false, false>());
    // MUL_MAT_ID (6 K tiles per expert; the RP16 ids kernel: K split 2 x 2 warp pairs)
    v.push_back(make_cand<2, 2, 2, 3, BK_BULK,    false, false, false, true>());
    v.push_back(make_cand<4, 2, 1, 3, BK_BULK,    false, false, false, true>());
    v.push_back(make_cand<2, 3, 1, 2, BK_BULK,    false, false, false, true>());
    v.push_back(make_cand<4, 3, 1, 2, BK_BULK,    false, false, false, true>());
    v.push_back(make_cand<2, 6, 1, 1, BK_BULK,    false, false, false, true>());
    v.push_back(make_cand<2, 2, 2, 3, BK_BULK,    true,  false, false, true>());
    v.push_back(make_cand<2, 2, 2, 3, BK_CPASYNC, false, false, false, true>());
    v.push_back(make_cand<2, 2, 2, 3, BK_BULK,    false, false, false, true, true>());
    v.push_back(make_cand<4, 2, 1, 3, BK_BULK,    false, false, false, true, true>());
    v.push_back(make_cand<2, 2, 2, 3, BK_BULK,    false, false, false, true, false, true>());
    v.push_back(make_cand<4, 2, 1, 3, BK_BULK,    false, false, false, true, false, true>());
    return v;
}

static mv_fn rp16_fn(int ks, int n) { // the RP16 kernel at K split ks (2, 4, 8), n columns
    static const mv_fn t2[9] = {nullptr, rp_mv<2, 1>, rp_mv<2, 2>, rp_mv<2, 3>, rp_mv<2, 4>, rp_mv<2, 5>, rp_mv<2, 6>, rp_mv<2, 7>, rp_mv<2, 8>};
    static const mv_fn t4[9] = {nullptr, rp_mv<4, 1>, rp_mv<4, 2>, rp_mv<4, 3>, rp_mv<4, 4>, rp_mv<4, 5>, rp_mv<4, 6>, rp_mv<4, 7>, rp_mv<4, 8>};
    static const mv_fn t8[9] = {nullptr, rp_mv<8, 1>, rp_mv<8, 2>, rp_mv<8, 3>, rp_mv<8, 4>, rp_mv<8, 5>, rp_mv<8, 6>, rp_mv<8, 7>, rp_mv<8, 8>};
    return ks == 2 ? t2[n] : ks == 4 ? t4[n] : ks == 8 ? t8[n] : nullptr;
}

// ---- host side ----------------------------------------------------------------------------------------------------
static int g_fails = 0;
#define FAILF(...) do { printf("FAIL " __VA_ARGS__); g_fails++; } while (0)

static uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull; x = (x ^ (x >> 30))*0xBF58476D1CE4E5B9ull; x = (x ^ (x >> 27))*0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// random GGUF STQ1_0 bytes with scales +-[0.001, 0.01)
static void fill_w(std::vector<uint8_t> & w, int64_t nblocks, uint64_t seed) {
    for (size_t i = 0; i < w.size(); i += 8) { const uint64_t r = mix64(i + seed); memcpy(&w[i], &r, std::min<size_t>(8, w.size() - i)); }
    for (int64_t b = 0; b < nblocks; ++b) {
        const uint64_t r = mix64(b ^ (seed*0x9E37 + 0xABCDEF));
        const float s = ((r & 1) ? -1.0f : 1.0f)*(0.001f + 0.009f*(float) ((r >> 8) & 0xFFFF)/65536.0f);
        const __half h = __float2half_rn(s); memcpy(&w[b*sizeof(block_stq1_0) + offsetof(block_stq1_0, d)], &h, 2);
    }
}

static uint8_t g_grid[32];

// float64 product of GGUF row r (nb blocks) with quantized activations q (RP16 order, nb*256) and scales d (stq1_0_ref.h)
static float f16_host(uint16_t h) { __half_raw hr; hr.x = h; return __half2float(__half(hr)); }
static void ref_row(const uint8_t * w, int64_t r, int64_t nb, const int8_t * q, const float * d, double & ref, double & sabs) {
    stq1_0_ref_row(w, r, nb, q, d, g_grid, f16_host, ref, sabs);
}

struct gpu {
    ggml_backend_cuda_context * ctx;
    cudaStream_t stream;
    cudaEvent_t e0, e1;
};

static void quantize(gpu & G, const float * x, int8_t * q, float * d, int64_t k, int ncol) {
    ggml_cuda_kernel_launch(stq1_0_rp16_quantize_kernel, ggml_cuda_kernel_launch_params(dim3(k/QK_K, ncol, 1), dim3(32), 0, G.stream),
        x, q, d, k, k, (int64_t) 0);
}

template <typename T>
static std::vector<T> d2h(gpu & G, const T * p, size_t n) {
    std::vector<T> h(n);
    CUDA_CHECK(cudaMemcpyAsync(h.data(), p, n*sizeof(T), cudaMemcpyDeviceToHost, G.stream));
    CUDA_CHECK(cudaStreamSynchronize(G.stream));
    return h;
}

struct variant {
    std::string name;
    std::function<void(int)> f;
    int base = -1; // index of the variant it is compared with (-1: none)
    double bytes = 0;
    std::vector<float> us;
};

static double g_copy_gbs = 0;

static void time_variants(gpu & G, std::vector<variant> & vs, int rounds, int reps) {
    for (auto & v : vs) for (int r = 0; r < 3; ++r) v.f(r); // warm-up (and the shared-memory attributes)
    CUDA_CHECK(cudaStreamSynchronize(G.stream));
    for (int r = 0; r < rounds; ++r) {
        for (size_t j = 0; j < vs.size(); ++j) {
            variant & v = vs[r % 2 ? vs.size() - 1 - j : j];
            CUDA_CHECK(cudaEventRecord(G.e0, G.stream));
            for (int i = 0; i < reps; ++i) v.f(i);
            CUDA_CHECK(cudaEventRecord(G.e1, G.stream));
            CUDA_CHECK(cudaEventSynchronize(G.e1));
            float ms; CUDA_CHECK(cudaEventElapsedTime(&ms, G.e0, G.e1));
            v.us.push_back(1000.0f*ms/reps);
        }
    }
    auto med = [](std::vector<double> a) { std::sort(a.begin(), a.end()); return a[a.size()/2]; };
    printf("  %-34s %9s %7s %7s %8s\n", "variant", "us", "GB/s", "% copy", "x base");
    for (auto & v : vs) {
        const double m = med(std::vector<double>(v.us.begin(), v.us.end()));
        const double gbs = v.bytes/(m*1e3);
        char rb[32] = "";
        if (v.base >= 0) {
            std::vector<double> rr;
            for (int r = 0; r < rounds; ++r) rr.push_back((double) v.us[r]/vs[v.base].us[r]);
            snprintf(rb, sizeof(rb), "%.3f", med(rr));
        }
        printf("  %-34s %9.2f %7.0f %6.1f%% %8s\n", v.name.c_str(), m, gbs, 100.0*gbs/g_copy_gbs, rb);
    }
    fflush(stdout);
}

static bool keep(const cand & c, const char * filter) {
    return !filter || c.name.find(filter) != std::string::npos;
}

// ---- MUL_MAT --------------------------------------------------------------------------------------------------------
static void run_2d(gpu & G, const std::vector<cand> & cands, const char * filter, int64_t m, int64_t k, int nmax,
        int rounds, int reps) {
    const int64_t nb = k/QK_K;
    const int ntiles = k/STQ1_0_RP16_K_ALIGN, nrg = m/STQ1_0_RP16_ROWS;
    const size_t wbytes = m*nb*sizeof(block_stq1_0);
    const int copies = (int) ((256ull << 20)/wbytes + 1);
    const int ksb = stq1_0_rp16_ks(nrg, ntiles);
    printf("\n== %lldx%lld n=1..%d: %d copies of %.2f MB (%.0f MB), RP16 K split %d\n", (long long) m, (long long) k, nmax,
        copies, wbytes/1e6, copies*wbytes/1e6, ksb);
    std::vector<uint8_t> w(wbytes);
    fill_w(w, m*nb, 77*m + k);
    void * graw; CUDA_CHECK(cudaMalloc(&graw, wbytes));
    CUDA_CHECK(cudaMemcpyAsync(graw, w.data(), wbytes, cudaMemcpyHostToDevice, G.stream));
    std::vector<void *> wp(copies);
    for (int c = 0; c < copies; ++c) {
        CUDA_CHECK(cudaMalloc(&wp[c], wbytes));
        ggml_cuda_stq1_0_rp16_repack(graw, wp[c], m, k, G.stream);
    }
    CUDA_CHECK(cudaStreamSynchronize(G.stream));
    CUDA_CHECK(cudaFree(graw));

    const int NX = 8;
    std::vector<float> x(k*NX);
    for (int64_t i = 0; i < k*NX; ++i) x[i] = (float) ((double) (mix64(i*31 + k) >> 11)/9007199254740992.0*2.0 - 1.0);
    float * gx; CUDA_CHECK(cudaMalloc(&gx, x.size()*4));
    CUDA_CHECK(cudaMemcpyAsync(gx, x.data(), x.size()*4, cudaMemcpyHostToDevice, G.stream));
    float * gy; CUDA_CHECK(cudaMalloc(&gy, m*NX*4));
    float * gy1; CUDA_CHECK(cudaMalloc(&gy1, m*NX*4));
    int8_t * gq; CUDA_CHECK(cudaMalloc(&gq, k*NX));
    float * gd; CUDA_CHECK(cudaMalloc(&gd, nb*NX*4));
    quantize(G, gx, gq, gd, k, NX);
    const std::vector<int8_t> hq = d2h(G, gq, k*NX);
    const std::vector<float>  hd = d2h(G, gd, nb*NX);
    const uint4 * Aq = (const uint4 *) gq;

    // float64 reference on sampled rows (and the last 64), every column
    std::vector<int64_t> rows;
    const int64_t step = m > 4096 ? 61 : 7;
    for (int64_t r = 0; r < m; ++r) if (r % step == 0 || r >= m - 64) rows.push_back(r);
    std::vector<double> ref(rows.size()*NX), sabs(rows.size()*NX);
    for (size_t ri = 0; ri < rows.size(); ++ri)
        for (int c = 0; c < NX; ++c) ref_row(w.data(), rows[ri], nb, &hq[c*k], &hd[c*nb], ref[ri*NX + c], sabs[ri*NX + c]);

    // y (m x n) against the reference; returns the worst |y - ref|/sabs, counts non-finite outputs
    auto check_ref = [&](const std::vector<float> & y, int n, int & nonfinite) {
        double worst = 0; nonfinite = 0;
        for (int64_t i = 0; i < m*n; ++i) nonfinite += !std::isfinite(y[i]);
        for (int c = 0; c < n; ++c)
            for (size_t ri = 0; ri < rows.size(); ++ri)
                worst = std::max(worst, std::fabs(y[c*m + rows[ri]] - ref[ri*NX + c])/std::max(sabs[ri*NX + c], 1e-30));
        return worst;
    };
    auto run_to_host = [&](mv_fn f, int n, float * dst) {
        CUDA_CHECK(cudaMemsetAsync(dst, 0xFF, m*NX*4, G.stream));
        f((const uint4 *) wp[0], Aq, gd, dst, ntiles, nrg, m, G.stream);
        return d2h(G, dst, m*n);
    };
    // one-column products of every column
    auto one_col = [&](mv_fn f1) {
        CUDA_CHECK(cudaMemsetAsync(gy1, 0xFF, m*NX*4, G.stream));
        for (int c = 0; c < NX; ++c) f1((const uint4 *) wp[0], Aq + c*k/16, gd + c*nb, gy1 + c*m, ntiles, nrg, m, G.stream);
        return d2h(G, gy1, m*NX);
    };

    // the RP16 kernel (its own split): the reference and the harness checked on it
    {
        const std::vector<float> one = one_col(rp16_fn(ksb, 1));
        int nf; double worst = check_ref(one, NX, nf);
        int diff = 0;
        for (int n = 2; n <= nmax; ++n) {
            const std::vector<float> y = run_to_host(rp16_fn(ksb, n), n, gy);
            int nf2; worst = std::max(worst, check_ref(y, n, nf2)); nf += nf2;
            for (int c = 0; c < n; ++c) diff += memcmp(&y[c*m], &one[c*m], m*4) != 0;
        }
        const bool ok = worst <= 1e-5 && nf == 0 && diff == 0;
        if (!ok) FAILF("%lldx%lld rp16 KS%d: ", (long long) m, (long long) k, ksb);
        printf("%s rp16 KS%d (baseline): max |y-ref|/sum|wq| %.1e, non-finite %d, columns differing from n=1: %d\n",
            ok ? "ok  " : "", ksb, worst, nf, diff);
    }
    std::vector<const cand *> use;
    for (const cand & c : cands) {
        if (!c.f[1] || !keep(c, filter) || c.KS > 2*ntiles) continue;
        use.push_back(&c);
    }
    for (const cand * cp : use) {
        const cand & c = *cp;
        if (c.floor) continue; // diagnostic: wrong results by design
        const std::vector<float> one = one_col(c.f[1]);
        int nf; double worst = check_ref(one, NX, nf);
        int diff = 0, nonid = 0, nbid = 0;
        for (int n = 1; n <= nmax; ++n) {
            if (!c.f[n]) continue;
            const std::vector<float> y = run_to_host(c.f[n], n, gy);
            int nf2; worst = std::max(worst, check_ref(y, n, nf2)); nf += nf2;
            for (int col = 0; col < n; ++col) diff += memcmp(&y[col*m], &one[col*m], m*4) != 0;
            if (rp16_fn(c.KS, n)) {
                const std::vector<float> yb = run_to_host(rp16_fn(c.KS, n), n, gy);
                nonid += memcmp(y.data(), yb.data(), m*n*4) != 0; nbid++;
            }
        }
        const bool ok = worst <= 1e-5 && nf == 0 && diff == 0 && nonid == 0;
        if (!ok) FAILF("%lldx%lld %s: ", (long long) m, (long long) k, c.name.c_str());
        char bid[64] = "n/a (no RP16 kernel with that K split)";
        if (nbid) snprintf(bid, sizeof(bid), "%s (%d column counts)", nonid ? "NO" : "yes", nbid);
        printf("%s %s: n=1..%d, max |y-ref|/sum|wq| %.1e, non-finite %d, columns differing from n=1: %d, bit-identical to rp16 KS%d: %s\n",
            ok ? "ok  " : "", c.name.c_str(), c.f[nmax] ? nmax : 1, worst, nf, diff, c.KS, bid);
    }
    fflush(stdout);

    // timing
    for (int n = 1; n <= nmax; ++n) {
        std::vector<variant> vs;
        const double bytes = (double) wbytes;
        vs.push_back({"rp16 entry (quantize + KS" + std::to_string(ksb) + ")", [&, n](int i) {
            ggml_tensor t0; memset(&t0, 0, sizeof(t0));
            t0.type = GGML_TYPE_STQ1_0; t0.ne[0] = k; t0.ne[1] = m; t0.ne[2] = t0.ne[3] = 1;
            t0.nb[0] = sizeof(block_stq1_0); t0.nb[1] = nb*sizeof(block_stq1_0); t0.nb[2] = t0.nb[3] = t0.nb[1]*m;
            t0.data = wp[i % copies];
            ggml_tensor t1 = t0; t1.type = GGML_TYPE_F32; t1.ne[1] = n; t1.nb[0] = 4; t1.nb[1] = k*4;
            t1.nb[2] = t1.nb[3] = k*4*n; t1.data = gx;
            ggml_tensor td = t1; td.ne[0] = m; td.nb[1] = m*4; td.nb[2] = td.nb[3] = m*4*n; td.data = gy;
            ggml_cuda_mul_mat_vec_stq1_0_rp16(*G.ctx, &t0, &t1, nullptr, &td);
        }, -1, bytes, {}});
        const int ie = 0;
        vs.push_back({"rp16 mat-vec KS" + std::to_string(ksb), [&, n](int i) {
            rp16_fn(ksb, n)((const uint4 *) wp[i % copies], Aq, gd, gy, ntiles, nrg, m, G.stream); }, -1, bytes, {}});
        const int im = 1;
        for (const cand * cp : use) {
            if (!cp->f[n]) continue;
            mv_fn f = cp->f[n];
            vs.push_back({cp->name, [&, f](int i) { f((const uint4 *) wp[i % copies], Aq, gd, gy, ntiles, nrg, m, G.stream); },
                im, bytes, {}});
            if (cp->floor) continue;
            vs.push_back({cp->name + " entry", [&, f, n](int i) {
                quantize(G, gx, gq, gd, k, n);
                f((const uint4 *) wp[i % copies], Aq, gd, gy, ntiles, nrg, m, G.stream); }, ie, bytes, {}});
        }
        printf("-- %lldx%lld n=%d (GB/s: weight bytes per call; x base: mat-vec vs rp16 mat-vec, entry vs rp16 entry)\n",
            (long long) m, (long long) k, n);
        time_variants(G, vs, rounds, reps);
    }
    for (void * p : wp) CUDA_CHECK(cudaFree(p));
    CUDA_CHECK(cudaFree(gx)); CUDA_CHECK(cudaFree(gy)); CUDA_CHECK(cudaFree(gy1)); CUDA_CHECK(cudaFree(gq)); CUDA_CHECK(cudaFree(gd));
}

// ---- MUL_MAT_ID: 256 experts of m x k, top-8 -------------------------------------------------------------------------
static void run_routed(gpu & G, const std::vector<cand> & cands, const char * filter, int rounds, int reps) {
    const int64_t m = 2048, k = 6144, E = 256, U = 8, nb = k/QK_K, NSET = 16, NT = 3;
    const int ntiles = k/STQ1_0_RP16_K_ALIGN, nrg = m/STQ1_0_RP16_ROWS;
    const size_t es = m*nb*sizeof(block_stq1_0), wbytes = E*es;
    printf("\n== routed %lld x (%lldx%lld) top-%lld: stack %.0f MB, %lld id sets, RP16 ids kernel K split %d x %d warp pairs\n",
        (long long) E, (long long) m, (long long) k, (long long) U, wbytes/1e6, (long long) NSET, STQ1_0_RP16_ID_KS, STQ1_0_RP16_ID_RPC);
    std::vector<uint8_t> w(wbytes);
    fill_w(w, E*m*nb, 991);
    void * graw; CUDA_CHECK(cudaMalloc(&graw, wbytes));
    void * wrp;  CUDA_CHECK(cudaMalloc(&wrp, wbytes));
    CUDA_CHECK(cudaMemcpyAsync(graw, w.data(), wbytes, cudaMemcpyHostToDevice, G.stream));
    ggml_cuda_stq1_0_rp16_repack(graw, wrp, m*E, k, G.stream);
    CUDA_CHECK(cudaStreamSynchronize(G.stream));
    CUDA_CHECK(cudaFree(graw));

    std::vector<int32_t> ids(NSET*NT*U); // NSET x NT tokens x U distinct experts
    for (int64_t s = 0; s < NSET*NT; ++s) {
        std::vector<int32_t> perm(E);
        for (int64_t e = 0; e < E; ++e) perm[e] = e;
        for (int64_t e = E - 1; e > 0; --e) std::swap(perm[e], perm[mix64(977*s + e) % (e + 1)]);
        std::copy(perm.begin(), perm.begin() + U, ids.begin() + s*U);
    }
    ids[0] = E - 1; // the last expert once
    if (std::find(ids.begin() + 1, ids.begin() + U, E - 1) != ids.begin() + U) ids[0] = E - 2;
    int32_t * gids; CUDA_CHECK(cudaMalloc(&gids, ids.size()*4));
    CUDA_CHECK(cudaMemcpyAsync(gids, ids.data(), ids.size()*4, cudaMemcpyHostToDevice, G.stream));
    std::vector<float> x(k*NT);
    for (int64_t i = 0; i < k*NT; ++i) x[i] = (float) ((double) (mix64(i*17 + 5) >> 11)/9007199254740992.0*2.0 - 1.0);
    float * gx; CUDA_CHECK(cudaMalloc(&gx, x.size()*4));
    CUDA_CHECK(cudaMemcpyAsync(gx, x.data(), x.size()*4, cudaMemcpyHostToDevice, G.stream));
    float * gy; CUDA_CHECK(cudaMalloc(&gy, m*U*NT*4));
    int8_t * gq; CUDA_CHECK(cudaMalloc(&gq, k*NT));
    float * gd; CUDA_CHECK(cudaMalloc(&gd, nb*NT*4));
    quantize(G, gx, gq, gd, k, NT);
    const std::vector<int8_t> hq = d2h(G, gq, k*NT);
    const std::vector<float>  hd = d2h(G, gd, nb*NT);
    const uint4 * W = (const uint4 *) wrp;
    const uint4 * Aq = (const uint4 *) gq;

    // (token, slot) -> reference of sampled rows
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < m; ++r) if (r % 29 == 0 || r >= m - 64) rows.push_back(r);
    std::vector<double> ref(NT*U*rows.size()), sabs(NT*U*rows.size());
    for (int64_t t = 0; t < NT; ++t)
        for (int64_t u = 0; u < U; ++u)
            for (size_t ri = 0; ri < rows.size(); ++ri)
                ref_row(w.data() + ids[t*U + u]*es, rows[ri], nb, &hq[t*k], &hd[t*nb], ref[(t*U + u)*rows.size() + ri],
                    sabs[(t*U + u)*rows.size() + ri]);

    auto ida_of = [&](const int32_t * idp) {
        stq1_0_rp16_ids_args a = {};
        a.ids = idp; a.expert_u4 = (int64_t) (es/16); a.ids_stride = U; a.stride_tok_dst = m*U; a.n_used = U; a.ne11 = 1;
        return a;
    };
    // tokens tok0 .. tok0 + nt - 1 of id set 0 through kernel f
    auto run_ids = [&](id_fn f, int64_t tok0, int64_t nt) {
        CUDA_CHECK(cudaMemsetAsync(gy, 0xFF, m*U*NT*4, G.stream));
        f(W, Aq + tok0*k/16, gd + tok0*nb, gy, ntiles, nrg, m, G.stream, ida_of(gids + tok0*U), U*nt);
        return d2h(G, gy, m*U*nt);
    };
    auto check = [&](const std::string & name, id_fn f, id_fn fb) {
        const std::vector<float> y = run_ids(f, 0, NT);
        double worst = 0; int nf = 0, diff = 0;
        for (size_t i = 0; i < y.size(); ++i) nf += !std::isfinite(y[i]);
        for (int64_t tu = 0; tu < NT*U; ++tu)
            for (size_t ri = 0; ri < rows.size(); ++ri)
                worst = std::max(worst, std::fabs(y[tu*m + rows[ri]] - ref[tu*rows.size() + ri])/std::max(sabs[tu*rows.size() + ri], 1e-30));
        for (int64_t t = 0; t < NT; ++t) {
            const std::vector<float> y1 = run_ids(f, t, 1);
            for (int64_t u = 0; u < U; ++u) diff += memcmp(&y[(t*U + u)*m], &y1[u*m], m*4) != 0;
        }
        int nonid = -1;
        if (fb) {
            const std::vector<float> yb = run_ids(fb, 0, NT);
            nonid = memcmp(y.data(), yb.data(), y.size()*4) != 0;
        }
        const bool ok = worst <= 1e-5 && nf == 0 && diff == 0 && nonid <= 0;
        if (!ok) FAILF("routed %s: ", name.c_str());
        printf("%s %s: %lld tokens, max |y-ref|/sum|wq| %.1e, non-finite %d, columns differing from their token alone: %d, "
            "bit-identical to rp16 ids KS2: %s\n", ok ? "ok  " : "", name.c_str(), (long long) NT, worst, nf, diff,
            nonid < 0 ? "n/a" : nonid ? "NO" : "yes");
    };
    const id_fn rp16_id = [](const uint4 * W_, const uint4 * A, const float * D, float * y, int nt, int nr, int64_t sd,
            cudaStream_t st, const stq1_0_rp16_ids_args & a, int ng) {
        mul_mat_vec_stq1_0_rp16_launch<1, STQ1_0_RP16_ID_KS, STQ1_0_RP16_ID_RPC, true>(W_, A, D, y, nt, nr, sd, st, a, ng); };
    check("rp16 ids (baseline)", rp16_id, nullptr);
    std::vector<const cand *> use;
    for (const cand & c : cands) if (c.fid && keep(c, filter) && c.KS <= 2*ntiles) use.push_back(&c);
    for (const cand * c : use) if (!c->floor) check(c->name, c->fid, c->KS == STQ1_0_RP16_ID_KS ? rp16_id : nullptr);
    fflush(stdout);

    // timing, 1 token, id sets rotated (set s: ids of token 0 of set s)
    ggml_tensor t0; memset(&t0, 0, sizeof(t0));
    t0.type = GGML_TYPE_STQ1_0; t0.ne[0] = k; t0.ne[1] = m; t0.ne[2] = E; t0.ne[3] = 1;
    t0.nb[0] = sizeof(block_stq1_0); t0.nb[1] = nb*sizeof(block_stq1_0); t0.nb[2] = t0.nb[1]*m; t0.nb[3] = t0.nb[2]*E;
    t0.data = wrp;
    std::vector<variant> vs;
    const double bytes = (double) U*es;
    vs.push_back({"rp16 entry (quantize + ids)", [&](int i) {
        ggml_tensor t1; memset(&t1, 0, sizeof(t1));
        t1.type = GGML_TYPE_F32; t1.ne[0] = k; t1.ne[1] = 1; t1.ne[2] = 1; t1.ne[3] = 1;
        t1.nb[0] = 4; t1.nb[1] = k*4; t1.nb[2] = t1.nb[3] = k*4; t1.data = gx;
        ggml_tensor ti = t1; ti.type = GGML_TYPE_I32; ti.ne[0] = U; ti.nb[1] = U*4; ti.nb[2] = ti.nb[3] = U*4;
        ti.data = gids + (i % NSET)*NT*U;
        ggml_tensor td = t1; td.ne[0] = m; td.ne[1] = U; td.nb[1] = m*4; td.nb[2] = td.nb[3] = m*U*4; td.data = gy;
        ggml_cuda_mul_mat_vec_stq1_0_rp16(*G.ctx, &t0, &t1, &ti, &td);
    }, -1, bytes, {}});
    vs.push_back({"rp16 ids KS2 RPC2", [&](int i) {
        rp16_id(W, Aq, gd, gy, ntiles, nrg, m, G.stream, ida_of(gids + (i % NSET)*NT*U), U); }, -1, bytes, {}});
    for (const cand * c : use) {
        id_fn f = c->fid;
        vs.push_back({c->name, [&, f](int i) { f(W, Aq, gd, gy, ntiles, nrg, m, G.stream, ida_of(gids + (i % NSET)*NT*U), U); },
            1, bytes, {}});
        if (c->floor) continue;
        vs.push_back({c->name + " entry", [&, f](int i) {
            quantize(G, gx, gq, gd, k, 1);
            f(W, Aq, gd, gy, ntiles, nrg, m, G.stream, ida_of(gids + (i % NSET)*NT*U), U); }, 0, bytes, {}});
    }
    printf("-- routed top-8, 1 token (GB/s: the 8 experts' bytes per call)\n");
    time_variants(G, vs, rounds, reps);
    CUDA_CHECK(cudaFree(wrp)); CUDA_CHECK(cudaFree(gids)); CUDA_CHECK(cudaFree(gx)); CUDA_CHECK(cudaFree(gy));
    CUDA_CHECK(cudaFree(gq)); CUDA_CHECK(cudaFree(gd));
}

int main(int argc, char ** argv) {
    const int rounds = argc > 1 ? atoi(argv[1]) : 15;
    const char * filter = argc > 2 ? argv[2] : nullptr;
    const int reps = 30;
    CUDA_CHECK(cudaMemcpyFromSymbol(g_grid, stq1_0_grid, 32));
    gpu G;
    G.ctx = new ggml_backend_cuda_context(0);
    G.stream = G.ctx->stream();
    CUDA_CHECK(cudaEventCreate(&G.e0)); CUDA_CHECK(cudaEventCreate(&G.e1));
    cudaDeviceProp prop; CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, %zu KB shared memory per SM (%zu per block opt-in), L2 %d MB; rounds %d x %d calls\n",
        prop.name, prop.multiProcessorCount, prop.sharedMemPerMultiprocessor/1024, prop.sharedMemPerBlockOptin/1024,
        prop.l2CacheSize >> 20, rounds, reps);

    // device-to-device copy bandwidth (read + write), 1 GiB, median of 7
    {
        const size_t n = 1ull << 30;
        void * a; void * b; CUDA_CHECK(cudaMalloc(&a, n)); CUDA_CHECK(cudaMalloc(&b, n));
        CUDA_CHECK(cudaMemsetAsync(a, 1, n, G.stream));
        std::vector<float> ms;
        for (int r = 0; r < 8; ++r) {
            CUDA_CHECK(cudaEventRecord(G.e0, G.stream));
            CUDA_CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, G.stream));
            CUDA_CHECK(cudaEventRecord(G.e1, G.stream));
            CUDA_CHECK(cudaEventSynchronize(G.e1));
            float t; CUDA_CHECK(cudaEventElapsedTime(&t, G.e0, G.e1));
            if (r) ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        g_copy_gbs = 2.0*n/(ms[ms.size()/2]*1e6);
        printf("copy: cudaMemcpyAsync D2D 1 GiB: %.0f GB/s (read + write)\n", g_copy_gbs);
        CUDA_CHECK(cudaFree(a)); CUDA_CHECK(cudaFree(b));
    }

    const std::vector<cand> cands = all_cands();
    for (const cand & c : cands) {
        if (keep(c, filter)) printf("kernel %-26s %s: %s\n", c.name.c_str(), c.fid ? "ids" : "n=1", c.info().c_str());
    }
    run_2d(G, cands, filter, 32768, 16384, 1, rounds, reps);
    run_2d(G, cands, filter, 4096, 14336, 8, rounds, reps);
    run_2d(G, cands, filter, 2048, 6144, 1, rounds, reps);
    run_routed(G, cands, filter, rounds, reps);
    printf("\n%s: %d failure(s)\n", g_fails ? "FAILED" : "PASSED", g_fails);
    return g_fails ? 1 : 0;
}
