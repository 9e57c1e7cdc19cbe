// mk_draft_ref.h: the float64 reference of k chained MTP draft steps (issue 14), read from the backend-neutral draft
// plan (megakernel/ggml-mk.h: ggml_mk_draft, ggml_mk_draft_step) in host memory, as the pinned
// src/models/gemma4-assistant.cpp computes one step and common/speculative.cpp (draft-mtp, a shared-KV assistant)
// chains them: every step at the same position and KV cells, step j+1 fed step j's argmax and h_next.
//
// Shared by the tests that check a fused draft: megakernel/tests/test-mk-draft.cpp (llama.cpp's own assistant graph on
// the CPU: the plan comes from llama-mk.cpp, the caches are llama.cpp's) and the host emulations of the kernels. The
// weights are dequantized by ggml's own to_float; the KV rows are the cache's F16 values; the rest is double. The
// element-wise helpers (rms norm, NEOX rope, gelu) are mk_ref.h's, the megakernel reference's.
#pragma once

#include "mk_ref.h"

#include <map>

namespace mk_draft_ref {

typedef std::vector<double> vd;

struct result {
    std::vector<int32_t> tokens;   // [k] argmax of each step (the first index of the largest logit)
    std::vector<vd>      logits;   // [k][n_vocab]
    std::vector<vd>      h;        // [k][n_embd_bb] h_next of each step
    std::vector<double>  margin;   // [k] the largest logit minus the second largest
};

// a plan's matrices dequantized once (by ggml's to_float), keyed by their address; q8_inputs (mk_ref::MK_REF_*): the
// types whose weights meet inputs rounded to 8 bits per 32 values, as the CUDA kernel's integer dot products do
// (mk_ref::q8_round, mk_ref::q8_rounds)
struct weights {
    std::map<const void *, std::vector<float>> f;
    int q8_inputs = 0;

    const std::vector<float> & get(const ggml_mk_weight & w) {
        auto it = f.find(w.data);
        if (it != f.end()) {
            return it->second;
        }
        std::vector<float> & out = f[w.data];
        out.resize((size_t) w.ne0*w.ne1);
        for (int r = 0; r < w.ne1; ++r) {
            row(w, r, out.data() + (size_t) r*w.ne0);
        }
        return out;
    }

    static void row(const ggml_mk_weight & w, int r, float * out) {
        const uint8_t * src = (const uint8_t *) w.data + (size_t) r*w.nb1;
        if (w.type == GGML_TYPE_F32) {
            memcpy(out, src, (size_t) w.ne0*sizeof(float));
        } else {
            ggml_get_type_traits((ggml_type) w.type)->to_float(src, out, w.ne0);
        }
    }

    vd mv(const ggml_mk_weight & w, const vd & x_in) {
        const std::vector<float> & m = get(w);
        vd x = x_in;
        if (mk_ref::q8_rounds(q8_inputs, w.type)) {
            mk_ref::q8_round(x);
        }
        vd y(w.ne1, 0.0);
        for (int r = 0; r < w.ne1; ++r) {
            const float * wr = m.data() + (size_t) r*w.ne0;
            double acc = 0.0;
            for (int c = 0; c < w.ne0; ++c) {
                acc += (double) wr[c]*x[c];
            }
            y[r] = acc;
        }
        return y;
    }
};

static double f16_at(const void * base, int64_t off) {
    return (double) ggml_fp16_to_fp32(*(const ggml_fp16_t *) ((const char *) base + off));
}

// one step of the assistant: token t, the target's (or the previous step's) hidden row h
static void step(weights & W, const ggml_mk_draft & p, const ggml_mk_draft_step & st, int32_t t, const vd & h, vd & logits,
                 vd & h_next) {
    const double eps = p.norm_eps;
    std::vector<float> e(p.n_embd_bb);
    weights::row(p.tok_embd, t, e.data());
    vd xh(2*p.n_embd_bb);
    for (int i = 0; i < p.n_embd_bb; ++i) {
        xh[i] = (double) e[i]*p.embd_scale;
        xh[p.n_embd_bb + i] = h[i];
    }
    vd cur = W.mv(p.pre, xh);

    for (int il = 0; il < p.n_layer; ++il) {
        const ggml_mk_layer & L = p.layers[il];
        const ggml_mk_kv_view & kv = st.kv[il];
        const int c = L.is_swa ? 1 : 0;
        const int hd = L.head_dim;
        const int gqa = L.n_head/L.n_head_kv;

        vd q = W.mv(L.wq, mk_ref::rms(cur, L.attn_norm, eps));
        vd att((size_t) L.n_head*hd, 0.0);
        for (int hh = 0; hh < L.n_head; ++hh) {
            vd qh = mk_ref::rms(q, L.q_norm, eps, (size_t) hh*hd, hd);
            mk_ref::rope(qh, L.n_rot, st.pos, L.rope_base, L.rope_freqs, L.rope_scale);
            for (int i = 0; i < L.n_rot; ++i) {
                qh[i] *= p.attn_factor;
            }
            const int hk = hh/gqa;
            std::vector<double> s;
            std::vector<int> cells;
            for (int cc = 0; cc < st.n_kv[c]; ++cc) {
                const float m = st.mask[c][cc];
                if (m == -INFINITY) {
                    continue;
                }
                double dot = 0.0;
                for (int i = 0; i < hd; ++i) {
                    dot += qh[i]*f16_at(kv.k, cc*kv.k_sc + hk*kv.k_sh + 2*i);
                }
                s.push_back(dot*p.kq_scale + m);
                cells.push_back(cc);
            }
            if (cells.empty()) {
                continue;   // (no cell seen: llama.cpp's softmax of an all -INF row; not a live decode state)
            }
            const double mx = *std::max_element(s.begin(), s.end());
            double l = 0.0;
            for (double & v : s) {
                v = exp(v - mx);
                l += v;
            }
            for (size_t j = 0; j < cells.size(); ++j) {
                for (int i = 0; i < hd; ++i) {
                    att[(size_t) hh*hd + i] += s[j]/l*f16_at(kv.v, cells[j]*kv.v_sc + hk*kv.v_sh + i*kv.v_sd);
                }
            }
        }
        vd a = mk_ref::rms(W.mv(L.wo, att), L.attn_post_norm, eps);
        for (int i = 0; i < p.n_embd; ++i) {
            a[i] += cur[i];
        }
        const vd f = mk_ref::rms(a, L.ffn_norm, eps);
        vd g = W.mv(L.ffn_gate, f);
        const vd u = W.mv(L.ffn_up, f);
        for (int i = 0; i < L.n_ff; ++i) {
            g[i] = mk_ref::gelu(g[i])*u[i];
        }
        const vd o = mk_ref::rms(W.mv(L.ffn_down, g), L.ffn_post_norm, eps);
        for (int i = 0; i < p.n_embd; ++i) {
            cur[i] = (o[i] + a[i])*L.out_scale;
        }
    }
    const vd n = mk_ref::rms(cur, p.output_norm, eps);
    logits = W.mv(p.output, n);
    h_next = W.mv(p.post, n);
}

// st.k chained steps from (st.token, st.h)
static result run(weights & W, const ggml_mk_draft & p, const ggml_mk_draft_step & st) {
    result r;
    vd h(st.h, st.h + p.n_embd_bb);
    int32_t t = st.token;
    for (int j = 0; j < st.k; ++j) {
        vd lo, hn;
        step(W, p, st, t, h, lo, hn);
        int a = 0;
        for (int i = 1; i < p.n_vocab; ++i) {
            a = lo[i] > lo[a] ? i : a;
        }
        double second = -INFINITY;
        for (int i = 0; i < p.n_vocab; ++i) {
            second = i != a ? std::max(second, lo[i]) : second;
        }
        r.tokens.push_back(a);
        r.margin.push_back(lo[a] - second);
        r.logits.push_back(lo);
        r.h.push_back(hn);
        t = a;
        h = hn;
    }
    return r;
}

} // namespace mk_draft_ref
