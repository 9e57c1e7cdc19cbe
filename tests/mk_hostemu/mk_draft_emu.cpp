// Host emulation of the fused MTP draft (issue 14): the CUDA megakernel's own source (megakernel/cuda/mk-kernel.cuh
// through cuda_emu.h) in a draft launch (mk_draft_kernel: k chained steps of the assistant in one launch, each a decode
// step of the plan ggml_mk_draft_model makes of it, between the in-kernel pre-projection of concat(tok_embd[t]*scale, h)
// and the post-projection h_next = post*n + argmax), against the float64 draft reference (mk_draft_ref.h), on a tiny
// random gemma4-assistant-shaped draft plan (ggml_mk_draft) and random F16 target caches, at several positions across
// the sliding window. Checks (OK/FAIL lines, exit 1 on a failure): draft tokens == the reference's, and the logits and
// h_next of every step within NMSE 1e-8 of it (measured: ~1.5e-10) (compared while the chains agree).
// `--planted` runs with the grid barriers off (GGML_MK_DEBUG_NO_GRID_BARRIER): that must fail. `--variant BITS`: with kernel
// variants on (ggml-mk.h GGML_MK_VAR_*; the draft shares the decode step's layer phases).
#define GGML_COMMON_DECL_C
#define GGML_COMMON_IMPL_C
#include "ggml-common.h"

#include "cuda_emu.h"
#include "mk-kernel.cuh"

#include "mk_draft_ref.h"

#include <cstdio>
#include <cstdlib>
#include <string>

using mk_ref::wt;
using mk_ref::make_w;
using mk_ref::make_v;

// the emulation launches kernels of one argument
struct draft_launch {
    mk_args               a;
    const mk_draft_args * da;
};
static void draft_entry(const draft_launch l) {
    mk_draft_kernel(l.a, l.da);
}

static const int n_embd = 64, n_embd_bb = 128, n_vocab = 301, n_ff = 256, n_layer = 2, kv_size = 32, W = 6, k_steps = 4;

int main(int argc, char ** argv) {
    bool planted = false;
    int variant = 0;
    for (int i = 1; i < argc; ++i) {
        if (std::string(argv[i]) == "--planted") {
            planted = true;
        } else if (std::string(argv[i]) == "--variant" && i + 1 < argc) {
            variant = (int) strtol(argv[++i], nullptr, 0);
        } else {
            fprintf(stderr, "usage: %s [--planted] [--variant BITS]\n", argv[0]);
            return 2;
        }
    }
    // the draft plan: layer 0 sliding window (64-dim heads, plain V), layer 1 global (128-dim heads, transposed V,
    // proportional rope); weight types whose inputs the kernel keeps in f32 (Q4_0/Q8_0 meet 8-bit inputs: that rounding
    // is the megakernel test's, mk_kernel_emu.cpp)
    std::vector<wt> keep;
    std::vector<std::vector<float>> vecs;
    keep.reserve(32);
    vecs.reserve(32);
    auto Wt = [&](ggml_type t, int ne0, int ne1, float s = 1.0f) -> ggml_mk_weight { keep.push_back(make_w(t, ne0, ne1, s)); return keep.back().mk(); };
    auto Vv = [&](int n, float lo, float hi) -> const float * { vecs.push_back(make_v(n, lo, hi)); return vecs.back().data(); };
    std::vector<float> rope_ff(64, 1e30f);
    for (int i = 0; i < 16; ++i) rope_ff[i] = 1.0f;

    ggml_mk_draft d = {};
    d.version = GGML_MK_DRAFT_VERSION; d.n_layer = n_layer; d.n_embd = n_embd; d.n_embd_bb = n_embd_bb; d.n_vocab = n_vocab;
    d.max_ff = n_ff; d.k_max = k_steps; d.kv_type = GGML_TYPE_F16; d.norm_eps = 1e-6f; d.embd_scale = sqrtf((float) n_embd_bb); d.kq_scale = 1.0f;
    d.attn_factor = 1.0f; d.tok_embd_host = 1;
    d.tok_embd = Wt(GGML_TYPE_Q8_0, n_embd_bb, n_vocab);   // the target's token embeddings (host glue here)
    d.pre      = Wt(GGML_TYPE_F16, 2*n_embd_bb, n_embd);
    d.post     = Wt(GGML_TYPE_F16, n_embd, n_embd_bb);
    // Q8_0 as the real assistants' tied LM head: one block pair per row, 30 rows per weight tile (one lane each), the
    // 301 rows ending in a part-filled tile. (Q4_0/Q8_0 rows inside the layers would chain the kernel's 8-bit rounding
    // of float sums into the next steps, where a value at a rounding boundary in float vs double moves the NMSE past
    // this test's bound; the decode emulation covers those)
    d.output   = Wt(GGML_TYPE_Q8_0, n_embd, n_vocab, 3.0f);
    d.output_norm = Vv(n_embd, 0.5f, 1.5f);
    const int hd[n_layer] = { 64, 128 };
    const ggml_type ty[n_layer][5] = {   // wq, wo, gate, up, down
        { GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q5_0, GGML_TYPE_F16,  GGML_TYPE_Q4_K },
        { GGML_TYPE_Q5_0, GGML_TYPE_F32,  GGML_TYPE_BF16, GGML_TYPE_Q5_0, GGML_TYPE_Q6_K },
    };
    for (int il = 0; il < n_layer; ++il) {
        ggml_mk_layer & L = d.layers[il];
        L.n_head = 2; L.n_head_kv = 1; L.head_dim = hd[il]; L.n_rot = hd[il]; L.n_ff = n_ff; L.is_swa = il == 0;
        L.q_scale = 1.0f; d.kv_layer[il] = il; L.rope_base = il == 0 ? 10000.0f : 1e6f; L.rope_scale = 1.0f; L.out_scale = il == 0 ? 0.8f : 1.25f;   // (the last layer's is invisible: the final norm undoes it)
        L.rope_freqs = il == 0 ? nullptr : rope_ff.data();
        L.wq = Wt(ty[il][0], n_embd, L.n_head*L.head_dim); L.wo = Wt(ty[il][1], L.n_head*L.head_dim, n_embd);
        L.ffn_gate = Wt(ty[il][2], n_embd, n_ff); L.ffn_up = Wt(ty[il][3], n_embd, n_ff); L.ffn_down = Wt(ty[il][4], n_ff, n_embd);
        L.attn_norm = Vv(n_embd, 0.5f, 1.5f); L.q_norm = Vv(L.head_dim, 0.5f, 1.5f); L.attn_post_norm = Vv(n_embd, 0.5f, 1.5f);
        L.ffn_norm = Vv(n_embd, 0.5f, 1.5f); L.ffn_post_norm = Vv(n_embd, 0.5f, 1.5f);
        d.max_q = std::max(d.max_q, L.n_head*L.head_dim);
    }
    d.debug_flags = (planted ? GGML_MK_DEBUG_NO_GRID_BARRIER : 0) | variant;

    // the target's caches, random F16 rows: cache 1 (sliding window) plain V, cache 0 (full attention) transposed V
    std::vector<half> K[2], V[2];
    ggml_mk_kv_view view[n_layer] = {};
    {
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (int il = 0; il < n_layer; ++il) {
            const int c = d.layers[il].is_swa ? 1 : 0;
            K[c].resize((size_t) kv_size*hd[il]);
            V[c].resize((size_t) kv_size*hd[il]);
            for (auto & x : K[c]) x = __float2half(nd(mk_ref::rng));
            for (auto & x : V[c]) x = __float2half(nd(mk_ref::rng));
            ggml_mk_kv_view & v = view[il];
            v.k = K[c].data(); v.v = V[c].data(); v.k_sc = 2*hd[il]; v.k_sh = 2*hd[il];
            if (c == 1) { v.v_sc = 2*hd[il]; v.v_sh = 2*hd[il]; v.v_sd = 2; }
            else        { v.v_sc = 2; v.v_sh = 2*kv_size*hd[il]; v.v_sd = 2*kv_size; }
        }
    }

    ggml_mk_model md = {};
    d.n_ctx = kv_size;
    ggml_mk_draft_model(&d, &md);

    // scratch for the emulated kernel (one token)
    const int n_chunk = kv_size/md.att_chunk + 1;
    std::vector<float> s_part((size_t) MK_M*2*n_chunk*(4 + md.max_head_dim));
    std::vector<unsigned> s_cnt(MK_M*2, 0u);
    std::vector<float> s_x(MK_M*n_embd), s_x1(MK_M*n_embd), s_q(MK_M*md.max_q), s_att(MK_M*md.max_q), s_h(MK_M*n_embd),
        s_g(MK_M*n_ff), s_lo(MK_M*n_vocab), s_hid(MK_M*n_embd), s_kv(MK_M*32), s_xh(2*n_embd_bb), s_hn(k_steps*n_embd_bb),
        s_lall(k_steps*n_vocab);
    std::vector<int32_t> s_tok(k_steps);
    // three blocks: the vocabulary's slices of the blocks' partial picks are uneven, and the draft is reduced from three
    const int grid = 3;
    std::vector<float> s_pick_v(grid);
    std::vector<unsigned> s_pick_i(grid);
    std::vector<uint8_t> s_rec;   // inputs staged once for the grid (mk_args.xrec), sized at the first launch
    unsigned bar[2] = {0, 0};
    int launches = 0;
    const int smem = 3*MK_WARPS*MK_STAGE_BYTES + 2*8*(int) MK_XS_GROUP + 2*8*MK_XQ_REC;
    mk_draft_ref::weights Wr;
    Wr.q8_inputs = mk_ref::MK_REF_Q8 | mk_ref::MK_REF_KQ8;   // (the kernel's Q4_0/Q8_0/Q4_K/Q6_K dot products take 8-bit inputs)
    int n_packed = 0;

    int fails = 0, n_same = 0, n_steps = 0, n_fold = 0;
    double worst_lo = 0, worst_h = 0;
    for (int pos : { 3, 9, 17, 31 }) {
        // the draft query at pos sees the cells of positions 0..pos-1 (cell = position), the window the last W of them
        std::vector<float> mask[2];
        mask[0].assign(kv_size, -INFINITY);
        mask[1].assign(kv_size, -INFINITY);
        for (int c = 0; c < pos; ++c) {
            mask[0][c] = 0.0f;
            mask[1][c] = pos - c < W ? 0.0f : -INFINITY;
        }
        std::vector<float> h0(n_embd_bb);
        {
            std::normal_distribution<float> nd(0.0f, 1.0f);
            for (auto & x : h0) x = nd(mk_ref::rng);
        }
        ggml_mk_draft_step st = {};
        st.k = k_steps; st.token = (pos*37) % n_vocab; st.pos = pos; st.h = h0.data();
        st.n_kv[0] = st.n_kv[1] = kv_size; st.mask[0] = mask[0].data(); st.mask[1] = mask[1].data();
        for (int il = 0; il < n_layer; ++il) st.kv[il] = view[il];
        const mk_draft_ref::result r = mk_draft_ref::run(Wr, d, st);

        // one launch: the k steps in the kernel (mk_draft_kernel)
        mk_draft_args da = {};
        da.tok_embd = d.tok_embd; da.embd_scale = d.embd_scale; da.n_embd_bb = n_embd_bb; da.k = k_steps; da.token = st.token;
        da.h = h0.data(); da.xh = s_xh.data(); da.h_next = s_hn.data(); da.tokens = s_tok.data(); da.logits = s_lall.data();
        da.pick_v = s_pick_v.data(); da.pick_i = s_pick_i.data();
        mk_dstep ds = {};
        ds.n_tokens = 1; ds.pos[0] = pos; ds.n_kv[0] = ds.n_kv[1] = kv_size;
        for (int il = 0; il < n_layer; ++il) ds.kv[il] = view[il];
        const float * masks[2] = { mask[0].data(), mask[1].data() };
        mk_step_chunks(ds, masks, 1, md.att_chunk, md.debug_flags);
        mk_args a = {};
        a.m = &md; a.st = &ds; a.mask[0] = mask[0].data(); a.mask[1] = mask[1].data();
        a.xb[0] = s_x.data(); a.xb[1] = s_x1.data(); a.att_part = s_part.data(); a.att_cnt = s_cnt.data();
        a.max_head = 2; a.n_chunk = n_chunk; a.q = s_q.data(); a.k = s_kv.data(); a.v = s_kv.data(); a.att = s_att.data();
        a.h = s_h.data(); a.g = s_g.data(); a.logits = s_lo.data(); a.h_out = s_hid.data();
        a.xrec_k = mk_xrec_k(md, n_embd_bb); if (s_rec.empty()) s_rec.assign((size_t) MK_M*(a.xrec_k/32)*MK_XQ_REC, 0); a.xrec = s_rec.data();
        a.bar = bar + launches % 2; a.bar_next = bar + (launches + 1) % 2; ++launches;
        std::vector<mk_mvr> mvt(mk_mv_draft_count(n_layer, k_steps));
        mk_mv_table_draft(d, md, a, da, mvt.data());
        a.mvt = mvt.data();
        n_packed = 0;   // (one-job mat-vecs here: job 0 is the whole of each)
        for (const mk_mvr & R : mvt) {
            n_packed += R.units && R.j[0].rpt > 1;
        }
        const mk_smem L = mk_smem_plan(mvt.data(), (int) mvt.size(), 1, smem, MK_NS_MIN, mk_att_bytes(md));
        if (L.ns == 0) {
            printf("FAIL the draft's mat-vecs do not fit in %d bytes of shared memory\n", smem);
            return 1;
        }
        a.xs_bytes = L.xs_bytes; a.xq_bytes = L.xq_bytes; a.ns = L.ns;
        for (int il = 0; il < n_layer; ++il) {   // (GGML_MK_VAR_FOLD_HEADS: the layers whose attention computes Q itself)
            n_fold += (md.debug_flags & GGML_MK_VAR_FOLD_HEADS) && !(md.debug_flags & GGML_MK_VAR_DEVICE_ATT) &&
                      mk_fold_plan(md.layers[il], 1, ds.n_ch[md.layers[il].is_swa ? 1 : 0], md.max_head_dim, L.xs_bytes + L.xq_bytes).fits;
        }
        if (!emu_launch(draft_entry, draft_launch{ a, &da }, grid, MK_THREADS, smem, "mk_draft_kernel")) {
            printf("FAIL deadlock in mk_draft_kernel\n");
            return 1;
        }

        // vs the reference's steps, while the chains agree
        std::vector<int> toks(s_tok.begin(), s_tok.begin() + k_steps);
        for (int j = 0; j < k_steps; ++j) {
            ++n_steps;
            const float * lo = s_lall.data() + (size_t) j*n_vocab;
            const float * hn = s_hn.data() + (size_t) j*n_embd_bb;
            double num = 0, den = 0, num_h = 0, den_h = 0;
            for (int i = 0; i < n_vocab; ++i) { num += (lo[i] - r.logits[j][i])*(lo[i] - r.logits[j][i]); den += r.logits[j][i]*r.logits[j][i]; }
            for (int i = 0; i < n_embd_bb; ++i) { num_h += (hn[i] - r.h[j][i])*(hn[i] - r.h[j][i]); den_h += r.h[j][i]*r.h[j][i]; }
            const double e_lo = std::isfinite(num/den) ? num/den : INFINITY, e_h = std::isfinite(num_h/den_h) ? num_h/den_h : INFINITY;
            worst_lo = std::max(worst_lo, e_lo);
            worst_h = std::max(worst_h, e_h);
            const bool same = toks[j] == r.tokens[j];
            n_same += same;
            if (!same || !(e_lo < 1e-8) || !(e_h < 1e-8)) {
                printf("FAIL pos %d step %d: kernel drafts %d, the reference %d (margin %.3g); NMSE logits %.3g, h_next %.3g\n",
                       pos, j, toks[j], r.tokens[j], r.margin[j], e_lo, e_h);
                ++fails;
            }
            if (!same) {
                break;   // (the chains part)
            }
        }
        printf("pos %d: kernel drafts", pos);
        for (int x : toks) printf(" %d", x);
        printf("; reference");
        for (int x : r.tokens) printf(" %d", x);
        printf("\n");
    }
    printf("%s the fused draft (mk_draft_kernel, one launch of k steps), 4 positions x k=%d (window %d crossed): "
           "%d of %d steps draft the reference's token; worst NMSE vs float64 %.3g (logits), %.3g (h_next)\n",
           fails ? "FAIL" : "OK", k_steps, W, n_same, n_steps, worst_lo, worst_h);
    printf("mat-vecs in tiles of several rows: %d\n", n_packed);
    if (variant & GGML_MK_VAR_FOLD_HEADS) {
        printf("heads folded into the attention: %d of %d layer launches (each for its k steps)\n", n_fold, 4*n_layer);
    }
    return fails ? 1 : 0;
}
