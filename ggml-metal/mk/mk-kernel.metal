// mk-kernel.metal: the Gemma decode megakernel for Metal (MSL 3.2: -std=metal3.2), stq-metal issue 13.
//
// One persistent dispatch runs a whole step (the plan of megakernel/ggml-mk.h, the same semantics as
// the CUDA kernel megakernel/cuda/mk-kernel.cuh): embedding, Gemma 4 per-layer inputs, per layer
// Q/K/V mat-vecs of rmsnorm(x), head norms + NEOX rope (proportional with rope_freqs) + K/V rows into
// llama.cpp's cache, attention in chunks of att_chunk cells counted from cell 0 with a fixed-order
// combine, O, GeGLU gate/up, down, Gemma 4 per-layer gate/proj, final norm, LM head, softcap. Phases
// are separated by grid barriers (grid-barrier.h); the grid is sized from the device's co-residency
// limit, never from the problem: every loop below strides over whatever threadgroups there are.
//
// kernel_mk_draft, the fused MTP draft (issue 14; the CUDA kernel's mk_draft_kernel): k one-token steps of the
// assistant's plan (ggml_mk_draft_model) in one dispatch, the same layer code (mk_layers_head) between the
// pre-projection of concat(tok_embd[t]*embd_scale, h) and h_next = post*n + the argmax of the logits (first index of
// the largest; the token and h_next chained to the next step on the GPU).
//
// Buffers and the device plan: mk-plan.h (weights, norms, KV and scratch as byte offsets into bound
// buffers; one source of truth with the host code that derives the plan).
//
// Lossless by construction: M (tokens of the step, 1..GGML_MK_MAX_TOKENS) is a runtime parameter, so
// decode (M = 1) and verify (M = k+1) run the SAME compiled pipeline. That matters on Apple GPUs: under
// fast math two separately compiled "identical" kernels disagree at ~1e-4 and flip near-ties, while
// one pipeline gives one instruction sequence. Within it, every column's arithmetic is independent of
// M: column loops run over the constant GGML_MK_MAX_TOKENS with an `m < M` guard (no unrolling that
// depends on M), products are accumulated with explicit fma() in a fixed order (no contraction choice
// left to the compiler), reductions are fixed butterflies over the 32 lanes of a simdgroup (not
// simd_sum, whose order is unspecified) and, across simdgroups, sums in simdgroup order; each row is
// reduced by one simdgroup with the same lane mapping for every M; the norms of a column are done by
// one threadgroup; attention chunks are counted from cell 0 and combined in chunk order.
// No infinities are computed (fast math may assume there are none): masked cells are tested with
// mask < -1e30 and running maxima start at -FLT_MAX/2.
#include <metal_stdlib>
using namespace metal;

#include "mk-plan.h"
#include "mk-deq.h"
#include "grid-barrier.h"

// scratch and KV: written by one threadgroup, read by others after a grid barrier
#define MK_DEV coherent(device) device

#define MK_MT       GGML_MK_MAX_TOKENS
#define MK_NEG_BIG  (-FLT_MAX/2)

struct mk_ctx {
    device const mk_mtl_plan * P;
    device const mk_mtl_step * S;
    device const uchar       * stp;
    device const uchar       * wb[MK_MTL_N_WBUF];
    MK_DEV uchar             * kvb[MK_MTL_N_KVBUF];
    MK_DEV uchar             * scr;
    device atomic_uint       * bar;
    threadgroup float        * red;   // [MK_MTL_NSG]
    int  M;
    int  tg;      // this threadgroup
    int  ntg;     // threadgroups in the grid
    int  tid;     // thread in the threadgroup
    int  sg;      // simdgroup in the threadgroup
    int  lane;
    int  gsg;     // simdgroup in the grid
    int  nsg;     // simdgroups in the grid
};

static inline MK_DEV float * mk_scr(thread const mk_ctx & c, ulong off) {
    return (MK_DEV float *) (c.scr + off);
}

static inline device const float * mk_vec(thread const mk_ctx & c, mk_mtl_v v) {
    return (device const float *) (c.wb[v.buf] + v.off);
}

static inline device const uchar * mk_row(thread const mk_ctx & c, mk_mtl_w w, int r) {
    return c.wb[w.buf] + w.off + (ulong) r*w.nb1;
}

// planted bug for the tests (MK_MTL_DEBUG_BARRIER_NO_FENCES): grid_barrier() without its fences
static inline void mk_grid_barrier_nofence(device atomic_uint * bar, uint n_tg, ushort tiitg) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tiitg == 0) {
        const uint gen = atomic_load_explicit(&bar[1], memory_order_relaxed);
        const uint arrived = atomic_fetch_add_explicit(&bar[0], 1u, memory_order_relaxed) + 1u;
        if (arrived == n_tg) {
            atomic_store_explicit(&bar[0], 0u, memory_order_relaxed);
            atomic_store_explicit(&bar[1], gen + 1u, memory_order_relaxed);
        } else {
            while (atomic_load_explicit(&bar[1], memory_order_relaxed) == gen) {
            }
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
}

static inline void mk_sync(thread const mk_ctx & c) {
    const int f = c.P->debug_flags;
    if (f & GGML_MK_DEBUG_NO_GRID_BARRIER) {
        threadgroup_barrier(mem_flags::mem_threadgroup);   // planted bug: the phases race
    } else if (f & MK_MTL_DEBUG_BARRIER_NO_FENCES) {
        mk_grid_barrier_nofence(c.bar, (uint) c.ntg, (ushort) c.tid);
    } else {
        grid_barrier(c.bar, (uint) c.ntg, (ushort) c.tid);
    }
}

// fixed-order sum over the 32 lanes (every lane gets the same bits: a + b == b + a)
static inline float mk_simd_sum(float v) {
    v += simd_shuffle_xor(v, 16);
    v += simd_shuffle_xor(v, 8);
    v += simd_shuffle_xor(v, 4);
    v += simd_shuffle_xor(v, 2);
    v += simd_shuffle_xor(v, 1);
    return v;
}

// threadgroup-wide sum: lanes, then simdgroups in order (called in threadgroup-uniform control flow)
static inline float mk_tg_sum(thread const mk_ctx & c, float v) {
    v = mk_simd_sum(v);
    if (c.lane == 0) {
        c.red[c.sg] = v;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float t = 0.0f;
    for (int k = 0; k < MK_MTL_NSG; ++k) {
        t += c.red[k];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return t;
}

static inline float mk_gelu(float x) {
    const float GELU_COEF_A    = 0.044715f;
    const float SQRT_2_OVER_PI = 0.79788456080286535587989211986876f;
    return 0.5f*x*(1.0f + tanh(SQRT_2_OVER_PI*x*(1.0f + GELU_COEF_A*x*x)));
}

// ---------------------------------------------------------------------------------------------
// mat-vec over the M columns of x (scratch, row stride ldx, K inputs): one simdgroup per row, lane l
// takes the 32-value groups l, l + 32, ...; up to 3 jobs over the same inputs

struct mk_job {
    mk_mtl_w w;
    ulong    y;     // scratch byte offset of the output, [M][ldy]
    int      ldy;
};

enum mk_ep {
    MK_EP_PLAIN   = 0,  // y = v
    MK_EP_SOFTCAP = 1,  // y = tanh(v/cap)*cap
    MK_EP_PAIR    = 2,  // jobs 0 and 1 have the same rows: y0 = gelu(v0)*v1 (one simdgroup per row pair)
    MK_EP_GEGLU   = 3,  // y = gelu(v)*aux[m][row]
};

static void mk_matvec(thread const mk_ctx & c, ulong x_off, int ldx, int K, thread const mk_job * jobs, int n_jobs,
                      int ep, ulong aux_off, int ld_aux, float cap) {
    const int nj = ep == MK_EP_PAIR ? 1 : n_jobs;
    int total = 0;
    for (int j = 0; j < nj; ++j) {
        total += jobs[j].w.ne1;
    }
    const int ngrp = (K + 31)/32;
    MK_DEV const float * xs = mk_scr(c, x_off);
    for (int u = c.gsg; u < total; u += c.nsg) {
        int j = 0;
        int r = u;
        while (r >= jobs[j].w.ne1) {
            r -= jobs[j].w.ne1;
            ++j;
        }
        const mk_mtl_w w0 = jobs[j].w;
        const mk_mtl_w w1 = jobs[ep == MK_EP_PAIR ? 1 : j].w;
        device const uchar * row0 = mk_row(c, w0, r);
        device const uchar * row1 = mk_row(c, w1, r);
        float acc0[MK_MT];
        float acc1[MK_MT];
        for (int m = 0; m < MK_MT; ++m) {
            acc0[m] = 0.0f;
            acc1[m] = 0.0f;
        }
        for (int g = c.lane; g < ngrp; g += 32) {
            const int lim = min(32, K - 32*g);
            float w[32];
            mk_deq32(row0, w0.type, g, lim, w);
            for (int m = 0; m < MK_MT; ++m) {
                if (m < c.M) {
                    MK_DEV const float * x = xs + m*ldx + 32*g;
                    float s = acc0[m];
                    for (int i = 0; i < 32; ++i) {
                        s = i < lim ? fma(w[i], x[i], s) : s;
                    }
                    acc0[m] = s;
                }
            }
            if (ep == MK_EP_PAIR) {
                mk_deq32(row1, w1.type, g, lim, w);
                for (int m = 0; m < MK_MT; ++m) {
                    if (m < c.M) {
                        MK_DEV const float * x = xs + m*ldx + 32*g;
                        float s = acc1[m];
                        for (int i = 0; i < 32; ++i) {
                            s = i < lim ? fma(w[i], x[i], s) : s;
                        }
                        acc1[m] = s;
                    }
                }
            }
        }
        for (int m = 0; m < MK_MT; ++m) {
            if (m < c.M) {
                acc0[m] = mk_simd_sum(acc0[m]);
                if (ep == MK_EP_PAIR) {
                    acc1[m] = mk_simd_sum(acc1[m]);
                }
            }
        }
        if (c.lane == 0) {
            MK_DEV float * y = mk_scr(c, jobs[j].y);
            const int ldy = jobs[j].ldy;
            for (int m = 0; m < MK_MT; ++m) {
                if (m < c.M) {
                    const float v = acc0[m];
                    float o = v;
                    if (ep == MK_EP_SOFTCAP) {
                        o = tanh(v/cap)*cap;
                    } else if (ep == MK_EP_PAIR) {
                        o = mk_gelu(v)*acc1[m];
                    } else if (ep == MK_EP_GEGLU) {
                        o = mk_gelu(v)*mk_scr(c, aux_off)[m*ld_aux + r];
                    }
                    y[m*ldy + r] = o;
                }
            }
        }
    }
}

static void mk_matvec1(thread const mk_ctx & c, ulong x_off, int ldx, mk_mtl_w w, ulong y, int ldy, int ep, ulong aux_off,
                       int ld_aux, float cap) {
    mk_job jb[1];
    jb[0].w = w;
    jb[0].y = y;
    jb[0].ldy = ldy;
    mk_matvec(c, x_off, ldx, w.ne0, jb, 1, ep, aux_off, ld_aux, cap);
}

// ---------------------------------------------------------------------------------------------
// residual step and norm of the stream, one threadgroup per column (each thread keeps its elements):
//   if res: x = (x + rmsnorm(h)*rw)*rs;   if nw present: xn = rmsnorm(x)*nw

static void mk_resnorm(thread const mk_ctx & c, bool res, mk_mtl_v rw, float rs, mk_mtl_v nw) {
    device const mk_mtl_plan & P = *c.P;
    const int n = P.n_embd;
    const float eps = P.norm_eps;
    for (int m = c.tg; m < c.M; m += c.ntg) {
        MK_DEV float * x = mk_scr(c, P.s_x) + m*n;
        if (res) {
            MK_DEV const float * h = mk_scr(c, P.s_h) + m*n;
            device const float * w = mk_vec(c, rw);
            float ss = 0.0f;
            for (int i = c.tid; i < n; i += MK_MTL_THREADS) {
                ss = fma(h[i], h[i], ss);
            }
            ss = mk_tg_sum(c, ss);
            const float r = 1.0f/sqrt(ss/n + eps);
            for (int i = c.tid; i < n; i += MK_MTL_THREADS) {
                x[i] = (x[i] + (h[i]*r)*w[i])*rs;
            }
        }
        if (nw.buf >= 0) {
            MK_DEV float * xn = mk_scr(c, P.s_xn) + m*n;
            device const float * w = mk_vec(c, nw);
            float ss = 0.0f;
            for (int i = c.tid; i < n; i += MK_MTL_THREADS) {
                ss = fma(x[i], x[i], ss);
            }
            ss = mk_tg_sum(c, ss);
            const float r = 1.0f/sqrt(ss/n + eps);
            for (int i = c.tid; i < n; i += MK_MTL_THREADS) {
                xn[i] = (x[i]*r)*w[i];
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Gemma 4 per-layer inputs: pl_in[m][il][j] = (rmsnorm(P x / sqrt(n_embd)) * w + e*sqrt(n_pl)) / sqrt(2),
// one simdgroup per (token, layer)

static void mk_pl_inputs(thread const mk_ctx & c) {
    device const mk_mtl_plan & P = *c.P;
    const int npl = P.n_embd_pl;
    const float s_proj = 1.0f/sqrt((float) P.n_embd);
    const float s_tok  = sqrt((float) npl);
    const float s_out  = 1.0f/sqrt(2.0f);
    device const float * pe = (device const float *) (c.stp + c.S->pl_embd);
    device const float * nw = mk_vec(c, P.pl_proj_norm);
    for (int u = c.gsg; u < c.M*P.n_layer; u += c.nsg) {
        const int m  = u / P.n_layer;
        const int il = u % P.n_layer;
        MK_DEV float * p = mk_scr(c, P.s_pl_in) + m*P.n_pl_all + il*npl;
        device const float * e = pe + m*P.n_pl_all + il*npl;
        float ss = 0.0f;
        for (int j = c.lane; j < npl; j += 32) {
            const float t = p[j]*s_proj;
            ss = fma(t, t, ss);
        }
        ss = mk_simd_sum(ss);
        const float r = 1.0f/sqrt(ss/npl + P.norm_eps);
        for (int j = c.lane; j < npl; j += 32) {
            const float t = p[j]*s_proj;
            p[j] = ((t*r)*nw[j] + e[j]*s_tok)*s_out;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// per head vector: Q/K/V norms, NEOX rope, K/V rows into the cache; one simdgroup per vector, lane l
// holds dims l + 32t (the rope pairs (i, i + n_rot/2) are in the same lane: n_rot % 64 == 0)

static void mk_heads(thread const mk_ctx & c, int il) {
    device const mk_mtl_plan  & P = *c.P;
    device const mk_mtl_layer & L = P.layers[il];
    device const mk_mtl_step  & S = *c.S;
    const int hd    = L.head_dim;
    const int nt    = hd/32;
    const int n_kvh = L.has_kv ? L.n_head_kv : 0;
    const int per_m = L.n_head + 2*n_kvh;
    const int cache = L.is_swa ? 1 : 0;
    const float theta_scale = pow(L.rope_base, -2.0f/L.n_rot);
    for (int u = c.gsg; u < c.M*per_m; u += c.nsg) {
        const int m = u / per_m;
        int h       = u % per_m;
        int kind    = 0; // 0 q, 1 k, 2 v
        if (h >= L.n_head) {
            h -= L.n_head;
            kind = 1 + h / n_kvh;
            h %= n_kvh;
        }
        MK_DEV float * src;
        mk_mtl_v nw;
        nw.buf = -1;
        nw.off = 0;
        if (kind == 0) {
            src = mk_scr(c, P.s_q) + m*P.max_q + h*hd;
            nw  = L.q_norm;
        } else if (kind == 1 || L.v_from_k) {
            src = mk_scr(c, P.s_k) + m*P.max_kv + h*hd;
            if (kind == 1) {
                nw = L.k_norm;
            }
        } else {
            src = mk_scr(c, P.s_v) + m*P.max_kv + h*hd;
        }
        const bool do_norm = kind != 2 || L.v_norm;

        float v[MK_MTL_HD_REGS];
        float ss = 0.0f;
        for (int t = 0; t < MK_MTL_HD_REGS; ++t) {
            v[t] = t < nt ? src[c.lane + 32*t] : 0.0f;
            ss = fma(v[t], v[t], ss);
        }
        ss = mk_simd_sum(ss);
        const float r = 1.0f/sqrt(ss/hd + P.norm_eps);
        if (do_norm) {
            const bool has_w = nw.buf >= 0;
            for (int t = 0; t < nt; ++t) {
                v[t] = has_w ? (v[t]*r)*mk_vec(c, nw)[c.lane + 32*t] : v[t]*r;
            }
        }
        if (kind != 2) {
            const int pos  = S.pos[m];
            const int half_rot = L.n_rot/2;
            const int tp   = half_rot/32;
            const bool has_ff = L.rope_freqs.buf >= 0;
            for (int t = 0; t < tp; ++t) {
                const int i = c.lane + 32*t;
                const float theta_base = pos*pow(theta_scale, (float) i);
                const float f  = has_ff ? mk_vec(c, L.rope_freqs)[i] : 1.0f;
                const float theta = L.rope_scale*(theta_base/f);
                const float cs = cos(theta)*P.attn_factor;
                const float sn = sin(theta)*P.attn_factor;
                const float x0 = v[t];
                const float x1 = v[t + tp];
                v[t]      = x0*cs - x1*sn;
                v[t + tp] = x0*sn + x1*cs;
            }
        }
        if (kind == 0) {
            for (int t = 0; t < nt; ++t) {
                src[c.lane + 32*t] = v[t]*L.q_scale;
            }
        } else {
            device const mk_mtl_kv & kv = S.kv[il];
            const long cell = S.kv_idx[cache][m];
            for (int t = 0; t < nt; ++t) {
                const int d = c.lane + 32*t;
                if (kind == 1) {
                    *(MK_DEV half *) (c.kvb[kv.k_buf] + kv.k_off + cell*kv.k_sc + h*kv.k_sh + 2*d) = (half) v[t];
                } else {
                    *(MK_DEV half *) (c.kvb[kv.v_buf] + kv.v_off + cell*kv.v_sc + h*kv.v_sh + d*kv.v_sd) = (half) v[t];
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// attention, split over the cells: one simdgroup per (token, head, chunk of att_chunk cells counted
// from cell 0), online softmax over the chunk's visible cells; then (after a grid barrier) one
// simdgroup per (token, head) combines the chunks in chunk order. Chunk bounds and order depend on the
// cell numbers alone, so a token's result does not depend on M.

static void mk_attn_chunks(thread const mk_ctx & c, int il) {
    device const mk_mtl_plan  & P = *c.P;
    device const mk_mtl_layer & L = P.layers[il];
    device const mk_mtl_step  & S = *c.S;
    device const mk_mtl_kv    & kv = S.kv[il];
    const int hd    = L.head_dim;
    const int nt    = hd/32;
    const int cache = L.is_swa ? 1 : 0;
    const int n_kv  = S.n_kv[cache];
    const int CH    = P.att_chunk;
    const int nch   = (n_kv + CH - 1)/CH;
    const int gqa   = L.n_head / L.n_head_kv;
    const int PS    = 4 + P.max_head_dim;
    device const float * mask = (device const float *) (c.stp + S.mask[cache]);
    MK_DEV const uchar * kb = c.kvb[kv.k_buf] + kv.k_off;
    MK_DEV const uchar * vb = c.kvb[kv.v_buf] + kv.v_off;
    for (int u = c.gsg; u < c.M*L.n_head*nch; u += c.nsg) {
        const int ch  = u % nch;
        const int mh  = u / nch;
        const int m   = mh / L.n_head;
        const int h   = mh % L.n_head;
        const int hkv = h / gqa;
        MK_DEV const float * q = mk_scr(c, P.s_q) + m*P.max_q + h*hd;
        float qv[MK_MTL_HD_REGS];
        float acc[MK_MTL_HD_REGS];
        for (int t = 0; t < MK_MTL_HD_REGS; ++t) {
            qv[t]  = t < nt ? q[c.lane + 32*t] : 0.0f;
            acc[t] = 0.0f;
        }
        float mx = MK_NEG_BIG;
        float l  = 0.0f;
        const int c0 = ch*CH;
        const int c1 = min(n_kv, c0 + CH);
        for (int cc = c0; cc < c1; ++cc) {
            const float mv = mask[m*n_kv + cc];
            if (mv < -1e30f) {
                continue;
            }
            MK_DEV const half * kr = (MK_DEV const half *) (kb + cc*kv.k_sc + hkv*kv.k_sh);
            float s = 0.0f;
            for (int t = 0; t < nt; ++t) {
                s = fma(qv[t], (float) kr[c.lane + 32*t], s);
            }
            s = mk_simd_sum(s);
            s = fma(s, P.kq_scale, mv);
            const float mn   = max(mx, s);
            const float corr = exp(mx - mn);
            const float p    = exp(s - mn);
            l = fma(l, corr, p);
            for (int t = 0; t < nt; ++t) {
                const int d = c.lane + 32*t;
                const float vv = (float) *(MK_DEV const half *) (vb + cc*kv.v_sc + hkv*kv.v_sh + d*kv.v_sd);
                acc[t] = fma(p, vv, acc[t]*corr);
            }
            mx = mn;
        }
        MK_DEV float * part = mk_scr(c, P.s_part) + ((ulong) mh*P.n_chunk + ch)*PS;
        if (c.lane == 0) {
            part[0] = mx;
            part[1] = l;
        }
        for (int t = 0; t < nt; ++t) {
            part[4 + c.lane + 32*t] = acc[t];
        }
    }
}

static void mk_attn_combine(thread const mk_ctx & c, int il) {
    device const mk_mtl_plan  & P = *c.P;
    device const mk_mtl_layer & L = P.layers[il];
    device const mk_mtl_step  & S = *c.S;
    const int hd    = L.head_dim;
    const int nt    = hd/32;
    const int cache = L.is_swa ? 1 : 0;
    const int nch   = (S.n_kv[cache] + P.att_chunk - 1)/P.att_chunk;
    const int PS    = 4 + P.max_head_dim;
    for (int u = c.gsg; u < c.M*L.n_head; u += c.nsg) {
        const int m = u / L.n_head;
        const int h = u % L.n_head;
        MK_DEV const float * part = mk_scr(c, P.s_part) + (ulong) u*P.n_chunk*PS;
        float gm = MK_NEG_BIG;
        for (int k = 0; k < nch; ++k) {
            if (part[k*PS + 1] > 0.0f) {
                gm = max(gm, part[k*PS]);
            }
        }
        float gl = 0.0f;
        float acc[MK_MTL_HD_REGS];
        for (int t = 0; t < MK_MTL_HD_REGS; ++t) {
            acc[t] = 0.0f;
        }
        for (int k = 0; k < nch; ++k) {
            MK_DEV const float * Pk = part + k*PS;
            const float lk = Pk[1];
            if (!(lk > 0.0f)) {
                continue;
            }
            const float w = exp(Pk[0] - gm);
            gl = fma(lk, w, gl);
            for (int t = 0; t < nt; ++t) {
                acc[t] = fma(w, Pk[4 + c.lane + 32*t], acc[t]);
            }
        }
        const float inv = gl > 0.0f ? 1.0f/gl : 0.0f;
        MK_DEV float * out = mk_scr(c, P.s_att) + m*P.max_q + h*hd;
        for (int t = 0; t < nt; ++t) {
            out[c.lane + 32*t] = acc[t]*inv;
        }
    }
}

// ---------------------------------------------------------------------------------------------

// the layers and the LM head of a step whose residual stream s_x holds its inputs (a decode step: the scaled token
// embeddings; a draft step: the pre-projection): the logits to s_logits, the LM head's inputs rmsnorm(x)*output_norm
// left in s_xn (the hidden states an MTP draft reads). Ends with the LM head (no barrier after it)
static void mk_layers_head(thread const mk_ctx & c) {
    device const mk_mtl_plan & P = *c.P;
    const int n = P.n_embd;
    const bool ple = P.n_embd_pl > 0;

    // the residual step still to apply to x before the next norm: x = (x + rmsnorm(h)*res_w)*res_s
    bool     res   = false;
    mk_mtl_v res_w = P.output_norm;
    float    res_s = 1.0f;

    for (int il = 0; il < P.n_layer; ++il) {
        device const mk_mtl_layer & L = P.layers[il];

        // Q, K, V of rmsnorm(x)*attn_norm
        mk_resnorm(c, res, res_w, res_s, L.attn_norm);
        mk_sync(c);
        {
            mk_job jb[3];
            int nj = 0;
            jb[nj].w = L.wq; jb[nj].y = P.s_q; jb[nj].ldy = P.max_q; ++nj;
            if (L.has_kv) {
                jb[nj].w = L.wk; jb[nj].y = P.s_k; jb[nj].ldy = P.max_kv; ++nj;
                if (!L.v_from_k) {
                    jb[nj].w = L.wv; jb[nj].y = P.s_v; jb[nj].ldy = P.max_kv; ++nj;
                }
            }
            mk_matvec(c, P.s_xn, n, n, jb, nj, MK_EP_PLAIN, 0, 0, 0.0f);
        }
        mk_sync(c);

        mk_heads(c, il);
        mk_sync(c);
        mk_attn_chunks(c, il);
        mk_sync(c);
        mk_attn_combine(c, il);
        mk_sync(c);

        mk_matvec1(c, P.s_att, P.max_q, L.wo, P.s_h, n, MK_EP_PLAIN, 0, 0, 0.0f);
        mk_sync(c);

        // gelu(gate)*up of rmsnorm(x)*ffn_norm, after the attention residual
        mk_resnorm(c, true, L.attn_post_norm, 1.0f, L.ffn_norm);
        mk_sync(c);
        {
            mk_job jb[2];
            jb[0].w = L.ffn_gate; jb[0].y = P.s_g; jb[0].ldy = P.max_ff;
            jb[1].w = L.ffn_up;   jb[1].y = P.s_g; jb[1].ldy = P.max_ff;
            mk_matvec(c, P.s_xn, n, n, jb, 2, MK_EP_PAIR, 0, 0, 0.0f);
        }
        mk_sync(c);
        mk_matvec1(c, P.s_g, P.max_ff, L.ffn_down, P.s_h, n, MK_EP_PLAIN, 0, 0, 0.0f);
        mk_sync(c);

        res   = true;
        res_w = L.ffn_post_norm;
        res_s = ple ? 1.0f : L.out_scale;
        if (ple) {
            // per-layer embedding: x += rmsnorm(h)*ffn_post_norm; pl_g = gelu(pl_gate x)*pl_in[il]; h = pl_proj pl_g
            mk_mtl_v none;
            none.buf = -1;
            none.off = 0;
            mk_resnorm(c, true, res_w, 1.0f, none);
            mk_sync(c);
            mk_matvec1(c, P.s_x, n, L.pl_gate, P.s_pl_g, P.n_embd_pl, MK_EP_GEGLU, P.s_pl_in + (ulong) il*P.n_embd_pl*4,
                       P.n_pl_all, 0.0f);
            mk_sync(c);
            mk_matvec1(c, P.s_pl_g, P.n_embd_pl, L.pl_proj, P.s_h, n, MK_EP_PLAIN, 0, 0, 0.0f);
            mk_sync(c);
            res_w = L.pl_post_norm;
            res_s = L.out_scale;
        }
    }

    // LM head of rmsnorm(x)*output_norm after the last residual, final softcap
    mk_resnorm(c, res, res_w, res_s, P.output_norm);
    mk_sync(c);
    mk_matvec1(c, P.s_xn, n, P.output, P.s_logits, P.n_vocab, P.softcap > 0.0f ? MK_EP_SOFTCAP : MK_EP_PLAIN, 0, 0,
               P.softcap);
}

// ---------------------------------------------------------------------------------------------
// the fused MTP draft (mk_mtl_draft in mk-plan.h; the CUDA kernel's mk_draft_inputs / mk_draft_pick / mk_draft_token)

struct mk_dctx {
    device const mk_mtl_draft * D;
    device const uchar        * tok;   // buffer(MK_MTL_B_TOK): the target's token embeddings
    threadgroup float         * pv;    // [MK_MTL_NSG]
    threadgroup uint          * pi;    // [MK_MTL_NSG]
};

// (v, i) = the pair with the larger value, on a tie the smaller index (the first index of the largest value)
static inline void mk_argmax_pair(thread float & v, thread uint & i, float ov, uint oi) {
    const bool take = ov > v || (ov == v && oi < i);
    v = take ? ov : v;
    i = take ? oi : i;
}

// the threadgroup's argmax of every thread's (v, i): lanes by a butterfly, then simdgroups in order; every thread
// gets the result (the rule is a total order: the result does not depend on the order of the comparisons). Called in
// threadgroup-uniform control flow
static inline void mk_argmax_tg(thread const mk_ctx & c, thread const mk_dctx & d, thread float & v, thread uint & i) {
    mk_argmax_pair(v, i, simd_shuffle_xor(v, 16), simd_shuffle_xor(i, 16));
    mk_argmax_pair(v, i, simd_shuffle_xor(v, 8),  simd_shuffle_xor(i, 8));
    mk_argmax_pair(v, i, simd_shuffle_xor(v, 4),  simd_shuffle_xor(i, 4));
    mk_argmax_pair(v, i, simd_shuffle_xor(v, 2),  simd_shuffle_xor(i, 2));
    mk_argmax_pair(v, i, simd_shuffle_xor(v, 1),  simd_shuffle_xor(i, 1));
    if (c.lane == 0) {
        d.pv[c.sg] = v;
        d.pi[c.sg] = i;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    v = d.pv[0];
    i = d.pi[0];
    for (int k = 1; k < MK_MTL_NSG; ++k) {
        mk_argmax_pair(v, i, d.pv[k], d.pi[k]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
}

// the draft of step j from the threadgroups' partial picks (after the grid barrier that follows mk_draft_pick): every
// threadgroup reduces the same partials, so all get the same token; threadgroup 0 also stores it for the host
static int mk_draft_token(thread const mk_ctx & c, thread const mk_dctx & d, int j) {
    device const mk_mtl_draft & D = *d.D;
    MK_DEV const float * pv = mk_scr(c, D.s_pv);
    MK_DEV const uint  * pi = (MK_DEV const uint *) (c.scr + D.s_pi);
    float v = -FLT_MAX;
    uint  i = 0xffffffffu;
    const int nb = c.P->debug_flags & MK_MTL_DEBUG_DRAFT_PICK_DROPPED ? c.ntg - 1 : c.ntg;   // (planted bug)
    for (int b = c.tid; b < nb; b += MK_MTL_THREADS) {
        mk_argmax_pair(v, i, pv[b], pi[b]);
    }
    mk_argmax_tg(c, d, v, i);
    const int t = i < (uint) c.P->n_vocab ? (int) i : 0;   // (no logit above -FLT_MAX: token 0)
    if (c.tg == 0 && c.tid == 0) {
        ((MK_DEV int *) (c.scr + D.s_tok))[j] = t;
    }
    return t;
}

// step j's pre-projection input concat(tok_embd[t]*embd_scale, h) (h: the launch's, or step j-1's h_next), the row
// decoded in place by mk_deq32 (the decoding of the weights)
static void mk_draft_inputs(thread const mk_ctx & c, thread const mk_dctx & d, int j, int t) {
    device const mk_mtl_draft & D = *d.D;
    const int nb = D.n_embd_bb;
    device const uchar * row = d.tok + D.tok_embd.off + (ulong) t*D.tok_embd.nb1;
    MK_DEV float * xh = mk_scr(c, D.s_xh);
    const int tid = c.tg*MK_MTL_THREADS + c.tid;
    for (int g = tid; g < nb/32; g += c.ntg*MK_MTL_THREADS) {
        float w[32];
        mk_deq32(row, D.tok_embd.type, g, 32, w);
        for (int i = 0; i < 32; ++i) {
            xh[32*g + i] = w[i]*D.embd_scale;
        }
    }
    const bool chain = !(c.P->debug_flags & MK_MTL_DEBUG_DRAFT_H_UNCHAINED);   // (planted bug)
    MK_DEV const float * h = j == 0 || !chain ? mk_scr(c, D.s_hin) : mk_scr(c, D.s_hn) + (ulong) (j - 1)*nb;
    for (int i = tid; i < nb; i += c.ntg*MK_MTL_THREADS) {
        xh[nb + i] = h[i];
    }
}

// every threadgroup: the largest logit of its slice of the vocabulary and its first index (and the slice's logits to
// s_lg, if wanted); the step's draft is reduced from them after the grid barrier that follows (mk_draft_token)
static void mk_draft_pick(thread const mk_ctx & c, thread const mk_dctx & d, int j) {
    device const mk_mtl_draft & D = *d.D;
    const int nv  = c.P->n_vocab;
    const int per = (nv + c.ntg - 1)/c.ntg;
    const int i0  = c.tg*per;
    const int i1  = min(i0 + per, nv);
    MK_DEV const float * lg = mk_scr(c, c.P->s_logits);
    MK_DEV float * out = mk_scr(c, D.s_lg) + (ulong) j*nv;
    float v = -FLT_MAX;
    uint  i = (uint) nv;   // (an empty slice: loses every comparison)
    for (int r = i0 + c.tid; r < i1; r += MK_MTL_THREADS) {
        const float x = lg[r];
        if (D.want_logits) {
            out[r] = x;
        }
        if (x > v) {
            v = x;
            i = (uint) r;
        }
    }
    mk_argmax_tg(c, d, v, i);
    if (c.tid == 0) {
        mk_scr(c, D.s_pv)[c.tg] = v;
        ((MK_DEV uint *) (c.scr + D.s_pi))[c.tg] = i;
    }
}

// ---------------------------------------------------------------------------------------------

// the buffer indices of mk-plan.h (literal in the attributes below)
static_assert(MK_MTL_B_PLAN == 0 && MK_MTL_B_STEP == 1 && MK_MTL_B_W0 == 2 && MK_MTL_N_WBUF == 4 && MK_MTL_B_KV0 == 6 &&
              MK_MTL_N_KVBUF == 2 && MK_MTL_B_SCRATCH == 8 && MK_MTL_B_BAR == 9 && MK_MTL_B_DRAFT == 10 &&
              MK_MTL_B_TOK == 11, "mk-plan.h buffer indices");

static inline void mk_ctx_init(thread mk_ctx & c, device const mk_mtl_plan * plan, device const uchar * stp,
                               device const uchar * w0, device const uchar * w1, device const uchar * w2, device const uchar * w3,
                               MK_DEV uchar * kv0, MK_DEV uchar * kv1, MK_DEV uchar * scr, device atomic_uint * bar,
                               threadgroup float * red, uint tgpig, uint ntgpg, ushort tiitg, ushort sgitg, ushort tiisg) {
    c.P      = plan;
    c.S      = (device const mk_mtl_step *) stp;
    c.stp    = stp;
    c.wb[0]  = w0;
    c.wb[1]  = w1;
    c.wb[2]  = w2;
    c.wb[3]  = w3;
    c.kvb[0] = kv0;
    c.kvb[1] = kv1;
    c.scr    = scr;
    c.bar    = bar;
    c.red    = red;
    c.M      = c.S->n_tokens;
    c.tg     = (int) tgpig;
    c.ntg    = (int) ntgpg;
    c.tid    = (int) tiitg;
    c.sg     = (int) sgitg;
    c.lane   = (int) tiisg;
    c.gsg    = c.tg*MK_MTL_NSG + c.sg;
    c.nsg    = c.ntg*MK_MTL_NSG;
}

kernel void kernel_mk_decode(
        device const mk_mtl_plan * plan  [[buffer(0)]],
        device const uchar       * stp   [[buffer(1)]],
        device const uchar       * w0    [[buffer(2)]],
        device const uchar       * w1    [[buffer(3)]],
        device const uchar       * w2    [[buffer(4)]],
        device const uchar       * w3    [[buffer(5)]],
        MK_DEV uchar             * kv0   [[buffer(6)]],
        MK_DEV uchar             * kv1   [[buffer(7)]],
        MK_DEV uchar             * scr   [[buffer(8)]],
        device atomic_uint       * bar   [[buffer(9)]],
        uint   tgpig [[threadgroup_position_in_grid]],
        uint   ntgpg [[threadgroups_per_grid]],
        ushort tiitg [[thread_index_in_threadgroup]],
        ushort sgitg [[simdgroup_index_in_threadgroup]],
        ushort tiisg [[thread_index_in_simdgroup]]) {
    threadgroup float red[MK_MTL_NSG];

    mk_ctx c;
    mk_ctx_init(c, plan, stp, w0, w1, w2, w3, kv0, kv1, scr, bar, red, tgpig, ntgpg, tiitg, sgitg, tiisg);

    device const mk_mtl_plan & P = *plan;
    const int n = P.n_embd;

    // x = token embedding * sqrt(n_embd)
    {
        device const float * e = (device const float *) (stp + c.S->embd);
        MK_DEV float * x = mk_scr(c, P.s_x);
        for (int i = c.tg*MK_MTL_THREADS + c.tid; i < c.M*n; i += c.ntg*MK_MTL_THREADS) {
            x[i] = e[i]*P.embd_scale;
        }
    }
    mk_sync(c);

    if (P.n_embd_pl > 0) {
        mk_matvec1(c, P.s_x, n, P.pl_model_proj, P.s_pl_in, P.n_pl_all, MK_EP_PLAIN, 0, 0, 0.0f);
        mk_sync(c);
        mk_pl_inputs(c);
        mk_sync(c);
    }

    mk_layers_head(c);
}

// the fused MTP draft: D.k steps of the assistant (a one-token step of the plan ggml_mk_draft_model makes of it) in
// one dispatch; step j: t = the launch's token or step j-1's draft, x = pre*concat(tok_embd[t]*embd_scale, h) (h: the
// launch's or step j-1's h_next), the layers and the LM head, h_next = post*n, the draft = the argmax of the logits.
// Every step is at the launch's position with its KV cells and masks (the step buffer, M = 1)
kernel void kernel_mk_draft(
        device const mk_mtl_plan  * plan  [[buffer(0)]],
        device const uchar        * stp   [[buffer(1)]],
        device const uchar        * w0    [[buffer(2)]],
        device const uchar        * w1    [[buffer(3)]],
        device const uchar        * w2    [[buffer(4)]],
        device const uchar        * w3    [[buffer(5)]],
        MK_DEV uchar              * kv0   [[buffer(6)]],
        MK_DEV uchar              * kv1   [[buffer(7)]],
        MK_DEV uchar              * scr   [[buffer(8)]],
        device atomic_uint        * bar   [[buffer(9)]],
        device const mk_mtl_draft * dft   [[buffer(10)]],
        device const uchar        * tok   [[buffer(11)]],
        uint   tgpig [[threadgroup_position_in_grid]],
        uint   ntgpg [[threadgroups_per_grid]],
        ushort tiitg [[thread_index_in_threadgroup]],
        ushort sgitg [[simdgroup_index_in_threadgroup]],
        ushort tiisg [[thread_index_in_simdgroup]]) {
    threadgroup float red[MK_MTL_NSG];
    threadgroup float pick_v[MK_MTL_NSG];
    threadgroup uint  pick_i[MK_MTL_NSG];

    mk_ctx c;
    mk_ctx_init(c, plan, stp, w0, w1, w2, w3, kv0, kv1, scr, bar, red, tgpig, ntgpg, tiitg, sgitg, tiisg);
    mk_dctx d;
    d.D   = dft;
    d.tok = tok;
    d.pv  = pick_v;
    d.pi  = pick_i;

    device const mk_mtl_plan  & P = *plan;
    device const mk_mtl_draft & D = *dft;
    const int n  = P.n_embd;
    const int nb = D.n_embd_bb;

    for (int j = 0; j < D.k; ++j) {
        const int t = j == 0 ? D.token : mk_draft_token(c, d, j - 1);
        mk_draft_inputs(c, d, j, t);
        mk_sync(c);
        mk_matvec1(c, D.s_xh, 2*nb, D.pre, P.s_x, n, MK_EP_PLAIN, 0, 0, 0.0f);
        mk_sync(c);
        mk_layers_head(c);
        mk_sync(c);
        // h_next = post*n (n: the LM head's inputs, s_xn), and the threadgroups' partial picks of the logits
        mk_matvec1(c, P.s_xn, n, D.post, D.s_hn + (ulong) j*nb*4, nb, MK_EP_PLAIN, 0, 0, 0.0f);
        mk_draft_pick(c, d, j);
        mk_sync(c);
    }
    if (c.tg == 0) {
        mk_draft_token(c, d, D.k - 1);   // the last draft for the host (the others: each next step reduced them)
    }
}
