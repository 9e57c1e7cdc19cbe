// Host emulation of the megakernel's weight decoding (megakernel/mk-deq32.h through its CUDA side
// megakernel/cuda/mk-deq.cuh, included as MK_DEQ_PATH; the test hands in a mutated mk-deq32.h through the
// include path): every supported type, rows quantized by
// ggml_quantize_chunk from random data, decoded 32 values at a time and compared with ggml's own
// to_float. Prints "OK <type>" per type, or "FAIL <type> ..." and exits 1.
#include "ggml.h"
#define GGML_COMMON_DECL_C
#define GGML_COMMON_IMPL_C
#include "ggml-common.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

static inline float mk_f16(uint16_t u) {
    ggml_fp16_t h;
    memcpy(&h, &u, sizeof(h));
    return ggml_fp16_to_fp32(h);
}
#define MK_DEVICE static inline
#define MK_UNROLL
#define MK_TRAP() abort()
#include MK_DEQ_PATH

int main(int argc, char ** argv) {
    const int n_rows = argc > 1 ? atoi(argv[1]) : 64;
    std::mt19937 rng(1234);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const ggml_type types[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q5_0,
                                GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_STQ1_0 };
    int fails = 0;
    for (ggml_type t : types) {
        const bool is_float = t == GGML_TYPE_F32 || t == GGML_TYPE_F16 || t == GGML_TYPE_BF16;
        // float rows also at a length that is not a multiple of 32 (the megakernel's row tails)
        const int lens[2] = { 768, is_float ? 200 : 512 };
        int bad = 0;
        double worst = 0;
        for (int K : lens) {
            std::vector<float> src((size_t) n_rows*K), ref(K);
            for (auto & v : src) v = nd(rng)*(1.0f + 3.0f*(rng() % 4 == 0));
            const size_t row_size = ggml_row_size(t, K);
            std::vector<uint8_t> q((size_t) n_rows*row_size + 64);
            if (t == GGML_TYPE_F32) {
                memcpy(q.data(), src.data(), src.size()*sizeof(float));
            } else {
                ggml_quantize_chunk(t, src.data(), q.data(), 0, n_rows, K, nullptr);
            }
            for (int r = 0; r < n_rows; ++r) {
                const uint8_t * row = q.data() + (size_t) r*row_size;
                if (t == GGML_TYPE_F32) {
                    memcpy(ref.data(), row, K*sizeof(float));
                } else {
                    ggml_get_type_traits(t)->to_float(row, ref.data(), K);
                }
                for (int g = 0; g < (K + 31)/32; ++g) {
                    const int lim = K - 32*g < 32 ? K - 32*g : 32;
                    float w[32];
                    mk_deq32(row, t, g, lim, w);
                    for (int i = 0; i < 32; ++i) {
                        const float want = i < lim ? ref[32*g + i] : 0.0f;
                        // 1e-6 relative: room for an FMA contraction, far below any decoding error
                        const double err = fabs((double) w[i] - want);
                        worst = std::max(worst, err/(fabs(want) + 1e-30));
                        if (err > 1e-6*fabs(want) + 1e-30) {
                            if (bad < 3) {
                                printf("FAIL %s K=%d row %d value %d: %g, ggml %g\n", ggml_type_name(t), K, r, 32*g + i, w[i], want);
                            }
                            ++bad;
                        }
                    }
                }
            }
        }
        if (bad) {
            printf("FAIL %s: %d values differ\n", ggml_type_name(t), bad);
            ++fails;
        } else {
            printf("OK %s (worst relative difference %.3g)\n", ggml_type_name(t), worst);
        }
    }
    return fails ? 1 : 0;
}
