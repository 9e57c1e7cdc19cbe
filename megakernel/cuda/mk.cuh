// mk.cuh: entry points of the CUDA Gemma decode megakernel (megakernel/cuda/mk.cu), exported through
// the CUDA backend registry's get_proc_address as ggml_backend_mk_create / _eval / _free, and of its
// fused MTP draft as ggml_backend_mk_draft_create / _eval / _free
#pragma once

#include "ggml-mk.h"

void * ggml_cuda_mk_create(const ggml_mk_model * model, char * err, size_t err_size);
int    ggml_cuda_mk_eval(void * mk, const ggml_mk_step * step, float * logits);
void   ggml_cuda_mk_free(void * mk);

void * ggml_cuda_mk_draft_create(const ggml_mk_draft * draft, char * err, size_t err_size);
int    ggml_cuda_mk_draft_eval(void * mkd, const ggml_mk_draft_step * step);
void   ggml_cuda_mk_draft_free(void * mkd);

// (internal) the draft kernel, compiled in its own module (mk-draft.cu)
const void * ggml_cuda_mk_draft_kernel();
