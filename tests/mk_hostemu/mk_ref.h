// mk_ref.h: the tiny random Gemma-4-shaped model and the independent float64 reference that the
// megakernel emulation tests share (tests/mk_hostemu/mk_kernel_emu.cpp runs the CUDA kernel on CPU
// fibers, tests/mk_hostemu/mk_metal_emu.cpp the Metal kernel through metal-emu).
//
// The model: 3 layers (sliding window of 6 with plain V, a global layer with transposed V and
// proportional rope, a sliding layer that shares layer 0's KV), per-layer inputs, final softcap; each
// driver picks the weight type of every matrix (types it supports). gemma3 = true builds the other
// shape of the plan instead: no per-layer inputs, Q scaled after rope, no V norm, V = K projection on the
// global layer (which also has a linear rope scale), the layer output scale applied after the FFN. The weights are dequantized by
// ggml's own to_float for the reference. A driver provides run(p0, M): the logits of tokens
// p0..p0+M-1 (token i has embedding row i and position i) evaluated as one step, then their hidden
// rows rmsnorm(x)*output_norm (ggml_mk_step.h_out: what an MTP draft reads); mk_ref_check runs the
// one-token steps over a sequence that crosses the window against the reference (logits and hidden
// rows) and the verify steps against the one-token steps (bitwise), printing OK/FAIL lines.
//
#pragma once

#include "ggml.h"
#include "ggml-mk.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <vector>

namespace mk_ref {

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

static float f16r(float x) { return ggml_fp16_to_fp32(ggml_fp32_to_fp16(x)); }

// ---- float64 reference ----------------------------------------------------------------------
typedef std::vector<double> vd;
// q8_inputs: Q4_0 and Q8_0 weights meet 8-bit inputs (per 32 values: d = max|x|/127, q = round(x*(1/d))),
// as in llama.cpp's mmvq (the CUDA kernel); the reference then rounds its inputs the same way for those types
// (MK_REF_Q8), and also for Q4_K and Q6_K (MK_REF_Q8 | MK_REF_KQ8: the CUDA kernel's default, mk_kq_groups)
enum { MK_REF_Q8 = 1, MK_REF_KQ8 = 2 };
static void q8_round(vd & x) {
    for (size_t b = 0; b < x.size(); b += 32) {
        float amax = 0.0f;
        for (size_t i = b; i < b + 32 && i < x.size(); ++i) amax = std::max(amax, fabsf((float) x[i]));
        const float d = amax/127.0f;
        const float id = amax == 0.0f ? 0.0f : 1.0f/d;
        for (size_t i = b; i < b + 32 && i < x.size(); ++i) x[i] = amax == 0.0f ? 0.0 : (double) nearbyintf((float) x[i]*id)*d;
    }
}
static bool q8_rounds(int q8_inputs, int type) {   // weights of this type meet 8-bit inputs
    return ((q8_inputs & MK_REF_Q8) && (type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q8_0)) ||
           ((q8_inputs & MK_REF_KQ8) && (type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K));
}
static vd mv(const wt & w, const vd & x_in, int q8_inputs) {
    vd x = x_in;
    if (q8_rounds(q8_inputs, w.type)) {
        q8_round(x);
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
static void rope(vd & v, int n_rot, int pos, double base, const float * ff, double scale = 1.0) {
    for (int i = 0; i < n_rot/2; ++i) {
        const double th = scale*pos*pow(base, -2.0*i/n_rot)/(ff ? ff[i] : 1.0);
        const double c = cos(th), s = sin(th), x0 = v[i], x1 = v[i + n_rot/2];
        v[i] = x0*c - x1*s; v[i + n_rot/2] = x0*s + x1*c;
    }
}

// ---- the model ------------------------------------------------------------------------------
static const int n_embd = 256, n_vocab = 300, n_pl = 16, n_layer = 3, kv_size = 32, W = 6;
static const int n_head = 2, n_ff = 256;
static const int n_seq = 14;           // one-token steps 0..n_seq+3
static const int n_tok = n_seq + 4;
static const double eps = 1e-6, softcap = 30.0;

// per layer: wq, wk, wv, wo, ffn_gate, ffn_up, ffn_down, pl_gate, pl_proj
struct layer_def { bool swa; int hd; bool has_kv; ggml_type t[9]; float out_scale; };

// KV caches, F16: 0 = sliding window (plain V, 64 dims), 1 = full (transposed V, 128 dims); layer 2
// shares layer 0's. Element counts of K0, V0, K1, V1:
static const size_t kv_elems[4] = { (size_t) kv_size*64, (size_t) kv_size*64, (size_t) kv_size*128, (size_t) kv_size*128 };

struct model {
    std::unique_ptr<ggml_mk_model> md;
    layer_def defs[n_layer];
    int q8_inputs = 0;   // MK_REF_Q8 | MK_REF_KQ8
    bool gemma3 = false;
    std::vector<wt> keep;
    std::vector<std::vector<float>> vecs;
    std::vector<float> rope_ff;
    const wt * out = nullptr;
    const wt * plp = nullptr;
    const wt * lw[n_layer][9] = {};
    std::vector<float> E, PE;        // token embedding rows [n_tok][n_embd], per-layer rows [n_tok][n_pl*n_layer]
    std::vector<vd> rK[2], rV[2];    // reference KV rows (rounded to f16 like the cache)

    // where layer il's K/V live, given the four cache arrays (element counts kv_elems)
    ggml_mk_kv_view view(int il, void * K0, void * V0, void * K1, void * V1) const {
        ggml_mk_kv_view v = {};
        if (defs[il].swa) { v.k = K0; v.v = V0; v.k_sc = 128; v.k_sh = 128; v.v_sc = 128; v.v_sh = 128; v.v_sd = 2; }
        else { v.k = K1; v.v = V1; v.k_sc = 256; v.k_sh = 256; v.v_sc = 2; v.v_sh = 128*kv_size*2; v.v_sd = kv_size*2; }
        return v;
    }

    // llama.cpp's masks for tokens p0..p0+M-1 (ggml-mk.h: cache 0 = full attention, 1 = sliding window)
    void masks(int p0, int M, std::vector<float> & mask0, std::vector<float> & mask1) const {
        mask0.assign((size_t) M*kv_size, -INFINITY); mask1.assign((size_t) M*kv_size, -INFINITY);
        for (int m = 0; m < M; ++m) {
            const int pos = p0 + m;
            for (int c = 0; c <= pos; ++c) {
                mask0[(size_t) m*kv_size + c] = 0.0f;
                if (pos - c < W) mask1[(size_t) m*kv_size + c] = 0.0f;
            }
        }
    }

    vd ref(int pos);
    vd ref_h;   // the hidden row rmsnorm(x)*output_norm of the last ref() (the LM head's input)
};

// builds the model with the given weight types (layer_def per layer) and output type
static void build(model & mm, const layer_def (&defs)[n_layer], ggml_type out_type, int q8_inputs, bool gemma3 = false) {
    mm.md.reset(new ggml_mk_model);
    ggml_mk_model & M_ = *mm.md;
    memset(&M_, 0, sizeof(M_));
    for (int il = 0; il < n_layer; ++il) mm.defs[il] = defs[il];
    mm.q8_inputs = q8_inputs;
    mm.gemma3 = gemma3;
    M_.version = GGML_MK_VERSION; M_.arch = GGML_MK_ARCH_GEMMA4; M_.n_layer = n_layer; M_.n_embd = n_embd;
    M_.n_vocab = n_vocab; M_.n_embd_pl = gemma3 ? 0 : n_pl; M_.kv_type = GGML_TYPE_F16; M_.norm_eps = (float) eps;
    M_.embd_scale = sqrtf((float) n_embd); M_.softcap = (float) softcap; M_.attn_factor = 1.0f; M_.kq_scale = 1.0f;
    M_.n_ctx = kv_size; M_.att_chunk = 4;   // 8 chunks: the split attention and its combine at work

    mm.keep.reserve(64);   // (references into keep stay valid)
    mm.vecs.reserve(64);
    auto W_ = [&](ggml_type t, int ne0, int ne1, float s = 1.0f) -> const wt & { mm.keep.push_back(make_w(t, ne0, ne1, s)); return mm.keep.back(); };
    auto V_ = [&](int n, float lo, float hi) -> const float * { mm.vecs.push_back(make_v(n, lo, hi)); return mm.vecs.back().data(); };

    mm.rope_ff.assign(64, 1e30f);
    for (int i = 0; i < 16; ++i) mm.rope_ff[i] = 1.0f;

    mm.out = &W_(out_type, n_embd, n_vocab, 3.0f);
    M_.output = mm.out->mk(); M_.output_norm = V_(n_embd, 0.5f, 1.5f);
    if (!gemma3) {
        mm.plp = &W_(GGML_TYPE_F32, n_embd, n_pl*n_layer);
        M_.pl_model_proj = mm.plp->mk(); M_.pl_proj_norm = V_(n_pl, 0.5f, 1.5f);
    } else {
        M_.arch = GGML_MK_ARCH_GEMMA3;
    }
    for (int il = 0; il < n_layer; ++il) {
        const layer_def & d = defs[il];
        ggml_mk_layer & L = M_.layers[il];
        const wt ** lw = mm.lw[il];
        L.n_head = n_head; L.n_head_kv = 1; L.head_dim = d.hd; L.n_rot = d.hd; L.n_ff = n_ff; L.is_swa = d.swa;
        L.has_kv = d.has_kv; L.v_norm = 1; L.rope_base = d.swa ? 10000.0f : 1e6f; L.rope_scale = 1.0f;
        L.q_scale = 1.0f; L.out_scale = d.out_scale; L.rope_freqs = d.swa ? nullptr : mm.rope_ff.data();
        if (gemma3) {
            L.q_scale = 1.0f/sqrtf((float) d.hd); L.v_norm = 0; L.v_from_k = !d.swa;
            L.rope_scale = d.swa ? 1.0f : 0.125f;
        }
        lw[0] = &W_(d.t[0], n_embd, n_head*d.hd);
        lw[1] = d.has_kv ? &W_(d.t[1], n_embd, d.hd) : nullptr;
        lw[2] = d.has_kv && !L.v_from_k ? &W_(d.t[2], n_embd, d.hd) : nullptr;
        lw[3] = &W_(d.t[3], n_head*d.hd, n_embd);
        lw[4] = &W_(d.t[4], n_embd, n_ff);
        lw[5] = &W_(d.t[5], n_embd, n_ff);
        lw[6] = &W_(d.t[6], n_ff, n_embd);
        lw[7] = gemma3 ? nullptr : &W_(d.t[7], n_embd, n_pl);
        lw[8] = gemma3 ? nullptr : &W_(d.t[8], n_pl, n_embd);
        L.wq = lw[0]->mk(); if (d.has_kv) { L.wk = lw[1]->mk(); if (lw[2]) L.wv = lw[2]->mk(); }
        L.wo = lw[3]->mk(); L.ffn_gate = lw[4]->mk(); L.ffn_up = lw[5]->mk(); L.ffn_down = lw[6]->mk();
        if (!gemma3) { L.pl_gate = lw[7]->mk(); L.pl_proj = lw[8]->mk(); }
        L.attn_norm = V_(n_embd, 0.5f, 1.5f); L.q_norm = V_(d.hd, 0.5f, 1.5f); L.k_norm = V_(d.hd, 0.5f, 1.5f);
        L.attn_post_norm = V_(n_embd, 0.5f, 1.5f); L.ffn_norm = V_(n_embd, 0.5f, 1.5f);
        L.ffn_post_norm = V_(n_embd, 0.5f, 1.5f); L.pl_post_norm = V_(n_embd, 0.5f, 1.5f);
        M_.max_head_dim = std::max(M_.max_head_dim, d.hd); M_.max_q = std::max(M_.max_q, n_head*d.hd);
        M_.max_kv = std::max(M_.max_kv, d.hd); M_.max_ff = n_ff;
    }

    mm.E.resize((size_t) n_tok*n_embd);
    mm.PE.resize((size_t) n_tok*n_pl*n_layer);
    { std::normal_distribution<float> nd(0, 1); for (auto & x : mm.E) x = nd(rng); for (auto & x : mm.PE) x = nd(rng); }
    for (int c = 0; c < 2; ++c) { mm.rK[c].assign(kv_size, vd()); mm.rV[c].assign(kv_size, vd()); }
}

// the float64 forward pass of token pos (after tokens 0..pos-1: it keeps their K/V rows)
inline vd model::ref(int pos) {
    const ggml_mk_model & M_ = *md;
    const int q8 = q8_inputs;
    vd x(n_embd); for (int k = 0; k < n_embd; ++k) x[k] = (double) E[(size_t) pos*n_embd + k]*sqrt((double) n_embd);
    std::vector<vd> plin(n_layer);
    if (!gemma3) {
        vd pp = mv(*plp, x, q8);
        for (int il = 0; il < n_layer; ++il) {
            vd t(n_pl); for (int j = 0; j < n_pl; ++j) t[j] = pp[il*n_pl + j]/sqrt((double) n_embd);
            vd tn = rms(t, M_.pl_proj_norm, eps);
            plin[il].resize(n_pl);
            for (int j = 0; j < n_pl; ++j) plin[il][j] = (tn[j] + PE[(size_t) pos*n_pl*n_layer + il*n_pl + j]*sqrt((double) n_pl))/sqrt(2.0);
        }
    }
    for (int il = 0; il < n_layer; ++il) {
        const ggml_mk_layer & L = M_.layers[il];
        const int hd = L.head_dim, c = L.is_swa ? 0 : 1;
        vd xn = rms(x, L.attn_norm, eps);
        vd q = mv(*lw[il][0], xn, q8);
        if (L.has_kv) {
            vd k = mv(*lw[il][1], xn, q8), v = L.v_from_k ? k : mv(*lw[il][2], xn, q8);
            vd kn = rms(k, L.k_norm, eps); rope(kn, hd, pos, L.rope_base, L.rope_freqs, L.rope_scale);
            vd vn = L.v_norm ? rms(v, nullptr, eps) : v;
            for (auto & e : kn) e = f16r((float) e);
            for (auto & e : vn) e = f16r((float) e);
            rK[c][pos] = kn; rV[c][pos] = vn;
        }
        vd att((size_t) n_head*hd);
        for (int h = 0; h < n_head; ++h) {
            vd qh = rms(q, L.q_norm, eps, (size_t) h*hd, hd); rope(qh, hd, pos, L.rope_base, L.rope_freqs, L.rope_scale);
            for (auto & e : qh) e *= L.q_scale;
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
        vd h = mv(*lw[il][3], att, q8);
        vd hn = rms(h, L.attn_post_norm, eps); for (int k = 0; k < n_embd; ++k) x[k] += hn[k];
        xn = rms(x, L.ffn_norm, eps);
        vd g = mv(*lw[il][4], xn, q8), u = mv(*lw[il][5], xn, q8);
        for (int k = 0; k < n_ff; ++k) g[k] = gelu(g[k])*u[k];
        h = mv(*lw[il][6], g, q8);
        hn = rms(h, L.ffn_post_norm, eps); for (int k = 0; k < n_embd; ++k) x[k] += hn[k];
        if (gemma3) {
            for (auto & e : x) e *= L.out_scale;
            continue;
        }
        vd pg = mv(*lw[il][7], x, q8);
        for (int j = 0; j < n_pl; ++j) pg[j] = gelu(pg[j])*plin[il][j];
        h = mv(*lw[il][8], pg, q8);
        hn = rms(h, L.pl_post_norm, eps); for (int k = 0; k < n_embd; ++k) x[k] = (x[k] + hn[k])*L.out_scale;
    }
    ref_h = rms(x, M_.output_norm, eps);
    vd lo = mv(*out, ref_h, q8);
    for (auto & v : lo) v = tanh(v/softcap)*softcap;
    return lo;
}

// run(p0, M): [M][n_vocab] logits, then [M][n_embd] hidden rows
typedef std::function<std::vector<float>(int p0, int M)> run_fn;

// one-token steps 0..n_seq+3 vs the reference (NMSE < nmse_bound, logits and hidden rows), then for every M in
// verify_m one step of the last M tokens: its rows (logits and hidden) must equal the one-token steps bitwise.
// Returns the failures.
static int check(model & mm, const run_fn & run, double nmse_bound, const std::vector<int> & verify_m, double * worst_out = nullptr) {
    int fails = 0, fails_h = 0;
    double worst = 0, worst_h = 0;
    std::vector<std::vector<float>> seq;
    auto nmse_of = [](const float * x, const vd & r, int n) {
        double num = 0, den = 0;
        for (int i = 0; i < n; ++i) { num += (x[i] - r[i])*(x[i] - r[i]); den += r[i]*r[i]; }
        return num/den;
    };
    for (int p = 0; p < n_tok; ++p) {
        std::vector<float> lo = run(p, 1);
        vd r = mm.ref(p);
        const double nmse = nmse_of(lo.data(), r, n_vocab);
        if (!(nmse <= worst)) worst = nmse;   // (a NaN stays)
        if (!(nmse < nmse_bound)) { printf("FAIL step %d: NMSE vs float64 reference %.3g\n", p, nmse); ++fails; }
        const double nmse_h = nmse_of(lo.data() + n_vocab, mm.ref_h, n_embd);
        if (!(nmse_h <= worst_h)) worst_h = nmse_h;
        if (!(nmse_h < nmse_bound)) { printf("FAIL step %d: hidden row NMSE vs float64 reference %.3g\n", p, nmse_h); ++fails_h; }
        seq.push_back(lo);
    }
    printf("%s one-token steps 0..%d (window %d crossed): worst NMSE vs float64 reference %.3g\n", fails ? "FAIL" : "OK", n_tok - 1, W, worst);
    printf("%s hidden rows (rmsnorm(x)*output_norm), one-token steps: worst NMSE vs float64 reference %.3g\n", fails_h ? "FAIL" : "OK", worst_h);
    fails += fails_h;
    if (worst_out) *worst_out = worst;

    // verify: the last M tokens as one step; the cache rows they write hold the same values again
    for (int M : verify_m) {
        const int p0 = n_tok - M;
        std::vector<float> lo = run(p0, M);
        int diff = 0, diff_h = 0;
        for (int m = 0; m < M; ++m) {
            diff   += memcmp(&lo[(size_t) m*n_vocab], seq[p0 + m].data(), n_vocab*sizeof(float)) != 0;
            diff_h += memcmp(&lo[(size_t) M*n_vocab + (size_t) m*n_embd], seq[p0 + m].data() + n_vocab, n_embd*sizeof(float)) != 0;
        }
        printf("%s verify M=%d: %d of %d rows differ bitwise from one-token steps\n", diff ? "FAIL" : "OK", M, diff, M);
        printf("%s verify M=%d: %d of %d hidden rows differ bitwise from one-token steps\n", diff_h ? "FAIL" : "OK", M, diff_h, M);
        fails += diff != 0 || diff_h != 0;
    }
    return fails;
}

} // namespace mk_ref
