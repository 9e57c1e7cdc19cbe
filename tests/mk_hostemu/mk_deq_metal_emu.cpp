// The Metal megakernel's weight decoding (megakernel/mk-deq32.h through ggml-metal/mk/mk-deq.h) against ggml's own CPU dequantizers:
// mk_deq_metal.metal (mk_deq32 in a plain kernel), translated by metal-emu's msl2cpp.py and run by
// emu-runtime.cpp, decodes every 32-value group of a few rows; each value must equal ggml's to_float of
// the same row (1e-6 relative: room for an FMA contraction, far below any decoding error).
// Per type, two sources of rows (fixed seeds): ggml_quantize_chunk of random data, and random bytes with
// finite scales (every bit pattern of codes, high bits and signs: what a quantizer may never emit).
// Rows of 640 values (Gemma 3 270M's width, why its Q4_K_M falls back to Q5_0) for the 32-value block
// types, 768 and 512 for the 256-value block types, 200 for float rows (a row tail shorter than 32), an
// odd number of rows, and row 0 at an offset of 2 mod 4 where the type allows 2-byte alignment (4-byte
// loads into 22- and 42-byte blocks would be misaligned: the emulator's checked casts report them).
// Prints "OK <type> ..." per type, or "FAIL <type> ..." and exits 1.
// usage: mk_deq_metal_emu [n_rows]
#include <ggml.h>

#include "emu-runtime.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <sys/mman.h>

void emu_register_mk_deq_p0();
void emu_register_all_kernels(void) { emu_register_mk_deq_p0(); }

struct mk_deq_test_args {   // as in mk_deq_metal.metal
    int32_t  type;
    int32_t  K;
    int32_t  n_rows;
    int32_t  pad;
    uint64_t off;
    uint64_t nb1;
};

static uint8_t * device_alloc(size_t n) {
    const size_t bytes = (n + 4095) & ~(size_t) 4095;
    void * p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(3);
    }
    emu_device_memory_register(p, bytes);
    return (uint8_t *) p;
}

static void device_free(uint8_t * p, size_t n) {
    emu_device_memory_unregister(p);
    munmap(p, (n + 4095) & ~(size_t) 4095);
}

// byte offsets of the fp16 scales in a block (random bytes get finite scales there)
static std::vector<int> scale_offsets(ggml_type t) {
    switch (t) {
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0: return { 0 };
        case GGML_TYPE_Q4_K:   return { 0, 2 };
        case GGML_TYPE_Q6_K:   return { 208 };
        case GGML_TYPE_STQ1_0: return { 40 };
        default:               return {};
    }
}

int main(int argc, char ** argv) {
    const int n_rows = argc > 1 ? atoi(argv[1]) : 7;
    const emu_kernel_info * kinfo = emu_find_kernel("kernel_mk_deq_test");
    if (!kinfo) {
        printf("FAIL kernel_mk_deq_test not registered\n");
        return 1;
    }
    const ggml_type types[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q5_0,
                                GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_STQ1_0 };
    std::mt19937 rng(1234);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(-2.0f, 2.0f);
    int fails = 0;
    for (ggml_type t : types) {
        const bool is_float = t == GGML_TYPE_F32 || t == GGML_TYPE_F16 || t == GGML_TYPE_BF16;
        std::vector<int> lens;
        if (ggml_blck_size(t) == 256) {
            lens = { 768, 512 };
        } else {
            lens = { 640 };
            if (is_float) {
                lens.push_back(200);
            }
        }
        const size_t align = t == GGML_TYPE_F32 || t == GGML_TYPE_Q4_K ? 4 : 2;   // mk_mtl_plan_w's requirement
        int bad = 0, checked = 0;
        double worst = 0;
        for (int K : lens) {
            for (int src_kind = 0; src_kind < (is_float ? 1 : 2); ++src_kind) {
                const size_t row_size = ggml_row_size(t, K);
                const size_t off = 64 + align;   // 2 mod 4 for the 2-byte-aligned types
                const size_t n_src = off + (size_t) n_rows*row_size;
                uint8_t * src = device_alloc(n_src);
                uint8_t * q = src + off;
                if (src_kind == 0) {
                    std::vector<float> x((size_t) n_rows*K);
                    for (auto & v : x) {
                        v = nd(rng)*(1.0f + 3.0f*(rng() % 4 == 0));
                    }
                    if (t == GGML_TYPE_F32) {
                        memcpy(q, x.data(), x.size()*sizeof(float));
                    } else {
                        ggml_quantize_chunk(t, x.data(), q, 0, n_rows, K, nullptr);
                    }
                } else {
                    for (size_t i = 0; i < (size_t) n_rows*row_size; ++i) {
                        q[i] = (uint8_t) rng();
                    }
                    const size_t bs = ggml_type_size(t);
                    for (size_t b = 0; b < (size_t) n_rows*row_size/bs; ++b) {
                        for (int so : scale_offsets(t)) {
                            const ggml_fp16_t h = ggml_fp32_to_fp16(ud(rng));
                            memcpy(q + b*bs + so, &h, sizeof(h));
                        }
                    }
                }
                const int ngrp = (K + 31)/32;
                const size_t n_dst = (size_t) n_rows*ngrp*32*sizeof(float);
                uint8_t * dst = device_alloc(n_dst);
                memset(dst, 0xff, n_dst);   // NaN: a value not written shows
                mk_deq_test_args args = { (int32_t) t, K, n_rows, 0, off, row_size };

                emu_dispatch d = {};
                d.kernel = kinfo;
                d.bufs[0] = &args;
                d.bufs[1] = src;
                d.bufs[2] = dst;
                const int n_thr = n_rows*ngrp;
                d.ntg[0] = 64; d.ntg[1] = 1; d.ntg[2] = 1;
                d.ntgpg[0] = (n_thr + 63)/64; d.ntgpg[1] = 1; d.ntgpg[2] = 1;
                if (!emu_run_dispatch(&d)) {
                    printf("FAIL %s: dispatch of kernel_mk_deq_test (emulator error)\n", ggml_type_name(t));
                    return 1;
                }

                std::vector<float> ref(K);
                const float * out = (const float *) dst;
                for (int r = 0; r < n_rows; ++r) {
                    const uint8_t * row = q + (size_t) r*row_size;
                    if (t == GGML_TYPE_F32) {
                        memcpy(ref.data(), row, K*sizeof(float));
                    } else {
                        ggml_get_type_traits(t)->to_float(row, ref.data(), K);
                    }
                    for (int i = 0; i < ngrp*32; ++i) {
                        const float want = i < K ? ref[i] : 0.0f;
                        const float got  = out[(size_t) r*ngrp*32 + i];
                        const double err = fabs((double) got - want);
                        ++checked;
                        if (!(err <= 1e-6*fabs(want))) {
                            if (bad < 3) {
                                printf("FAIL %s K=%d %s row %d value %d: %g, ggml %g\n", ggml_type_name(t), K,
                                       src_kind ? "random bytes" : "quantized", r, i, got, want);
                            }
                            ++bad;
                        } else if (want != 0.0f) {
                            worst = std::max(worst, err/fabs(want));
                        }
                    }
                }
                device_free(src, n_src);
                device_free(dst, n_dst);
            }
        }
        if (bad) {
            printf("FAIL %s: %d of %d values differ from ggml's dequantizer\n", ggml_type_name(t), bad, checked);
            ++fails;
        } else {
            printf("OK %s: %d values of %d rows equal ggml's dequantizer (worst relative difference %.3g)\n",
                   ggml_type_name(t), checked, n_rows, worst);
        }
    }
    return fails ? 1 : 0;
}
