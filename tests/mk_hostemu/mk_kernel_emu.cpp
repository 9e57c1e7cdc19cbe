// Host emulation of the CUDA Gemma decode megakernel (megakernel/cuda/mk-kernel.cuh, the kernel's own
// source, run through cuda_emu.h) on a tiny random Gemma-4-shaped model with every supported weight
// type, against an independent float64 reference of the same forward pass (dequantization by ggml's
// to_float). Checks, printing OK/FAIL lines and exiting 1 on any failure:
//  - one-token steps over a sequence that crosses the sliding window: logits vs the reference;
//  - a verify step of M tokens: every row bitwise equal to the one-token steps (lossless);
//  - both KV layouts (plain and transposed V), a shared-KV layer, proportional rope, per-layer inputs.
// `--planted` runs with the grid barriers off (GGML_MK_DEBUG_NO_GRID_BARRIER): that must fail.
#define GGML_COMMON_DECL_C
#define GGML_COMMON_IMPL_C
#include "ggml-common.h"

#include "cuda_emu.h"
#include "mk-kernel.cuh"

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

static std::mt19937 rng(20261130);

struct wt {
    ggml_type type;
    int ne0, ne1;
    std::vector<uint8_t> q;   // as stored
    std::vector<float>   f;   // dequantized by ggml (the reference's view)
    ggml_mk_weight mk() const {
        ggml_mk_weight w = {};
        w.data = q.data(); w.type = type; w.ne0 = ne0; w.ne1 = ne1; w.nb1 = ggml_row_size(type, ne0); w.b256 = (int32_t) ggml_row_size(type, 256);
        return w;
    }
};

static wt make_w(ggml_type t, int ne0, int ne1, float scale = 1.0f) {
    std::normal_distribution<float> nd(0.0f, scale/sqrtf((float) ne0));
    std::vector<float> src((size_t) ne0*ne1);
    for (auto & v : src) v = nd(rng);
    wt w{t, ne0, ne1, std::vector<uint8_t>(ggml_row_size(t, ne0)*ne1 + 64), std::vector<float>(src.size())};
    if (t == GGML_TYPE_F32) {
        memcpy(w.q.data(), src.data(), src.size()*4);
    } else {
        ggml_quantize_chunk(t, src.data(), w.q.data(), 0, ne1, ne0, nullptr);
    }
    for (int r = 0; r < ne1; ++r) {
        const uint8_t * row = w.q.data() + ggml_row_size(t, ne0)*r;
        if (t == GGML_TYPE_F32) memcpy(&w.f[(size_t) r*ne0], row, ne0*4);
        else ggml_get_type_traits(t)->to_float(row, &w.f[(size_t) r*ne0], ne0);
    }
    return w;
}

static std::vector<float> make_v(int n, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (auto & x : v) x = u(rng);
    return v;
}

static float f16r(float x) { return __half2float(__float2half(x)); }

// ---- float64 reference ----------------------------------------------------------------------
typedef std::vector<double> vd;
// Q4_0 and Q8_0 weights meet 8-bit inputs (per 32 values: d = max|x|/127, q = round(x/d)), as in
// llama.cpp's mmvq; the reference rounds its inputs the same way for those types
static vd mv(const wt & w, const vd & x_in) {
    vd x = x_in;
    if (w.type == GGML_TYPE_Q4_0 || w.type == GGML_TYPE_Q8_0) {
        for (size_t b = 0; b < x.size(); b += 32) {
            float amax = 0.0f;
            for (size_t i = b; i < b + 32 && i < x.size(); ++i) amax = std::max(amax, fabsf((float) x[i]));
            const float d = amax/127.0f;
            for (size_t i = b; i < b + 32 && i < x.size(); ++i) x[i] = amax == 0.0f ? 0.0 : (double) nearbyintf((float) x[i]/d)*d;
        }
    }
    vd y(w.ne1, 0.0);
    for (int r = 0; r < w.ne1; ++r) for (int k = 0; k < w.ne0; ++k) y[r] += (double) w.f[(size_t) r*w.ne0 + k]*x[k];
    return y;
}
static vd rms(const vd & x, const float * w, double eps, size_t off = 0, size_t n = 0) {
    n = n ? n : x.size();
    double ss = 0; for (size_t i = 0; i < n; ++i) ss += x[off + i]*x[off + i];
    const double r = 1.0/sqrt(ss/n + eps);
    vd y(n); for (size_t i = 0; i < n; ++i) y[i] = x[off + i]*r*(w ? w[i] : 1.0);
    return y;
}
static double gelu(double x) { return 0.5*x*(1.0 + tanh(0.79788456080286535587989211986876*x*(1.0 + 0.044715*x*x))); }
static void rope(vd & v, int n_rot, int pos, double base, const float * ff) {
    for (int i = 0; i < n_rot/2; ++i) {
        const double th = pos*pow(base, -2.0*i/n_rot)/(ff ? ff[i] : 1.0);
        const double c = cos(th), s = sin(th), x0 = v[i], x1 = v[i + n_rot/2];
        v[i] = x0*c - x1*s; v[i + n_rot/2] = x0*s + x1*c;
    }
}

int main(int argc, char ** argv) {
    bool planted = false;
    int variant = 0;   // GGML_MK_VAR_* bits (a kernel variant must give the same results)
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--planted") {
            planted = true;
        } else if (a == "--variant" && i + 1 < argc) {
            variant = (int) strtol(argv[++i], nullptr, 0);
        } else {
            fprintf(stderr, "usage: %s [--planted] [--variant BITS]\n", argv[0]);
            return 2;
        }
    }
    const int n_embd = 256, n_vocab = 300, n_pl = 16, n_layer = 3, kv_size = 32, W = 6;
    const double eps = 1e-6, softcap = 30.0;

    auto mdl = std::make_unique<ggml_mk_model>();
    ggml_mk_model & M_ = *mdl;
    memset(&M_, 0, sizeof(M_));
    M_.version = GGML_MK_VERSION; M_.arch = GGML_MK_ARCH_GEMMA4; M_.n_layer = n_layer; M_.n_embd = n_embd;
    M_.n_vocab = n_vocab; M_.n_embd_pl = n_pl; M_.kv_type = GGML_TYPE_F16; M_.norm_eps = (float) eps;
    M_.embd_scale = sqrtf((float) n_embd); M_.softcap = (float) softcap; M_.attn_factor = 1.0f; M_.kq_scale = 1.0f;
    M_.debug_flags = (planted ? GGML_MK_DEBUG_NO_GRID_BARRIER : 0) | variant;
    M_.n_ctx = kv_size; M_.att_chunk = 4;   // 8 chunks: the split attention and its combine at work

    struct layer_def { bool swa; int hd; bool has_kv; ggml_type t[9]; float out_scale; };
    const layer_def defs[n_layer] = {
        { true,   64, true,  { GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_STQ1_0, GGML_TYPE_Q4_0, GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_F32 }, 1.0f },
        { false, 128, true,  { GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_F32,  GGML_TYPE_STQ1_0, GGML_TYPE_Q6_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_F32 }, 0.8f },
        { true,   64, false, { GGML_TYPE_F16,  GGML_TYPE_F16,  GGML_TYPE_F16,  GGML_TYPE_Q4_0, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q4_0, GGML_TYPE_F32 }, 1.0f },
    };
    const int n_head = 2, n_ff = 256;
    std::vector<wt> keep; keep.reserve(64);
    std::vector<std::vector<float>> vecs; vecs.reserve(64);
    auto W_ = [&](ggml_type t, int ne0, int ne1, float s = 1.0f) -> const wt & { keep.push_back(make_w(t, ne0, ne1, s)); return keep.back(); };
    auto V_ = [&](int n, float lo, float hi) -> const float * { vecs.push_back(make_v(n, lo, hi)); return vecs.back().data(); };

    std::vector<float> rope_ff(64, 1e30f);
    for (int i = 0; i < 16; ++i) rope_ff[i] = 1.0f;

    const wt & out = W_(GGML_TYPE_Q8_0, n_embd, n_vocab, 3.0f);
    M_.output = out.mk(); M_.output_norm = V_(n_embd, 0.5f, 1.5f);
    const wt & plp = W_(GGML_TYPE_F32, n_embd, n_pl*n_layer);
    M_.pl_model_proj = plp.mk(); M_.pl_proj_norm = V_(n_pl, 0.5f, 1.5f);
    const wt * lw[n_layer][9];
    for (int il = 0; il < n_layer; ++il) {
        const layer_def & d = defs[il];
        ggml_mk_layer & L = M_.layers[il];
        L.n_head = n_head; L.n_head_kv = 1; L.head_dim = d.hd; L.n_rot = d.hd; L.n_ff = n_ff; L.is_swa = d.swa;
        L.has_kv = d.has_kv; L.v_norm = 1; L.rope_base = d.swa ? 10000.0f : 1e6f; L.rope_scale = 1.0f;
        L.q_scale = 1.0f; L.out_scale = d.out_scale; L.rope_freqs = d.swa ? nullptr : rope_ff.data();
        lw[il][0] = &W_(d.t[0], n_embd, n_head*d.hd);
        lw[il][1] = d.has_kv ? &W_(d.t[1], n_embd, d.hd) : nullptr;
        lw[il][2] = d.has_kv ? &W_(d.t[2], n_embd, d.hd) : nullptr;
        lw[il][3] = &W_(d.t[3], n_head*d.hd, n_embd);
        lw[il][4] = &W_(d.t[4], n_embd, n_ff);
        lw[il][5] = &W_(d.t[5], n_embd, n_ff);
        lw[il][6] = &W_(d.t[6], n_ff, n_embd);
        lw[il][7] = &W_(d.t[7], n_embd, n_pl);
        lw[il][8] = &W_(d.t[8], n_pl, n_embd);
        L.wq = lw[il][0]->mk(); if (d.has_kv) { L.wk = lw[il][1]->mk(); L.wv = lw[il][2]->mk(); }
        L.wo = lw[il][3]->mk(); L.ffn_gate = lw[il][4]->mk(); L.ffn_up = lw[il][5]->mk(); L.ffn_down = lw[il][6]->mk();
        L.pl_gate = lw[il][7]->mk(); L.pl_proj = lw[il][8]->mk();
        L.attn_norm = V_(n_embd, 0.5f, 1.5f); L.q_norm = V_(d.hd, 0.5f, 1.5f); L.k_norm = V_(d.hd, 0.5f, 1.5f);
        L.attn_post_norm = V_(n_embd, 0.5f, 1.5f); L.ffn_norm = V_(n_embd, 0.5f, 1.5f);
        L.ffn_post_norm = V_(n_embd, 0.5f, 1.5f); L.pl_post_norm = V_(n_embd, 0.5f, 1.5f);
        M_.max_head_dim = std::max(M_.max_head_dim, d.hd); M_.max_q = std::max(M_.max_q, n_head*d.hd);
        M_.max_kv = std::max(M_.max_kv, d.hd); M_.max_ff = n_ff;
    }

    // KV caches: 0 = sliding window (plain V), 1 = full (transposed V); layer 2 shares layer 0's
    std::vector<half> K0((size_t) kv_size*64), V0((size_t) kv_size*64), K1((size_t) kv_size*128), V1((size_t) kv_size*128);
    auto view = [&](int il) {
        ggml_mk_kv_view v = {};
        if (defs[il].swa) { v.k = K0.data(); v.v = V0.data(); v.k_sc = 128; v.k_sh = 128; v.v_sc = 128; v.v_sh = 128; v.v_sd = 2; }
        else { v.k = K1.data(); v.v = V1.data(); v.k_sc = 256; v.k_sh = 256; v.v_sc = 2; v.v_sh = 128*kv_size*2; v.v_sd = kv_size*2; }
        return v;
    };

    const int n_tok = 18;
    std::vector<float> E((size_t) n_tok*n_embd), PE((size_t) n_tok*n_pl*n_layer);
    { std::normal_distribution<float> nd(0, 1); for (auto & x : E) x = nd(rng); for (auto & x : PE) x = nd(rng); }

    // scratch for the emulated kernel
    const int n_chunk = kv_size/M_.att_chunk + 1;
    std::vector<float> s_part((size_t) MK_M*n_head*n_chunk*(4 + M_.max_head_dim));
    std::vector<unsigned> s_cnt(MK_M*n_head, 0u);
    std::vector<float> s_x(MK_M*n_embd), s_x1(MK_M*n_embd), s_q(MK_M*M_.max_q), s_k(MK_M*M_.max_kv), s_v(MK_M*M_.max_kv), s_att(MK_M*M_.max_q),
        s_h(MK_M*n_embd), s_g(MK_M*n_ff), s_pl(MK_M*n_pl*n_layer), s_plg(MK_M*n_pl), s_lo(MK_M*n_vocab);
    unsigned bar[2] = {0, 0};
    int launches = 0;
    std::vector<float> mask0, mask1;

    auto run = [&](int p0, int M) {   // tokens p0..p0+M-1 (token i has embedding row i, position i)
        mk_dstep ds = {};
        ds.n_tokens = M;
        mask0.assign((size_t) M*kv_size, -INFINITY); mask1.assign((size_t) M*kv_size, -INFINITY);
        for (int m = 0; m < M; ++m) {
            const int pos = p0 + m;
            ds.pos[m] = pos; ds.kv_idx[0][m] = pos; ds.kv_idx[1][m] = pos;
            for (int c = 0; c <= pos; ++c) {   // ggml-mk.h: cache 0 = full attention, 1 = sliding window
                mask0[(size_t) m*kv_size + c] = 0.0f;
                if (pos - c < W) mask1[(size_t) m*kv_size + c] = 0.0f;
            }
        }
        ds.n_kv[0] = ds.n_kv[1] = kv_size;
        for (int il = 0; il < n_layer; ++il) ds.kv[il] = view(il);
        const float * masks[2] = { mask0.data(), mask1.data() };
        mk_step_chunks(ds, masks, M, M_.att_chunk, (M_.debug_flags & GGML_MK_VAR_ALL_CHUNKS) != 0);
        mk_args a = {};
        a.m = &M_; a.st = &ds; a.mask[0] = mask0.data(); a.mask[1] = mask1.data();
        a.embd = &E[(size_t) p0*n_embd]; a.pl_embd = &PE[(size_t) p0*n_pl*n_layer];
        a.xb[0] = s_x.data(); a.xb[1] = s_x1.data(); a.att_part = s_part.data(); a.att_cnt = s_cnt.data();
        a.max_head = n_head; a.n_chunk = n_chunk; a.q = s_q.data(); a.k = s_k.data(); a.v = s_v.data(); a.att = s_att.data(); a.h = s_h.data();
        a.g = s_g.data(); a.pl_in = s_pl.data(); a.pl_g = s_plg.data(); a.logits = s_lo.data();
        a.bar = bar + launches % 2; a.bar_next = bar + (launches + 1) % 2; ++launches; a.n_pl_all = n_pl*n_layer;
        std::vector<mk_mvr> mvt(mk_mv_count(n_layer));
        mk_mv_table(M_, a, mvt.data());
        a.mvt = mvt.data();
        if (!emu_launch(mk_decode_kernel, a, 2, MK_THREADS, MK_SMEM_BYTES, "mk_decode_kernel")) {
            printf("FAIL deadlock in mk_decode_kernel\n");
            exit(1);
        }
        return std::vector<float>(s_lo.begin(), s_lo.begin() + (size_t) M*n_vocab);
    };

    // reference state: K/V rows rounded to f16 like the cache
    std::vector<vd> rK[2], rV[2];
    for (int c = 0; c < 2; ++c) { rK[c].resize(kv_size); rV[c].resize(kv_size); }
    auto ref = [&](int pos) {
        vd x(n_embd); for (int k = 0; k < n_embd; ++k) x[k] = (double) E[(size_t) pos*n_embd + k]*sqrt((double) n_embd);
        vd pp = mv(plp, x);
        std::vector<vd> plin(n_layer);
        for (int il = 0; il < n_layer; ++il) {
            vd t(n_pl); for (int j = 0; j < n_pl; ++j) t[j] = pp[il*n_pl + j]/sqrt((double) n_embd);
            vd tn = rms(t, M_.pl_proj_norm, eps);
            plin[il].resize(n_pl);
            for (int j = 0; j < n_pl; ++j) plin[il][j] = (tn[j] + PE[(size_t) pos*n_pl*n_layer + il*n_pl + j]*sqrt((double) n_pl))/sqrt(2.0);
        }
        for (int il = 0; il < n_layer; ++il) {
            const ggml_mk_layer & L = M_.layers[il];
            const int hd = L.head_dim, c = L.is_swa ? 0 : 1;
            vd xn = rms(x, L.attn_norm, eps);
            vd q = mv(*lw[il][0], xn);
            if (L.has_kv) {
                vd k = mv(*lw[il][1], xn), v = mv(*lw[il][2], xn);
                vd kn = rms(k, L.k_norm, eps); rope(kn, hd, pos, L.rope_base, L.rope_freqs);
                vd vn = rms(v, nullptr, eps);
                for (auto & e : kn) e = f16r((float) e);
                for (auto & e : vn) e = f16r((float) e);
                rK[c][pos] = kn; rV[c][pos] = vn;
            }
            vd att((size_t) n_head*hd);
            for (int h = 0; h < n_head; ++h) {
                vd qh = rms(q, L.q_norm, eps, (size_t) h*hd, hd); rope(qh, hd, pos, L.rope_base, L.rope_freqs);
                std::vector<double> sc; std::vector<int> cells;
                for (int cc = 0; cc <= pos; ++cc) {
                    if (c == 0 && pos - cc >= W) continue;
                    double s = 0; for (int d = 0; d < hd; ++d) s += qh[d]*rK[c][cc][d];
                    sc.push_back(s); cells.push_back(cc);
                }
                const double mx = *std::max_element(sc.begin(), sc.end());
                double l = 0; for (auto & s : sc) { s = exp(s - mx); l += s; }
                for (size_t i = 0; i < cells.size(); ++i) for (int d = 0; d < hd; ++d) att[(size_t) h*hd + d] += sc[i]/l*rV[c][cells[i]][d];
            }
            vd h = mv(*lw[il][3], att);
            vd hn = rms(h, L.attn_post_norm, eps); for (int k = 0; k < n_embd; ++k) x[k] += hn[k];
            xn = rms(x, L.ffn_norm, eps);
            vd g = mv(*lw[il][4], xn), u = mv(*lw[il][5], xn);
            for (int k = 0; k < n_ff; ++k) g[k] = gelu(g[k])*u[k];
            h = mv(*lw[il][6], g);
            hn = rms(h, L.ffn_post_norm, eps); for (int k = 0; k < n_embd; ++k) x[k] += hn[k];
            vd pg = mv(*lw[il][7], x);
            for (int j = 0; j < n_pl; ++j) pg[j] = gelu(pg[j])*plin[il][j];
            h = mv(*lw[il][8], pg);
            hn = rms(h, L.pl_post_norm, eps); for (int k = 0; k < n_embd; ++k) x[k] = (x[k] + hn[k])*L.out_scale;
        }
        vd lo = mv(out, rms(x, M_.output_norm, eps));
        for (auto & v : lo) v = tanh(v/softcap)*softcap;
        return lo;
    };

    int fails = 0;
    double worst = 0;
    std::vector<std::vector<float>> seq;
    const int n_seq = 14;
    for (int p = 0; p < n_seq + 4; ++p) {
        std::vector<float> lo = run(p, 1);
        vd r = ref(p);
        double num = 0, den = 0;
        for (int i = 0; i < n_vocab; ++i) { num += (lo[i] - r[i])*(lo[i] - r[i]); den += r[i]*r[i]; }
        const double nmse = num/den;
        worst = std::max(worst, nmse);
        // bound: the Q4_0/Q8_0 mat-vecs round their inputs to 8 bits; the reference rounds its own (float64)
        // inputs, and an input within a last-bit difference of a rounding boundary lands on the other step
        // now and then (~1e-6); a wrong lane mapping, block or barrier costs >= 1e-3
        if (!(nmse < 1e-5)) { printf("FAIL step %d: NMSE vs float64 reference %.3g\n", p, nmse); ++fails; }
        seq.push_back(lo);
    }
    printf("%s one-token steps 0..%d (window %d crossed): worst NMSE vs float64 reference %.3g\n", fails ? "FAIL" : "OK", n_seq + 3, W, worst);

    // verify: tokens n_seq..n_seq+3 as one step; the cache rows they write hold the same values again
    std::vector<float> lo = run(n_seq, 4);
    int diff = 0;
    for (int m = 0; m < 4; ++m) diff += memcmp(&lo[(size_t) m*n_vocab], seq[n_seq + m].data(), n_vocab*sizeof(float)) != 0;
    printf("%s verify M=4: %d of 4 rows differ bitwise from one-token steps\n", diff ? "FAIL" : "OK", diff);
    fails += diff != 0;
    return fails ? 1 : 0;
}
