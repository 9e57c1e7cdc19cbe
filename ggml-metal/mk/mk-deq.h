// mk-deq.h: the Metal side of the megakernel's weight decoding (MSL 3.2): megakernel/mk-deq32.h, the code the
// CUDA kernel decodes with, in device memory, for the types the Metal kernel reads (mk_mtl_type_supported in
// mk-plan.h). The STQ1_0 patterns are ggml-common.h's stq1_0_grid, included here as ggml's Metal kernels include
// it (one table for every backend). Included by mk-kernel.metal after mk-plan.h (MK_MTL_TYPE_*), and by the
// decoding test's kernel (tests/mk_hostemu/mk_deq_metal.metal), which compares it with ggml's CPU dequantizers.
// mk.cmake inlines this file, mk-deq32.h and ggml-common.h into the source a Mac compiles.
#pragma once

#define GGML_COMMON_DECL_METAL
#define GGML_COMMON_IMPL_METAL
#include "ggml-common.h"

static inline float mk_f16(uint16_t bits) {
    return (float) as_type<half>(bits);
}

static inline float mk_bf16(uint16_t bits) {
    return as_type<float>((uint32_t) bits << 16);
}

static inline int mk_i8(uint8_t v) {
    return (int) as_type<char>(v);
}

#define MK_DEQ_FN              static inline
#define MK_DEQ_DEV             device
#define MK_DEQ_OUT             thread float *
#define MK_DEQ_T(NAME)         MK_MTL_TYPE_##NAME
#define MK_DEQ_UNSUPPORTED(w)  for (int l = 0; l < 32; ++l) { w[l] = 0.0f; }   // (the host refuses other types: mk_mtl_plan_make)
#define MK_UNROLL
#include "mk-deq32.h"
