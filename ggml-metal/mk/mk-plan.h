// mk-plan.h: the device-side plan of the Metal Gemma decode megakernel (ggml-metal/mk/mk-kernel.metal),
// shared by the kernel (MSL 3.2) and the host code that derives it from a ggml_mk_model
// (megakernel/ggml-mk.h). One source of truth for the layout; the limits come from ggml-mk.h.
//
// MSL cannot take the host plan's raw pointers, so everything the kernel reads or writes is a byte
// offset into one of a few bound buffers (a kernel binds at most 31):
//
//   buffer(MK_MTL_B_PLAN)     mk_mtl_plan: shapes, weight/norm references, scratch offsets (per model)
//   buffer(MK_MTL_B_STEP)     mk_mtl_step, followed by the step's masks and embedding rows (per step)
//   buffer(MK_MTL_B_W0 + i)   weight buffer i < MK_MTL_N_WBUF (llama.cpp's model buffers, read in place)
//   buffer(MK_MTL_B_KV0 + i)  KV cache buffer i < MK_MTL_N_KVBUF (llama.cpp's own cache tensors)
//   buffer(MK_MTL_B_SCRATCH)  scratch (activations; layout in the plan)
//   buffer(MK_MTL_B_BAR)      grid barrier state: two atomic_uint, zero once (grid-barrier.h)
//   buffer(MK_MTL_B_DRAFT)    the fused MTP draft only (kernel_mk_draft): mk_mtl_draft, the launch's k and token
//   buffer(MK_MTL_B_TOK)      the fused MTP draft only: the target's token embeddings (a copy, or its Metal buffer)
//
// A weight or vector is (buffer slot, byte offset); the host maps every address of the ggml_mk_model
// to the bound buffer that contains it, as ggml-metal maps tensor addresses to MTLBuffers.
#pragma once

#include "ggml-mk.h"

#define MK_MTL_N_WBUF   4
#define MK_MTL_N_KVBUF  2

#define MK_MTL_B_PLAN    0
#define MK_MTL_B_STEP    1
#define MK_MTL_B_W0      2
#define MK_MTL_B_KV0     (MK_MTL_B_W0 + MK_MTL_N_WBUF)
#define MK_MTL_B_SCRATCH (MK_MTL_B_KV0 + MK_MTL_N_KVBUF)
#define MK_MTL_B_BAR     (MK_MTL_B_SCRATCH + 1)
#define MK_MTL_N_BUF     (MK_MTL_B_BAR + 1)
#define MK_MTL_B_DRAFT   MK_MTL_N_BUF
#define MK_MTL_B_TOK     (MK_MTL_B_DRAFT + 1)

// simdgroups per threadgroup (threads: 32x); the launch has as many threadgroups as the device keeps
// co-resident at this size (never more: grid-barrier.h)
#ifndef MK_MTL_NSG
#define MK_MTL_NSG 8
#endif
#define MK_MTL_THREADS (MK_MTL_NSG*32)

// head vectors are held in registers, 32 lanes x MK_MTL_HD_REGS values
#define MK_MTL_HD_REGS (GGML_MK_MAX_HEAD_DIM/32)

// planted bug for the tests (Metal only; GGML_MK_DEBUG_NO_GRID_BARRIER removes the barrier): the
// grid barrier's arrive/spin without its device-scope fences (the naive barrier)
#define MK_MTL_DEBUG_BARRIER_NO_FENCES 0x10000
// planted bugs of the fused draft (kernel_mk_draft): every step reads the launch's h instead of the step before's
// h_next; the last threadgroup's partial pick left out of the argmax
#define MK_MTL_DEBUG_DRAFT_H_UNCHAINED  0x20000
#define MK_MTL_DEBUG_DRAFT_PICK_DROPPED 0x40000

// the weight types the kernel decodes (enum ggml_type numbers; the host side checks them against ggml.h)
#define MK_MTL_TYPE_F32   0
#define MK_MTL_TYPE_F16   1
#define MK_MTL_TYPE_Q4_0  2
#define MK_MTL_TYPE_Q5_0  6
#define MK_MTL_TYPE_Q8_0  8
#define MK_MTL_TYPE_Q4_K  12
#define MK_MTL_TYPE_Q6_K  14
#define MK_MTL_TYPE_BF16  30
#define MK_MTL_TYPE_STQ1_0 43

// a matrix: row r (of ne1) starts at byte off + r*nb1 of weight buffer buf and holds ne0 values of type
typedef struct {
    uint64_t off;
    int32_t  buf;     // weight buffer slot; -1 = absent
    int32_t  type;    // enum ggml_type
    int32_t  ne0;
    int32_t  ne1;
    uint64_t nb1;
} mk_mtl_w;

// a float vector in a weight buffer (norm weights, rope frequency factors)
typedef struct {
    uint64_t off;
    int32_t  buf;     // -1 = absent
    int32_t  pad;
} mk_mtl_v;

typedef struct {
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t n_rot;
    int32_t n_ff;
    int32_t is_swa;
    int32_t has_kv;
    int32_t v_from_k;
    int32_t v_norm;
    int32_t pad0;
    float   rope_base;
    float   rope_scale;
    float   q_scale;
    float   out_scale;
    mk_mtl_v rope_freqs;

    mk_mtl_w wq, wk, wv, wo;
    mk_mtl_w ffn_gate, ffn_up, ffn_down;
    mk_mtl_w pl_gate, pl_proj;

    mk_mtl_v attn_norm, q_norm, k_norm, attn_post_norm, ffn_norm, ffn_post_norm, pl_post_norm;
} mk_mtl_layer;

typedef struct {
    int32_t arch;
    int32_t n_layer;
    int32_t n_embd;
    int32_t n_vocab;
    int32_t n_embd_pl;
    int32_t n_pl_all;      // n_embd_pl*n_layer
    int32_t max_head;      // max n_head over layers
    int32_t max_head_dim;
    int32_t max_q;
    int32_t max_kv;
    int32_t max_ff;
    int32_t n_ctx;
    int32_t att_chunk;
    int32_t n_chunk;       // chunks of a context: ceil(n_ctx/att_chunk)
    int32_t debug_flags;
    int32_t pad0;
    float   norm_eps;
    float   embd_scale;
    float   softcap;
    float   attn_factor;
    float   kq_scale;
    float   pad1;

    // scratch: byte offsets of float arrays, each [GGML_MK_MAX_TOKENS][width]
    uint64_t s_x;       // residual stream (n_embd)
    uint64_t s_xn;      // normalised mat-vec input (max(n_embd, ...)): rmsnorm(x)*w
    uint64_t s_q;       // max_q
    uint64_t s_k;       // max_kv
    uint64_t s_v;       // max_kv
    uint64_t s_att;     // max_q
    uint64_t s_h;       // n_embd
    uint64_t s_g;       // max_ff: gelu(gate)*up
    uint64_t s_pl_in;   // n_pl_all
    uint64_t s_pl_g;    // n_embd_pl
    uint64_t s_logits;  // n_vocab
    uint64_t s_part;    // attention chunks: [M][max_head][n_chunk][4 + max_head_dim] (max, sum, -, -, acc)
    uint64_t scratch_size;

    mk_mtl_w output;
    mk_mtl_v output_norm;
    mk_mtl_w pl_model_proj;
    mk_mtl_v pl_proj_norm;

    mk_mtl_layer layers[GGML_MK_MAX_LAYERS];
} mk_mtl_plan;

// one layer's K/V for this step: element (cell c, kv head h, dim d) at
// K: kv buffer k_buf, byte k_off + c*k_sc + h*k_sh + 2*d; V: v_off + c*v_sc + h*v_sh + d*v_sd (F16)
typedef struct {
    uint64_t k_off;
    uint64_t v_off;
    int32_t  k_buf;
    int32_t  v_buf;
    int64_t  k_sc, k_sh;
    int64_t  v_sc, v_sh, v_sd;
} mk_mtl_kv;

typedef struct {
    int32_t n_tokens;
    int32_t pad0;
    int32_t pos[GGML_MK_MAX_TOKENS];
    int32_t n_kv[GGML_MK_N_CACHES];
    int32_t kv_idx[GGML_MK_N_CACHES][GGML_MK_MAX_TOKENS];
    // byte offsets from the start of this struct (the data follows it in the step buffer)
    uint64_t mask[GGML_MK_N_CACHES];   // [n_tokens][n_kv] additive (0 / -INF)
    uint64_t embd;                     // [n_tokens][n_embd] token embedding rows (unscaled)
    uint64_t pl_embd;                  // [n_tokens][n_pl_all]
    mk_mtl_kv kv[GGML_MK_MAX_LAYERS];
} mk_mtl_step;

// the fused MTP draft (megakernel/ggml-mk.h: ggml_mk_draft): k decode steps of the plan ggml_mk_draft_model makes of
// the assistant in one dispatch (kernel_mk_draft), each fed pre*concat(tok_embd[t]*embd_scale, h) and followed by
// h_next = post*n and the argmax of the logits. Its buffers are regions of the scratch past the plan's (s_* below)
typedef struct {
    int32_t  k;            // steps of this launch (1..k_max)
    int32_t  token;        // the last sampled token
    int32_t  n_embd_bb;    // the target's hidden size
    int32_t  want_logits;  // 1: every step's logits to s_lg
    float    embd_scale;   // sqrt(n_embd_bb)
    int32_t  k_max;
    mk_mtl_w tok_embd;     // the target's token embeddings: in buffer(MK_MTL_B_TOK) at off (buf unused)
    mk_mtl_w pre;          // nextn_proj_pre  [2*n_embd_bb -> n_embd]
    mk_mtl_w post;         // nextn_proj_post [n_embd -> n_embd_bb]
    uint64_t s_xh;         // [2*n_embd_bb] the pre-projection's input
    uint64_t s_hin;        // [n_embd_bb] the launch's h (written by the host)
    uint64_t s_hn;         // [k_max][n_embd_bb] each step's h_next
    uint64_t s_tok;        // int32 [k_max] the drafts
    uint64_t s_lg;         // [k_max][n_vocab] each step's logits (want_logits)
    uint64_t s_pv;         // [n_tg] each threadgroup's largest logit of its slice of the vocabulary
    uint64_t s_pi;         // uint32 [n_tg] its first index
    uint64_t scratch_size; // the whole scratch, the plan's and the draft's
} mk_mtl_draft;

#ifndef __METAL_VERSION__
// ---- host side ------------------------------------------------------------------------------
#include <ggml.h>   // (angle brackets: msl2cpp inlines only "..." includes, and MSL never sees this part)

#include <stdio.h>
#include <string.h>

static_assert(MK_MTL_TYPE_F32 == GGML_TYPE_F32 && MK_MTL_TYPE_F16 == GGML_TYPE_F16 && MK_MTL_TYPE_Q4_0 == GGML_TYPE_Q4_0 &&
              MK_MTL_TYPE_Q8_0 == GGML_TYPE_Q8_0 && MK_MTL_TYPE_Q4_K == GGML_TYPE_Q4_K && MK_MTL_TYPE_Q6_K == GGML_TYPE_Q6_K &&
              MK_MTL_TYPE_BF16 == GGML_TYPE_BF16 && MK_MTL_TYPE_Q5_0 == GGML_TYPE_Q5_0 && MK_MTL_TYPE_STQ1_0 == GGML_TYPE_STQ1_0,
              "mk-plan.h: ggml_type numbers");
static_assert(sizeof(mk_mtl_w) == 32 && sizeof(mk_mtl_v) == 16 && sizeof(mk_mtl_kv) == 64, "mk-plan.h layout");
static_assert(sizeof(mk_mtl_layer) % 8 == 0 && sizeof(mk_mtl_plan) % 8 == 0 && sizeof(mk_mtl_step) % 8 == 0 &&
              sizeof(mk_mtl_draft) % 8 == 0, "mk-plan.h layout");

// a bound buffer as the host sees it (Apple unified memory: the MTLBuffer's contents)
struct mk_mtl_range {
    const void * base;
    size_t       size;
};

// the weight types the Metal kernel decodes (mk_deq32 in mk-deq.h)
static inline bool mk_mtl_type_supported(int type) {
    switch (type) {
        case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16: case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q4_K: case GGML_TYPE_Q6_K: case GGML_TYPE_STQ1_0:
            return true;
        default:
            return false;
    }
}

static inline bool mk_mtl_find(const mk_mtl_range * bufs, int n_bufs, const void * p, size_t n, int32_t * buf, uint64_t * off) {
    for (int i = 0; i < n_bufs; ++i) {
        const char * b = (const char *) bufs[i].base;
        if (b && (const char *) p >= b && (const char *) p + n <= b + bufs[i].size) {
            *buf = i;
            *off = (uint64_t) ((const char *) p - b);
            return true;
        }
    }
    return false;
}

// a matrix of the plan; name for the error message; false + err if it cannot be used
static inline bool mk_mtl_plan_w(const ggml_mk_weight & w, const char * name, int il, const mk_mtl_range * bufs, int n_bufs,
                                 mk_mtl_w * out, char * err, size_t err_size) {
    memset(out, 0, sizeof(*out));
    out->buf = -1;
    if (!w.data) {
        return true;
    }
    char what[64];
    if (il >= 0) {
        snprintf(what, sizeof(what), "layer %d %s", il, name);
    } else {
        snprintf(what, sizeof(what), "%s", name);
    }
    if (!mk_mtl_type_supported(w.type)) {
        snprintf(err, err_size, "%s: weight type %s is not supported by the Metal megakernel", what, ggml_type_name((enum ggml_type) w.type));
        return false;
    }
    const int64_t blck = ggml_blck_size((enum ggml_type) w.type);
    if (w.ne0 % blck != 0 || (blck > 1 && w.ne0 % 32 != 0)) {
        snprintf(err, err_size, "%s: row length %d is not a multiple of the %s block", what, w.ne0, ggml_type_name((enum ggml_type) w.type));
        return false;
    }
    const size_t row = ggml_row_size((enum ggml_type) w.type, w.ne0);
    const size_t align = w.type == GGML_TYPE_F32 || w.type == GGML_TYPE_Q4_K ? 4 : 2;
    if (!mk_mtl_find(bufs, n_bufs, w.data, (size_t) (w.ne1 - 1)*w.nb1 + row, &out->buf, &out->off)) {
        snprintf(err, err_size, "%s: not inside a bound weight buffer", what);
        return false;
    }
    if (out->off % align != 0 || w.nb1 % align != 0) {
        snprintf(err, err_size, "%s: offset or row stride not %zu-byte aligned", what, align);
        return false;
    }
    out->type = w.type;
    out->ne0  = w.ne0;
    out->ne1  = w.ne1;
    out->nb1  = w.nb1;
    return true;
}

static inline bool mk_mtl_plan_v(const float * p, size_t n, const char * name, int il, const mk_mtl_range * bufs, int n_bufs,
                                 mk_mtl_v * out, char * err, size_t err_size) {
    memset(out, 0, sizeof(*out));
    out->buf = -1;
    if (!p) {
        return true;
    }
    if (!mk_mtl_find(bufs, n_bufs, p, n*sizeof(float), &out->buf, &out->off) || out->off % 4 != 0) {
        snprintf(err, err_size, "layer %d %s: not inside a bound weight buffer (or not 4-byte aligned)", il, name);
        return false;
    }
    return true;
}

// derives the device plan from the host plan: the weights and norm vectors must lie in the weight
// buffers wbufs (at most MK_MTL_N_WBUF). Returns 0, or -1 with a message naming the tensor in err.
static inline int mk_mtl_plan_make(const ggml_mk_model * m, const mk_mtl_range * wbufs, int n_wbufs, mk_mtl_plan * P,
                                   char * err, size_t err_size) {
    memset(P, 0, sizeof(*P));
    if (m->version != GGML_MK_VERSION || n_wbufs > MK_MTL_N_WBUF || m->n_layer > GGML_MK_MAX_LAYERS) {
        snprintf(err, err_size, "plan version %d (want %d), %d weight buffers (max %d), %d layers", m->version,
                 GGML_MK_VERSION, n_wbufs, MK_MTL_N_WBUF, m->n_layer);
        return -1;
    }
    if (m->kv_type != GGML_TYPE_F16) {
        snprintf(err, err_size, "KV cache type %s: the Metal megakernel reads F16 caches", ggml_type_name((enum ggml_type) m->kv_type));
        return -1;
    }
    if (m->att_chunk <= 0 || m->n_ctx <= 0) {
        snprintf(err, err_size, "att_chunk %d, n_ctx %d", m->att_chunk, m->n_ctx);
        return -1;
    }
    P->arch = m->arch; P->n_layer = m->n_layer; P->n_embd = m->n_embd; P->n_vocab = m->n_vocab; P->n_embd_pl = m->n_embd_pl;
    P->n_pl_all = m->n_embd_pl*m->n_layer; P->max_head_dim = m->max_head_dim; P->max_q = m->max_q; P->max_kv = m->max_kv;
    P->max_ff = m->max_ff; P->n_ctx = m->n_ctx; P->att_chunk = m->att_chunk; P->n_chunk = (m->n_ctx + m->att_chunk - 1)/m->att_chunk;
    P->debug_flags = m->debug_flags; P->norm_eps = m->norm_eps; P->embd_scale = m->embd_scale; P->softcap = m->softcap;
    P->attn_factor = m->attn_factor; P->kq_scale = m->kq_scale;

    char * e = err; const size_t es = err_size;
    if (!mk_mtl_plan_w(m->output, "output", -1, wbufs, n_wbufs, &P->output, e, es) ||
        !mk_mtl_plan_v(m->output_norm, m->n_embd, "output_norm", -1, wbufs, n_wbufs, &P->output_norm, e, es) ||
        !mk_mtl_plan_w(m->pl_model_proj, "per_layer_model_proj", -1, wbufs, n_wbufs, &P->pl_model_proj, e, es) ||
        !mk_mtl_plan_v(m->pl_proj_norm, m->n_embd_pl, "per_layer_proj_norm", -1, wbufs, n_wbufs, &P->pl_proj_norm, e, es)) {
        return -1;
    }
    int max_head = 0;
    for (int il = 0; il < m->n_layer; ++il) {
        const ggml_mk_layer & L = m->layers[il];
        mk_mtl_layer & D = P->layers[il];
        if (L.head_dim % 32 != 0 || L.head_dim > GGML_MK_MAX_HEAD_DIM || L.n_rot % 64 != 0 || L.n_rot > L.head_dim ||
            L.n_head_kv <= 0 || L.n_head % L.n_head_kv != 0) {
            snprintf(err, err_size, "layer %d: head_dim %d / n_rot %d / heads %d:%d not supported (head_dim a multiple of 32 "
                     "up to %d, n_rot a multiple of 64)", il, L.head_dim, L.n_rot, L.n_head, L.n_head_kv, GGML_MK_MAX_HEAD_DIM);
            return -1;
        }
        max_head = L.n_head > max_head ? L.n_head : max_head;
        D.n_head = L.n_head; D.n_head_kv = L.n_head_kv; D.head_dim = L.head_dim; D.n_rot = L.n_rot; D.n_ff = L.n_ff;
        D.is_swa = L.is_swa; D.has_kv = L.has_kv; D.v_from_k = L.v_from_k; D.v_norm = L.v_norm;
        D.rope_base = L.rope_base; D.rope_scale = L.rope_scale; D.q_scale = L.q_scale; D.out_scale = L.out_scale;
        const int hd = L.head_dim, n = m->n_embd;
        if (!mk_mtl_plan_v(L.rope_freqs, L.n_rot/2, "rope_freqs", il, wbufs, n_wbufs, &D.rope_freqs, e, es) ||
            !mk_mtl_plan_w(L.wq, "attn_q", il, wbufs, n_wbufs, &D.wq, e, es) ||
            !mk_mtl_plan_w(L.wk, "attn_k", il, wbufs, n_wbufs, &D.wk, e, es) ||
            !mk_mtl_plan_w(L.wv, "attn_v", il, wbufs, n_wbufs, &D.wv, e, es) ||
            !mk_mtl_plan_w(L.wo, "attn_output", il, wbufs, n_wbufs, &D.wo, e, es) ||
            !mk_mtl_plan_w(L.ffn_gate, "ffn_gate", il, wbufs, n_wbufs, &D.ffn_gate, e, es) ||
            !mk_mtl_plan_w(L.ffn_up, "ffn_up", il, wbufs, n_wbufs, &D.ffn_up, e, es) ||
            !mk_mtl_plan_w(L.ffn_down, "ffn_down", il, wbufs, n_wbufs, &D.ffn_down, e, es) ||
            !mk_mtl_plan_w(L.pl_gate, "per_layer_inp_gate", il, wbufs, n_wbufs, &D.pl_gate, e, es) ||
            !mk_mtl_plan_w(L.pl_proj, "per_layer_proj", il, wbufs, n_wbufs, &D.pl_proj, e, es) ||
            !mk_mtl_plan_v(L.attn_norm, n, "attn_norm", il, wbufs, n_wbufs, &D.attn_norm, e, es) ||
            !mk_mtl_plan_v(L.q_norm, hd, "attn_q_norm", il, wbufs, n_wbufs, &D.q_norm, e, es) ||
            !mk_mtl_plan_v(L.k_norm, hd, "attn_k_norm", il, wbufs, n_wbufs, &D.k_norm, e, es) ||
            !mk_mtl_plan_v(L.attn_post_norm, n, "post_attention_norm", il, wbufs, n_wbufs, &D.attn_post_norm, e, es) ||
            !mk_mtl_plan_v(L.ffn_norm, n, "ffn_norm", il, wbufs, n_wbufs, &D.ffn_norm, e, es) ||
            !mk_mtl_plan_v(L.ffn_post_norm, n, "post_ffw_norm", il, wbufs, n_wbufs, &D.ffn_post_norm, e, es) ||
            !mk_mtl_plan_v(L.pl_post_norm, n, "post_norm", il, wbufs, n_wbufs, &D.pl_post_norm, e, es)) {
            return -1;
        }
        if ((m->n_embd_pl > 0) != (D.pl_gate.buf >= 0 && D.pl_proj.buf >= 0)) {
            snprintf(err, err_size, "layer %d: per-layer embedding weights and n_embd_pl = %d disagree", il, m->n_embd_pl);
            return -1;
        }
    }
    P->max_head = max_head;

    // scratch: float arrays of GGML_MK_MAX_TOKENS columns, 256-byte aligned
    const int mt = GGML_MK_MAX_TOKENS;
    uint64_t o = 0;
    auto take = [&](uint64_t n_floats) {
        const uint64_t r = o;
        o += (n_floats*sizeof(float) + 255) & ~(uint64_t) 255;
        return r;
    };
    int xn_w = m->n_embd;
    P->s_x      = take((uint64_t) mt*m->n_embd);
    P->s_xn     = take((uint64_t) mt*xn_w);
    P->s_q      = take((uint64_t) mt*m->max_q);
    P->s_k      = take((uint64_t) mt*m->max_kv);
    P->s_v      = take((uint64_t) mt*m->max_kv);
    P->s_att    = take((uint64_t) mt*m->max_q);
    P->s_h      = take((uint64_t) mt*m->n_embd);
    P->s_g      = take((uint64_t) mt*m->max_ff);
    P->s_pl_in  = take((uint64_t) mt*(P->n_pl_all > 0 ? P->n_pl_all : 1));
    P->s_pl_g   = take((uint64_t) mt*(m->n_embd_pl > 0 ? m->n_embd_pl : 1));
    P->s_logits = take((uint64_t) mt*m->n_vocab);
    P->s_part   = take((uint64_t) mt*max_head*P->n_chunk*(4 + m->max_head_dim));
    P->scratch_size = o;
    return 0;
}

// the draft's part of the device plan: its weights (in the weight buffers wbufs, as the plan's), its scratch regions
// past the plan's (P: mk_mtl_plan_make of ggml_mk_draft_model(d)), n_tg threadgroups. The token embeddings are bound
// on their own (tok_off: their offset in that buffer). Returns 0, or -1 with a message in err
static inline int mk_mtl_draft_make(const ggml_mk_draft * d, const mk_mtl_plan * P, const mk_mtl_range * wbufs, int n_wbufs,
                                    int n_tg, uint64_t tok_off, mk_mtl_draft * D, char * err, size_t err_size) {
    memset(D, 0, sizeof(*D));
    if (d->version != GGML_MK_DRAFT_VERSION || d->k_max < 1 || d->k_max > GGML_MK_DRAFT_MAX_K || d->n_layer < 1 ||
        d->n_layer > GGML_MK_DRAFT_MAX_LAYERS) {
        snprintf(err, err_size, "draft plan version %d (want %d), k_max %d (1..%d), %d layers (1..%d)", d->version,
                 GGML_MK_DRAFT_VERSION, d->k_max, GGML_MK_DRAFT_MAX_K, d->n_layer, GGML_MK_DRAFT_MAX_LAYERS);
        return -1;
    }
    if (d->n_embd_bb % 32 != 0 || d->tok_embd.ne0 != d->n_embd_bb || d->tok_embd.ne1 < d->n_vocab ||
        d->pre.ne0 != 2*d->n_embd_bb || d->pre.ne1 != d->n_embd || d->post.ne0 != d->n_embd || d->post.ne1 != d->n_embd_bb) {
        snprintf(err, err_size, "the draft's shapes: token embeddings %d x %d, pre %d -> %d, post %d -> %d for n_embd %d, "
                 "n_embd_bb %d (a multiple of 32), n_vocab %d", d->tok_embd.ne0, d->tok_embd.ne1, d->pre.ne0, d->pre.ne1,
                 d->post.ne0, d->post.ne1, d->n_embd, d->n_embd_bb, d->n_vocab);
        return -1;
    }
    if (!mk_mtl_type_supported(d->tok_embd.type)) {
        snprintf(err, err_size, "the target's token embeddings: type %s is not supported by the Metal megakernel",
                 ggml_type_name((enum ggml_type) d->tok_embd.type));
        return -1;
    }
    if (!mk_mtl_plan_w(d->pre, "nextn.pre_projection", -1, wbufs, n_wbufs, &D->pre, err, err_size) ||
        !mk_mtl_plan_w(d->post, "nextn.post_projection", -1, wbufs, n_wbufs, &D->post, err, err_size)) {
        return -1;
    }
    if (D->pre.buf < 0 || D->post.buf < 0) {
        snprintf(err, err_size, "the draft has no pre- or post-projection");
        return -1;
    }
    D->n_embd_bb  = d->n_embd_bb;
    D->embd_scale = d->embd_scale;
    D->k_max      = d->k_max;
    D->tok_embd.off  = tok_off;
    D->tok_embd.buf  = 0;
    D->tok_embd.type = d->tok_embd.type;
    D->tok_embd.ne0  = d->tok_embd.ne0;
    D->tok_embd.ne1  = d->tok_embd.ne1;
    D->tok_embd.nb1  = d->tok_embd.nb1;

    uint64_t o = P->scratch_size;
    auto take = [&](uint64_t n4) {
        const uint64_t r = o;
        o += (n4*4 + 255) & ~(uint64_t) 255;
        return r;
    };
    D->s_xh  = take((uint64_t) 2*d->n_embd_bb);
    D->s_hin = take((uint64_t) d->n_embd_bb);
    D->s_hn  = take((uint64_t) d->k_max*d->n_embd_bb);
    D->s_tok = take((uint64_t) d->k_max);
    D->s_lg  = take((uint64_t) d->k_max*P->n_vocab);
    D->s_pv  = take((uint64_t) n_tg);
    D->s_pi  = take((uint64_t) n_tg);
    D->scratch_size = o;
    return 0;
}

// bytes of the step buffer: the header and, 16-byte aligned, masks and embedding rows
static inline size_t mk_mtl_step_size(const mk_mtl_plan * P) {
    const size_t mt = GGML_MK_MAX_TOKENS;
    return ((sizeof(mk_mtl_step) + 15) & ~(size_t) 15) + 4*(GGML_MK_N_CACHES*mt*P->n_ctx + mt*P->n_embd + mt*P->n_pl_all) + 64;
}

// fills the step buffer dst (mk_mtl_step_size bytes) from a host step; the KV views must lie in the KV
// buffers kvbufs (at most MK_MTL_N_KVBUF). Returns 0, or -1 with a message in err.
static inline int mk_mtl_step_fill(const mk_mtl_plan * P, const ggml_mk_step * st, const mk_mtl_range * kvbufs, int n_kvbufs,
                                   void * dst, char * err, size_t err_size) {
    mk_mtl_step * S = (mk_mtl_step *) dst;
    memset(S, 0, sizeof(*S));
    if (st->n_tokens < 1 || st->n_tokens > GGML_MK_MAX_TOKENS || n_kvbufs > MK_MTL_N_KVBUF) {
        snprintf(err, err_size, "step of %d tokens (1..%d), %d KV buffers (max %d)", st->n_tokens, GGML_MK_MAX_TOKENS, n_kvbufs, MK_MTL_N_KVBUF);
        return -1;
    }
    const int M = st->n_tokens;
    if (st->n_h < 0 || st->n_h > M || (st->n_h > 0 && !st->h_out)) {
        snprintf(err, err_size, "%d hidden rows of a step of %d tokens (h_out %s)", st->n_h, M, st->h_out ? "set" : "NULL");
        return -1;
    }
    for (int i = 0; i < st->n_h; ++i) {
        if (st->h_rows[i] < 0 || st->h_rows[i] >= M) {
            snprintf(err, err_size, "hidden row %d of a step of %d tokens", st->h_rows[i], M);
            return -1;
        }
    }
    S->n_tokens = M;
    for (int m = 0; m < M; ++m) {
        S->pos[m] = st->pos[m];
    }
    size_t o = (sizeof(mk_mtl_step) + 15) & ~(size_t) 15;
    for (int c = 0; c < GGML_MK_N_CACHES; ++c) {
        if (st->n_kv[c] < 0 || st->n_kv[c] > P->n_ctx) {
            snprintf(err, err_size, "cache %d: n_kv %d outside 0..n_ctx %d", c, st->n_kv[c], P->n_ctx);
            return -1;
        }
        S->n_kv[c] = st->n_kv[c];
        for (int m = 0; m < M; ++m) {
            S->kv_idx[c][m] = (int32_t) st->kv_idx[c][m];
        }
        S->mask[c] = o;
        if (st->mask[c]) {
            memcpy((char *) dst + o, st->mask[c], (size_t) M*st->n_kv[c]*sizeof(float));
        }
        o += (size_t) M*st->n_kv[c]*sizeof(float);
    }
    S->embd = o;
    memcpy((char *) dst + o, st->embd, (size_t) M*P->n_embd*sizeof(float));
    o += (size_t) M*P->n_embd*sizeof(float);
    S->pl_embd = o;
    if (P->n_pl_all > 0) {
        memcpy((char *) dst + o, st->pl_embd, (size_t) M*P->n_pl_all*sizeof(float));
    }
    for (int il = 0; il < P->n_layer; ++il) {
        const ggml_mk_kv_view & v = st->kv[il];
        mk_mtl_kv & D = S->kv[il];
        if (!mk_mtl_find(kvbufs, n_kvbufs, v.k, 2, &D.k_buf, &D.k_off) || !mk_mtl_find(kvbufs, n_kvbufs, v.v, 2, &D.v_buf, &D.v_off)) {
            snprintf(err, err_size, "layer %d: K/V cache not inside a bound KV buffer", il);
            return -1;
        }
        D.k_sc = v.k_sc; D.k_sh = v.k_sh; D.v_sc = v.v_sc; D.v_sh = v.v_sh; D.v_sd = v.v_sd;
    }
    return 0;
}
#endif // __METAL_VERSION__
