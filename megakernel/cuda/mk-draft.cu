// mk-draft.cu: the fused MTP draft kernel of the Gemma megakernel (stq-metal, issue 14): k draft steps of a gemma4
// assistant in one cooperative launch (mk-kernel.cuh: mk_draft_kernel = k x mk_step<true>). Its own module so that
// mk.cu's decode kernel keeps its code; mk.cu's host side (ggml_cuda_mk_draft_create/_eval/_free) launches it.
#define GGML_MK_DRAFT_KERNEL

#include "mk.cuh"
#include "mk-device.cuh"
#include "mk-kernel.cuh"

const void * ggml_cuda_mk_draft_kernel() {
    return (const void *) mk_draft_kernel;
}
