// llama-mk.cpp: the backend-neutral host side of the Gemma decode megakernel (stq-metal).
//
// Built into libllama when LLAMA_MEGAKERNEL is defined (cmake: GGML_MEGAKERNEL_DIR). It derives the
// plan (ggml-mk.h) from the loaded model, and for each decode/verify ubatch hands the backend the
// tokens' embedding rows, positions, KV cells and llama.cpp's own attention masks. The kernel itself
// is the backend's (CUDA: megakernel/cuda/mk.cu), found through the backend registry by name.

#include "llama-mk.h"
#include "ggml-mk.h"

#include "llama-impl.h"
#include "llama-model.h"
#include "llama-cparams.h"
#include "llama-batch.h"
#include "llama-kv-cache.h"
#include "llama-kv-cache-iswa.h"
#include "llama-graph.h"

#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

// ---- LLAMA_MEGAKERNEL_TIMELINE (llama-mk.h) --------------------------------------------------------

namespace {

struct llama_mk_timeline {
    static constexpr int64_t MAX_GAP   = 50000;   // us: a longer interval between calls is idle time
    static constexpr size_t  MAX_KEEP  = 1 << 20; // samples kept per pair (for its median)
    static constexpr size_t  MAX_PAIRS = 48;      // pairs a line shows (the largest totals)

    struct pair_stat {
        std::vector<int32_t> us;
        int64_t n   = 0;
        int64_t sum = 0;
    };

    bool         on     = false;
    int64_t      every  = 256;     // a line every this many points (LLAMA_MEGAKERNEL_TIMELINE=N > 1: every N)
    int64_t      points = 0;
    const char * last_what = nullptr;
    int32_t      last_n    = 0;
    int64_t      last_t    = 0;
    std::map<std::string, pair_stat> pairs;

    void say() const {
        std::vector<std::pair<int64_t, const std::string *>> order;
        for (const auto & [key, st] : pairs) {
            order.emplace_back(-st.sum, &key);
        }
        std::sort(order.begin(), order.end());
        std::string line;
        char buf[192];
        for (size_t i = 0; i < order.size() && i < MAX_PAIRS; ++i) {
            const pair_stat & st = pairs.at(*order[i].second);
            std::vector<int32_t> v = st.us;
            std::nth_element(v.begin(), v.begin() + v.size()/2, v.end());
            snprintf(buf, sizeof(buf), "; %s: %lld x %d us median, %.1f mean", order[i].second->c_str(), (long long) st.n,
                     v.empty() ? 0 : v[v.size()/2], (double) st.sum/st.n);
            line += buf;
        }
        if (!line.empty()) {
            LLAMA_LOG_INFO("llama_mk timeline: %lld points%s\n", (long long) points, line.c_str());
        }
    }
};

llama_mk_timeline & llama_mk_tl() {
    static llama_mk_timeline tl = [] {
        llama_mk_timeline t;
        // (LLAMA_MEGAKERNEL_PROFILE, the kernel's own per-phase profile, turns the host's timeline on too)
        const char * e = getenv("LLAMA_MEGAKERNEL_TIMELINE");
        const char * p = getenv("LLAMA_MEGAKERNEL_PROFILE");
        t.on = (e && atoi(e) > 0) || (p && atoi(p) > 0);
        if (e && atoi(e) > 1) {
            t.every = atoi(e);
        }
        return t;
    }();
    return tl;
}

} // namespace

int64_t llama_mk_tl_now() {
    return llama_mk_tl().on ? ggml_time_us() : 0;
}

void llama_mk_tl_mark(const char * what, int32_t n, int64_t t_us) {
    llama_mk_timeline & tl = llama_mk_tl();
    if (!tl.on) {
        return;
    }
    const int64_t t = t_us != 0 ? t_us : ggml_time_us();
    // (an interval from the end of a decode or a draft is the server's: over MAX_GAP it idled between requests)
    const bool between = tl.last_what && (strcmp(tl.last_what, "decode<") == 0 || strcmp(tl.last_what, "draft<") == 0);
    if (tl.last_what && (!between || t - tl.last_t <= llama_mk_timeline::MAX_GAP)) {
        char key[96];
        snprintf(key, sizeof(key), "%s%d .. %s%d", tl.last_what, tl.last_n, what, n);
        auto & st = tl.pairs[key];
        const int64_t d = std::max<int64_t>(t - tl.last_t, 0);
        if (st.us.size() < llama_mk_timeline::MAX_KEEP) {
            st.us.push_back((int32_t) d);
        }
        st.n++;
        st.sum += d;
    }
    tl.last_what = what;
    tl.last_n    = n;
    tl.last_t    = t;
    if (++tl.points % tl.every == 0) {
        tl.say();
    }
}

// host staging of a step: mask and index tensors in a host buffer, views of llama.cpp's caches
struct llama_mk_staging {
    ggml_context         * ctx_host = nullptr;
    ggml_backend_buffer_t  buf_host = nullptr;
    ggml_context         * ctx_views = nullptr;

    ~llama_mk_staging() {
        if (buf_host) {
            ggml_backend_buffer_free(buf_host);
        }
        if (ctx_host) {
            ggml_free(ctx_host);
        }
        if (ctx_views) {
            ggml_free(ctx_views);
        }
    }
};

struct llama_mk : llama_mk_staging {
    const llama_model   * model = nullptr;
    ggml_backend_mk_eval_t eval = nullptr;
    ggml_backend_mk_free_t free_fn = nullptr;
    void                 * backend_mk = nullptr;
    ggml_mk_model          plan = {};
    bool                   iswa = false;
    bool                   multi_stream = false; // non-unified KV cache of several sequences: one stream per sequence
    bool                   streams_ok = false;   // a batch over several streams can be one step (llama_mk_decode)

    // host staging for one step
    std::vector<float>     embd;     // [n_tokens][n_embd]
    std::vector<float>     pl_embd;  // [n_tokens][n_embd_pl*n_layer]
    std::vector<uint8_t>   row_buf;
    std::vector<float>     mask_cat[GGML_MK_N_CACHES];   // masks over the streams of a batch laid end to end
    uint32_t               host_n_kv[GGML_MK_N_CACHES] = {0, 0};
    uint32_t               host_n_tokens = 0;
    uint32_t               host_n_stream = 0;
    ggml_tensor          * t_mask[GGML_MK_N_CACHES] = {nullptr, nullptr};
    ggml_tensor          * t_idx [GGML_MK_N_CACHES] = {nullptr, nullptr};

    // the logits rows for the backend samplers on the output device (llama_mk_logits_dev)
    ggml_context         * ctx_dev = nullptr;
    ggml_backend_buffer_t  buf_dev = nullptr;
    ggml_tensor          * t_logits_dev = nullptr;
    bool                   tried_dev = false;

    std::set<std::string>  said;     // reasons already logged
    bool                   said_streams = false;

    ~llama_mk() {
        llama_mk_tl().say();
        if (buf_dev) {
            ggml_backend_buffer_free(buf_dev);
        }
        if (ctx_dev) {
            ggml_free(ctx_dev);
        }
        if (backend_mk && free_fn) {
            free_fn(backend_mk);
        }
    }
};

void llama_mk_deleter::operator()(llama_mk * mk) const {
    delete mk;
}

static void llama_mk_say_once(llama_mk * mk, const std::string & why) {
    if (mk->said.insert(why).second) {
        LLAMA_LOG_INFO("llama_mk: standard graph for this batch: %s\n", why.c_str());
    }
}

static bool llama_mk_type_ok(ggml_type type) {
    switch (type) {
        case GGML_TYPE_F32:
        case GGML_TYPE_F16:
        case GGML_TYPE_BF16:
        case GGML_TYPE_Q4_0:
        case GGML_TYPE_Q5_0:
        case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q4_K:
        case GGML_TYPE_Q6_K:
        case GGML_TYPE_STQ1_0:
            return true;
        default:
            return false;
    }
}

// the device a tensor's data lives on, or nullptr when it is in host memory
static ggml_backend_dev_t llama_mk_tensor_dev(const ggml_tensor * t) {
    if (!t || !t->buffer || ggml_backend_buffer_is_host(t->buffer)) {
        return nullptr;
    }
    return ggml_backend_buft_get_device(ggml_backend_buffer_get_type(t->buffer));
}

// whether bt is one of the device's extra buffer types (weights repacked at load, e.g. CUDA's STQ1_0 RP16): their
// bytes are not in the GGUF layout the kernels decode
static bool llama_mk_is_extra_buft(ggml_backend_dev_t dev, ggml_backend_buffer_type_t bt) {
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto get_extra = reg ? (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts") : nullptr;
    if (!get_extra) {
        return false;
    }
    for (ggml_backend_buffer_type_t * p = get_extra(dev); p && *p; ++p) {
        if (*p == bt) {
            return true;
        }
    }
    return false;
}

struct llama_mk_builder {
    std::string         why;     // first reason the plan cannot be made
    ggml_backend_dev_t  dev = nullptr;
    bool                host_ok = false;   // host memory is fine (a plan read on the CPU, by a reference)

    bool on_dev(const ggml_tensor * t, const char * what) {
        if (!why.empty()) {
            return false;
        }
        ggml_backend_dev_t d = llama_mk_tensor_dev(t);
        if (!d) {
            if (host_ok) {
                return true;
            }
            why = std::string(what) + " (" + t->name + ") is in host memory (CPU backend or partial offload)";
            return false;
        }
        const char * bname = ggml_backend_buft_name(ggml_backend_buffer_get_type(t->buffer));
        if (strstr(bname, "Split") || strstr(bname, "split")) {
            why = std::string(what) + " is in a split buffer (" + bname + "): multi-GPU split";
            return false;
        }
        if (llama_mk_is_extra_buft(d, ggml_backend_buffer_get_type(t->buffer))) {
            why = std::string(what) + " (" + t->name + ") was repacked at load (" + bname + "): not in the GGUF layout the kernel reads";
            return false;
        }
        if (dev && d != dev) {
            why = std::string("weights on more than one device (") + ggml_backend_dev_name(dev) + ", " + ggml_backend_dev_name(d) + ")";
            return false;
        }
        dev = d;
        return true;
    }

    ggml_mk_weight weight(const ggml_tensor * t, const char * what, bool optional = false) {
        ggml_mk_weight w = {};
        if (!t) {
            if (!optional && why.empty()) {
                why = std::string(what) + " is missing";
            }
            return w;
        }
        if (!on_dev(t, what)) {
            return w;
        }
        if (!llama_mk_type_ok(t->type)) {
            why = std::string(what) + " (" + t->name + ") has type " + ggml_type_name(t->type) + ", which the megakernel does not read";
            return w;
        }
        const bool is_float = t->type == GGML_TYPE_F32 || t->type == GGML_TYPE_F16 || t->type == GGML_TYPE_BF16;
        if (ggml_n_dims(t) != 2 || (!is_float && t->ne[0] % 32 != 0) || t->nb[0] != ggml_type_size(t->type)) {
            why = std::string(what) + " (" + t->name + ") is not a plain 2-D matrix (quantized rows: a multiple of 32)";
            return w;
        }
        w.data = t->data;
        w.type = t->type;
        w.ne0  = (int32_t) t->ne[0];
        w.ne1  = (int32_t) t->ne[1];
        w.nb1  = t->nb[1];
        w.b256 = (int32_t) ggml_row_size(t->type, 256);
        return w;
    }

    const float * vec(const ggml_tensor * t, const char * what, int64_t n, bool optional = false) {
        if (!t) {
            if (!optional && why.empty()) {
                why = std::string(what) + " is missing";
            }
            return nullptr;
        }
        if (!on_dev(t, what)) {
            return nullptr;
        }
        if (t->type != GGML_TYPE_F32 || ggml_nelements(t) < n || !ggml_is_contiguous(t)) {
            why = std::string(what) + " (" + t->name + ") is not a contiguous F32 vector of " + std::to_string(n);
            return nullptr;
        }
        return (const float *) t->data;
    }
};

// what a layer's plan has in common for a gemma3/gemma4 target and a gemma4 assistant: shapes, rope, the norms, Q/O
// and FFN weights, rope_freqs (Gemma 4 global layers), the output scale; kind names the layer in the reasons. false (and
// b.why) when the megakernel cannot run it. K/V, per-layer inputs and Q scale are the caller's
static bool llama_mk_layer_plan(llama_mk_builder & b, const llama_model & model, const llama_cparams & cparams, int il,
                                const char * kind, ggml_mk_layer & L) {
    const auto & hp = model.hparams;
    const auto & l  = model.layers[il];
    const std::string at = std::string(" of ") + kind + " " + std::to_string(il);

    L.n_head    = (int32_t) hp.n_head(il);
    L.n_head_kv = (int32_t) hp.n_head_kv(il);
    L.head_dim  = (int32_t) hp.n_embd_head_k(il);
    L.n_rot     = (int32_t) hp.n_rot(il);
    L.n_ff      = (int32_t) hp.n_ff(il);
    L.is_swa    = hp.is_swa(il) ? 1 : 0;
    L.rope_base = model.get_rope_freq_base(cparams, il);
    L.rope_scale= model.get_rope_freq_scale(cparams, il);
    L.out_scale = 1.0f;

    if (L.head_dim > GGML_MK_MAX_HEAD_DIM || L.head_dim % 32 != 0 || L.head_dim < 32 || L.n_rot > L.head_dim || L.n_rot % 2 != 0 ||
        L.n_head_kv <= 0 || L.n_head % L.n_head_kv != 0 || hp.n_embd_head_v(il) != (uint32_t) L.head_dim) {
        b.why = std::string(kind) + " " + std::to_string(il) + " has a head layout the megakernel does not handle";
        return false;
    }

    L.attn_norm      = b.vec(l.attn_norm,      ("attn_norm" + at).c_str(), hp.n_embd);
    L.q_norm         = b.vec(l.attn_q_norm,    ("attn_q_norm" + at).c_str(), L.head_dim);
    L.attn_post_norm = b.vec(l.attn_post_norm, ("post_attention_norm" + at).c_str(), hp.n_embd);
    L.ffn_norm       = b.vec(l.ffn_norm,       ("ffn_norm" + at).c_str(), hp.n_embd);
    L.ffn_post_norm  = b.vec(l.ffn_post_norm,  ("post_ffw_norm" + at).c_str(), hp.n_embd);

    L.wq       = b.weight(l.wq,       ("attn_q" + at).c_str());
    L.wo       = b.weight(l.wo,       ("attn_output" + at).c_str());
    L.ffn_gate = b.weight(l.ffn_gate, ("ffn_gate" + at).c_str());
    L.ffn_up   = b.weight(l.ffn_up,   ("ffn_up" + at).c_str());
    L.ffn_down = b.weight(l.ffn_down, ("ffn_down" + at).c_str());
    if (model.arch != LLM_ARCH_GEMMA3 && !L.is_swa) {
        L.rope_freqs = b.vec(l.rope_freqs, ("rope_freqs" + at).c_str(), L.n_rot/2, true);
    }
    if (l.out_scale) {
        if (l.out_scale->type != GGML_TYPE_F32 || ggml_nelements(l.out_scale) != 1) {
            b.why = "layer_output_scale" + at + " is not one F32 value";
            return false;
        }
        ggml_backend_tensor_get(l.out_scale, &L.out_scale, 0, sizeof(float));
    }
    return b.why.empty();
}

// a device's index within its backend (the position among the reg's devices): what the plans call device
static int32_t llama_mk_dev_index(ggml_backend_reg_t reg, ggml_backend_dev_t dev) {
    for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); ++i) {
        if (ggml_backend_reg_dev_get(reg, i) == dev) {
            return (int32_t) i;
        }
    }
    return 0;
}

// the kernel's debug flags from the environment: LLAMA_MEGAKERNEL_DEBUG (planted bugs, tests only) and
// LLAMA_MEGAKERNEL_VARIANT (GGML_MK_VAR_* bits only: kernel variants for A/B runs; logged if log)
static int32_t llama_mk_env_flags(bool log) {
    int32_t flags = 0;
    if (const char * dbg = getenv("LLAMA_MEGAKERNEL_DEBUG")) {
        flags = atoi(dbg);
    }
    if (const char * var = getenv("LLAMA_MEGAKERNEL_VARIANT")) {
        const int bits = (int) strtol(var, nullptr, 0) & ~GGML_MK_DEBUG_MASK;
        flags |= bits;
        if (log) {
            LLAMA_LOG_INFO("llama_mk: kernel variant 0x%x (LLAMA_MEGAKERNEL_VARIANT)\n", bits);
        }
    }
    return flags;
}

llama_mk_ptr llama_mk_init(const llama_model & model, const llama_cparams & cparams) {
    // on by default where the backend has measured it faster than its graph (CUDA on Hopper: NOTES.md, session 10);
    // LLAMA_MEGAKERNEL=1 asks for it on any device, 0 keeps the graph
    const char * env = getenv("LLAMA_MEGAKERNEL");
    const bool asked = env && (strcmp(env, "1") == 0 || strcmp(env, "on") == 0);
    const bool on    = asked || !env || env[0] == '\0' || strcmp(env, "auto") == 0;

    const auto & hp = model.hparams;
    const bool is_g3 = model.arch == LLM_ARCH_GEMMA3;
    const bool is_g4 = model.arch == LLM_ARCH_GEMMA4;
    if (!is_g3 && !is_g4) {
        return nullptr; // other architectures: silently the standard graph
    }
    if (!on) {
        LLAMA_LOG_INFO("llama_mk: megakernel off (LLAMA_MEGAKERNEL=%s; unset it or set 1 to use it)\n", env);
        return nullptr;
    }
    if (hp.no_alloc) {
        return nullptr; // a model without weight data (llama-server's memory fit probes contexts on one): nothing to plan
    }

    auto off = [](const std::string & why) {
        LLAMA_LOG_INFO("llama_mk: megakernel off: %s; the standard graph runs every batch\n", why.c_str());
        return llama_mk_ptr();
    };

    if (hp.n_layer() > GGML_MK_MAX_LAYERS) {
        return off("more than " + std::to_string(GGML_MK_MAX_LAYERS) + " layers");
    }
    if (cparams.yarn_ext_factor != 0.0f) {
        return off("YaRN rope extrapolation (ext_factor != 0)");
    }
    if (hp.rope_type != LLAMA_ROPE_TYPE_NEOX) {
        return off("rope type is not NEOX");
    }
    if (hp.n_embd % 32 != 0) {
        return off("n_embd is not a multiple of 32");
    }

    auto mk = llama_mk_ptr(new llama_mk());
    mk->model = &model;
    mk->multi_stream = !cparams.kv_unified && cparams.n_seq_max > 1;
    ggml_mk_model & p = mk->plan;
    llama_mk_builder b;

    p.version     = GGML_MK_VERSION;
    p.arch        = is_g4 ? GGML_MK_ARCH_GEMMA4 : GGML_MK_ARCH_GEMMA3;
    p.n_layer     = (int32_t) hp.n_layer();
    p.n_embd      = (int32_t) hp.n_embd;
    p.norm_eps    = hp.f_norm_rms_eps;
    p.embd_scale  = sqrtf((float) hp.n_embd);
    p.softcap     = hp.f_final_logit_softcapping;
    p.attn_factor = cparams.yarn_attn_factor;
    p.kq_scale    = is_g4 ? hp.f_attention_scale : 1.0f;
    p.n_embd_pl   = is_g4 ? (int32_t) hp.n_embd_per_layer : 0;
    p.n_ctx       = (int32_t) cparams.n_ctx;
    p.att_chunk   = ggml_mk_att_chunk(p.n_ctx, llama_mk_env_flags(false));
    // several streams laid end to end (llama_mk_decode): V not transposed (llama_context stores it transposed without
    // flash attention), and every stream's cells (n_ctx_seq; the sliding-window caches: multiples of 256) a multiple
    // of the attention chunk
    mk->streams_ok = cparams.flash_attn && cparams.n_ctx_seq % p.att_chunk == 0 && 256 % p.att_chunk == 0;

    // the token embedding rows are looked up on the host (llama.cpp keeps tok_embd in the input
    // layer's buffer); the kernel starts from them
    if (!model.tok_embd || ggml_n_dims(model.tok_embd) != 2) {
        return off("token_embd missing");
    }
    p.output      = b.weight(model.output, "output");
    p.output_norm = b.vec(model.output_norm, "output_norm", hp.n_embd);
    p.n_vocab     = p.output.ne1;

    if (p.n_embd_pl > 0) {
        if (!model.per_layer_tok_embd) {
            return off("per_layer_token_embd missing");
        }
        p.pl_model_proj = b.weight(model.per_layer_model_proj, "per_layer_model_proj");
        p.pl_proj_norm  = b.vec(model.per_layer_proj_norm, "per_layer_proj_norm", p.n_embd_pl);
    }

    for (int il = 0; il < p.n_layer && b.why.empty(); ++il) {
        const auto & l = model.layers[il];
        ggml_mk_layer & L = p.layers[il];
        const std::string at = " of layer " + std::to_string(il);

        if (l.wqkv || l.ffn_gate_inp || l.wq_s || l.wk_s || l.wv_s || l.wo_s || l.ffn_gate_s || l.ffn_up_s || l.ffn_down_s) {
            b.why = "layer " + std::to_string(il) + " has a fused QKV, MoE experts or weight scales";
            break;
        }
        if (!llama_mk_layer_plan(b, model, cparams, il, "layer", L)) {
            break;
        }
        L.has_kv  = hp.has_kv(il) ? 1 : 0;
        L.v_norm  = is_g4 ? 1 : 0;
        L.q_scale = is_g4 ? 1.0f : hp.f_attention_scale;
        if (L.has_kv) {
            L.k_norm = b.vec(l.attn_k_norm, ("attn_k_norm" + at).c_str(), L.head_dim);
            L.wk = b.weight(l.wk, ("attn_k" + at).c_str());
            L.wv = b.weight(l.wv, ("attn_v" + at).c_str(), is_g4);
            L.v_from_k = l.wv ? 0 : 1;
        }
        if (p.n_embd_pl > 0) {
            L.pl_gate      = b.weight(l.per_layer_inp_gate, ("inp_gate" + at).c_str());
            L.pl_proj      = b.weight(l.per_layer_proj,     ("proj" + at).c_str());
            L.pl_post_norm = b.vec(l.per_layer_post_norm,   ("post_norm" + at).c_str(), hp.n_embd);
        }

        p.max_head_dim = std::max(p.max_head_dim, L.head_dim);
        p.max_q        = std::max(p.max_q,  L.n_head*L.head_dim);
        p.max_kv       = std::max(p.max_kv, L.n_head_kv*L.head_dim);
        p.max_ff       = std::max(p.max_ff, L.n_ff);
    }
    if (!b.why.empty()) {
        return off(b.why);
    }
    if (ggml_backend_dev_type(b.dev) != GGML_BACKEND_DEVICE_TYPE_GPU) {
        return off(std::string("weights are on ") + ggml_backend_dev_name(b.dev) + ", not a GPU");
    }
    p.kv_type = GGML_TYPE_F16;
    p.by_default = asked ? 0 : 1;

    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(b.dev);
    auto create = (ggml_backend_mk_create_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_mk_create");
    mk->eval    = (ggml_backend_mk_eval_t)   ggml_backend_reg_get_proc_address(reg, "ggml_backend_mk_eval");
    mk->free_fn = (ggml_backend_mk_free_t)   ggml_backend_reg_get_proc_address(reg, "ggml_backend_mk_free");
    if (!create || !mk->eval || !mk->free_fn) {
        return off(std::string("backend ") + ggml_backend_reg_name(reg) + " has no megakernel");
    }
    p.device = llama_mk_dev_index(reg, b.dev);
    p.debug_flags = llama_mk_env_flags(true);

    char err[256] = {0};
    mk->backend_mk = create(&p, err, sizeof(err));
    if (!mk->backend_mk) {
        return off(std::string("backend: ") + err);
    }
    LLAMA_LOG_INFO("llama_mk: megakernel on %s for decode/verify batches of up to %d tokens (%s, %d layers%s); "
                   "LLAMA_MEGAKERNEL=0 turns it off\n", ggml_backend_dev_name(b.dev), GGML_MK_MAX_TOKENS,
                   is_g4 ? "gemma4" : "gemma3", p.n_layer, p.n_embd_pl ? ", per-layer embeddings" : "");
    return mk;
}

// the iswa context's two caches, or the single cache in slot 0
static bool llama_mk_caches(llama_memory_context_i * mctx, const llama_kv_cache_context * kc[GGML_MK_N_CACHES]) {
    kc[0] = kc[1] = nullptr;
    if (auto * iswa = dynamic_cast<llama_kv_cache_iswa_context *>(mctx)) {
        kc[0] = iswa->get_base();
        kc[1] = iswa->get_swa();
        return true;
    }
    if (auto * kv = dynamic_cast<llama_kv_cache_context *>(mctx)) {
        kc[0] = kv;
        return true;
    }
    return false;
}

bool llama_mk_accepts(llama_mk * mk, const llama_ubatch & ubatch, llama_memory_context_i * mctx, const char * no) {
    if (!mk) {
        return false;
    }
    if (ubatch.n_tokens > GGML_MK_MAX_TOKENS) {
        return false; // prefill: the standard graph, no log line per prompt
    }
    if (no) {
        llama_mk_say_once(mk, no);
        return false;
    }
    if (!ubatch.token) {
        llama_mk_say_once(mk, "embedding inputs (not tokens)");
        return false;
    }
    if (ubatch.n_pos != 1) {
        llama_mk_say_once(mk, "multi-dimensional positions");
        return false;
    }
    const llama_kv_cache_context * kc[GGML_MK_N_CACHES];
    if (!llama_mk_caches(mctx, kc)) {
        llama_mk_say_once(mk, "memory is not a KV cache");
        return false;
    }
    // every cache in use: F16, one stream, on the weights' device
    for (int c = 0; c < GGML_MK_N_CACHES; ++c) {
        if (!kc[c]) {
            continue;
        }
        if (kc[c]->type_k() != GGML_TYPE_F16 || kc[c]->type_v() != GGML_TYPE_F16) {
            llama_mk_say_once(mk, std::string("KV cache type ") + ggml_type_name(kc[c]->type_k()) + "/" + ggml_type_name(kc[c]->type_v()) + " (F16 only)");
            return false;
        }
    }
    for (uint32_t i = 0; i < ubatch.n_tokens; ++i) {
        if (ubatch.n_seq_id[i] != 1) {
            llama_mk_say_once(mk, "a token in several sequences");
            return false;
        }
    }
    // a non-unified cache with -np N spreads a batch over N streams, each with its own cells and mask: the step
    // then sees the streams laid end to end (llama_mk_decode), which needs K and V rows of a cell to be cells of one
    // array across the streams: not so for transposed V. Decided from the sequences, not from a cache view: before
    // apply() the memory context's n_kv is not set yet
    if (mk->multi_stream && !mk->streams_ok) {
        for (uint32_t i = 1; i < ubatch.n_tokens; ++i) {
            if (ubatch.seq_id[i][0] != ubatch.seq_id[0][0]) {
                llama_mk_say_once(mk, "a batch across several KV streams (-np N without a unified KV cache) with V transposed "
                                      "(flash attention off) or streams of cells not a multiple of the attention chunk");
                return false;
            }
        }
    }
    return true;
}

static bool llama_mk_host_tensors(llama_mk * mk, const uint32_t n_kv[GGML_MK_N_CACHES], uint32_t n_tokens, uint32_t n_stream) {
    if (mk->ctx_host && n_tokens == mk->host_n_tokens && n_kv[0] == mk->host_n_kv[0] && n_kv[1] == mk->host_n_kv[1] &&
        n_stream == mk->host_n_stream) {
        return true;
    }
    if (mk->buf_host) {
        ggml_backend_buffer_free(mk->buf_host);
        mk->buf_host = nullptr;
    }
    if (mk->ctx_host) {
        ggml_free(mk->ctx_host);
        mk->ctx_host = nullptr;
    }
    ggml_init_params ip = { 8*ggml_tensor_overhead(), nullptr, true };
    mk->ctx_host = ggml_init(ip);
    for (int c = 0; c < GGML_MK_N_CACHES; ++c) {
        // (the layout llama.cpp's graph input has: [n_kv, tokens per stream, 1, streams], tokens stream by stream)
        mk->t_mask[c] = ggml_new_tensor_4d(mk->ctx_host, GGML_TYPE_F32, std::max<uint32_t>(n_kv[c], 1), n_tokens/n_stream, 1, n_stream);
        mk->t_idx[c]  = ggml_new_tensor_1d(mk->ctx_host, GGML_TYPE_I64, n_tokens);
    }
    mk->buf_host = ggml_backend_alloc_ctx_tensors_from_buft(mk->ctx_host, ggml_backend_cpu_buffer_type());
    if (!mk->buf_host) {
        return false;
    }
    mk->host_n_tokens = n_tokens;
    mk->host_n_stream = n_stream;
    mk->host_n_kv[0]  = n_kv[0];
    mk->host_n_kv[1]  = n_kv[1];
    return true;
}

// dequantized row r of t (any buffer, any type with to_float) into out[t->ne[0]]
static void llama_mk_get_row(llama_mk * mk, const ggml_tensor * t, int64_t r, float * out) {
    const size_t nb = t->nb[1];
    mk->row_buf.resize(nb);
    ggml_backend_tensor_get(t, mk->row_buf.data(), r*nb, nb);
    if (t->type == GGML_TYPE_F32) {
        memcpy(out, mk->row_buf.data(), t->ne[0]*sizeof(float));
    } else {
        ggml_get_type_traits(t->type)->to_float(mk->row_buf.data(), out, t->ne[0]);
    }
}

// where a layer's K/V rows live, from llama.cpp's views of its cache (llama_kv_cache::get_k/get_v)
static ggml_mk_kv_view llama_mk_kv_view_of(const ggml_tensor * k, const ggml_tensor * v) {
    ggml_mk_kv_view kv = {};
    kv.k    = k->data;
    kv.k_sh = (int64_t) k->nb[1];
    kv.k_sc = (int64_t) k->nb[2];
    kv.v    = v->data;
    if (v->nb[1] <= v->nb[2]) { // [head_dim, n_head_kv, n_kv] (llama_kv_cache::get_v: only transposed V has nb[1] > nb[2])
        kv.v_sd = (int64_t) v->nb[0];
        kv.v_sh = (int64_t) v->nb[1];
        kv.v_sc = (int64_t) v->nb[2];
    } else { // transposed V: [n_kv, n_head_kv, head_dim]
        kv.v_sc = (int64_t) v->nb[0];
        kv.v_sh = (int64_t) v->nb[1];
        kv.v_sd = (int64_t) v->nb[2];
    }
    return kv;
}

ggml_tensor * llama_mk_logits_dev(llama_mk * mk) {
    if (!mk->tried_dev) {
        mk->tried_dev = true;
        ggml_backend_dev_t dev = mk->model->dev_output();
        // (rows of the context's logits stride, which the samplers' graph reads)
        ggml_backend_buffer_type_t bt = dev && mk->plan.n_vocab == (int32_t) mk->model->vocab.n_tokens() ?
            ggml_backend_dev_buffer_type(dev) : nullptr;
        ggml_init_params ip = { ggml_tensor_overhead(), nullptr, true };
        mk->ctx_dev = bt ? ggml_init(ip) : nullptr;
        if (mk->ctx_dev) {
            mk->t_logits_dev = ggml_new_tensor_2d(mk->ctx_dev, GGML_TYPE_F32, mk->model->vocab.n_tokens(), GGML_MK_MAX_TOKENS);
            ggml_set_name(mk->t_logits_dev, "mk_logits_dev");
            mk->buf_dev = ggml_backend_alloc_ctx_tensors_from_buft(mk->ctx_dev, bt);
        }
        if (!mk->buf_dev) {
            LLAMA_LOG_WARN("llama_mk: no buffer on the output device for the backend samplers' logits rows (LM head rows %d, "
                           "vocabulary %d)\n", mk->plan.n_vocab, (int) mk->model->vocab.n_tokens());
            mk->t_logits_dev = nullptr;
        }
    }
    return mk->t_logits_dev;
}

bool llama_mk_decode(llama_mk * mk, const llama_ubatch & ubatch, llama_memory_context_i * mctx, float * logits_out,
                     float * h_out, bool h_masked, ggml_tensor * logits_dev) {
    const ggml_mk_model & p = mk->plan;
    const llama_model & model = *mk->model;
    const uint32_t n_tokens = ubatch.n_tokens;
    llama_mk_tl_mark("step>", (int32_t) n_tokens);

    if (!mctx->apply()) {
        LLAMA_LOG_ERROR("llama_mk: failed to apply the memory context\n");
        return false;
    }

    const llama_kv_cache_context * kc[GGML_MK_N_CACHES];
    llama_mk_caches(mctx, kc);

    ggml_mk_step st = {};
    st.n_tokens = (int32_t) n_tokens;

    uint32_t n_kv[GGML_MK_N_CACHES] = {0, 0};
    for (int c = 0; c < GGML_MK_N_CACHES; ++c) {
        n_kv[c] = kc[c] ? kc[c]->get_n_kv() : 0;
    }
    // the streams of this batch (a non-unified cache: one per sequence)
    const uint32_t n_stream = mk->multi_stream ? std::max<uint32_t>(ubatch.n_seqs_unq, 1) : 1;
    if (n_tokens % n_stream != 0) {
        LLAMA_LOG_ERROR("llama_mk: %u tokens over %u KV streams\n", n_tokens, n_stream);
        return false;
    }
    if (!llama_mk_host_tensors(mk, n_kv, n_tokens, n_stream)) {
        LLAMA_LOG_ERROR("llama_mk: cannot allocate the host staging tensors\n");
        return false;
    }
    for (int c = 0; c < GGML_MK_N_CACHES; ++c) {
        st.n_kv[c] = (int32_t) n_kv[c];
        if (!kc[c]) {
            continue;
        }
        // llama.cpp's own cell indices and mask (the same calls its graph inputs make)
        kc[c]->set_input_k_idxs(mk->t_idx[c], &ubatch);
        kc[c]->set_input_kq_mask(mk->t_mask[c], &ubatch, true);
        st.mask[c] = (const float *) mk->t_mask[c]->data;
    }
    // per-layer cache views (the layer a shared-KV layer reads resolves inside get_k/get_v); they start
    // at the ubatch's stream, while set_input_k_idxs counts rows from the start of the whole tensor
    if (!mk->ctx_views) {
        ggml_init_params ip = { (size_t) 4*GGML_MK_MAX_LAYERS*ggml_tensor_overhead(), nullptr, true };
        mk->ctx_views = ggml_init(ip);
    }
    ggml_reset(mk->ctx_views);
    int64_t first_cell[GGML_MK_N_CACHES] = { -1, -1 };
    int64_t kv_size[GGML_MK_N_CACHES]    = { 0, 0 };   // cells per stream
    int64_t n_view[GGML_MK_N_CACHES]     = { 1, 1 };   // streams the views span (first to last of the batch)
    for (int il = 0; il < p.n_layer; ++il) {
        const int c = (p.layers[il].is_swa && kc[1]) ? 1 : 0;
        ggml_tensor * k = kc[c]->get_k(mk->ctx_views, il);
        if (first_cell[c] < 0) {
            first_cell[c] = (int64_t) (k->view_offs / k->nb[2]);
            kv_size[c]    = (int64_t) (k->nb[3] / k->nb[2]);
            n_view[c]     = k->ne[3];
        }
        st.kv[il] = llama_mk_kv_view_of(k, kc[c]->get_v(mk->ctx_views, il));
    }

    for (int c = 0; c < GGML_MK_N_CACHES; ++c) {
        if (!kc[c]) {
            continue;
        }
        const int64_t * idx = (const int64_t *) mk->t_idx[c]->data;
        for (uint32_t i = 0; i < n_tokens; ++i) {
            st.kv_idx[c][i] = idx[i] - std::max<int64_t>(first_cell[c], 0);
        }
        if (n_view[c] > 1) {
            // several streams: the kernel sees them end to end (stream j's cell x is cell j*kv_size + x of the views:
            // K and plain V rows are one array across the streams), each token's mask -INF outside its own stream's
            // n_kv cells. With kv_size a multiple of the attention chunk a sequence's chunks are the ones it has
            // alone, so its logits do not depend on the other streams (the combine order stays its own)
            if (!mk->streams_ok || kv_size[c] % p.att_chunk != 0) {   // (llama_mk_accepts declines such batches)
                LLAMA_LOG_ERROR("llama_mk: KV streams that cannot be laid end to end (%lld cells per stream)\n",
                                (long long) kv_size[c]);
                return false;
            }
            const int64_t W = (n_view[c] - 1)*kv_size[c] + n_kv[c];
            mk->mask_cat[c].assign((size_t) n_tokens*W, -INFINITY);
            const float * m = (const float *) mk->t_mask[c]->data;
            for (uint32_t i = 0; i < n_tokens; ++i) {
                const int64_t j = st.kv_idx[c][i] / kv_size[c];   // the token's stream, counted from the first in view
                memcpy(mk->mask_cat[c].data() + (size_t) i*W + j*kv_size[c], m + (size_t) i*n_kv[c], n_kv[c]*sizeof(float));
            }
            st.mask[c] = mk->mask_cat[c].data();
            st.n_kv[c] = (int32_t) W;
            if (!mk->said_streams) {
                mk->said_streams = true;
                LLAMA_LOG_INFO("llama_mk: a step over %lld KV streams (laid end to end, %lld cells each)\n",
                               (long long) n_view[c], (long long) kv_size[c]);
            }
        }
    }
    if (!kc[1]) {
        // one cache for all layers: the SWA slot aliases it
        st.n_kv[1] = st.n_kv[0];
        st.mask[1] = st.mask[0];
        for (uint32_t i = 0; i < n_tokens; ++i) {
            st.kv_idx[1][i] = st.kv_idx[0][i];
        }
    }

    llama_mk_tl_mark("step.rows>", (int32_t) n_tokens);

    // token embeddings (and Gemma 4 per-layer token embeddings) looked up on the host
    const int64_t n_pl = (int64_t) p.n_embd_pl*p.n_layer;
    mk->embd.resize((size_t) n_tokens*p.n_embd);
    mk->pl_embd.resize((size_t) n_tokens*std::max<int64_t>(n_pl, 1));
    int32_t n_out = 0;
    for (uint32_t i = 0; i < n_tokens; ++i) {
        st.tokens[i] = ubatch.token[i];
        st.pos[i]    = ubatch.pos[i];
        if (ubatch.output[i]) {
            st.out_rows[n_out++] = (int32_t) i;
        }
        llama_mk_get_row(mk, model.tok_embd, ubatch.token[i], mk->embd.data() + (size_t) i*p.n_embd);
        if (n_pl > 0) {
            llama_mk_get_row(mk, model.per_layer_tok_embd, ubatch.token[i], mk->pl_embd.data() + (size_t) i*n_pl);
        }
    }
    st.n_out  = n_out;
    if (h_out) {
        // the rows the graph's t_h_nextn holds: every token, or (masked) the output tokens
        st.n_h = h_masked ? n_out : (int32_t) n_tokens;
        for (int32_t i = 0; i < st.n_h; ++i) {
            st.h_rows[i] = h_masked ? st.out_rows[i] : i;
        }
        st.h_out = h_out;
    }
    st.embd   = mk->embd.data();
    st.pl_embd = n_pl > 0 ? mk->pl_embd.data() : nullptr;
    if (logits_dev) {
        GGML_ASSERT(logits_dev->ne[0] == p.n_vocab && logits_dev->ne[1] >= n_out && ggml_is_contiguous(logits_dev));
        st.logits_dev = logits_dev->data;
    }

    llama_mk_tl_mark("step.launch>", (int32_t) n_tokens);
    const int rc = mk->eval(mk->backend_mk, &st, logits_out);
    if (rc != 0) {
        LLAMA_LOG_ERROR("llama_mk: the megakernel failed (code %d)\n", rc);
        return false;
    }
    llama_mk_tl_mark("step<", (int32_t) n_tokens);
    return true;
}

// ---- backend sampling of a megakernel step --------------------------------------------------------

namespace {

// the input of a LLM_GRAPH_TYPE_MK_SAMPLING graph: the step's logits rows, which the megakernel wrote to its tensor on
// the output device (llama_mk_logits_dev): nothing to upload; the graph can be reused while the rows' tensor and count
// are the same
class llm_graph_input_mk_logits : public llm_graph_input_i {
public:
    explicit llm_graph_input_mk_logits(ggml_tensor * src) : src(src) {}

    void set_input(const llama_ubatch * ubatch) override {
        GGML_UNUSED(ubatch);
    }

    bool can_reuse(const llm_graph_params & params) override {
        return params.mk_logits == src && logits->ne[1] == (int64_t) params.n_outputs;
    }

    ggml_tensor * logits = nullptr;   // [n_vocab, n_outputs]: a view of src
    ggml_tensor * src;
};

// the context's backend samplers over a megakernel step's logits: llm_graph_context::build_sampling, as the model's
// graph applies them to its own t_logits, here on a view of the rows the megakernel wrote to the output device (the
// device llama_context::set_sampler initialized the samplers for: they run where the model's graph would run them)
struct llm_build_mk_sampling : public llm_graph_context {
    llm_build_mk_sampling(const llama_model & model, const llm_graph_params & params) : llm_graph_context(params) {
        GGML_ASSERT(params.mk_logits != nullptr && "LLM_GRAPH_TYPE_MK_SAMPLING without logits");
        GGML_ASSERT(params.mk_logits->ne[0] == model.vocab.n_tokens() && params.mk_logits->ne[1] >= n_outputs);
        auto inp = std::make_unique<llm_graph_input_mk_logits>(params.mk_logits);
        inp->logits = ggml_view_2d(ctx0, params.mk_logits, params.mk_logits->ne[0], n_outputs, params.mk_logits->nb[1], 0);
        ggml_set_name(inp->logits, "mk_logits");
        res->t_logits = inp->logits;
        res->add_input(std::move(inp));
        ggml_build_forward_expand(gf, res->t_logits);
    }
};

} // namespace

std::unique_ptr<llm_graph_context> llama_mk_sampling_graph(const llama_model & model, const llm_graph_params & params) {
    return std::make_unique<llm_build_mk_sampling>(model, params);
}

// ---- the fused MTP draft ----------------------------------------------------------------------

struct llama_mk_draft : llama_mk_staging {
    const llama_model     * model     = nullptr;   // the assistant
    const llama_model     * model_tgt = nullptr;
    llama_context         * ctx_tgt   = nullptr;
    ggml_mk_draft           plan      = {};

    ggml_tensor           * t_mask[GGML_MK_N_CACHES] = {nullptr, nullptr};   // the query's mask row in each cache

    // the backend's fused draft kernel (llama_mk_draft_init without host_ok)
    ggml_backend_mk_draft_eval_t eval       = nullptr;
    ggml_backend_mk_draft_free_t free_fn    = nullptr;
    void                       * backend_mk = nullptr;

    bool said_k = false;   // (llama_mk_draft_tokens: a k above k_max logged once)
};

void llama_mk_draft_deleter::operator()(llama_mk_draft * d) const {
    if (d && d->backend_mk) {
        d->free_fn(d->backend_mk);
    }
    delete d;
}

const ggml_mk_draft * llama_mk_draft_plan(const llama_mk_draft * d) {
    return &d->plan;
}

llama_mk_draft_ptr llama_mk_draft_init(const llama_model & model, const llama_cparams & cparams, std::string & why,
                                       bool host_ok, int32_t k_max) {
    auto fail = [&](const std::string & w) {
        why = w;
        return llama_mk_draft_ptr();
    };
    if (model.arch != LLM_ARCH_GEMMA4_ASSISTANT) {
        return fail(std::string("the draft model's architecture is ") + llm_arch_name(model.arch) + ", not gemma4-assistant");
    }
    if (!cparams.ctx_other) {
        return fail("the assistant's context has no target context (ctx_other)");
    }
    const auto & hp = model.hparams;
    const llama_model & tgt = *llama_get_model(cparams.ctx_other);
    const auto & hpt = tgt.hparams;
    if (tgt.arch != LLM_ARCH_GEMMA4) {
        return fail(std::string("the target's architecture is ") + llm_arch_name(tgt.arch) + ", not gemma4");
    }
    const int32_t n_layer = (int32_t) hp.n_layer_nextn;
    if (n_layer <= 0 || n_layer > GGML_MK_DRAFT_MAX_LAYERS) {
        return fail("the assistant has " + std::to_string(n_layer) + " layers (1.." + std::to_string(GGML_MK_DRAFT_MAX_LAYERS) + ")");
    }
    if (k_max < 1 || k_max > GGML_MK_DRAFT_MAX_K) {
        return fail("k_max = " + std::to_string(k_max) + " (1.." + std::to_string(GGML_MK_DRAFT_MAX_K) + ")");
    }
    if (cparams.yarn_ext_factor != 0.0f || hp.rope_type != LLAMA_ROPE_TYPE_NEOX) {
        return fail("rope is not plain NEOX (YaRN extrapolation or another rope type)");
    }
    const int32_t n_embd_bb = (int32_t) hp.n_embd_inp();
    if (n_embd_bb != (int32_t) hpt.n_embd) {
        return fail("the assistant reads hidden rows of " + std::to_string(n_embd_bb) + " values, the target's are " +
                    std::to_string(hpt.n_embd));
    }
    if (hp.n_embd % 32 != 0 || n_embd_bb % 32 != 0) {
        return fail("n_embd of the assistant or the target is not a multiple of 32");
    }

    auto d = llama_mk_draft_ptr(new llama_mk_draft());
    d->model     = &model;
    d->model_tgt = &tgt;
    d->ctx_tgt   = cparams.ctx_other;
    ggml_mk_draft & p = d->plan;
    llama_mk_builder b;
    b.host_ok = host_ok;

    p.version     = GGML_MK_DRAFT_VERSION;
    p.n_layer     = n_layer;
    p.n_embd      = (int32_t) hp.n_embd;
    p.n_embd_bb   = n_embd_bb;
    p.k_max       = k_max;
    p.kv_type     = GGML_TYPE_F16;   // (llama_mk_draft_inputs refuses other caches)
    p.n_ctx       = (int32_t) llama_n_ctx(cparams.ctx_other);   // (its caches share the target's cells)
    p.norm_eps    = hp.f_norm_rms_eps;
    p.embd_scale  = sqrtf((float) n_embd_bb);
    p.kq_scale    = hp.f_attention_scale;
    p.attn_factor = cparams.yarn_attn_factor;

    // the target's token embeddings: llama.cpp keeps them in the input layer's buffer (host memory) even when every
    // layer is offloaded; the backend makes them readable by the kernel
    {
        const ggml_tensor * te = tgt.tok_embd;
        llama_mk_builder bt;
        bt.host_ok = true;
        p.tok_embd      = bt.weight(te, "the target's token_embd");
        p.tok_embd_host = llama_mk_tensor_dev(te) == nullptr ? 1 : 0;
        if (!bt.why.empty()) {
            return fail(bt.why);
        }
    }
    p.pre         = b.weight(model.nextn_proj_pre,  "nextn.pre_projection");
    p.post        = b.weight(model.nextn_proj_post, "nextn.post_projection");
    p.output      = b.weight(model.output,          "output (token_embd, tied)");
    p.output_norm = b.vec(model.output_norm, "output_norm", hp.n_embd);
    p.n_vocab     = p.output.ne1;
    if (b.why.empty() && (p.pre.ne0 != 2*n_embd_bb || p.pre.ne1 != p.n_embd || p.post.ne0 != p.n_embd || p.post.ne1 != n_embd_bb ||
                          p.tok_embd.ne0 != n_embd_bb || p.tok_embd.ne1 < p.n_vocab)) {
        b.why = "the projections or token embeddings do not have the shapes of a gemma4 assistant";
    }

    // llama.cpp's share map for this architecture (src/llama-model.cpp, create_memory): a sliding-window layer reads
    // the target layer n_layer - 2, a global layer n_layer - 1 (llama_kv_cache resolves them through the target
    // cache's own layer map, so a target layer that reuses another's KV hands over its source's tensors)
    const int32_t n_layer_tgt = (int32_t) hpt.n_layer();
    for (int il = 0; il < n_layer && b.why.empty(); ++il) {
        const auto & l = model.layers[il];
        ggml_mk_layer & L = p.layers[il];
        if (l.wq_s || l.wo_s || l.ffn_gate_s || l.ffn_up_s || l.ffn_down_s) {
            b.why = "assistant layer " + std::to_string(il) + " has weight scales";
            break;
        }
        if (!llama_mk_layer_plan(b, model, cparams, il, "assistant layer", L)) {
            break;
        }
        L.has_kv  = 0;   // (it reads the target's cache of layer kv_layer[il])
        L.q_scale = 1.0f;
        const int32_t kvl = n_layer_tgt - (L.is_swa ? 2 : 1);
        p.kv_layer[il] = kvl;
        if (kvl < 0 || hpt.is_swa(kvl) != hp.is_swa(il) || hpt.n_embd_head_k(kvl) != (uint32_t) L.head_dim ||
            hpt.n_head_kv(kvl) != (uint32_t) L.n_head_kv) {
            b.why = "assistant layer " + std::to_string(il) + " does not match the target layer " + std::to_string(kvl) +
                    " whose cache it reads (window kind, head size or KV heads)";
            break;
        }
        p.max_q  = std::max(p.max_q,  L.n_head*L.head_dim);
        p.max_ff = std::max(p.max_ff, L.n_ff);
    }
    if (!b.why.empty()) {
        return fail(b.why);
    }
    if (!host_ok && (!b.dev || ggml_backend_dev_type(b.dev) != GGML_BACKEND_DEVICE_TYPE_GPU)) {
        return fail("the assistant's weights are not on a GPU");
    }
    p.debug_flags = llama_mk_env_flags(false);   // (the draft shares the layer phases and their variants)
    if (host_ok) {
        return d;   // (the plan only: a CPU reference reads it)
    }

    // the backend's fused draft kernel for the device that holds the assistant's weights
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(b.dev);
    auto create = (ggml_backend_mk_draft_create_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_mk_draft_create");
    d->eval     = (ggml_backend_mk_draft_eval_t)   ggml_backend_reg_get_proc_address(reg, "ggml_backend_mk_draft_eval");
    d->free_fn  = (ggml_backend_mk_draft_free_t)   ggml_backend_reg_get_proc_address(reg, "ggml_backend_mk_draft_free");
    if (!create || !d->eval || !d->free_fn) {
        return fail(std::string("backend ") + ggml_backend_reg_name(reg) + " has no fused draft kernel");
    }
    p.device = llama_mk_dev_index(reg, b.dev);
    char err[256] = {0};
    d->backend_mk = create(&p, err, sizeof(err));
    if (!d->backend_mk) {
        return fail(std::string(ggml_backend_reg_name(reg)) + " declined the fused draft: " + err);
    }
    return d;
}

bool llama_mk_draft_eval(llama_mk_draft * d, const ggml_mk_draft_step & st) {
    if (!d->backend_mk) {
        LLAMA_LOG_ERROR("llama_mk_draft: no backend kernel (a plan made with host_ok)\n");
        return false;
    }
    const int rc = d->eval(d->backend_mk, &st);
    if (rc != 0) {
        LLAMA_LOG_ERROR("llama_mk_draft: the fused draft failed (code %d)\n", rc);
        return false;
    }
    return true;
}

bool llama_mk_draft_inputs(llama_mk_draft * d, llama_memory_i * mem_dft, int32_t seq, int32_t pos, ggml_mk_draft_step & st) {
    const ggml_mk_draft & p = d->plan;
    auto * iswa_tgt = dynamic_cast<llama_kv_cache_iswa *>(llama_get_memory(d->ctx_tgt));
    auto * iswa_dft = dynamic_cast<llama_kv_cache_iswa *>(mem_dft);
    if (!iswa_tgt || !iswa_dft) {
        LLAMA_LOG_ERROR("llama_mk_draft: the target's or the assistant's memory is not a sliding-window KV cache pair\n");
        return false;
    }
    const llama_kv_cache * kv_tgt[GGML_MK_N_CACHES] = { iswa_tgt->get_base(), iswa_tgt->get_swa() };
    const llama_kv_cache * kv_dft[GGML_MK_N_CACHES] = { iswa_dft->get_base(), iswa_dft->get_swa() };
    for (int c = 0; c < GGML_MK_N_CACHES; ++c) {
        if (kv_tgt[c]->type_k() != GGML_TYPE_F16 || kv_tgt[c]->type_v() != GGML_TYPE_F16 || kv_dft[c]->get_size() != kv_tgt[c]->get_size()) {
            LLAMA_LOG_ERROR("llama_mk_draft: cache %d is not F16 or its cells are not the target's\n", c);
            return false;
        }
    }
    if (!d->ctx_host) {
        ggml_init_params ip = { 4*ggml_tensor_overhead(), nullptr, true };
        d->ctx_host = ggml_init(ip);
        for (int c = 0; c < GGML_MK_N_CACHES; ++c) {
            d->t_mask[c] = ggml_new_tensor_4d(d->ctx_host, GGML_TYPE_F32, kv_dft[c]->get_size(), 1, 1, 1);
        }
        d->buf_host = ggml_backend_alloc_ctx_tensors_from_buft(d->ctx_host, ggml_backend_cpu_buffer_type());
        ggml_init_params iv = { (size_t) 4*GGML_MK_DRAFT_MAX_LAYERS*ggml_tensor_overhead(), nullptr, true };
        d->ctx_views = ggml_init(iv);
    }
    if (!d->buf_host) {
        LLAMA_LOG_ERROR("llama_mk_draft: cannot allocate the host staging tensors\n");
        return false;
    }

    // the query's mask rows: llama.cpp's own, from the assistant's caches (their cells are the target's; the window
    // is the assistant's), over every cell of the sequence's stream
    llama_token  tok    = 0;
    llama_pos    qpos   = pos;
    int32_t      n_sid  = 1;
    llama_seq_id sid    = seq;
    llama_seq_id * sids = &sid;
    int32_t      sidx[LLAMA_MAX_SEQ] = {};
    int8_t       out    = 1;
    llama_ubatch ub = {};
    ub.n_tokens = ub.n_seq_tokens = ub.n_seqs = ub.n_seqs_unq = ub.n_pos = 1;
    ub.token = &tok; ub.pos = &qpos; ub.n_seq_id = &n_sid; ub.seq_id = &sids; ub.seq_id_unq = &sid; ub.seq_idx = sidx;
    ub.output = &out;
    for (int c = 0; c < GGML_MK_N_CACHES; ++c) {
        kv_dft[c]->set_input_kq_mask(d->t_mask[c], &ub, true);
        st.mask[c] = (const float *) d->t_mask[c]->data;
        st.n_kv[c] = (int32_t) kv_dft[c]->get_size();
    }

    // each assistant layer's view of its target layer's cache, in the sequence's stream
    ggml_reset(d->ctx_views);
    for (int il = 0; il < p.n_layer; ++il) {
        const llama_kv_cache * kv = kv_tgt[p.layers[il].is_swa ? 1 : 0];
        llama_kv_cache::slot_info si;
        si.s0 = si.s1 = kv->get_stream(seq);
        si.strm = { (llama_seq_id) si.s0 };
        si.idxs = { { 0 } };
        st.kv[il] = llama_mk_kv_view_of(kv->get_k(d->ctx_views, p.kv_layer[il], kv->get_size(), si),
                                        kv->get_v(d->ctx_views, p.kv_layer[il], kv->get_size(), si));
    }
    st.pos = pos;
    return true;
}

llama_mk_draft_ptr llama_mk_draft_open(const llama_model & model, const llama_cparams & cparams, const llama_mk * mk_tgt) {
    auto off = [](const std::string & why) {
        LLAMA_LOG_INFO("llama_mk_draft: the assistant's graph drafts: %s\n", why.c_str());
        return llama_mk_draft_ptr();
    };
    if (const char * e = getenv("LLAMA_MEGAKERNEL_DRAFT"); e && (strcmp(e, "0") == 0 || strcmp(e, "off") == 0)) {
        return off("LLAMA_MEGAKERNEL_DRAFT=0");
    }
    if (!mk_tgt) {
        return off("the target context does not run on the megakernel");
    }
    std::string why;
    llama_mk_draft_ptr d = llama_mk_draft_init(model, cparams, why, /*host_ok*/ false, GGML_MK_DRAFT_MAX_K);
    if (!d) {
        return off(why);
    }
    LLAMA_LOG_INFO("llama_mk_draft: the fused MTP draft kernel drafts (%d assistant layers, one launch of k <= %d steps per "
                   "sequence)\n", d->plan.n_layer, d->plan.k_max);
    return d;
}

int32_t llama_mk_draft_tokens(llama_mk_draft * d, llama_memory_i * mem_dft, int32_t seq, int32_t token, int32_t pos,
                              const float * h, int32_t k, int32_t * out) {
    if (k < 1 || k > d->plan.k_max) {
        if (!d->said_k) {
            d->said_k = true;
            LLAMA_LOG_INFO("llama_mk_draft: %d draft tokens asked, the fused kernel drafts at most %d: the graph drafts\n",
                           k, d->plan.k_max);
        }
        return -1;
    }
    llama_mk_tl_mark("draft>", k);
    ggml_mk_draft_step st = {};
    if (!llama_mk_draft_inputs(d, mem_dft, seq, pos, st)) {
        return -1;
    }
    st.k          = k;
    st.token      = token;
    st.h          = h;
    st.tokens_out = out;
    llama_mk_tl_mark("draft.launch>", k);
    if (!llama_mk_draft_eval(d, st)) {
        return -1;
    }
    llama_mk_tl_mark("draft<", k);
    return k;
}
