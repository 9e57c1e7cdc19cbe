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
struct ggml_tensor;

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
// logits of the ubatch's output tokens (ubatch.output order) written to logits_out (host; nullptr: not there) and to
// the first rows of logits_dev (llama_mk_logits_dev; nullptr: not there); false = error.
// h_out != nullptr: also the hidden states an MTP draft reads (the graph's t_h_nextn: rmsnorm(x)*output_norm,
// n_embd floats per row), of every token of the ubatch or, h_masked, of its output tokens (ubatch.output order)
bool llama_mk_decode(llama_mk * mk, const llama_ubatch & ubatch, llama_memory_context_i * mctx, float * logits_out,
                     float * h_out = nullptr, bool h_masked = false, ggml_tensor * logits_dev = nullptr);

// the tensor on the model's output device ([n_vocab, GGML_MK_MAX_TOKENS] F32, made on the first call) that a step's
// logits rows go to for the backend samplers, so they never pass through the host; nullptr if it cannot be made
ggml_tensor * llama_mk_logits_dev(llama_mk * mk);

// the graph of a LLM_GRAPH_TYPE_MK_SAMPLING step (llama_model::build_graph): the context's backend samplers applied to
// the logits rows a megakernel step wrote to llama_mk_logits_dev (params.mk_logits, its first n_outputs rows)
std::unique_ptr<llm_graph_context> llama_mk_sampling_graph(const llama_model & model, const llm_graph_params & params);

// ---- LLAMA_MEGAKERNEL_TIMELINE=1: where a server's decode time goes around the megakernel ----
//
// A process-wide timeline of points one thread marks (llama-server's): llama_context::decode's start and end around a
// batch the megakernel takes ("decode>", "decode<"), a step's start, its embedding rows, its launch and its end
// ("step>", "step.rows>", "step.launch>", "step<": llama_mk_decode), the backend samplers' graph after it ("sampling>", "sampling<"), a fused draft's start,
// launch and end ("draft>", "draft.launch>", "draft<"); each point with the size of its batch or draft. Every
// interval between two consecutive points is counted under the pair ("draft<3 .. decode>4": the host's work from a
// draft launch's end to the next decode), with its count, median and mean; intervals from a decode's or a draft's
// end over 50 ms (idle between requests) are left out. One line, the pairs by their total time, every 256 points
// (=N > 1: every N) and at teardown. LLAMA_MEGAKERNEL_PROFILE (the kernel's per-phase profile) turns it on too.

// the clock (ggml_time_us) when the timeline is on, else 0
int64_t llama_mk_tl_now();

// a point of the timeline: what (a string literal) for a batch or draft of n, at t_us (0: now); nothing when off
void llama_mk_tl_mark(const char * what, int32_t n, int64_t t_us = 0);

// llama_context::decode's points: its start is marked once the megakernel takes one of its ubatches (took()), its
// end when it returns
struct llama_mk_tl_decode {
    int32_t n;
    int64_t t_begin;
    bool    on = false;
    explicit llama_mk_tl_decode(int32_t n) : n(n), t_begin(llama_mk_tl_now()) {}
    void took() {
        if (!on && t_begin != 0) {
            on = true;
            llama_mk_tl_mark("decode>", n, t_begin);
        }
    }
    ~llama_mk_tl_decode() {
        if (on) {
            llama_mk_tl_mark("decode<", n);
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
