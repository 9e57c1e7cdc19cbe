// test-mk: the Gemma decode megakernel against llama.cpp's standard graph, in one process.
//
//   test-mk -m MODEL.gguf [-p PROMPT] [-n N] [--fa 0|1] [--rounds R] [--bench-n T]
//
// Two contexts on one model: A with the megakernel (LLAMA_MEGAKERNEL=1), B with the standard
// graph (LLAMA_MEGAKERNEL=0). Prints, and exits non-zero when a check fails:
//  1. teacher-forced logits A vs B over N steps (NMSE per step, argmax agreement, margins);
//  2. free-running greedy A vs B (first divergence and its logit margin in B);
//  3. verify == decode: on A, a batch of M = 2..V tokens gives each row the bits of M one-token steps (V: --verify-max,
//     default 8; compute-sanitizer's racecheck runs a small V: every launch under it takes seconds);
//  4. speed: greedy tok/s A vs B, rounds in AB/BA order, medians and the median of paired ratios;
//  5. with --verify-cost: the time of one M-token verify batch over one-token steps, M = 1..5, on A
//     and on B (rounds alternate the order of M);
//  1b. with --cpu-ref: a third context on a CPU copy of the model (no offload) in the same teacher-forced steps: NMSE
//     and argmax agreement of the megakernel and of the graph against it; fails when the megakernel is further from
//     the CPU than the graph is (mean NMSE more than 2x the graph's + 1e-6);
//  6. with --variant BITS: a third context C, the megakernel with LLAMA_MEGAKERNEL_VARIANT=BITS (a
//     candidate kernel change, ggml-mk.h GGML_MK_VAR_*): its logits must equal A's bit for bit over the
//     teacher-forced steps, and its speed is measured against A's (AB/BA, median of paired ratios). With
//     --variant-other-bits (a variant whose arithmetic differs by design, e.g. GGML_MK_VAR_CHUNK4's attention chunks):
//     its logits must be within NMSE 1e-3 of A's at every step (rounding-order differences; a wrong attention gives ~1)
//     and its argmax A's (a disagreement is allowed only where A's top-2 margin is below 1e-3), instead of bit for bit.
//  7. gemma4 models: the hidden states an MTP draft reads (llama_set_embeddings_nextn: rmsnorm(x)*output_norm, the
//     LM head's input) over teacher-forced batches of M = 1..4 tokens, every token's row (unmasked) and the output
//     rows only (masked): megakernel vs graph, NMSE per row <= --max-nmse; on A, a batch's rows equal those of its
//     one-token steps bit for bit (--hidden-batches N: N batches each way, default min(24, max(4, -n)); 0 skips it).
#include "llama.h"
#include "llama-ext.h"   // llama_set_embeddings_nextn, llama_get_embeddings_nextn_ith (the MTP staging API)

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// the first index of the largest value (std::max_element's answer), in two passes the compiler vectorises: the greedy
// loop's host share is ~155 us per 262144 logits on the dev box instead of ~790 us (which both contexts paid: it diluted the
// speed ratio); NaN-free logits assumed, as the checks below already require
static int argmax(const float * x, int n) {
    float m[8];
    for (int j = 0; j < 8; ++j) {
        m[j] = -INFINITY;
    }
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < 8; ++j) {
            m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
        }
    }
    float mx = -INFINITY;
    for (int j = 0; j < 8; ++j) {
        mx = m[j] > mx ? m[j] : mx;
    }
    for (; i < n; ++i) {
        mx = x[i] > mx ? x[i] : mx;
    }
    for (i = 0; i < n; ++i) {
        if (x[i] == mx) {
            return i;
        }
    }
    return (int) (std::max_element(x, x + n) - x);   // only NaNs left
}

static float margin(const float * x, int n) {
    int a = argmax(x, n);
    float second = -INFINITY;
    for (int i = 0; i < n; ++i) {
        if (i != a) second = std::max(second, x[i]);
    }
    return x[a] - second;
}

struct ctx_t {
    llama_context * ctx = nullptr;
    int n_vocab = 0;
};

static double nmse(const float * x, const float * ref, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; ++i) {
        num += (double) (x[i] - ref[i])*(x[i] - ref[i]);
        den += (double) ref[i]*ref[i];
    }
    const double r = num/std::max(den, 1e-30);
    return std::isfinite(r) ? r : INFINITY;   // NaN logits must fail a bound, not slip past std::max
}

static ctx_t make_ctx(llama_model * model, bool mk, int n_ctx, int fa, const std::string & variant = "", bool offload = true) {
    const char * saved = getenv("LLAMA_MEGAKERNEL");
    const std::string keep = saved ? saved : "";
    setenv("LLAMA_MEGAKERNEL", mk ? "1" : "0", 1);
    if (!variant.empty()) {
        setenv("LLAMA_MEGAKERNEL_VARIANT", variant.c_str(), 1);
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.op_offload = offload;
    ctx_t c;
    c.ctx = llama_init_from_model(model, cp);
    if (!c.ctx) {
        fprintf(stderr, "test-mk: cannot create a context\n");
        exit(2);
    }
    c.n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    if (!variant.empty()) {
        unsetenv("LLAMA_MEGAKERNEL_VARIANT");
    }
    if (saved) {
        setenv("LLAMA_MEGAKERNEL", keep.c_str(), 1);
    } else {
        unsetenv("LLAMA_MEGAKERNEL");
    }
    return c;
}

static void decode_or_die(llama_context * ctx, llama_batch b, const char * what) {
    int rc = llama_decode(ctx, b);
    if (rc != 0) {
        fprintf(stderr, "test-mk: llama_decode failed (%s): %d\n", what, rc);
        exit(2);
    }
}

static void prefill(ctx_t & c, std::vector<llama_token> & prompt) {
    llama_memory_clear(llama_get_memory(c.ctx), true);
    // in pieces of at most n_batch tokens (device.sh stage deep's prompts of thousands)
    const size_t nb = llama_n_batch(c.ctx);
    for (size_t i = 0; i < prompt.size(); i += nb) {
        const size_t n = std::min(nb, prompt.size() - i);
        decode_or_die(c.ctx, llama_batch_get_one(prompt.data() + i, (int) n), "prompt");
    }
}

// M tokens tok[first + j] (cyclically) at positions pos0 + j of sequence 0, logits for every one
static llama_batch seq_batch(const std::vector<llama_token> & tok, size_t first, int M, int pos0) {
    llama_batch b = llama_batch_init(M, 0, 1);
    b.n_tokens = M;
    for (int j = 0; j < M; ++j) {
        b.token[j] = tok[(first + j) % tok.size()];
        b.pos[j] = pos0 + j;
        b.n_seq_id[j] = 1;
        b.seq_id[j][0] = 0;
        b.logits[j] = 1;
    }
    return b;
}

// sequence 0 from pos0 on dropped, then M tokens tok[first + j] decoded there in one batch
static void verify_batch(llama_context * ctx, const std::vector<llama_token> & tok, size_t first, int M, int pos0,
                         const char * what) {
    llama_memory_seq_rm(llama_get_memory(ctx), 0, pos0, -1);
    llama_batch b = seq_batch(tok, first, M, pos0);
    decode_or_die(ctx, b, what);
    llama_batch_free(b);
}

static void step(ctx_t & c, llama_token t, int pos) {
    llama_batch b = seq_batch({ t }, 0, 1, pos);
    decode_or_die(c.ctx, b, "step");
    llama_batch_free(b);
}

// greedy decode speed of x and y in `rounds` rounds, AB/BA order: medians of x's and y's tok/s and of x/y
struct ab_speed {
    double x, y, ratio;
};

static double greedy_tps(ctx_t & c, std::vector<llama_token> & prompt, int bench_n) {
    const int np = (int) prompt.size();
    prefill(c, prompt);
    llama_token tok = argmax(llama_get_logits_ith(c.ctx, -1), c.n_vocab);
    auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < bench_n; ++s) {
        step(c, tok, np + s);
        tok = argmax(llama_get_logits_ith(c.ctx, -1), c.n_vocab);
    }
    auto t1 = std::chrono::steady_clock::now();
    return bench_n/std::chrono::duration<double>(t1 - t0).count();
}

static ab_speed ab_greedy(ctx_t & x, ctx_t & y, std::vector<llama_token> & prompt, int bench_n, int rounds) {
    std::vector<double> tx, ty, ratio;
    for (int r = 0; r < rounds; ++r) {
        double a, b;
        if (r % 2 == 0) {
            a = greedy_tps(x, prompt, bench_n);
            b = greedy_tps(y, prompt, bench_n);
        } else {
            b = greedy_tps(y, prompt, bench_n);
            a = greedy_tps(x, prompt, bench_n);
        }
        tx.push_back(a);
        ty.push_back(b);
        ratio.push_back(a/b);
    }
    auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size()/2]; };
    return { med(tx), med(ty), med(ratio) };
}

int main(int argc, char ** argv) {
    std::string model_path;
    std::string prompt_text = "The history of the printing press begins in";
    int n_steps = 128, fa = 0, rounds = 6, bench_n = 64, n_ctx = 2048, max_disagree = -1;
    double max_nmse = 1e-4;
    int verify_max = 8, hidden_batches = -1;
    bool verify_cost = false, cpu_ref = false, variant_other_bits = false;
    std::string variant;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&]() { if (i + 1 >= argc) { fprintf(stderr, "missing value for %s\n", a.c_str()); exit(2); } return std::string(argv[++i]); };
        if (a == "-m") model_path = next();
        else if (a == "-p") prompt_text = next();
        else if (a == "-n") n_steps = std::stoi(next());
        else if (a == "--fa") fa = std::stoi(next());
        else if (a == "--rounds") rounds = std::stoi(next());
        else if (a == "--bench-n") bench_n = std::stoi(next());
        else if (a == "-c") n_ctx = std::stoi(next());
        else if (a == "--max-nmse") max_nmse = std::stod(next());
        else if (a == "--max-disagree") max_disagree = std::stoi(next());
        else if (a == "--verify-cost") verify_cost = true;
        else if (a == "--cpu-ref") cpu_ref = true;
        else if (a == "--variant") variant = next();
        else if (a == "--variant-other-bits") variant_other_bits = true;
        else if (a == "--verify-max") verify_max = std::stoi(next());
        else if (a == "--hidden-batches") hidden_batches = std::stoi(next());
        else { fprintf(stderr, "usage: %s -m MODEL [-p PROMPT] [-n N] [--fa 0|1] [--rounds R] [--bench-n T] [-c N_CTX] [--max-nmse X] [--max-disagree N] [--verify-cost] [--cpu-ref] [--variant BITS [--variant-other-bits]] [--verify-max V (2..8)] [--hidden-batches N]\n", argv[0]); return 2; }
    }
    if (verify_max < 2 || verify_max > 8) {
        fprintf(stderr, "test-mk: --verify-max %d: the verify check takes batches of 2..8 tokens\n", verify_max);
        return 2;
    }
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 999;
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mp);
    if (!model) {
        fprintf(stderr, "test-mk: cannot load %s\n", model_path.c_str());
        return 2;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::vector<llama_token> prompt(4096);
    int np = llama_tokenize(vocab, prompt_text.c_str(), (int) prompt_text.size(), prompt.data(), (int) prompt.size(), true, true);
    if (np < 0) {   // (longer: -np tokens)
        prompt.resize(-np);
        np = llama_tokenize(vocab, prompt_text.c_str(), (int) prompt_text.size(), prompt.data(), (int) prompt.size(), true, true);
    }
    prompt.resize(np);
    printf("test-mk: prompt of %d tokens, context of %d cells\n", np, n_ctx);
    if (np >= n_ctx) {
        fprintf(stderr, "test-mk: the prompt (%d tokens) does not fit the context: -c %d, want more than %d\n", np, n_ctx, np);
        return 2;
    }

    ctx_t A = make_ctx(model, true, n_ctx, fa);
    ctx_t B = make_ctx(model, false, n_ctx, fa);
    llama_model * model_cpu = nullptr;
    ctx_t R;
    if (cpu_ref) {
        llama_model_params mpc = llama_model_default_params();
        mpc.n_gpu_layers = 0;
        model_cpu = llama_model_load_from_file(model_path.c_str(), mpc);
        if (!model_cpu) {
            fprintf(stderr, "test-mk: cannot load %s for the CPU\n", model_path.c_str());
            return 2;
        }
        R = make_ctx(model_cpu, false, n_ctx, fa, "", false);
    }
    const int nv = A.n_vocab;
    int fails = 0;

    // 1. teacher-forced logits
    {
        prefill(A, prompt);
        prefill(B, prompt);
        if (cpu_ref) {
            prefill(R, prompt);
        }
        double worst = 0, sum_nmse = 0;
        double ref_sum[2] = {0, 0}, ref_max[2] = {0, 0};   // megakernel, graph vs the CPU
        int ref_agree[2] = {0, 0};
        int disagree = 0;
        float worst_margin = 0;
        for (int s = 0; s < n_steps; ++s) {
            const float * la = llama_get_logits_ith(A.ctx, -1);
            const float * lb = llama_get_logits_ith(B.ctx, -1);
            const double e = nmse(la, lb, nv);
            worst = std::max(worst, e);
            sum_nmse += e;
            if (cpu_ref) {
                const float * lr = llama_get_logits_ith(R.ctx, -1);
                const int tr = argmax(lr, nv);
                const float * lx[2] = { la, lb };
                for (int k = 0; k < 2; ++k) {
                    const double ek = nmse(lx[k], lr, nv);
                    ref_sum[k] += ek;
                    ref_max[k] = std::max(ref_max[k], ek);
                    ref_agree[k] += argmax(lx[k], nv) == tr;
                }
            }
            const int ta = argmax(la, nv), tb = argmax(lb, nv);
            if (ta != tb) {
                ++disagree;
                worst_margin = std::max(worst_margin, margin(lb, nv));
                printf("  step %d: argmax megakernel %d vs graph %d (graph's top-2 margin %.4g)\n", s, ta, tb, margin(lb, nv));
            }
            step(A, tb, np + s);
            step(B, tb, np + s);
            if (cpu_ref) {
                step(R, tb, np + s);
            }
        }
        if (cpu_ref) {
            const bool ok_ref = ref_sum[0] <= 2.0*ref_sum[1] + 1e-6*n_steps;
            printf("vs the CPU, %d teacher-forced steps: megakernel NMSE mean %.3g max %.3g, argmax agrees %d; graph NMSE mean %.3g max %.3g, argmax agrees %d: %s\n",
                   n_steps, ref_sum[0]/n_steps, ref_max[0], ref_agree[0], ref_sum[1]/n_steps, ref_max[1], ref_agree[1],
                   ok_ref ? "ok" : "FAIL (the megakernel is further from the CPU than the graph)");
            fails += !ok_ref;
        }
        const bool ok = worst <= max_nmse && disagree <= (max_disagree >= 0 ? max_disagree : n_steps/50);
        printf("teacher-forced %d steps: NMSE mean %.3g max %.3g; argmax disagreements %d (largest graph margin there %.4g): %s\n",
               n_steps, sum_nmse/n_steps, worst, disagree, worst_margin, ok ? "ok" : "FAIL");
        fails += !ok;
    }

    // 2. free-running greedy
    std::vector<llama_token> gen_a, gen_b;
    {
        prefill(A, prompt);
        prefill(B, prompt);
        int first_div = -1;
        float div_margin = 0;
        const int n_free = std::max(n_steps, 2*verify_max); // the verify check below uses 2*verify_max of these tokens
        for (int s = 0; s < n_free; ++s) {
            const float * la = llama_get_logits_ith(A.ctx, -1);
            const float * lb = llama_get_logits_ith(B.ctx, -1);
            const int ta = argmax(la, nv), tb = argmax(lb, nv);
            if (first_div < 0 && ta != tb) {
                first_div = s;
                div_margin = margin(lb, nv);
            }
            gen_a.push_back(ta);
            gen_b.push_back(tb);
            step(A, ta, np + s);
            step(B, tb, np + s);
        }
        if (first_div < 0) {
            printf("free-running greedy %d tokens: identical\n", n_free);
        } else {
            printf("free-running greedy %d tokens: first divergence at %d (graph's top-2 margin there %.4g)\n", n_free, first_div, div_margin);
        }
    }

    // 3. verify == decode, bitwise, on the megakernel context: V = verify_max one-token steps from p0 give the reference rows of
    // every M (a row depends only on the cells before it and its token); then, for each M, the cells from p0 on are
    // dropped and the M tokens come again as one batch
    {
        int bad = 0;
        const int V  = verify_max;
        const int p0 = np + V;
        prefill(A, prompt);
        for (int s = 0; s < V; ++s) {
            step(A, gen_a[s], np + s);
        }
        std::vector<float> seq((size_t) V*nv), bat((size_t) V*nv);
        for (int j = 0; j < V; ++j) {
            step(A, gen_a[V + j], p0 + j);
            memcpy(seq.data() + (size_t) j*nv, llama_get_logits_ith(A.ctx, -1), nv*sizeof(float));
        }
        for (int M = 2; M <= V; ++M) {
            verify_batch(A.ctx, gen_a, V, M, p0, "verify");
            int rows_diff = 0;
            for (int j = 0; j < M; ++j) {
                memcpy(bat.data() + (size_t) j*nv, llama_get_logits_ith(A.ctx, j), nv*sizeof(float));
                rows_diff += memcmp(seq.data() + (size_t) j*nv, bat.data() + (size_t) j*nv, nv*sizeof(float)) != 0;
            }
            printf("verify M=%d: %d of %d rows differ from one-token decode\n", M, rows_diff, M);
            bad += rows_diff;
        }
        printf("verify == decode (bitwise), M = 2..%d: %s\n", V, bad == 0 ? "ok" : "FAIL");
        fails += bad != 0;
    }

    // 4. speed: greedy decode tok/s, AB/BA rounds
    if (rounds > 0) {
        const ab_speed sp = ab_greedy(A, B, prompt, bench_n, rounds);
        printf("speed, greedy tg%d, %d rounds AB/BA: megakernel %.1f tok/s, graph %.1f tok/s, ratio %.3f (median of paired ratios)\n",
               bench_n, rounds, sp.x, sp.y, sp.ratio);
        printf("model size %.3f GB\n", llama_model_size(model)/1e9);
    }

    // 5. verify cost: one batch of M tokens vs one token, M = 1..5
    if (verify_cost && rounds > 0) {
        auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size()/2]; };
        for (int k = 0; k < 2; ++k) {
            ctx_t & c = k == 0 ? A : B;
            prefill(c, prompt);
            const int p0 = np;
            // the prompt's graph runs asynchronously: without this wait the first timed batch carries the prompt
            // (session 33: M = 1 measured ~1 ms a batch too long, 8 batches sharing the prompt's ~8 ms, which pulled
            // every ratio toward 1); one untimed batch of each M keeps any first use of M rows out of the timing too
            llama_synchronize(c.ctx);
            for (int M = 1; M <= 5; ++M) {
                llama_batch b = seq_batch(gen_a, 0, M, p0);
                decode_or_die(c.ctx, b, "verify cost (warm-up)");
                llama_get_logits_ith(c.ctx, M - 1);
                llama_memory_seq_rm(llama_get_memory(c.ctx), 0, p0, -1);
                llama_batch_free(b);
            }
            // per batch: the whole call sequence (t), and its parts: llama_decode (td), the logits row (tl), seq_rm (tr)
            std::vector<std::vector<double>> t(6), td(6), tl(6), tr(6);
            const int reps = 8;
            using clk = std::chrono::steady_clock;
            auto us = [](clk::time_point a, clk::time_point b) { return std::chrono::duration<double>(b - a).count()*1e6; };
            for (int r = 0; r < rounds; ++r) {
                for (int i = 1; i <= 5; ++i) {
                    const int M = (r % 2 == 0) ? i : 6 - i;
                    llama_batch b = seq_batch(gen_a, 0, M, p0);
                    double sd = 0, sl = 0, sr = 0;
                    auto t0 = clk::now();
                    for (int rep = 0; rep < reps; ++rep) {
                        auto ta = clk::now();
                        decode_or_die(c.ctx, b, "verify cost");
                        auto tb = clk::now();
                        llama_get_logits_ith(c.ctx, M - 1); // waits for the result
                        auto tc = clk::now();
                        llama_memory_seq_rm(llama_get_memory(c.ctx), 0, p0, -1);
                        auto te = clk::now();
                        sd += us(ta, tb); sl += us(tb, tc); sr += us(tc, te);
                    }
                    auto t1 = clk::now();
                    t[M].push_back(us(t0, t1)/reps);
                    td[M].push_back(sd/reps); tl[M].push_back(sl/reps); tr[M].push_back(sr/reps);
                    llama_batch_free(b);
                }
            }
            // whole calls: the host's time per batch is in them (llama_decode's own work, the rows to the host: 125-480
            // us beside the launch on E4B, session 33); the kernel's own ratios are LLAMA_MEGAKERNEL_PROFILE=1's
            // "kernel" lines
            printf("verify cost (%s), whole batch call: ", k == 0 ? "megakernel" : "graph");
            for (int M = 1; M <= 5; ++M) {
                printf("M=%d %.1f us (%.2fx)%s", M, med(t[M]), med(t[M])/med(t[1]), M < 5 ? ", " : "\n");
            }
            printf("verify cost (%s), its parts (decode / logits row / seq_rm, us): ", k == 0 ? "megakernel" : "graph");
            for (int M = 1; M <= 5; ++M) {
                printf("M=%d %.1f / %.1f / %.1f%s", M, med(td[M]), med(tl[M]), med(tr[M]), M < 5 ? ", " : "\n");
            }
        }
    }

    // 6. a kernel variant: bitwise equal to the default megakernel, and its speed against it
    if (!variant.empty()) {
        ctx_t C = make_ctx(model, true, n_ctx, fa, variant);
        prefill(A, prompt);
        prefill(C, prompt);
        // --variant-other-bits: the NMSE bound (a combine order moves the last bits; a wrong attention gives ~1) and the
        // top-2 margin of the default's logits below which its argmax may differ
        const double other_bits_nmse   = 1e-3;
        const float  other_bits_margin = 1e-3f;
        int rows_diff = 0, disagree = 0, bad_disagree = 0;
        double worst = 0;
        for (int s = 0; s < n_steps; ++s) {
            const float * la = llama_get_logits_ith(A.ctx, -1);
            const float * lc = llama_get_logits_ith(C.ctx, -1);
            rows_diff += memcmp(la, lc, nv*sizeof(float)) != 0;
            worst = std::max(worst, nmse(lc, la, nv));
            const int t = argmax(la, nv);
            if (argmax(lc, nv) != t) {
                ++disagree;
                bad_disagree += margin(la, nv) >= other_bits_margin;
            }
            step(A, t, np + s);
            step(C, t, np + s);
        }
        if (variant_other_bits) {
            // other bits by design: as close to the default as the bound, and the same greedy choices where they are clear
            const bool ok = worst <= other_bits_nmse && bad_disagree == 0;
            printf("variant %s ~ default megakernel (other bits by design), %d teacher-forced steps: %d differ, NMSE max %.3g, "
                   "argmax disagreements %d (%d at a top-2 margin >= %g): %s\n", variant.c_str(), n_steps, rows_diff, worst,
                   disagree, bad_disagree, other_bits_margin, ok ? "ok" : "FAIL");
            fails += !ok;
        } else {
            printf("variant %s == default megakernel (bitwise), %d teacher-forced steps: %d differ: %s\n", variant.c_str(), n_steps,
                   rows_diff, rows_diff == 0 ? "ok" : "FAIL");
            fails += rows_diff != 0;
        }
        if (rounds > 0) {
            const ab_speed sp = ab_greedy(C, A, prompt, bench_n, rounds);
            printf("speed, variant %s vs default megakernel, greedy tg%d, %d rounds AB/BA: %.1f vs %.1f tok/s, ratio %.3f (median of paired ratios)\n",
                   variant.c_str(), bench_n, rounds, sp.x, sp.y, sp.ratio);
        }
        llama_free(C.ctx);
    }

    // 7. hidden states for an MTP draft (gemma4: the graph exposes them as t_h_nextn)
    char arch[64] = "";
    llama_model_meta_val_str(model, "general.architecture", arch, sizeof(arch));
    const int n_batches = hidden_batches >= 0 ? hidden_batches : std::max(4, std::min(n_steps, 24));
    if (strcmp(arch, "gemma4") == 0 && n_batches > 0) {
        const int n_embd = llama_model_n_embd(model);
        int bad = 0;
        for (int masked = 0; masked <= 1; ++masked) {
            llama_set_embeddings_nextn(A.ctx, true, masked);
            llama_set_embeddings_nextn(B.ctx, true, masked);
            prefill(A, prompt);
            prefill(B, prompt);
            double worst = 0;
            int rows = 0, pos = np, t = 0;
            for (int s = 0; s < n_batches; ++s) {
                const int M = 1 + s % 4;
                llama_batch b = seq_batch(gen_b, t, M, pos);
                t += M;
                for (int j = 0; j < M; ++j) {
                    b.logits[j] = j == M - 1 || j % 2 == 1;   // not every row: unmasked rows come for every token anyway
                }
                decode_or_die(A.ctx, b, "hidden states");
                decode_or_die(B.ctx, b, "hidden states");
                for (int j = 0; j < M; ++j) {
                    if (masked && !b.logits[j]) {
                        continue;
                    }
                    const float * ha = llama_get_embeddings_nextn_ith(A.ctx, j);
                    const float * hb = llama_get_embeddings_nextn_ith(B.ctx, j);
                    if (!ha || !hb) {
                        fprintf(stderr, "test-mk: no hidden-state row %d (megakernel %p, graph %p)\n", j, (const void *) ha, (const void *) hb);
                        exit(2);
                    }
                    worst = std::max(worst, nmse(ha, hb, n_embd));
                    ++rows;
                }
                llama_batch_free(b);
                pos += M;
            }
            const bool ok = worst <= max_nmse;
            printf("hidden states (%s), %d batches of M = 1..4: %d rows, NMSE max %.3g: %s\n", masked ? "masked: output rows" : "unmasked: every token",
                   n_batches, rows, worst, ok ? "ok" : "FAIL");
            bad += !ok;
        }
        {
            // a verify batch's rows are those of its one-token steps, bit for bit (what makes a draft lossless)
            llama_set_embeddings_nextn(A.ctx, true, false);
            const int M = 4;
            prefill(A, prompt);
            std::vector<float> seq((size_t) M*n_embd), bat((size_t) M*n_embd);
            for (int j = 0; j < M; ++j) {
                step(A, gen_a[j], np + j);
                memcpy(seq.data() + (size_t) j*n_embd, llama_get_embeddings_nextn_ith(A.ctx, 0), n_embd*sizeof(float));
            }
            verify_batch(A.ctx, gen_a, 0, M, np, "hidden states, verify");
            int rows_diff = 0;
            for (int j = 0; j < M; ++j) {
                rows_diff += memcmp(seq.data() + (size_t) j*n_embd, llama_get_embeddings_nextn_ith(A.ctx, j), n_embd*sizeof(float)) != 0;
            }
            printf("hidden states, verify M=%d == one-token steps (bitwise): %d rows differ: %s\n", M, rows_diff, rows_diff ? "FAIL" : "ok");
            bad += rows_diff != 0;
        }
        llama_set_embeddings_nextn(A.ctx, false, false);
        llama_set_embeddings_nextn(B.ctx, false, false);
        fails += bad != 0;
    }

    llama_free(A.ctx);
    llama_free(B.ctx);
    if (cpu_ref) {
        llama_free(R.ctx);
        llama_model_free(model_cpu);
    }
    llama_model_free(model);
    printf("test-mk: %s\n", fails ? "FAILED" : "passed");
    return fails ? 1 : 0;
}
