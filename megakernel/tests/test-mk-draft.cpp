// test-mk-draft: the fused MTP draft's plan and its float64 reference against llama.cpp's own gemma4-assistant graph.
//
//   test-mk-draft -m TARGET.gguf -md ASSISTANT.gguf [-p PROMPT] [-n STATES] [-k K] [-c N_CTX] [--fa 0|1] [--np N]
//                 [--max-nmse X] [--max-nmse-h Y] [--max-margin M] [--fused]
//
// On the CPU (every weight and cache in host memory), for STATES live decode states of the target (greedy decoding
// after the prompt, one token per state, so the states walk across the sliding window); --np N: N sequences, each in
// its own KV stream (-np N without a unified cache), decoded and drafted in turn:
//  1. llama.cpp drafts k tokens exactly as common/speculative.cpp's draft-mtp does for a shared-KV assistant: k
//     one-token batches of the assistant's context at the same position pos0, the first with the last sampled token and
//     the target's hidden row of the token before, each next one with the previous draft (argmax of its logits) and its
//     h_nextn row;
//  2. the plan llama-mk.cpp derives (llama_mk_draft_init, host memory allowed) and the inputs it hands a backend
//     (llama_mk_draft_inputs: each assistant layer's view of its target cache, llama.cpp's mask rows) feed the float64
//     reference (tests/mk_hostemu/mk_draft_ref.h) for the same k chained steps.
// Checks (exit 1 when one fails):
//  - the cache each assistant layer reads: the plan's view == the assistant cache's own view of that layer (llama.cpp's
//    share map, resolved through the target's layer map), K and V;
//  - draft tokens: identical step by step until a state's first divergence; a divergence passes only when the
//    reference's own top-2 logit margin there is below --max-margin (a near tie that rounding may flip);
//  - while the tokens agree, the logits and h_next of every step: NMSE vs the reference <= --max-nmse (logits: the CPU
//    rounds the LM head's inputs to 8 bits for its Q8_0 rows, ~4e-5) and --max-nmse-h (h_next: F16/F32 rows, ~1e-6).
// --fused (a GPU build: every layer offloaded): instead of the float64 reference (it reads weights in host memory), the
// backend's fused draft kernel (llama_mk_draft_init without host_ok, llama_mk_draft_eval: one launch of k steps) on the
// same inputs, checked the same way against llama.cpp's drafts on that GPU (tokens; a divergence passes only where
// llama.cpp's own margin is below --max-margin; logits and h_next NMSE vs llama.cpp's); also the mean time of one fused
// launch, of llama.cpp's k assistant steps and of one target decode step (for the record, not judged).
#include "llama.h"
#include "llama-ext.h"
#include "llama-context.h"
#include "llama-kv-cache.h"
#include "llama-kv-cache-iswa.h"

#include "llama-mk.h"
#include "mk_draft_ref.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static int argmax_f(const float * x, int n) {
    int a = 0;
    for (int i = 1; i < n; ++i) {
        a = x[i] > x[a] ? i : a;
    }
    return a;
}

static double margin_f(const float * x, int n) {
    const int a = argmax_f(x, n);
    double second = -INFINITY;
    for (int i = 0; i < n; ++i) {
        second = i != a ? std::max(second, (double) x[i]) : second;
    }
    return x[a] - second;
}

static double nmse_fd(const float * x, const std::vector<double> & r) {
    double num = 0, den = 0;
    for (size_t i = 0; i < r.size(); ++i) {
        num += (x[i] - r[i])*(x[i] - r[i]);
        den += r[i]*r[i];
    }
    const double v = num/std::max(den, 1e-30);
    return std::isfinite(v) ? v : INFINITY;
}

// the target decodes n tokens of sequence seq at positions pos0..; lo, h: the last token's logits and hidden row
static bool decode_seq(llama_context * ctx, const llama_token * t, int n, int pos0, int seq, std::vector<float> & lo,
                       std::vector<float> & h) {
    llama_batch b = llama_batch_init(n, 0, 1);
    b.n_tokens = n;
    for (int i = 0; i < n; ++i) {
        b.token[i]     = t[i];
        b.pos[i]       = pos0 + i;
        b.n_seq_id[i]  = 1;
        b.seq_id[i][0] = seq;
        b.logits[i]    = i == n - 1;
    }
    const bool ok = llama_decode(ctx, b) == 0;
    llama_batch_free(b);
    if (ok) {
        const float * l = llama_get_logits_ith(ctx, n - 1);
        const float * e = llama_get_embeddings_nextn_ith(ctx, n - 1);
        lo.assign(l, l + lo.size());
        h.assign(e, e + h.size());
    }
    return ok;
}

static void die(const char * what) {
    fprintf(stderr, "test-mk-draft: %s\n", what);
    exit(2);
}

int main(int argc, char ** argv) {
    std::string path_tgt, path_dft;
    std::string prompt = "The quick brown fox jumps over the lazy dog. Once upon a time";
    int n_states = 40, k = 4, n_ctx = 512, fa = 0, n_seq = 1;
    double max_nmse = 1e-3, max_nmse_h = 1e-5, max_margin = 1e-2;
    bool fused = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> const char * {
            if (i + 1 >= argc) {
                die(("missing value for " + a).c_str());
            }
            return argv[++i];
        };
        if      (a == "-m")           path_tgt = next();
        else if (a == "-md")          path_dft = next();
        else if (a == "-p")           prompt = next();
        else if (a == "-n")           n_states = atoi(next());
        else if (a == "-k")           k = atoi(next());
        else if (a == "-c")           n_ctx = atoi(next());
        else if (a == "--fa")         fa = atoi(next());
        else if (a == "--np")         n_seq = atoi(next());
        else if (a == "--max-nmse")   max_nmse = atof(next());
        else if (a == "--max-nmse-h") max_nmse_h = atof(next());
        else if (a == "--max-margin") max_margin = atof(next());
        else if (a == "--fused")      fused = true;
        else die(("unknown argument " + a).c_str());
    }
    if (path_tgt.empty() || path_dft.empty() || k < 1 || k > GGML_MK_DRAFT_MAX_K) {
        die("usage: test-mk-draft -m TARGET.gguf -md ASSISTANT.gguf [-n STATES] [-k 1..8] [-c N_CTX] [--fa 0|1]");
    }
    setenv("LLAMA_MEGAKERNEL", "0", 1);   // llama.cpp's graphs on both sides

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers    = fused ? 999 : 0;
    mp.use_extra_bufts = false;   // weights in their GGUF layout (the plan reads them in place)
    llama_model * m_tgt = llama_model_load_from_file(path_tgt.c_str(), mp);
    llama_model * m_dft = llama_model_load_from_file(path_dft.c_str(), mp);
    if (!m_tgt || !m_dft) {
        die("cannot load the models");
    }

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = n_ctx;
    cp.n_batch         = 512;
    cp.n_ubatch        = 512;
    cp.n_seq_max       = n_seq;
    cp.kv_unified      = false;   // one KV stream per sequence
    cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context * ctx_tgt = llama_init_from_model(m_tgt, cp);
    llama_context_params cpd = cp;
    cpd.ctx_type  = LLAMA_CONTEXT_TYPE_MTP;
    cpd.ctx_other = ctx_tgt;
    llama_context * ctx_dft = ctx_tgt ? llama_init_from_model(m_dft, cpd) : nullptr;
    if (!ctx_tgt || !ctx_dft) {
        die("cannot create the contexts");
    }
    llama_set_embeddings_nextn(ctx_tgt, true, false);   // as draft-mtp sets them (common/speculative.cpp)
    llama_set_embeddings_nextn(ctx_dft, true, true);

    std::string why;
    llama_mk_draft_ptr d = llama_mk_draft_init(*m_dft, ctx_dft->get_cparams(), why, /*host_ok*/ !fused, k);
    if (!d) {
        fprintf(stdout, "test-mk-draft: no draft plan: %s\ntest-mk-draft: FAILED\n", why.c_str());
        return 1;
    }
    const ggml_mk_draft & p = *llama_mk_draft_plan(d.get());
    printf("draft plan: %d layers, n_embd %d, target n_embd %d, n_vocab %d; the target's token_embd %s (%s)%s\n", p.n_layer,
           p.n_embd, p.n_embd_bb, p.n_vocab, ggml_type_name((ggml_type) p.tok_embd.type), p.tok_embd_host ? "host memory" : "device",
           fused ? "; checking the backend's fused draft kernel against llama.cpp's assistant graph" : "");
    for (int il = 0; il < p.n_layer; ++il) {
        const ggml_mk_layer & L = p.layers[il];
        printf("  layer %d: %s, %d heads x %d (KV heads %d), n_ff %d, reads the cache of target layer %d; wq %s, ffn_down %s\n",
               il, L.is_swa ? "sliding window" : "global", L.n_head, L.head_dim, L.n_head_kv, L.n_ff, p.kv_layer[il],
               ggml_type_name((ggml_type) L.wq.type), ggml_type_name((ggml_type) L.ffn_down.type));
    }

    const llama_vocab * vocab = llama_model_get_vocab(m_tgt);
    const int n_vocab = p.n_vocab;
    const int n_embd_bb = p.n_embd_bb;
    // every sequence's prompt (sequence i > 0: the prompt with i words in front) and its state
    std::vector<int> pos(n_seq), n_prompt(n_seq);
    std::vector<std::vector<float>> lo_t(n_seq, std::vector<float>(llama_vocab_n_tokens(vocab))), h_t(n_seq, std::vector<float>(n_embd_bb));
    for (int q = 0; q < n_seq; ++q) {
        std::string text = prompt;
        for (int i = 0; i < q; ++i) {
            text = "Then " + text;
        }
        std::vector<llama_token> tok(text.size() + 16);
        n_prompt[q] = llama_tokenize(vocab, text.c_str(), (int) text.size(), tok.data(), (int) tok.size(), true, false);
        if (n_prompt[q] <= 0 || !decode_seq(ctx_tgt, tok.data(), n_prompt[q], 0, q, lo_t[q], h_t[q])) {
            die("cannot tokenize or decode the prompt");
        }
        pos[q] = n_prompt[q];
    }

    llama_batch_ext * bd = llama_batch_ext_init(ctx_dft);
    mk_draft_ref::weights W;
    int fails = 0, n_steps = 0, n_same = 0, n_div = 0, n_div_bad = 0, map_bad = 0;
    double worst_lo = 0, worst_h = 0, min_margin_same = INFINITY;
    double t_fused = 0, t_fused_all = 0, t_graph = 0, t_target = 0;   // us, summed
    int    n_launch = 0, n_target = 0;
    std::vector<int32_t> tok_f(k);
    std::vector<float> lo_f((size_t) k*n_vocab), h_f((size_t) k*n_embd_bb);
    for (int s = 0; s < n_states; ++s) {
      for (int q = 0; q < n_seq; ++q) {
        int pos0 = pos[q];
        const llama_token id_last = argmax_f(lo_t[q].data(), (int) lo_t[q].size());
        const std::vector<float> h0 = h_t[q];

        // 1. llama.cpp's drafts
        std::vector<int> ids;
        std::vector<std::vector<float>> lo_ll, h_ll;
        std::vector<float> h = h0;
        llama_token t = id_last;
        const int64_t t0 = ggml_time_us();
        for (int j = 0; j < k; ++j) {
            llama_batch_ext_clear(bd);
            const int32_t idx = llama_batch_ext_add_token(bd, q, t);
            llama_batch_ext_set_pos(bd, idx, &pos0);
            llama_batch_ext_set_embd_token(bd, idx, { h.data(), 1, (size_t) n_embd_bb });
            llama_batch_ext_set_output_logits(bd, idx, true);
            if (llama_process(ctx_dft, LLAMA_PROCESS_TYPE_DECODE, bd) != 0) {
                die("the assistant's decode failed");
            }
            const float * lo = llama_get_logits_ith(ctx_dft, 0);
            const float * hn = llama_get_embeddings_nextn_ith(ctx_dft, 0);
            lo_ll.emplace_back(lo, lo + n_vocab);
            h_ll.emplace_back(hn, hn + n_embd_bb);
            t = argmax_f(lo, n_vocab);
            ids.push_back(t);
            h.assign(hn, hn + n_embd_bb);
        }
        t_graph += ggml_time_us() - t0;

        // 2. the plan's inputs and the float64 reference
        ggml_mk_draft_step st = {};
        if (!llama_mk_draft_inputs(d.get(), llama_get_memory(ctx_dft), q, pos0, st)) {
            die("llama_mk_draft_inputs failed");
        }
        st.k = k;
        st.token = id_last;
        st.h = h0.data();
        if (s == 0) {
            // the cache each layer reads: the assistant cache's own view of its layer il (llama.cpp's share map)
            auto * iswa = dynamic_cast<llama_kv_cache_iswa *>(llama_get_memory(ctx_dft));
            ggml_init_params ip = { 8*ggml_tensor_overhead(), nullptr, true };
            ggml_context * cv = ggml_init(ip);
            for (int il = 0; il < p.n_layer; ++il) {
                const llama_kv_cache * kv = p.layers[il].is_swa ? iswa->get_swa() : iswa->get_base();
                llama_kv_cache::slot_info si;
                si.s0 = si.s1 = kv->get_stream(q);
                si.strm = { (llama_seq_id) si.s0 };
                si.idxs = { { 0 } };
                const void * k_ll = kv->get_k(cv, il, kv->get_size(), si)->data;
                const void * v_ll = kv->get_v(cv, il, kv->get_size(), si)->data;
                const bool ok = k_ll == st.kv[il].k && v_ll == st.kv[il].v;
                map_bad += !ok;
                printf("%s assistant layer %d reads target layer %d's cache: the plan's K/V views %s llama.cpp's (sequence %d, "
                       "stream %u)\n", ok ? "OK" : "FAIL", il, p.kv_layer[il], ok ? "==" : "!=", q, si.s0);
            }
            ggml_free(cv);
        }
        mk_draft_ref::result r;
        if (fused) {
            // the backend's kernel on the same inputs: one launch of k steps; llama.cpp's drafts are the reference
            st.tokens_out = tok_f.data();
            st.logits_out = lo_f.data();
            st.h_out      = h_f.data();
            const int64_t t1 = ggml_time_us();
            if (!llama_mk_draft_eval(d.get(), st)) {
                die("the fused draft kernel failed");
            }
            t_fused_all += ggml_time_us() - t1;
            // again with the tokens only (what draft-mtp asks for): the same drafts, and the launch's time without the
            // copies of every step's logits and h_next
            std::vector<int32_t> tok2(k, -1);
            st.tokens_out = tok2.data();
            st.logits_out = nullptr;
            st.h_out      = nullptr;
            const int64_t t3 = ggml_time_us();
            if (!llama_mk_draft_eval(d.get(), st)) {
                die("the fused draft kernel failed");
            }
            t_fused += ggml_time_us() - t3;
            ++n_launch;
            if (tok2 != tok_f) {
                printf("FAIL sequence %d state %d (pos %d): a tokens-only launch drafts other tokens than the same launch "
                       "with logits\n", q, s, pos0);
                ++fails;
            }
            r.tokens.assign(ids.begin(), ids.end());
            for (int j = 0; j < k; ++j) {
                r.logits.emplace_back(lo_ll[j].begin(), lo_ll[j].end());
                r.h.emplace_back(h_ll[j].begin(), h_ll[j].end());
                r.margin.push_back(margin_f(lo_ll[j].data(), n_vocab));
                ids[j] = tok_f[j];
                lo_ll[j].assign(lo_f.begin() + (size_t) j*n_vocab, lo_f.begin() + (size_t) (j + 1)*n_vocab);
                h_ll[j].assign(h_f.begin() + (size_t) j*n_embd_bb, h_f.begin() + (size_t) (j + 1)*n_embd_bb);
            }
        } else {
            r = mk_draft_ref::run(W, p, st);
        }

        // 3. compare (fused: the kernel's drafts in ids/lo_ll/h_ll, llama.cpp's in r)
        const char * who = fused ? "the kernel" : "llama.cpp";      // (what is checked)
        const char * ref = fused ? "llama.cpp" : "the reference";   // (against what)
        int same = 0;
        for (int j = 0; j < k; ++j) {
            ++n_steps;
            const double e_lo = nmse_fd(lo_ll[j].data(), r.logits[j]);
            const double e_h  = nmse_fd(h_ll[j].data(), r.h[j]);
            worst_lo = std::max(worst_lo, e_lo);
            worst_h  = std::max(worst_h, e_h);
            if (!(e_lo <= max_nmse) || !(e_h <= max_nmse_h)) {
                printf("FAIL sequence %d state %d (pos %d) step %d: NMSE vs %s logits %.3g, h_next %.3g\n", q, s, pos0, j,
                       fused ? "llama.cpp" : "float64", e_lo, e_h);
                ++fails;
            }
            if (ids[j] != r.tokens[j]) {
                ++n_div;
                const bool near_tie = r.margin[j] < max_margin;
                n_div_bad += !near_tie;
                printf("%s sequence %d state %d (pos %d) step %d: %s drafts %d, %s %d; %s's margin %.3g, %s's %.3g, %d steps left "
                       "uncompared\n", near_tie ? "near tie" : "FAIL", q, s, pos0, j, who, ids[j], ref, r.tokens[j], ref,
                       r.margin[j], who, margin_f(lo_ll[j].data(), n_vocab), k - 1 - j);
                break;
            }
            ++same;
            min_margin_same = std::min(min_margin_same, r.margin[j]);
        }
        n_same += same;
        if (s < 3 || s == n_states - 1) {
            printf("state %d (sequence %d, pos %d, token %d): %s drafts", s, q, pos0, id_last, who);
            for (int j = 0; j < k; ++j) printf(" %d", ids[j]);
            printf("; %s", fused ? "llama.cpp" : "reference");
            for (int j = 0; j < k; ++j) printf(" %d", r.tokens[j]);
            printf("\n");
        }

        // the target takes the token (a live decode state: greedy, one step)
        const int64_t t2 = ggml_time_us();
        if (!decode_seq(ctx_tgt, &id_last, 1, pos0, q, lo_t[q], h_t[q])) {
            die("target decode failed");
        }
        t_target += ggml_time_us() - t2;
        ++n_target;
        pos[q] = pos0 + 1;
      }
    }
    llama_batch_ext_free(bd);

    printf("%s draft tokens, %d states x k=%d (%d sequence(s); positions %d..%d of sequence 0, window crossed): %d of %d "
           "compared steps identical, %d divergences (%d not near ties, margin bound %.3g); smallest %s margin where "
           "they agree %.3g\n", n_div_bad ? "FAIL" : "OK", n_states, k, n_seq, n_prompt[0], pos[0] - 1, n_same,
           n_same + n_div, n_div, n_div_bad, max_margin, fused ? "llama.cpp" : "reference", min_margin_same);
    printf("%s logits and h_next while the tokens agree: worst NMSE vs %s %.3g (logits, bound %.3g), %.3g (h_next, "
           "bound %.3g)\n", fails ? "FAIL" : "OK", fused ? "llama.cpp's assistant graph" : "float64", worst_lo, max_nmse,
           worst_h, max_nmse_h);
    if (fused && n_launch > 0) {
        printf("timing (mean, host clock, k=%d): one fused draft launch %.1f us (tokens only; %.1f us with every step's "
               "logits and h_next copied out); llama.cpp's %d assistant steps %.1f us (%.2fx the launch); one target decode "
               "step (llama.cpp's graph) %.1f us\n", k, t_fused/n_launch, t_fused_all/n_launch, k, t_graph/n_launch,
               t_graph/std::max(t_fused, 1.0), t_target/std::max(n_target, 1));
    }
    fails += n_div_bad + map_bad;
    printf("test-mk-draft: %s\n", fails ? "FAILED" : "passed");

    d.reset();
    llama_free(ctx_dft);
    llama_free(ctx_tgt);
    llama_model_free(m_dft);
    llama_model_free(m_tgt);
    llama_backend_free();
    return fails ? 1 : 0;
}
