// ggml-metal-mk.h: host side of the Metal Gemma decode megakernel (stq-metal issue 13).
//
// ggml-metal exports these through its registry's get_proc_address as ggml_backend_mk_create /
// _eval / _free and ggml_backend_mk_draft_create / _eval / _free (megakernel/ggml-mk.h), so libllama's megakernel/llama-mk.cpp finds them by name
// exactly as it finds the CUDA ones. Built into ggml-metal (and into metal-emu's ggml-metal) when
// GGML_MEGAKERNEL_DIR is set; the kernel is ggml-metal/mk/mk-kernel.metal, the device plan
// ggml-metal/mk/mk-plan.h.
#pragma once

#include "ggml-mk.h"
#include "ggml-metal-device.h"

#ifdef __cplusplus
extern "C" {
#endif

// the megakernel of one Metal device; NULL + a message naming the tensor/limit in err if it cannot run
void * ggml_metal_mk_create(ggml_metal_device_t dev, const struct ggml_mk_model * model, char * err, size_t err_size);
// one decode/verify step: n_out rows of n_vocab logits (host memory); 0 = success
int    ggml_metal_mk_eval(void * mk, const struct ggml_mk_step * step, float * logits);
void   ggml_metal_mk_free(void * mk);

// the fused MTP draft (issue 14): kernel_mk_draft, k steps of the assistant in one dispatch (ggml-mk.h: ggml_mk_draft,
// ggml_mk_draft_step), exported as ggml_backend_mk_draft_create / _eval / _free; eval returns 0 = success
void * ggml_metal_mk_draft_create(ggml_metal_device_t dev, const struct ggml_mk_draft * draft, char * err, size_t err_size);
int    ggml_metal_mk_draft_eval(void * mkd, const struct ggml_mk_draft_step * step);
void   ggml_metal_mk_draft_free(void * mkd);

// the backend's buffers (ggml-metal.cpp registers every buffer it creates and drops it when freed):
// the plan's weight and KV addresses are mapped to Metal buffers + offsets through them
void   ggml_metal_mk_buffer_add   (ggml_metal_buffer_t buf, void * base, size_t size);
void   ggml_metal_mk_buffer_remove(ggml_metal_buffer_t buf);

#ifdef __cplusplus
}
#endif
