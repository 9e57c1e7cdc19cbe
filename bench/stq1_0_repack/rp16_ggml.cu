// The RP16 mat-vec of patch 0032 (ggml/src/ggml-cuda/stq1_0-rp16.cu, compiled in from the applied tree and called
// through its own host entry point: activation quantization + mat-vec, programmatic dependent launch) on the GPU
// without building all of ggml-cuda: correctness against a float64 reference from the GGUF bytes, batch invariance,
// and timings of the K-split variants (KS warps per 32 rows) per shape; then MUL_MAT_ID (patch 0033) on Hy4's routed
// experts (256 of 2048 x 6144, top-8): correctness, batch invariance over 1..3 tokens, and the ids kernel's K splits.
//
//   nvcc -std=c++17 -O3 -arch=sm_90 -DGGML_USE_CUDA -I<tree>/ggml/src/ggml-cuda -I<tree>/ggml/src -I<tree>/ggml/include \
//        rp16_ggml.cu -o rp16_ggml -lcublas && ./rp16_ggml [rounds]
//
// Timing: CUDA events around 30 back-to-back calls (weights rotated over copies that exceed the 60 MB L2), variants
// in alternating order over the rounds (AB/BA), medians. Exit 1 on any failed check.
#include "stq1_0-rp16.cu"
#include "mmv-stq1_0.cu" // the series' GGUF-layout kernel (patch 0031), launched directly as the baseline

#include <algorithm>
#include <cstdarg>
#include <functional>
#include <string>
#include <vector>

// ---- what stq1_0-rp16.cu needs from the rest of ggml: ggml_cuda_stubs.h, and (for mmv-stq1_0.cu) ---------------
#include "ggml_cuda_stubs.h"
#include "stq1_0_ref.h"
extern "C" size_t ggml_type_size(enum ggml_type) { abort(); }
void quantize_mmq_q8_1_cuda(const float *, const int32_t *, void *, ggml_type, int64_t, int64_t, int64_t, int64_t,
                            int64_t, int64_t, int64_t, int64_t, cudaStream_t) { abort(); }

// ---- driver -------------------------------------------------------------------------------------------------------
typedef void (*launch_fn)(const uint4 *, const uint4 *, const float *, float *, int, int, int64_t, cudaStream_t);

static uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull; x = (x ^ (x >> 30))*0xBF58476D1CE4E5B9ull; x = (x ^ (x >> 27))*0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static ggml_tensor make_tensor(ggml_type type, int64_t ne0, int64_t ne1, size_t ts, void * data) {
    ggml_tensor t; memset(&t, 0, sizeof(t));
    t.type = type; t.ne[0] = ne0; t.ne[1] = ne1; t.ne[2] = t.ne[3] = 1;
    t.nb[0] = ts; t.nb[1] = type == GGML_TYPE_STQ1_0 ? (ne0/QK_K)*sizeof(block_stq1_0) : ne0*ts;
    t.nb[2] = t.nb[3] = t.nb[1]*ne1; t.data = data;
    snprintf(t.name, sizeof(t.name), "%s", type == GGML_TYPE_STQ1_0 ? "w" : "x");
    return t;
}

// float64 dot of row r of GGUF STQ1_0 weights (nb blocks per row) with x
static double ref_dot(const uint8_t * w, int64_t r, int64_t nb, const uint8_t grid[32], const float * x) {
    double acc = 0.0;
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t * blk = w + (r*nb + b)*sizeof(block_stq1_0);
        __half_raw hr; memcpy(&hr.x, blk + 40, 2); const double d = __half2float(__half(hr));
        for (int G = 0; G < 64; ++G) {
            for (int p = 0; p < 4; ++p) {
                const int v = stq1_0_ref_w(blk, grid, G, p);
                if (v) acc += d*v*x[b*QK_K + (G/16)*64 + G % 16 + 16*p];
            }
        }
    }
    return acc;
}

// MUL_MAT_ID through the entry point (patch 0033) on 256 experts of m x k, top-8: NMSE against float64 (sampled
// rows), every column of 3 tokens bit-identical to its token alone, then the time per call of the entry (quantize +
// ids kernel) and of the ids kernel alone per K split x warp pairs per CUDA block, 16 id sets rotated
static int run_routed(ggml_backend_cuda_context * ctx, cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1,
        const uint8_t grid[32], const int rounds, const int reps) {
    const int64_t m = 2048, k = 6144, E = 256, U = 8, nb = k/QK_K, NSET = 16, NT = 3;
    const size_t es = m*nb*sizeof(block_stq1_0), wbytes = E*es;
    int fails = 0;
    printf("== routed %lld x (%lldx%lld) top-%lld: %.0f MB, %lld id sets\n", (long long) E, (long long) m, (long long) k,
        (long long) U, wbytes/1e6, (long long) NSET);
    std::vector<uint8_t> w(wbytes);
    for (size_t i = 0; i < wbytes; i += 8) { const uint64_t r = mix64(i + 991); memcpy(&w[i], &r, std::min<size_t>(8, wbytes - i)); }
    for (int64_t b = 0; b < E*m*nb; ++b) {
        const uint64_t r = mix64(b ^ 0x5EED);
        const float s = ((r & 1) ? -1.0f : 1.0f)*(0.001f + 0.009f*(float) ((r >> 8) & 0xFFFF)/65536.0f);
        const __half h = __float2half_rn(s); memcpy(&w[b*sizeof(block_stq1_0) + 40], &h, 2);
    }
    void * graw; CUDA_CHECK(cudaMalloc(&graw, wbytes));
    void * wrp;  CUDA_CHECK(cudaMalloc(&wrp, wbytes));
    CUDA_CHECK(cudaMemcpy(graw, w.data(), wbytes, cudaMemcpyHostToDevice));
    ggml_cuda_stq1_0_rp16_repack(graw, wrp, m*E, k, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaFree(graw));

    // id sets: NSET x NT tokens x U distinct experts
    std::vector<int32_t> ids(NSET*NT*U);
    for (int64_t s = 0; s < NSET*NT; ++s) {
        std::vector<int32_t> perm(E);
        for (int64_t e = 0; e < E; ++e) perm[e] = e;
        for (int64_t e = E - 1; e > 0; --e) std::swap(perm[e], perm[mix64(977*s + e) % (e + 1)]);
        std::copy(perm.begin(), perm.begin() + U, ids.begin() + s*U);
    }
    int32_t * gids; CUDA_CHECK(cudaMalloc(&gids, ids.size()*4));
    CUDA_CHECK(cudaMemcpy(gids, ids.data(), ids.size()*4, cudaMemcpyHostToDevice));
    std::vector<float> x(k*NT);
    for (int64_t i = 0; i < k*NT; ++i) x[i] = (float) ((double) (mix64(i*17 + 5) >> 11)/9007199254740992.0*2.0 - 1.0);
    float * gx; CUDA_CHECK(cudaMalloc(&gx, x.size()*4)); CUDA_CHECK(cudaMemcpy(gx, x.data(), x.size()*4, cudaMemcpyHostToDevice));
    float * gy; CUDA_CHECK(cudaMalloc(&gy, m*U*NT*4));

    ggml_tensor t0 = make_tensor(GGML_TYPE_STQ1_0, k, m, sizeof(block_stq1_0), wrp);
    t0.ne[2] = E; t0.nb[3] = t0.nb[2]*E;
    // tokens t0 .. t0 + n - 1 of id set s (gate/up: one activation column per token)
    auto run = [&](int64_t s, int64_t tok0, int64_t n, float * y) {
        ggml_tensor t1 = make_tensor(GGML_TYPE_F32, k, 1, 4, gx + tok0*k);
        t1.ne[2] = n; t1.nb[3] = t1.nb[2]*n;
        ggml_tensor ti = make_tensor(GGML_TYPE_I32, U, n, 4, gids + (s*NT + tok0)*U);
        ti.nb[1] = U*4; ti.nb[2] = ti.nb[3] = ti.nb[1]*n;
        ggml_tensor td = make_tensor(GGML_TYPE_F32, m, U, 4, y);
        td.ne[2] = n; td.nb[3] = td.nb[2]*n;
        ggml_cuda_mul_mat_vec_stq1_0_rp16(*ctx, &t0, &t1, &ti, &td);
    };

    // correctness: 3 tokens of set 0 against float64 and against each token alone
    {
        CUDA_CHECK(cudaMemset(gy, 0xFF, m*U*NT*4));
        run(0, 0, NT, gy);
        CUDA_CHECK(cudaStreamSynchronize(stream));
        std::vector<float> y(m*U*NT), y1(m*U);
        CUDA_CHECK(cudaMemcpy(y.data(), gy, y.size()*4, cudaMemcpyDeviceToHost));
        double e2 = 0, r2 = 0; int diff = 0;
        for (int64_t t = 0; t < NT; ++t) {
            run(0, t, 1, gy);
            CUDA_CHECK(cudaStreamSynchronize(stream));
            CUDA_CHECK(cudaMemcpy(y1.data(), gy, y1.size()*4, cudaMemcpyDeviceToHost));
            for (int64_t u = 0; u < U; ++u) {
                diff += memcmp(&y[(t*U + u)*m], &y1[u*m], m*4) != 0;
                const int64_t e = ids[t*U + u];
                for (int64_t r = 0; r < m; r += 29) {
                    const double a = y[(t*U + u)*m + r], rf = ref_dot(w.data() + e*es, r, nb, grid, &x[t*k]);
                    e2 += (a - rf)*(a - rf); r2 += rf*rf;
                }
            }
        }
        const bool ok = e2/r2 < 5e-4 && diff == 0;
        printf("  %s routed %lld tokens: NMSE vs float64 %.2e, columns differing from their token alone: %d of %lld\n",
            ok ? "ok  " : "FAIL", (long long) NT, e2/r2, diff, (long long) (NT*U));
        fails += !ok;
    }

    // timing, 1 token
    struct variant { std::string name; std::function<void(int)> f; std::vector<float> us; };
    std::vector<variant> vs;
    vs.push_back({"entry", [&](int c) { run(c % NSET, 0, 1, gy); }, {}});
    ggml_cuda_pool_alloc<int8_t> q(ctx->pool(), k);
    ggml_cuda_pool_alloc<float> d(ctx->pool(), nb);
    stq1_0_rp16_quantize_kernel<<<dim3(nb, 1), 32, 0, stream>>>(gx, q.get(), d.get(), k, k, k);
    const int ntiles = k/1024, nrg = m/16;
    auto ida_of = [&](int c) {
        stq1_0_rp16_ids_args a = {};
        a.ids = gids + (c % NSET)*NT*U; a.expert_u4 = (int64_t) (es/16); a.ids_stride = U; a.stride_tok_dst = m*U;
        a.n_used = U; a.ne11 = 1;
        return a;
    };
#define RP16_ID_VARIANT(KS, RPC) vs.push_back({"ids KS" #KS " RPC" #RPC, [&](int c) { \
        mul_mat_vec_stq1_0_rp16_launch<1, KS, RPC, true>((const uint4 *) wrp, (const uint4 *) q.get(), d.get(), gy, \
            ntiles, nrg, m, stream, ida_of(c), U); }, {}})
    RP16_ID_VARIANT(2, 2);
    RP16_ID_VARIANT(2, 1);
    RP16_ID_VARIANT(4, 1);
    RP16_ID_VARIANT(1, 4);
    RP16_ID_VARIANT(8, 1);
#undef RP16_ID_VARIANT
    for (auto & v : vs) for (int r = 0; r < 3; ++r) v.f(r);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int r = 0; r < rounds; ++r) {
        for (size_t j = 0; j < vs.size(); ++j) {
            variant & v = vs[r % 2 ? vs.size() - 1 - j : j];
            CUDA_CHECK(cudaEventRecord(e0, stream));
            for (int i = 0; i < reps; ++i) v.f(i);
            CUDA_CHECK(cudaEventRecord(e1, stream));
            CUDA_CHECK(cudaEventSynchronize(e1));
            float ms; CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            v.us.push_back(1000.0f*ms/reps);
        }
    }
    for (auto & v : vs) {
        std::sort(v.us.begin(), v.us.end());
        const float med = v.us[v.us.size()/2];
        printf("  %-16s %8.2f us  %6.0f GB/s\n", v.name.c_str(), med, U*es/(med*1e3));
    }
    CUDA_CHECK(cudaFree(wrp)); CUDA_CHECK(cudaFree(gids)); CUDA_CHECK(cudaFree(gx)); CUDA_CHECK(cudaFree(gy));
    return fails;
}

int main(int argc, char ** argv) {
    const int rounds = argc > 1 ? atoi(argv[1]) : 15;
    const int reps = 30;
    uint8_t grid[32];
    CUDA_CHECK(cudaMemcpyFromSymbol(grid, stq1_0_grid, 32));
    ggml_backend_cuda_context * ctx = new ggml_backend_cuda_context(0);
    cudaStream_t stream = ctx->stream();
    cudaEvent_t e0, e1; CUDA_CHECK(cudaEventCreate(&e0)); CUDA_CHECK(cudaEventCreate(&e1));
    int fails = 0;

    struct shape { int64_t m, k; };
    const shape shapes[] = { {32768, 16384}, {4096, 14336}, {2048, 6144}, {96, 9216} };
    for (const auto & sh : shapes) {
        const int64_t m = sh.m, k = sh.k, nb = k/QK_K;
        const size_t wbytes = m*nb*sizeof(block_stq1_0);
        const int copies = (int) std::max<int64_t>(1, std::min<int64_t>(16, (int64_t) (256u << 20)/wbytes + 1));
        std::vector<uint8_t> w(wbytes);
        for (size_t i = 0; i < wbytes; i += 8) { const uint64_t r = mix64(i + 77*m); memcpy(&w[i], &r, std::min<size_t>(8, wbytes - i)); }
        for (int64_t b = 0; b < m*nb; ++b) { // scales: +-[0.001, 0.01)
            const uint64_t r = mix64(b ^ 0xABCDEF);
            const float s = ((r & 1) ? -1.0f : 1.0f)*(0.001f + 0.009f*(float) ((r >> 8) & 0xFFFF)/65536.0f);
            const __half h = __float2half_rn(s); memcpy(&w[b*sizeof(block_stq1_0) + 40], &h, 2);
        }
        void * graw; CUDA_CHECK(cudaMalloc(&graw, wbytes));
        CUDA_CHECK(cudaMemcpy(graw, w.data(), wbytes, cudaMemcpyHostToDevice));
        std::vector<void *> wp(copies);
        for (int c = 0; c < copies; ++c) {
            CUDA_CHECK(cudaMalloc(&wp[c], wbytes));
            ggml_cuda_stq1_0_rp16_repack(graw, wp[c], m, k, stream);
        }
        // round trip
        {
            void * back; CUDA_CHECK(cudaMalloc(&back, wbytes));
            ggml_cuda_stq1_0_rp16_unpack(wp[0], back, m, k, stream);
            CUDA_CHECK(cudaStreamSynchronize(stream)); // (the stream does not synchronize with the legacy one)
            std::vector<uint8_t> hb(wbytes); CUDA_CHECK(cudaMemcpy(hb.data(), back, wbytes, cudaMemcpyDeviceToHost));
            if (hb != w) { printf("FAIL %lldx%lld: unpack(repack) differs\n", (long long) m, (long long) k); fails++; }
            CUDA_CHECK(cudaFree(back));
        }
        const int NX = 8;
        std::vector<float> x(k*NX);
        for (int64_t i = 0; i < k*NX; ++i) x[i] = (float) ((double) (mix64(i*31 + k) >> 11)/9007199254740992.0*2.0 - 1.0);
        float * gx; CUDA_CHECK(cudaMalloc(&gx, x.size()*4)); CUDA_CHECK(cudaMemcpy(gx, x.data(), x.size()*4, cudaMemcpyHostToDevice));
        float * gy; CUDA_CHECK(cudaMalloc(&gy, m*NX*4));

        // float64 reference of sampled rows
        const int64_t step = m > 4096 ? 61 : 1;
        std::vector<int64_t> rows; for (int64_t r = 0; r < m; r += step) rows.push_back(r);
        std::vector<double> ref(rows.size()*NX);
        for (size_t ri = 0; ri < rows.size(); ++ri) {
            std::vector<double> acc(NX, 0.0);
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t * blk = &w[(rows[ri]*nb + b)*sizeof(block_stq1_0)];
                __half_raw hr; memcpy(&hr.x, blk + 40, 2); const double d = __half2float(__half(hr));
                for (int G = 0; G < 64; ++G) {
                    for (int p = 0; p < 4; ++p) {
                        const int v = stq1_0_ref_w(blk, grid, G, p);
                        if (!v) continue;
                        const int64_t kk = b*QK_K + (G/16)*64 + G % 16 + 16*p;
                        for (int c = 0; c < NX; ++c) acc[c] += d*v*x[c*k + kk];
                    }
                }
            }
            for (int c = 0; c < NX; ++c) ref[ri*NX + c] = acc[c];
        }

        // the product through the entry point; columns 0..n-1
        auto run = [&](int n, int copy) {
            ggml_tensor t0 = make_tensor(GGML_TYPE_STQ1_0, k, m, sizeof(block_stq1_0), wp[copy]);
            ggml_tensor t1 = make_tensor(GGML_TYPE_F32, k, n, 4, gx);
            ggml_tensor td = make_tensor(GGML_TYPE_F32, m, n, 4, gy);
            ggml_cuda_mul_mat_vec_stq1_0_rp16(*ctx, &t0, &t1, nullptr, &td);
        };
        const int nrg = m/16, ntiles = k/1024;
        printf("== %lldx%lld: %d copies of %.1f MB, K split %d\n", (long long) m, (long long) k, copies, wbytes/1e6, stq1_0_rp16_ks(nrg, ntiles));
        std::vector<float> one(m*NX);
        for (int n : {1, 2, 3, 5, 8}) {
            CUDA_CHECK(cudaStreamSynchronize(stream));
            CUDA_CHECK(cudaMemset(gy, 0xFF, m*NX*4));
            run(n, 0);
            CUDA_CHECK(cudaStreamSynchronize(stream));
            std::vector<float> y(m*n); CUDA_CHECK(cudaMemcpy(y.data(), gy, m*n*4, cudaMemcpyDeviceToHost));
            if (n == 1) {
                // the one-column product of every column
                for (int c = 0; c < NX; ++c) {
                    float * gxc = gx + c*k;
                    ggml_tensor t0 = make_tensor(GGML_TYPE_STQ1_0, k, m, sizeof(block_stq1_0), wp[0]);
                    ggml_tensor t1 = make_tensor(GGML_TYPE_F32, k, 1, 4, gxc);
                    ggml_tensor td = make_tensor(GGML_TYPE_F32, m, 1, 4, gy + c*m);
                    ggml_cuda_mul_mat_vec_stq1_0_rp16(*ctx, &t0, &t1, nullptr, &td);
                }
                CUDA_CHECK(cudaStreamSynchronize(stream));
                CUDA_CHECK(cudaMemcpy(one.data(), gy, m*NX*4, cudaMemcpyDeviceToHost));
            }
            double e2 = 0, r2 = 0; int diff = 0;
            for (int c = 0; c < n; ++c) {
                for (size_t ri = 0; ri < rows.size(); ++ri) {
                    const double a = y[c*m + rows[ri]], r = ref[ri*NX + c];
                    e2 += (a - r)*(a - r); r2 += r*r;
                }
                diff += memcmp(&y[c*m], &one[c*m], m*4) != 0;
            }
            const double nmse = e2/r2;
            const bool ok = nmse < 5e-4 && diff == 0;
            printf("  %s n=%d: NMSE vs float64 %.2e, columns differing from their one-column product: %d\n", ok ? "ok  " : "FAIL", n, nmse, diff);
            fails += !ok;
        }
        // timing: the entry point (quantize + mat-vec) and the mat-vec alone per K split, n = 1 (and 5, 8 at 4096)
        struct variant { std::string name; std::function<void(int)> f; std::vector<float> us; };
        std::vector<variant> vs;
        for (int n : {1, 5, 8}) {
            if (n > 1 && m != 4096) continue;
            vs.push_back({"entry n=" + std::to_string(n), [&, n](int c) { run(n, c); }, {}});
        }
        ggml_cuda_pool_alloc<int8_t> q(ctx->pool(), NX*k);
        ggml_cuda_pool_alloc<float> d(ctx->pool(), NX*nb);
        run(1, 0);
        stq1_0_rp16_quantize_kernel<<<dim3(nb, 1), 32, 0, stream>>>(gx, q.get(), d.get(), k, k, k);
        // the 0031 kernel alone (its q8_1 activations: zeros; only timed) on GGUF-layout copies
        std::vector<void *> wg(copies, nullptr);
        void * ym = nullptr;
        if (k % 2048 == 0) {
            for (int c = 0; c < copies; ++c) {
                CUDA_CHECK(cudaMalloc(&wg[c], wbytes));
                CUDA_CHECK(cudaMemcpy(wg[c], graw, wbytes, cudaMemcpyDeviceToDevice));
            }
            CUDA_CHECK(cudaMalloc(&ym, (k/128)*sizeof(block_q8_1_mmq)));
            CUDA_CHECK(cudaMemset(ym, 0, (k/128)*sizeof(block_q8_1_mmq)));
            vs.push_back({"0031 mat-vec", [&, ym](int c) {
                const dim3 grid(m/4, 1, 1), block(32, 1, 1);
                const uint3 one = init_fastdiv_values(1);
                mul_mat_vec_stq1_0<1, 4, 1, 4><<<grid, block, 4*4*STQ1_0_MMV_TILE_BYTES, stream>>>(
                    (const char *) wg[c], (const block_q8_1_mmq *) ym, nullptr, gy, (int) (k/2048), (int) m,
                    (int) (nb*sizeof(block_stq1_0)), 1, 1, (int) m, one, 0, 0, 0, one, 0, 0, 0, one, 0);
            }, {}});
        }
        const launch_fn lf[3] = {
            [](const uint4 * W, const uint4 * A, const float * D, float * y, int nt, int nr, int64_t s, cudaStream_t st) {
                mul_mat_vec_stq1_0_rp16_launch<1, 2, 2>(W, A, D, y, nt, nr, s, st); },
            [](const uint4 * W, const uint4 * A, const float * D, float * y, int nt, int nr, int64_t s, cudaStream_t st) {
                mul_mat_vec_stq1_0_rp16_launch<1, 4, 1>(W, A, D, y, nt, nr, s, st); },
            [](const uint4 * W, const uint4 * A, const float * D, float * y, int nt, int nr, int64_t s, cudaStream_t st) {
                mul_mat_vec_stq1_0_rp16_launch<1, 8, 1>(W, A, D, y, nt, nr, s, st); } };
        const int ksv[3] = {2, 4, 8};
        for (int i = 0; i < 3; ++i) {
            if (ksv[i] > 2*ntiles) continue;
            vs.push_back({"mat-vec KS" + std::to_string(ksv[i]), [&, i](int c) {
                lf[i]((const uint4 *) wp[c], (const uint4 *) q.get(), d.get(), gy, ntiles, nrg, m, stream); }, {}});
        }
        for (auto & v : vs) for (int r = 0; r < 3; ++r) v.f(r % copies); // warm-up
        CUDA_CHECK(cudaStreamSynchronize(stream));
        for (int r = 0; r < rounds; ++r) {
            for (size_t j = 0; j < vs.size(); ++j) {
                variant & v = vs[r % 2 ? vs.size() - 1 - j : j];
                CUDA_CHECK(cudaEventRecord(e0, stream));
                for (int i = 0; i < reps; ++i) v.f(i % copies);
                CUDA_CHECK(cudaEventRecord(e1, stream));
                CUDA_CHECK(cudaEventSynchronize(e1));
                float ms; CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
                v.us.push_back(1000.0f*ms/reps);
            }
        }
        for (auto & v : vs) {
            std::sort(v.us.begin(), v.us.end());
            const float med = v.us[v.us.size()/2];
            printf("  %-16s %8.2f us  %6.0f GB/s\n", v.name.c_str(), med, wbytes/(med*1e3));
        }
        CUDA_CHECK(cudaFree(graw)); for (void * p : wp) CUDA_CHECK(cudaFree(p));
        for (void * p : wg) if (p) CUDA_CHECK(cudaFree(p));
        if (ym) CUDA_CHECK(cudaFree(ym));
        CUDA_CHECK(cudaFree(gx)); CUDA_CHECK(cudaFree(gy));
    }
    fails += run_routed(ctx, stream, e0, e1, grid, rounds, reps);
    printf("%s: %d failure(s)\n", fails ? "FAILED" : "PASSED", fails);
    return fails ? 1 : 0;
}
