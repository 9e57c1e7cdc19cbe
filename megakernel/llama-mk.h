// llama-mk.h: llama.cpp side of the Gemma decode megakernel (stq-metal); see megakernel/README.md
#pragma once

#include <cstdint>
#include <memory>

struct llama_model;
struct llama_cparams;
struct llama_ubatch;
class  llama_memory_context_i;

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
