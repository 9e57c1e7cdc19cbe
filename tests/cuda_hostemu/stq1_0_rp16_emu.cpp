// Host emulation of CUDA's STQ1_0 RP16 repack and mat-vec (ggml-cuda/stq1_0-rp16.cu{,h}; CI has no GPU).
//
// tests/test_cuda_stq1_0_rp16_hostemu.py takes stq1_0-rp16.cuh and stq1_0-rp16.cu from the applied tree, rewrites
// the launches, __global__ and __shared__ (STQ_RP16_INC) and includes them here. Every CUDA thread of a block is
// a fiber (emu_fibers.h) scheduled round-robin; __syncthreads and __shfl_xor_sync are real barriers between them.
// Checks on random STQ1_0 weights: unpack(repack(W)) == W byte for byte; MUL_MAT with n = 1..8 columns against
// (a) the same quantized activations and ggml's dequantized weights in float64 (tight: catches any mismatch of
// the weight and activation layouts) and (b) the float activations (NMSE); every column bit-identical to the
// one-column product (batch invariance). MUL_MAT_ID (expert stacks, ids with a padded row stride): the stack's
// repack equal to its experts' 2-D repacks, the round trip, 1..8 tokens against float64 as above, every column
// bit-identical to the same token alone and to the one-column product of its expert's matrix; the exact Hy4 shape
// (256 experts of 2048 x 6144, top-8) with only the experts used filled, the others poison.

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "ggml.h"
#include "emu_fibers.h"
#define GGML_COMMON_DECL_CPP
#define GGML_COMMON_IMPL_CPP
#include "ggml-common.h"
#include "cuda_intrin_emu.h"


// ---- CUDA types and intrinsics, ggml-cuda's launch helpers: cuda_intrin_emu.h ---------------------------------
template <typename F>
static void emu_launch(const dim3 & grid, const dim3 & block, F && f) {
    g_grid_dim = grid;
    for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
    for (unsigned x = 0; x < grid.x; ++x) {
        g_block_idx = dim3(x, y, z);
        run_block(block, f);
    }
}

template <typename Kernel, typename... Args>
static void ggml_cuda_kernel_launch(Kernel kernel, const ggml_cuda_kernel_launch_params & p, Args &&... args) {
    emu_launch(p.block_nums, p.block_dims, [&] { kernel(args...); });
}


#include STQ_RP16_INC

// the quantizer of the included code for one column (for the direct launches below)
static void stq1_0_rp16_quantize_kernel_emu_launch(const ggml_tensor * x, int8_t * q, float * d, int64_t k) {
    emu_launch(dim3(k/QK_K, 1), dim3(32), [&] { stq1_0_rp16_quantize_kernel((const float *) x->data, q, d, k, k, k); });
}

// ---- the checks --------------------------------------------------------------------------------------------
static std::mt19937 rng(20261201);

static void fill_stq1_0(uint8_t * p, size_t nbytes) {
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> scale(0.001f, 0.01f);
    for (size_t i = 0; i < nbytes; ++i) p[i] = (uint8_t) byte(rng);
    for (size_t i = 0; i < nbytes; i += sizeof(block_stq1_0)) {
        const ggml_fp16_t h = ggml_fp32_to_fp16((byte(rng) & 1 ? -1.0f : 1.0f)*scale(rng));
        memcpy(p + i + offsetof(block_stq1_0, d), &h, 2);
    }
}

// the kernel's activation quantization of one column (d = max|x|/127 per 256, round to nearest even), un-permuted
// with stq1_0_rp16_act_pos, in double
static void quantized_ref(const float * xc, int64_t k, double * xq) {
    for (int64_t b = 0; b < k/QK_K; ++b) {
        float amax = 0.0f;
        for (int i = 0; i < QK_K; ++i) amax = std::max(amax, fabsf(xc[b*QK_K + i]));
        const float d = amax/127.0f;
        int8_t qp[QK_K];
        for (int i = 0; i < QK_K; ++i) qp[stq1_0_rp16_act_pos(i)] = (int8_t) (d > 0 ? nearbyintf(xc[b*QK_K + i]/d) : 0);
        for (int i = 0; i < QK_K; ++i) xq[b*QK_K + i] = (double) qp[stq1_0_rp16_act_pos(i)]*d;
    }
}

static int check_shape(int64_t m, int64_t k, bool quick) {
    const int nb = k / QK_K;
    const size_t rs = ggml_row_size(GGML_TYPE_STQ1_0, k);
    ggml_init_params ip = { (size_t) (2*m*rs + 64*k*sizeof(float) + (size_t) 64*m*sizeof(float)) + 64*ggml_tensor_overhead(), nullptr, false };
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * w  = ggml_new_tensor_2d(ctx, GGML_TYPE_STQ1_0, k, m);
    ggml_tensor * rp = ggml_new_tensor_2d(ctx, GGML_TYPE_STQ1_0, k, m);
    fill_stq1_0((uint8_t *) w->data, ggml_nbytes(w));
    int fails = 0;

    if (!ggml_cuda_stq1_0_rp16_supported(w)) {
        printf("FAIL %" PRId64 "x%" PRId64 ": not supported\n", m, k);
        return 1;
    }
    g_lo[0] = g_lo[1] = nullptr;
    ggml_cuda_stq1_0_rp16_repack(w->data, rp->data, m, k, 0);
    std::vector<uint8_t> back(ggml_nbytes(w));
    ggml_cuda_stq1_0_rp16_unpack(rp->data, back.data(), m, k, 0);
    if (memcmp(back.data(), w->data, back.size()) != 0) {
        size_t i = 0;
        while (back[i] == ((uint8_t *) w->data)[i]) ++i;
        printf("FAIL %" PRId64 "x%" PRId64 ": unpack(repack(W)) differs from W at byte %zu\n", m, k, i);
        fails++;
    }

    // the weights in float (ggml's dequantization)
    std::vector<float> wf(m*k);
    ggml_get_type_traits(GGML_TYPE_STQ1_0)->to_float(w->data, wf.data(), m*k);

    const int NX = 8;
    ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, NX);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t i = 0; i < k*NX; ++i) ((float *) x->data)[i] = nd(rng);

    ggml_backend_cuda_context cctx;
    std::vector<float> one(NX*m);
    for (int n = 1; n <= NX; ++n) {
        if (quick && n > 2 && n < NX) continue;
        ggml_tensor * xn = ggml_view_2d(ctx, x, k, n, x->nb[1], 0);
        ggml_tensor * y  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, m, n);
        for (int64_t i = 0; i < m*n; ++i) ((float *) y->data)[i] = NAN;
        g_lo[0] = (const char *) rp->data; g_hi[0] = g_lo[0] + ggml_nbytes(rp);
        g_lo[1] = nullptr; // activations: the pool buffer of the call
        ggml_cuda_mul_mat_vec_stq1_0_rp16(cctx, rp, xn, nullptr, y);
        if (g_fail) return fails + 1;

        // reference with the kernel's activation quantization (d = max|x|/127 per 256, round to nearest even),
        // un-permuted with stq1_0_rp16_act_pos: float64 sums, tolerance relative to the output scale
        double max_err = 0.0, max_ref = 0.0, e2 = 0.0, r2 = 0.0;
        for (int c = 0; c < n; ++c) {
            const float * xc = (const float *) x->data + c*k;
            std::vector<double> xq(k);
            quantized_ref(xc, k, xq.data());
            for (int64_t r = 0; r < m; ++r) {
                double a = 0.0, af = 0.0;
                for (int64_t i = 0; i < k; ++i) {
                    a  += (double) wf[r*k + i]*xq[i];
                    af += (double) wf[r*k + i]*xc[i];
                }
                const float got = ((float *) y->data)[c*m + r];
                max_err = std::max(max_err, fabs(got - a));
                max_ref = std::max(max_ref, fabs(a));
                e2 += (got - af)*(got - af);
                r2 += af*af;
                if (!std::isfinite(got)) max_err = INFINITY;
            }
            if (n == 1) memcpy(one.data(), y->data, m*sizeof(float));
        }
        // column 0 against the n = 1 product, columns c >= 1 against their own one-column products
        int diff_cols = memcmp(y->data, one.data(), m*sizeof(float)) != 0;
        for (int c = 1; c < n; ++c) {
            ggml_tensor * x1 = ggml_view_2d(ctx, x, k, 1, x->nb[1], c*x->nb[1]);
            ggml_tensor * y1 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, m, 1);
            ggml_cuda_mul_mat_vec_stq1_0_rp16(cctx, rp, x1, nullptr, y1);
            if (memcmp((float *) y->data + c*m, y1->data, m*sizeof(float)) != 0) diff_cols++;
        }
        const double rel = max_err/std::max(max_ref, 1e-30);
        const double nmse = e2/r2;
        const bool ok = rel < 1e-5 && nmse < 5e-4 && diff_cols == 0;
        printf("%s %" PRId64 "x%" PRId64 " n=%d: max |y - ref(q)| / max |ref| = %.2e, NMSE vs float x %.2e, columns differing from n=1: %d\n",
            ok ? "ok  " : "FAIL", m, k, n, rel, nmse, diff_cols);
        fails += !ok;
    }
    // the K split of large matrices (4 warps) against the one these small ones take (8): same products up to the
    // float order of the K split
    if (!quick && m % 32 == 0) {
        ggml_cuda_pool_alloc<int8_t> q(nullptr, k);
        ggml_cuda_pool_alloc<float>  d(nullptr, nb);
        stq1_0_rp16_quantize_kernel_emu_launch(x, q.get(), d.get(), k);
        std::vector<float> y4(m, NAN), y8(m, NAN);
        mul_mat_vec_stq1_0_rp16_launch<1, 4, 1>((const uint4 *) rp->data, (const uint4 *) q.get(), d.get(), y4.data(),
            k/1024, m/16, m, 0);
        mul_mat_vec_stq1_0_rp16_launch<1, 8, 1>((const uint4 *) rp->data, (const uint4 *) q.get(), d.get(), y8.data(),
            k/1024, m/16, m, 0);
        double e = 0.0, r = 0.0;
        for (int64_t i = 0; i < m; ++i) { e = std::max(e, (double) fabsf(y4[i] - y8[i])); r = std::max(r, (double) fabsf(y8[i])); }
        const bool ok = e <= 1e-5*r && std::isfinite(e);
        printf("%s %" PRId64 "x%" PRId64 ": K split 4 vs 8: max diff / max |y| = %.2e\n", ok ? "ok  " : "FAIL", m, k, e/r);
        fails += !ok;
    }
    ggml_free(ctx);
    return fails;
}

// ---- MUL_MAT_ID ----------------------------------------------------------------------------------------------

struct id_case {
    int64_t m, k, n_expert, n_used;
    bool    bcast;  // src1 with one column per token (gate/up: ne11 = 1), else one per expert used (down: ne11 = n_used)
    int     n_tok;
    bool    sparse; // only the experts used hold weights (repacked one by one), the others poison (NaN scales)
};

// MUL_MAT_ID with the weights in RP16: dst[:, u, t] = W[ids[u, t]] x src1[:, u % ne11, t]
static int check_id(const id_case & c, bool quick) {
    const int64_t m = c.m, k = c.k, E = c.n_expert, U = c.n_used, T = c.n_tok, ne11 = c.bcast ? 1 : U;
    const size_t  rs = ggml_row_size(GGML_TYPE_STQ1_0, k);
    const size_t  es = m*rs; // bytes per expert
    char what[96];
    snprintf(what, sizeof(what), "id %" PRId64 "x(%" PRId64 "x%" PRId64 ") top-%" PRId64 " ne11=%" PRId64 "%s", E, m, k, U, ne11,
        c.sparse ? " (sparse)" : "");

    ggml_init_params ip = { 256*ggml_tensor_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    std::vector<uint8_t> wb(E*es), rb(E*es);
    ggml_tensor * rp = ggml_new_tensor_3d(ctx, GGML_TYPE_STQ1_0, k, m, E);
    rp->data = rb.data();
    int fails = 0;
    if (!ggml_cuda_stq1_0_rp16_supported(rp)) {
        printf("FAIL %s: not supported\n", what);
        ggml_free(ctx);
        return 1;
    }

    // ids: U distinct experts per token, in a tensor with a padded row stride (as the view of top-k gives); the first
    // token takes the last expert
    const int64_t ids_row = U + 3;
    std::vector<int32_t> idb(ids_row*T, -1);
    std::vector<bool> used(E, false);
    for (int64_t t = 0; t < T; ++t) {
        std::vector<int32_t> perm(E);
        for (int64_t e = 0; e < E; ++e) perm[e] = e;
        std::shuffle(perm.begin(), perm.end(), rng);
        if (t == 0) std::swap(*std::find(perm.begin(), perm.end(), (int32_t) (E - 1)), perm[0]);
        for (int64_t u = 0; u < U; ++u) {
            idb[t*ids_row + u] = perm[u];
            used[perm[u]] = true;
        }
    }

    g_lo[0] = g_lo[1] = nullptr;
    if (c.sparse) {
        memset(rb.data(), 0xFF, rb.size()); // fp16 0xFFFF: NaN scales
        for (int64_t e = 0; e < E; ++e) {
            if (!used[e]) continue;
            fill_stq1_0(wb.data() + e*es, es);
            ggml_cuda_stq1_0_rp16_repack(wb.data() + e*es, rb.data() + e*es, m, k, 0);
        }
    } else {
        fill_stq1_0(wb.data(), wb.size());
        // the stack is repacked as one matrix of m*E rows: equal to its experts repacked one by one
        ggml_cuda_stq1_0_rp16_repack(wb.data(), rb.data(), m*E, k, 0);
        std::vector<uint8_t> one(es);
        int bad = -1;
        for (int64_t e = 0; e < E && bad < 0; ++e) {
            ggml_cuda_stq1_0_rp16_repack(wb.data() + e*es, one.data(), m, k, 0);
            if (memcmp(one.data(), rb.data() + e*es, es) != 0) bad = e;
        }
        std::vector<uint8_t> back(wb.size());
        ggml_cuda_stq1_0_rp16_unpack(rb.data(), back.data(), m*E, k, 0);
        const bool rt = back == wb;
        printf("%s %s: repack of the stack == the experts' repacks: %s, unpack(repack(W)) == W: %s\n",
            bad < 0 && rt ? "ok  " : "FAIL", what, bad < 0 ? "yes" : "no", rt ? "yes" : "no");
        fails += bad >= 0 || !rt;
    }

    // the float weights of expert e (ggml's dequantization)
    std::vector<float> wfe(m*k);
    auto wf_of = [&](int64_t e) -> const float * {
        ggml_get_type_traits(GGML_TYPE_STQ1_0)->to_float(wb.data() + e*es, wfe.data(), m*k);
        return wfe.data();
    };

    std::vector<float> xb(k*ne11*T);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto & v : xb) v = nd(rng);

    ggml_backend_cuda_context cctx;
    // MUL_MAT_ID of tokens t0 .. t0 + n - 1 into y (m x U x n, NaN first)
    auto run = [&](int64_t t0, int64_t n, std::vector<float> & y) {
        ggml_tensor * x   = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, k, ne11, n);
        ggml_tensor * ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, U, n);
        ggml_tensor * dst = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, m, U, n);
        x->data = xb.data() + t0*k*ne11;
        ids->data = idb.data() + t0*ids_row;
        ids->nb[1] = ids_row*sizeof(int32_t);
        ids->nb[2] = ids->nb[3] = n*ids->nb[1];
        y.assign(m*U*n, NAN);
        dst->data = y.data();
        if (!ggml_cuda_should_use_mmv_stq1_0_rp16(rp, x, ids, dst)) {
            printf("FAIL %s: %" PRId64 " tokens not taken by the RP16 kernel\n", what, n);
            fails++;
            return;
        }
        g_lo[0] = (const char *) rb.data(); g_hi[0] = g_lo[0] + rb.size();
        g_lo[1] = nullptr;
        ggml_cuda_mul_mat_vec_stq1_0_rp16(cctx, rp, x, ids, dst);
    };

    // every token alone
    std::vector<std::vector<float>> alone(T);
    for (int64_t t = 0; t < T; ++t) run(t, 1, alone[t]);

    std::vector<double> xq(k);
    for (int64_t n = quick || c.sparse ? T : 1; n <= T; ++n) {
        std::vector<float> y;
        run(0, n, y);
        if (g_fail) break;
        double max_err = 0.0, max_ref = 0.0, e2 = 0.0, r2 = 0.0;
        int diff_cols = 0;
        for (int64_t t = 0; t < n; ++t) {
            for (int64_t u = 0; u < U; ++u) {
                const int64_t e  = idb[t*ids_row + u];
                const float * xc = xb.data() + (t*ne11 + u % ne11)*k;
                const float * we = wf_of(e);
                const float * yc = y.data() + (t*U + u)*m;
                quantized_ref(xc, k, xq.data());
                for (int64_t r = 0; r < m; ++r) {
                    double a = 0.0, af = 0.0;
                    for (int64_t i = 0; i < k; ++i) {
                        a  += (double) we[r*k + i]*xq[i];
                        af += (double) we[r*k + i]*xc[i];
                    }
                    max_err = std::max(max_err, std::isfinite(yc[r]) ? fabs(yc[r] - a) : INFINITY);
                    max_ref = std::max(max_ref, fabs(a));
                    e2 += (yc[r] - af)*(yc[r] - af);
                    r2 += af*af;
                }
                diff_cols += memcmp(yc, alone[t].data() + u*m, m*sizeof(float)) != 0;
            }
        }
        const double rel = max_err/std::max(max_ref, 1e-30), nmse = e2/r2;
        const bool ok = rel < 1e-5 && nmse < 5e-4 && diff_cols == 0;
        printf("%s %s tokens=%" PRId64 ": max |y - ref(q)| / max |ref| = %.2e, NMSE vs float x %.2e, columns differing from the token alone: %d\n",
            ok ? "ok  " : "FAIL", what, n, rel, nmse, diff_cols);
        fails += !ok;

        if (n == T) {
            // every column against the one-column product of its expert's matrix (the kernel with the same K split)
            int diff = 0;
            for (int64_t t = 0; t < T; ++t) {
                for (int64_t u = 0; u < U; ++u) {
                    const int64_t e = idb[t*ids_row + u];
                    ggml_cuda_pool_alloc<int8_t> q(nullptr, k);
                    ggml_cuda_pool_alloc<float>  d(nullptr, k/QK_K);
                    const float * xc = xb.data() + (t*ne11 + u % ne11)*k;
                    emu_launch(dim3(k/QK_K, 1), dim3(32), [&] { stq1_0_rp16_quantize_kernel(xc, q.get(), d.get(), k, k, k); });
                    std::vector<float> y1(m, NAN);
                    mul_mat_vec_stq1_0_rp16_launch<1, STQ1_0_RP16_ID_KS, STQ1_0_RP16_ID_RPC>(
                        (const uint4 *) (rb.data() + e*es), (const uint4 *) q.get(), d.get(), y1.data(), k/1024, m/16, m, 0);
                    diff += memcmp(y1.data(), y.data() + (t*U + u)*m, m*sizeof(float)) != 0;
                }
            }
            printf("%s %s tokens=%" PRId64 ": columns differing from the one-column product of their expert: %d of %" PRId64 "\n",
                diff ? "FAIL" : "ok  ", what, n, diff, T*U);
            fails += diff != 0;
        }
    }
    ggml_free(ctx);
    return fails;
}

int main(int argc, char ** argv) {
    const bool quick = argc > 1 && !strcmp(argv[1], "quick");
    int fails = 0;
    // K split (stq1_0_rp16_ks): 2 warps for these few tiles, 4 for 64x4096, 8 for 96x9216 (9 tiles: a dead slot)
    const int64_t shapes[][2] = { {32, 1024}, {64, 2048}, {96, 3072}, {160, 1024}, {224, 2048}, {64, 4096}, {96, 9216} };
    for (const auto & s : shapes) {
        fails += check_shape(s[0], s[1], quick);
    }
    // MUL_MAT_ID: odd expert counts, non-square, 1 or n_used columns per token, a K split with a dead slot (3 tiles
    // over 2 warps), a last CUDA block with one live warp pair (224 rows)
    const id_case id_cases[] = {
        {  64, 1024,   3, 2, true,  8, false },
        {  96, 2048,   5, 3, false, 4, false },
        {  32, 3072,   7, 7, true,  3, false },
        { 224, 2048,   4, 2, true,  5, false },
        { 160, 1024,   1, 1, false, 2, false },
        { 128, 4096,  33, 8, true,  2, false },
    };
    for (const auto & c : id_cases) {
        fails += check_id(c, quick);
    }
    if (!quick) {
        // Hy4's routed experts: 256 of 2048 x 6144 (ne00 = 6144), top-8, gate/up (one column per token) and a
        // 2-token verify
        fails += check_id({ 2048, 6144, 256, 8, true, 2, true }, quick);
    }

    // which tensors are supported
    ggml_init_params ip = { 64*ggml_tensor_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    // supported: the layout; wanted: the default policy (GGML_CUDA_STQ1_0_REPACK unset), >= 32 Mi weights
    const struct { int64_t k, m; bool sup, want; } sel[] = { {1024, 32, true, false}, {6144, 2048, true, false},
        {2048, 131, false, false}, {2048, 48, false, false}, {1536, 64, false, false}, {14336, 4096, true, true},
        {16384, 32768, true, true}, {16384, 32776, false, false} };
    for (const auto & s : sel) {
        ggml_tensor * t = ggml_new_tensor_2d(ctx, GGML_TYPE_STQ1_0, s.k, s.m);
        const bool sup = ggml_cuda_stq1_0_rp16_supported(t), want = ggml_cuda_stq1_0_rp16_wanted(t, 1);
        if (sup != s.sup || want != s.want) {
            printf("FAIL %" PRId64 "x%" PRId64 ": supported %d wanted %d\n", s.m, s.k, sup, want);
            fails++;
        }
    }
    // expert stacks (default policy: the experts one op streams per column, n_mat of them, >= 32 Mi weights)
    const struct { int64_t k, m, e, n_mat; bool sup, want; } stacks[] = {
        { 6144, 2048, 256, 8, true, true },  // Hy4 routed top-8: 8 x 12.6 Mi
        { 6144, 2048, 256, 2, true, false }, // 2 x 12.6 Mi
        { 2048, 6144, 256, 8, true, true },  // the down projection's shape
        { 1024,   32,   3, 2, true, false },
        { 1024,   48,   4, 2, false, false },
    };
    for (const auto & s : stacks) {
        ggml_tensor * t = ggml_new_tensor_3d(ctx, GGML_TYPE_STQ1_0, s.k, s.m, s.e);
        const bool sup = ggml_cuda_stq1_0_rp16_supported(t), want = ggml_cuda_stq1_0_rp16_wanted(t, s.n_mat);
        if (sup != s.sup || want != s.want) {
            printf("FAIL stack %" PRId64 "x(%" PRId64 "x%" PRId64 ") n_mat %" PRId64 ": supported %d wanted %d\n", s.e, s.m, s.k,
                s.n_mat, sup, want);
            fails++;
        }
    }
    // which MUL_MAT_ID batches take the RP16 kernel: 1..8 tokens, I32 ids of as many tokens
    {
        ggml_tensor * w = ggml_new_tensor_3d(ctx, GGML_TYPE_STQ1_0, 1024, 64, 16);
        const struct { int64_t ne11, tok, ids_tok; ggml_type ids_type; bool want; } bat[] = {
            { 1, 1, 1, GGML_TYPE_I32, true }, { 1, 8, 8, GGML_TYPE_I32, true }, { 4, 8, 8, GGML_TYPE_I32, true },
            { 1, 9, 9, GGML_TYPE_I32, false }, { 1, 4, 5, GGML_TYPE_I32, false }, { 1, 4, 4, GGML_TYPE_F32, false },
        };
        for (const auto & b : bat) {
            ggml_tensor * x   = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 1024, b.ne11, b.tok);
            ggml_tensor * ids = ggml_new_tensor_2d(ctx, b.ids_type, 4, b.ids_tok);
            ggml_tensor * dst = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 64, 4, b.tok);
            const bool got = ggml_cuda_should_use_mmv_stq1_0_rp16(w, x, ids, dst);
            if (got != b.want) {
                printf("FAIL MUL_MAT_ID ne11 %" PRId64 " tokens %" PRId64 " ids of %" PRId64 " tokens (%s): RP16 kernel %d\n", b.ne11,
                    b.tok, b.ids_tok, ggml_type_name(b.ids_type), got);
                fails++;
            }
        }
        // MUL_MAT of a stack is not taken (MUL_MAT_ID only)
        if (ggml_cuda_should_use_mmv_stq1_0_rp16(w, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1024, 1), nullptr,
                ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 1))) {
            printf("FAIL MUL_MAT of a 3-D stack taken by the RP16 kernel\n");
            fails++;
        }
    }
    ggml_free(ctx);
    printf("%s\n", fails || g_fail ? "FAILED" : "OK");
    return fails || g_fail ? 1 : 0;
}
