// llama-mk.h: llama.cpp side of the Gemma decode megakernel (stq-metal); see megakernel/README.md
#pragma once

#include "ggml-mk.h"

#include <cstdint>
#include <memory>
#include <string>

struct llama_model;
struct llama_cparams;
struct llama_ubatch;
class  llama_memory_context_i;
struct llama_memory_i;
struct llm_graph_context;
struct llm_graph_params;

struct llama_mk;

struct llama_mk_deleter {
    void operator()(llama_mk * mk) const;
};

using llama_mk_ptr = std::unique_ptr<llama_mk, llama_mk_deleter>;

// the megakernel for this model and context, or nullptr (one log line says why)
llama_mk_ptr llama_mk_init(const llama_model & model, const llama_cparams & cparams);

// whether the megakernel takes this ubatch (decode/verify of up to GGML_MK_MAX_TOKENS tokens, all
// else the standard graph); logs the first occurrence of each reason for not taking it. no: why the
// context cannot take the megakernel's output for this batch (it wants more than logits), or nullptr
bool llama_mk_accepts(llama_mk * mk, const llama_ubatch & ubatch, llama_memory_context_i * mctx, const char * no = nullptr);

// applies mctx (the ubatch's KV cells) and evaluates the ubatch: K/V rows written to the cache, the
// logits of the ubatch's output tokens (ubatch.output order) written to logits_out; false = error.
// h_out != nullptr: also the hidden states an MTP draft reads (the graph's t_h_nextn: rmsnorm(x)*output_norm,
// n_embd floats per row), of every token of the ubatch or, h_masked, of its output tokens (ubatch.output order)
bool llama_mk_decode(llama_mk * mk, const llama_ubatch & ubatch, llama_memory_context_i * mctx, float * logits_out,
                     float * h_out = nullptr, bool h_masked = false);

// the graph of a LLM_GRAPH_TYPE_MK_SAMPLING step (llama_model::build_graph): the context's backend samplers applied to
// the logits rows a megakernel step wrote to host memory (params.mk_logits, n_outputs rows), on the LM head's backend
std::unique_ptr<llm_graph_context> llama_mk_sampling_graph(const llama_model & model, const llm_graph_params & params);

// ---- LLAMA_MEGAKERNEL_TIMELINE=1: where a server's decode time goes around the megakernel ----
//
// One process-wide timeline of the calls one thread makes (llama-server's): the target's megakernel steps
// (llama_mk_decode), the backend samplers' graph after a step, the fused draft's launches, and llama_context::decode
// around a step the megakernel took. For each kind and size (tokens of a step, drafts of a launch): how many, their
// mean time and the mean host time between the end of the previous call (not a decode: it encloses the others) and
// their start (gaps over 50 ms, idle between requests, are left out). One line every 256 calls (=N > 1: every N) and
// at teardown.

enum llama_mk_tl_kind {
    LLAMA_MK_TL_STEP     = 0,   // llama_mk_decode of a ubatch of n tokens
    LLAMA_MK_TL_SAMPLING = 1,   // the backend samplers' graph over a step's logits (n: the step's tokens)
    LLAMA_MK_TL_DRAFT    = 2,   // a fused draft launch of n steps (inputs included)
    LLAMA_MK_TL_DECODE   = 3,   // llama_context::decode of a batch of n tokens the megakernel took
    LLAMA_MK_TL_N_KINDS  = 4,
};

// the clock (ggml_time_us) at the start of a call, 0 when the timeline is off
int64_t llama_mk_tl_begin();

// the call of this kind and size that began at t_begin (from llama_mk_tl_begin) has ended
void llama_mk_tl_end(llama_mk_tl_kind kind, int32_t n, int64_t t_begin);

// a llama_context::decode the megakernel takes part in: set `on` once it has taken a ubatch
struct llama_mk_tl_scope {
    int32_t n;
    int64_t t_begin;
    bool    on = false;
    explicit llama_mk_tl_scope(int32_t n) : n(n), t_begin(llama_mk_tl_begin()) {}
    ~llama_mk_tl_scope() {
        if (on) {
            llama_mk_tl_end(LLAMA_MK_TL_DECODE, n, t_begin);
        }
    }
};

// ---- the fused MTP draft (ggml-mk.h: ggml_mk_draft) ----

struct llama_mk_draft;

struct llama_mk_draft_deleter {
    void operator()(llama_mk_draft * d) const;
};

using llama_mk_draft_ptr = std::unique_ptr<llama_mk_draft, llama_mk_draft_deleter>;

// the fused-draft plan of a gemma4-assistant model (model, cparams: the assistant's context, whose ctx_other is the
// target's) and the backend's kernel for it, or nullptr with why set. host_ok: the plan only, weights in host memory
// are fine (a CPU reference reads it; no backend is asked for a kernel). k_max: the most draft steps a launch will ask for
llama_mk_draft_ptr llama_mk_draft_init(const llama_model & model, const llama_cparams & cparams, std::string & why,
                                       bool host_ok = false, int32_t k_max = GGML_MK_DRAFT_MAX_K);

const ggml_mk_draft * llama_mk_draft_plan(const llama_mk_draft * d);

// the cache inputs of a draft launch for sequence seq at position pos: each assistant layer's view of its target
// layer's K/V (from the target's memory) and llama.cpp's mask rows of the query (from mem_dft, the assistant's memory,
// whose caches share the target's cells); the caller sets k, token, h and the outputs. false = error (logged)
bool llama_mk_draft_inputs(llama_mk_draft * d, llama_memory_i * mem_dft, int32_t seq, int32_t pos, ggml_mk_draft_step & st);

// one launch of the backend's fused draft kernel (a plan made without host_ok): st from llama_mk_draft_inputs plus k,
// token, h and the outputs; false = error (logged)
bool llama_mk_draft_eval(llama_mk_draft * d, const ggml_mk_draft_step & st);

// the fused draft of an MTP assistant's context (model, cparams: the assistant's) when its target context runs on the
// megakernel (mk_tgt: the target's, or nullptr) and LLAMA_MEGAKERNEL_DRAFT is not 0; else nullptr. Logs one line
// either way (why the graph drafts)
llama_mk_draft_ptr llama_mk_draft_open(const llama_model & model, const llama_cparams & cparams, const llama_mk * mk_tgt);

// k greedy draft tokens of sequence seq from (token, h) at position pos in one launch (draft-mtp's drafts of a
// shared-KV assistant): out[0..k-1]; returns k, or -1 (k above the plan's k_max, or an error; logged): the caller
// drafts with the graph
int32_t llama_mk_draft_tokens(llama_mk_draft * d, llama_memory_i * mem_dft, int32_t seq, int32_t token, int32_t pos,
                              const float * h, int32_t k, int32_t * out);
