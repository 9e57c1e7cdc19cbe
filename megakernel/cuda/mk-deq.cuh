// mk-deq.cuh: the CUDA side of the megakernel's weight decoding (megakernel/mk-deq32.h, shared with the Metal
// kernel). Byte-level code with no CUDA-only types, so that the host emulation test (tests/test_megakernel.py)
// compiles this very file for the CPU and compares it with ggml's own dequantizers. The includer defines
// MK_DEVICE (CUDA: static __device__ __forceinline__), MK_UNROLL and MK_TRAP() and provides
// float mk_f16(uint16_t bits) and stq1_0_grid[32] (ggml-common.h).
#pragma once

MK_DEVICE float mk_bf16(uint16_t bits) {
    const uint32_t u = (uint32_t) bits << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

MK_DEVICE int mk_i8(uint8_t v) {
    return (int8_t) v;
}

#define MK_DEQ_FN              MK_DEVICE
#define MK_DEQ_DEV
#define MK_DEQ_OUT             float *
#define MK_DEQ_T(NAME)         GGML_TYPE_##NAME
#define MK_DEQ_UNSUPPORTED(w)  MK_TRAP()
#include "mk-deq32.h"
