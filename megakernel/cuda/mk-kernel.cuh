// mk-kernel.cuh: the device code of the CUDA Gemma decode megakernel (megakernel/cuda/mk.cu has the
// host side). Written against a few macros so that the very same code also compiles for the CPU in
// the host emulation test (tests/mk_hostemu/): the includer defines
//   MK_DEVICE (inline helpers), MK_DEVICE_FN (larger device functions), MK_KERNEL (return type and
//   attributes of the entry point),
//   MK_SHARED(T, name, n) / MK_SHARED_DYN(T, name) (block-shared arrays), MK_UNROLL, MK_TRAP(),
//   mk_f16(bits) -> float, mk_ldcg(p) (a load through L2, past the non-coherent L1),
// plus the CUDA built-ins it uses (threadIdx, __syncthreads, __shfl_xor_sync, atomics, half, ...).
#pragma once

#include "ggml-mk.h"

#define MK_WARPS   8
#define MK_THREADS (MK_WARPS*WARP_SIZE)
#define MK_M       GGML_MK_MAX_TOKENS

static_assert(MK_M <= MK_WARPS, "one warp per column in the norm prologue");

// the per-step data on the device (uploaded with the masks and embedding rows in one copy)
struct mk_dstep {
    int32_t n_tokens;
    int32_t pos[MK_M];
    int32_t n_kv[GGML_MK_N_CACHES];
    int64_t kv_idx[GGML_MK_N_CACHES][MK_M];
    ggml_mk_kv_view kv[GGML_MK_MAX_LAYERS];
};

struct mk_args {
    const ggml_mk_model * m;     // device copy of the plan
    const mk_dstep      * st;    // device copy of the step
    const float * mask[GGML_MK_N_CACHES];  // [n_tokens][n_kv]
    const float * embd;          // [M][n_embd]
    const float * pl_embd;       // [M][n_pl_all]

    // scratch, each [MK_M][width]
    float * x;      // residual stream (n_embd)
    float * q;      // max_q
    float * k;      // max_kv
    float * v;      // max_kv
    float * att;    // max_q
    float * h;      // n_embd
    float * g;      // max_ff
    float * u;      // max_ff
    float * pl_in;  // n_pl_all (Gemma 4: per-layer inputs)
    float * pl_g;   // n_embd_pl
    float * logits; // n_vocab
    unsigned * bar; // grid barrier: [0] arrivals, [1] generation
    int n_pl_all;
};

// ---------------------------------------------------------------------------------------------
// grid barrier: arrive + spin on a generation counter, fences on both sides

MK_DEVICE void mk_grid_sync(const mk_args & a) {
    __syncthreads();
    if (a.m->debug_flags & GGML_MK_DEBUG_NO_GRID_BARRIER) {
        return; // planted bug for the tests: phases race
    }
    if (threadIdx.x == 0) {
        volatile unsigned * gen = a.bar + 1;
        const unsigned g = *gen;
        __threadfence();
        if (atomicAdd(a.bar, 1u) == gridDim.x - 1) {
            atomicExch(a.bar, 0u);
            __threadfence();
            atomicAdd(a.bar + 1, 1u);
        } else {
            while (*gen == g) {
                __nanosleep(20);
            }
        }
        __threadfence();
    }
    __syncthreads();
}

// ---------------------------------------------------------------------------------------------
// weights: 32 consecutive values of a row (group g = values 32g..32g+31), any supported type

#include "mk-deq.cuh"

// ---------------------------------------------------------------------------------------------
// mat-vec over M columns: y[m][r] = sum_k W[r][k] * X(m, k)

enum mk_xmode {
    MK_X_PLAIN = 0,   // X = a[m][k]
    MK_X_NORM  = 1,   // X = a[m][k] * rs[m] * nw[k]     (rms norm with weight, rs from the prologue)
    MK_X_GEGLU = 2,   // X = gelu(a[m][k]) * b[m][k]
};

struct mk_xin {
    int           mode;
    const float * a;  int lda;
    const float * b;  int ldb;
    const float * nw;
};

struct mk_job {
    ggml_mk_weight w;
    float * y;  int ldy;
    float softcap;   // 0 = none
};

// explicit rounding intrinsics: never contracted into FMAs differently at different call sites
MK_DEVICE float mk_gelu(float x) {
    const float GELU_COEF_A    = 0.044715f;
    const float SQRT_2_OVER_PI = 0.79788456080286535587989211986876f;
    const float inner = __fmul_rn(__fmul_rn(SQRT_2_OVER_PI, x), __fadd_rn(1.0f, __fmul_rn(__fmul_rn(GELU_COEF_A, x), x)));
    return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(inner)));
}

MK_DEVICE float mk_warp_sum(float v) {
#pragma unroll
    for (int o = WARP_SIZE/2; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffff, v, o);
    }
    return v;
}

// rs[m] = 1/sqrt(mean(a[m]^2) + eps) for m < M, one warp per column; every block computes its own copy
MK_DEVICE_FN void mk_rms_prologue(const float * a, int lda, int n, int M, float eps, float * rs) {
    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (warp < M) {
        float ss = 0.0f;
        for (int k = lane; k < n; k += WARP_SIZE) {
            const float t = mk_ldcg(a + (size_t) warp*lda + k);
            ss = fmaf(t, t, ss);
        }
        ss = mk_warp_sum(ss);
        if (lane == 0) {
            rs[warp] = 1.0f/sqrtf(ss/n + eps);
        }
    }
    __syncthreads();
}

MK_DEVICE float mk_x(const mk_xin & x, const float * rs, int m, int k) {
    switch (x.mode) {
        case MK_X_NORM:  return __fmul_rn(__fmul_rn(mk_ldcg(x.a + (size_t) m*x.lda + k), rs[m]), x.nw[k]);
        case MK_X_GEGLU: return __fmul_rn(mk_gelu(mk_ldcg(x.a + (size_t) m*x.lda + k)), mk_ldcg(x.b + (size_t) m*x.ldb + k));
        default:         return mk_ldcg(x.a + (size_t) m*x.lda + k);
    }
}

// the block's copy of the transformed inputs, when M*K fits: [m][k + k/32] (padded: no bank conflicts)
#define MK_XS_CAP   20480
#define MK_XS_BYTES ((MK_XS_CAP + MK_XS_CAP/32)*sizeof(float))

MK_DEVICE_FN void mk_matvec(const mk_job * jobs, int n_jobs, const mk_xin & x, const float * rs, int M) {
    MK_SHARED_DYN(float, xs);
    const int K  = jobs[0].w.ne0;
    const int KP = K + K/32;
    const bool staged = M*K <= MK_XS_CAP;
    if (staged) {
        for (int i = threadIdx.x; i < M*K; i += MK_THREADS) {
            const int m = i / K;
            const int k = i % K;
            xs[m*KP + k + k/32] = mk_x(x, rs, m, k);
        }
        __syncthreads();
    }
    const int lane   = threadIdx.x % WARP_SIZE;
    const int warp   = blockIdx.x*MK_WARPS + threadIdx.x / WARP_SIZE;
    const int nwarps = gridDim.x*MK_WARPS;

    int rows = 0;
    for (int j = 0; j < n_jobs; ++j) {
        rows += jobs[j].w.ne1;
    }
    for (int r = warp; r < rows; r += nwarps) {
        int j  = 0;
        int rr = r;
        while (rr >= jobs[j].w.ne1) {
            rr -= jobs[j].w.ne1;
            ++j;
        }
        const mk_job & jb = jobs[j];
        const uint8_t * row = (const uint8_t *) jb.w.data + (size_t) rr*jb.w.nb1;
        const int G = (K + 31)/32;

        float acc[MK_M];
#pragma unroll
        for (int m = 0; m < MK_M; ++m) acc[m] = 0.0f;

        for (int g = lane; g < G; g += WARP_SIZE) {
            const int lim = min(32, K - 32*g);
            float w[32];
            mk_deq32(row, jb.w.type, g, lim, w);
#pragma unroll
            for (int m = 0; m < MK_M; ++m) {
                if (m < M) {
#pragma unroll
                    for (int i = 0; i < 32; ++i) {
                        if (i < lim) {
                            const float xv = staged ? xs[m*KP + 33*g + i] : mk_x(x, rs, m, 32*g + i);
                            acc[m] = fmaf(w[i], xv, acc[m]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int m = 0; m < MK_M; ++m) {
            if (m < M) {
                float s = mk_warp_sum(acc[m]);
                if (jb.softcap != 0.0f) {
                    s = tanhf(s/jb.softcap)*jb.softcap;
                }
                if (lane == 0) {
                    jb.y[(size_t) m*jb.ldy + rr] = s;
                }
            }
        }
    }
    __syncthreads(); // xs is restaged by the next mat-vec
}

// x[m][k] = (x[m][k] + h[m][k]*rs_h[m]*nw[k]) * scale over the grid
MK_DEVICE_FN void mk_residual(const mk_args & a, const float * nw, float scale, int M, float * rs) {
    const int n = a.m->n_embd;
    mk_rms_prologue(a.h, n, n, M, a.m->norm_eps, rs);
    const int tid = blockIdx.x*MK_THREADS + threadIdx.x;
    for (int i = tid; i < M*n; i += gridDim.x*MK_THREADS) {
        const int m = i / n;
        const int k = i % n;
        a.x[i] = (mk_ldcg(a.x + i) + mk_ldcg(a.h + i)*rs[m]*nw[k])*scale;
    }
}

// ---------------------------------------------------------------------------------------------
// per-head work: Q/K/V norms, rope, KV cache writes (one warp per head vector)

MK_DEVICE_FN void mk_rope(float * s, int n_rot, int pos, const ggml_mk_layer & L, float attn_factor) {
    const int lane = threadIdx.x % WARP_SIZE;
    const float theta_scale = powf(L.rope_base, -2.0f/n_rot);
    for (int i = lane; i < n_rot/2; i += WARP_SIZE) {
        const float theta_base = pos*powf(theta_scale, (float) i);
        const float ff = L.rope_freqs ? L.rope_freqs[i] : 1.0f;
        const float theta = L.rope_scale*(theta_base/ff);
        const float c = cosf(theta)*attn_factor;
        const float sn = sinf(theta)*attn_factor;
        const float x0 = s[i];
        const float x1 = s[i + n_rot/2];
        s[i]           = x0*c - x1*sn;
        s[i + n_rot/2] = x0*sn + x1*c;
    }
    __syncwarp();
}

MK_DEVICE_FN void mk_heads(const mk_args & a, int il, int M, float * wsm) {
    const ggml_mk_layer & L = a.m->layers[il];
    const mk_dstep & st = *a.st;
    const int lane   = threadIdx.x % WARP_SIZE;
    const int warp   = blockIdx.x*MK_WARPS + threadIdx.x / WARP_SIZE;
    const int nwarps = gridDim.x*MK_WARPS;
    const int hd     = L.head_dim;
    const int n_kvh  = L.has_kv ? L.n_head_kv : 0;
    const int per_m  = L.n_head + 2*n_kvh;
    const int cache  = L.is_swa ? 1 : 0;
    const float eps  = a.m->norm_eps;
    float * s = wsm + (threadIdx.x / WARP_SIZE)*GGML_MK_MAX_HEAD_DIM;

    for (int u = warp; u < M*per_m; u += nwarps) {
        const int m  = u / per_m;
        int h        = u % per_m;
        int kind     = 0; // 0 q, 1 k, 2 v
        if (h >= L.n_head) {
            h -= L.n_head;
            kind = 1 + h / n_kvh;
            h %= n_kvh;
        }
        const float * src;
        const float * nw = nullptr;
        if (kind == 0) {
            src = a.q + (size_t) m*a.m->max_q + h*hd;
            nw  = L.q_norm;
        } else if (kind == 1 || L.v_from_k) {
            src = a.k + (size_t) m*a.m->max_kv + h*hd;
            nw  = kind == 1 ? L.k_norm : nullptr;
        } else {
            src = a.v + (size_t) m*a.m->max_kv + h*hd;
        }
        const bool do_norm = kind != 2 || L.v_norm;

        float ss = 0.0f;
        for (int d = lane; d < hd; d += WARP_SIZE) {
            const float t = mk_ldcg(src + d);
            s[d] = t;
            ss = fmaf(t, t, ss);
        }
        ss = mk_warp_sum(ss);
        const float r = 1.0f/sqrtf(ss/hd + eps);
        if (do_norm) {
            for (int d = lane; d < hd; d += WARP_SIZE) {
                s[d] = nw ? s[d]*r*nw[d] : s[d]*r;
            }
        }
        __syncwarp();
        if (kind != 2) {
            mk_rope(s, L.n_rot, st.pos[m], L, a.m->attn_factor);
        }
        if (kind == 0) {
            float * dst = a.q + (size_t) m*a.m->max_q + h*hd;
            for (int d = lane; d < hd; d += WARP_SIZE) {
                dst[d] = s[d]*L.q_scale;
            }
        } else {
            const ggml_mk_kv_view & kv = st.kv[il];
            const int64_t cell = st.kv_idx[cache][m];
            for (int d = lane; d < hd; d += WARP_SIZE) {
                const half hv = __float2half(s[d]);
                if (kind == 1) {
                    *(half *) ((char *) kv.k + cell*kv.k_sc + h*kv.k_sh + 2*d) = hv;
                } else {
                    *(half *) ((char *) kv.v + cell*kv.v_sc + h*kv.v_sh + d*kv.v_sd) = hv;
                }
            }
        }
        __syncwarp();
    }
}

// ---------------------------------------------------------------------------------------------
// attention: one warp per (token, head), online softmax over the cells the mask lets through

MK_DEVICE_FN void mk_attention(const mk_args & a, int il, int M) {
    const ggml_mk_layer & L = a.m->layers[il];
    const mk_dstep & st = *a.st;
    const int lane   = threadIdx.x % WARP_SIZE;
    const int warp   = blockIdx.x*MK_WARPS + threadIdx.x / WARP_SIZE;
    const int nwarps = gridDim.x*MK_WARPS;
    const int hd     = L.head_dim;
    const int nd     = hd/WARP_SIZE;      // dims per lane (<= 16): d = lane + 32*i
    const int cache  = L.is_swa ? 1 : 0;
    const int n_kv   = st.n_kv[cache];
    const ggml_mk_kv_view & kv = st.kv[il];
    const int gqa    = L.n_head / L.n_head_kv;

    for (int u = warp; u < M*L.n_head; u += nwarps) {
        const int m   = u / L.n_head;
        const int h   = u % L.n_head;
        const int hkv = h / gqa;
        const float * q = a.q + (size_t) m*a.m->max_q + h*hd;
        const float * mask = a.mask[cache] + (size_t) m*n_kv;

        float qr[GGML_MK_MAX_HEAD_DIM/WARP_SIZE];
        float acc[GGML_MK_MAX_HEAD_DIM/WARP_SIZE];
#pragma unroll
        for (int i = 0; i < GGML_MK_MAX_HEAD_DIM/WARP_SIZE; ++i) {
            qr[i]  = i < nd ? mk_ldcg(q + lane + WARP_SIZE*i) : 0.0f;
            acc[i] = 0.0f;
        }
        float mx = -INFINITY;
        float l  = 0.0f;
        const char * kb = (const char *) kv.k + hkv*kv.k_sh + 2*lane;
        const char * vb = (const char *) kv.v + hkv*kv.v_sh + lane*kv.v_sd;
        for (int c = 0; c < n_kv; ++c) {
            const float mv = mask[c];
            if (mv == -INFINITY) {
                continue;
            }
            const char * kc = kb + c*kv.k_sc;
            float sdot = 0.0f;
#pragma unroll
            for (int i = 0; i < GGML_MK_MAX_HEAD_DIM/WARP_SIZE; ++i) {
                if (i < nd) {
                    const half kh = __ushort_as_half(mk_ldcg((const unsigned short *) (kc + 2*WARP_SIZE*i)));
                    sdot = fmaf(qr[i], __half2float(kh), sdot);
                }
            }
            const float sc = mk_warp_sum(sdot)*a.m->kq_scale + mv;
            const float mn = fmaxf(mx, sc);
            const float corr = expf(mx - mn);
            const float p = expf(sc - mn);
            l = l*corr + p;
            const char * vc = vb + c*kv.v_sc;
#pragma unroll
            for (int i = 0; i < GGML_MK_MAX_HEAD_DIM/WARP_SIZE; ++i) {
                if (i < nd) {
                    const half vh = __ushort_as_half(mk_ldcg((const unsigned short *) (vc + WARP_SIZE*i*kv.v_sd)));
                    acc[i] = fmaf(p, __half2float(vh), acc[i]*corr);
                }
            }
            mx = mn;
        }
        float * out = a.att + (size_t) m*a.m->max_q + h*hd;
        const float inv = l > 0.0f ? 1.0f/l : 0.0f;
#pragma unroll
        for (int i = 0; i < GGML_MK_MAX_HEAD_DIM/WARP_SIZE; ++i) {
            if (i < nd) {
                out[lane + WARP_SIZE*i] = acc[i]*inv;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Gemma 4 per-layer inputs: pl_in[m][il][j] = (rmsnorm(P x / sqrt(n_embd)) * w + e*sqrt(n_pl)) / sqrt(2)

MK_DEVICE_FN void mk_pl_inputs(const mk_args & a, int M) {
    const ggml_mk_model & md = *a.m;
    const int lane   = threadIdx.x % WARP_SIZE;
    const int warp   = blockIdx.x*MK_WARPS + threadIdx.x / WARP_SIZE;
    const int nwarps = gridDim.x*MK_WARPS;
    const int npl    = md.n_embd_pl;
    const float s_proj = 1.0f/sqrtf((float) md.n_embd);
    const float s_tok  = sqrtf((float) npl);
    const float s_out  = 1.0f/sqrtf(2.0f);
    for (int u = warp; u < M*md.n_layer; u += nwarps) {
        const int m  = u / md.n_layer;
        const int il = u % md.n_layer;
        float * p = a.pl_in + (size_t) m*a.n_pl_all + il*npl;
        const float * e = a.pl_embd + (size_t) m*a.n_pl_all + il*npl;
        float ss = 0.0f;
        for (int j = lane; j < npl; j += WARP_SIZE) {
            const float t = mk_ldcg(p + j)*s_proj;
            ss = fmaf(t, t, ss);
        }
        ss = mk_warp_sum(ss);
        const float r = 1.0f/sqrtf(ss/npl + md.norm_eps);
        for (int j = lane; j < npl; j += WARP_SIZE) {
            const float t = mk_ldcg(p + j)*s_proj;
            p[j] = (t*r*md.pl_proj_norm[j] + e[j]*s_tok)*s_out;
        }
    }
}

// ---------------------------------------------------------------------------------------------

MK_KERNEL mk_decode_kernel(const mk_args a) {
    MK_SHARED(float, rs, MK_M);
    MK_SHARED(float, wsm, MK_WARPS*GGML_MK_MAX_HEAD_DIM);

    const ggml_mk_model & md = *a.m;
    const int M = a.st->n_tokens;
    const int n = md.n_embd;

    // x = token embedding * sqrt(n_embd)
    {
        const int tid = blockIdx.x*MK_THREADS + threadIdx.x;
        for (int i = tid; i < M*n; i += gridDim.x*MK_THREADS) {
            a.x[i] = a.embd[i]*md.embd_scale;
        }
    }
    mk_grid_sync(a);

    if (md.n_embd_pl > 0) {
        mk_job j = { md.pl_model_proj, a.pl_in, a.n_pl_all, 0.0f };
        mk_xin xi = { MK_X_PLAIN, a.x, n, nullptr, 0, nullptr };
        mk_matvec(&j, 1, xi, rs, M);
        mk_grid_sync(a);
        mk_pl_inputs(a, M);
        mk_grid_sync(a);
    }

    for (int il = 0; il < md.n_layer; ++il) {
        const ggml_mk_layer & L = md.layers[il];

        // Q, K, V projections of rmsnorm(x) * attn_norm
        {
            mk_rms_prologue(a.x, n, n, M, md.norm_eps, rs);
            mk_job jobs[3];
            int nj = 0;
            jobs[nj++] = { L.wq, a.q, md.max_q, 0.0f };
            if (L.has_kv) {
                jobs[nj++] = { L.wk, a.k, md.max_kv, 0.0f };
                if (!L.v_from_k) {
                    jobs[nj++] = { L.wv, a.v, md.max_kv, 0.0f };
                }
            }
            mk_xin xi = { MK_X_NORM, a.x, n, nullptr, 0, L.attn_norm };
            mk_matvec(jobs, nj, xi, rs, M);
        }
        mk_grid_sync(a);

        mk_heads(a, il, M, wsm);
        mk_grid_sync(a);

        mk_attention(a, il, M);
        mk_grid_sync(a);

        {
            mk_job j = { L.wo, a.h, n, 0.0f };
            mk_xin xi = { MK_X_PLAIN, a.att, md.max_q, nullptr, 0, nullptr };
            mk_matvec(&j, 1, xi, rs, M);
        }
        mk_grid_sync(a);

        mk_residual(a, L.attn_post_norm, 1.0f, M, rs);
        mk_grid_sync(a);

        {
            mk_rms_prologue(a.x, n, n, M, md.norm_eps, rs);
            mk_job jobs[2] = {
                { L.ffn_gate, a.g, md.max_ff, 0.0f },
                { L.ffn_up,   a.u, md.max_ff, 0.0f },
            };
            mk_xin xi = { MK_X_NORM, a.x, n, nullptr, 0, L.ffn_norm };
            mk_matvec(jobs, 2, xi, rs, M);
        }
        mk_grid_sync(a);

        {
            mk_job j = { L.ffn_down, a.h, n, 0.0f };
            mk_xin xi = { MK_X_GEGLU, a.g, md.max_ff, a.u, md.max_ff, nullptr };
            mk_matvec(&j, 1, xi, rs, M);
        }
        mk_grid_sync(a);

        const bool ple = md.n_embd_pl > 0;
        mk_residual(a, L.ffn_post_norm, ple ? 1.0f : L.out_scale, M, rs);
        mk_grid_sync(a);

        if (ple) {
            {
                mk_job j = { L.pl_gate, a.pl_g, md.n_embd_pl, 0.0f };
                mk_xin xi = { MK_X_PLAIN, a.x, n, nullptr, 0, nullptr };
                mk_matvec(&j, 1, xi, rs, M);
            }
            mk_grid_sync(a);
            {
                mk_job j = { L.pl_proj, a.h, n, 0.0f };
                mk_xin xi = { MK_X_GEGLU, a.pl_g, md.n_embd_pl, a.pl_in + il*md.n_embd_pl, a.n_pl_all, nullptr };
                mk_matvec(&j, 1, xi, rs, M);
            }
            mk_grid_sync(a);
            mk_residual(a, L.pl_post_norm, L.out_scale, M, rs);
            mk_grid_sync(a);
        }
    }

    // LM head of rmsnorm(x) * output_norm, final softcap
    {
        mk_rms_prologue(a.x, n, n, M, md.norm_eps, rs);
        mk_job j = { md.output, a.logits, md.n_vocab, md.softcap };
        mk_xin xi = { MK_X_NORM, a.x, n, nullptr, 0, md.output_norm };
        mk_matvec(&j, 1, xi, rs, M);
    }
}

