// Exactness check of the STQ1_0 vec_dot of an aarch64 (NEON) ggml-cpu build, run under qemu-user by
// tests/test_stq1_0_neon.py. STQ1_0 blocks with d = 1 and Q8_K blocks with d = 1 make every dot product an
// integer, so the kernel's result must equal the integer reference exactly. The reference multiplies
// ggml's own dequantized weights (to_float, checked bit-exact against the numpy reference elsewhere)
// with the int8 activations.
#include "ggml.h"
#include "ggml-cpu.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { float d; int8_t qs[256]; int16_t bsums[16]; } q8_K_block; // block_q8_K (ggml-common.h)

static uint64_t rng = 0x2026112900000001ull;
static uint32_t next(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t) (rng >> 16); }

int main(void) {
    const struct ggml_type_traits     * tt  = ggml_get_type_traits(GGML_TYPE_STQ1_0);
    const struct ggml_type_traits_cpu * ttc = ggml_get_type_traits_cpu(GGML_TYPE_STQ1_0);
    if (tt->blck_size != 256 || tt->type_size != 42 || ttc->vec_dot_type != GGML_TYPE_Q8_K || sizeof(q8_K_block) != ggml_type_size(GGML_TYPE_Q8_K)) {
        printf("FAIL: unexpected STQ1_0/Q8_K traits (block %d, size %zu, vec_dot_type %d)\n", (int) tt->blck_size, tt->type_size, (int) ttc->vec_dot_type);
        return 1;
    }
    int bad = 0, cases = 0;
    for (int nb = 1; nb <= 24; ++nb) {
        for (int rep = 0; rep < 8; ++rep) {
            uint8_t * x = malloc(42*nb);
            q8_K_block * y = malloc(sizeof(q8_K_block)*nb);
            float * w = malloc(sizeof(float)*256*nb);
            for (int b = 0; b < nb; ++b) {
                uint8_t * blk = x + 42*b;
                for (int i = 0; i < 40; ++i) blk[i] = (uint8_t) next();
                blk[40] = 0x00; blk[41] = 0x3C; // fp16 1.0
                y[b].d = 1.0f;
                for (int i = 0; i < 256; ++i) y[b].qs[i] = (int8_t) ((int) (next() % 255) - 127);
                for (int g = 0; g < 16; ++g) {
                    int s = 0;
                    for (int i = 0; i < 16; ++i) s += y[b].qs[16*g + i];
                    y[b].bsums[g] = (int16_t) s;
                }
            }
            tt->to_float(x, w, 256*nb);
            long ref = 0;
            for (int i = 0; i < 256*nb; ++i) {
                if (w[i] != -1.0f && w[i] != 0.0f && w[i] != 1.0f) { printf("FAIL: dequantized weight %g\n", w[i]); return 1; }
                ref += (long) w[i] * y[i/256].qs[i % 256];
            }
            float got = 0.0f;
            ttc->vec_dot(256*nb, &got, 0, x, 0, y, 0, 1);
            ++cases;
            if (got != (float) ref) {
                if (bad++ < 5) printf("mismatch: %d blocks: vec_dot %.1f, integer reference %ld\n", nb, got, ref);
            }
            free(x); free(y); free(w);
        }
    }
    printf("%s: %d of %d STQ1_0 x Q8_K dot products differ from the integer reference\n", bad ? "FAIL" : "OK", bad, cases);
    return bad != 0;
}
