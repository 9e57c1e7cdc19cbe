// mk.cuh: entry points of the CUDA Gemma decode megakernel (megakernel/cuda/mk.cu), exported through
// the CUDA backend registry's get_proc_address as ggml_backend_mk_create / _eval / _free
#pragma once

#include "ggml-mk.h"

void * ggml_cuda_mk_create(const ggml_mk_model * model, char * err, size_t err_size);
int    ggml_cuda_mk_eval(void * mk, const ggml_mk_step * step, float * logits);
void   ggml_cuda_mk_free(void * mk);
