// Host emulation of the CUDA megakernel's inputs staged once for the grid (megakernel/cuda/mk-kernel.cuh through
// cuda_emu.h) at production widths: every block of a grid rounds its slice of a plain mat-vec's inputs into global
// records (mk_stage_once), and one block then copies a pass of them (mk_stage_copy), against one block staging the
// same columns itself (mk_stage<MK_M>, direct: the 8-bit records only). The kernel emulation's tiny model has rows of at
// most 512 values and a grid of a few blocks; here K = 10240 (E4B's down input), 2048 and 4096 (E4B's O, sliding and
// global), 6144 (E2B's down), 5120 (a draft's pre-projection, 2*2560), 256 (the per-layer projection's GEGLU inputs)
// and 2080 (65 groups: slices of unequal size), grids of 3, 7, 17 and 132 blocks (an H100's: slices of 2 and 3 groups;
// more blocks than groups for K = 256: blocks without a slice), 1, 2, 3, 5 and 8 columns, and a later pass (the copy of
// columns m0.. of the buffer). Every record's quants, d and sum must equal the block's own staging byte for byte. And
// mk_rec_fits, the host's check of the widths whose records would not stay within their column; and where the default
// takes this way (mk_once_on's bound) at E4B's shapes.
// Prints OK/FAIL per case, exits 1 on any failure.
#define GGML_COMMON_DECL_C
#define GGML_COMMON_IMPL_C
#include "ggml-common.h"

#include "cuda_emu.h"
#define MK_ATT_GROUP 3
#include "mk-kernel.cuh"

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

struct once_args {
    mk_xin    x;
    int       K, M;
    uint8_t * rec;   // [M][KG] records (global)
};

// the grid's slices, as the kernel's mk_once does them before its grid barrier
static void once_kernel(const once_args a) {
    mk_stage_once(a.x, a.K, a.M, a.rec);
}

struct copy_args {
    mk_xin          x;
    int             K, m0, Mc;
    const uint8_t * rec;   // NULL: the block stages columns m0.. itself (mk_stage<MK_M>, direct)
    char          * out;
    int             out_bytes;
};

static void copy_kernel(const copy_args a) {
    MK_SHARED_DYN(char, smem);
    const int KG = mk_kg(a.K);
    if (a.rec) {
        mk_stage_copy(a.rec + (size_t) a.m0*KG*MK_XQ_REC, (uint8_t *) smem, a.Mc*KG*MK_XQ_REC);
    } else {
        mk_stage<MK_M>(a.x, a.K, a.m0, a.Mc, 1e-6f, (float *) smem, (uint8_t *) smem, true, true, nullptr);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < a.out_bytes; i += MK_THREADS) {
        a.out[i] = smem[i];
    }
}

int main() {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    std::mt19937 rng(20261206);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int Ks[]    = { 10240, 2048, 4096, 6144, 5120, 256, 2080 };
    const int grids[] = { 3, 7, 17, 132 };
    const int Ms[]    = { 1, 2, 3, 5, 8 };
    int fails = 0, cases = 0;
    // rows whose last record would sit past the column (mk_rec_fits: the host refuses them): 2336 (73 groups) crashed
    // this program's own staging before the host checked; every width above fits
    for (int K : { 288, 2336, 2080, 640, 1536, 2560, 10240 }) {
        const bool fits = K != 288 && K != 2336;
        if (mk_rec_fits(K) != fits) {
            ++fails;
            printf("FAIL mk_rec_fits(%d) = %d\n", K, (int) mk_rec_fits(K));
        }
    }
    // where the default stages once (mk_once_on's bound: at least 8192 values a step, every job on 8-bit records, no norm,
    // no pending residual step, a column within the host's buffer): E4B's down at every M, O (2048) from 4 tokens on,
    // the global layers' O (4096) from 2; never under GGML_MK_VAR_STAGE_EVERY, always under GGML_MK_VAR_ONCE_ALL
    {
        static uint8_t wbuf[64];
        auto mvr = [&](int type, int K, bool norm) {
            const bool q4 = type == GGML_TYPE_Q4_0;
            ggml_mk_weight w = { wbuf, type, K, 2560, q4 ? 144 : 1024, (uint64_t) (q4 ? K/32*18 : 4*K) };
            mk_mv mv = {};
            mv.jobs[0] = { w, nullptr, K, 0.0f };
            mv.n_jobs  = 1;
            mv.norm    = norm;
            return mk_mvr_of(mv, 0);
        };
        const float one = 1.0f;
        mk_xin plain = {}, normed = {}, res = {};
        normed.nw = &one;
        res.res_h = &one;
        uint8_t * buf = wbuf;
        struct { int type, K; bool norm; const mk_xin * x; int M; const uint8_t * xrec; int xrec_k, flags; bool want; } cs[] = {
            { GGML_TYPE_Q4_0, 10240, false, &plain,  1, buf, 10240, 0, true  },   // down
            { GGML_TYPE_Q4_0,  2048, false, &plain,  3, buf, 10240, 0, false },   // O, 3 tokens
            { GGML_TYPE_Q4_0,  2048, false, &plain,  4, buf, 10240, 0, true  },   // O, 4 tokens
            { GGML_TYPE_Q4_0,  4096, false, &plain,  1, buf, 10240, 0, false },   // global O, 1 token
            { GGML_TYPE_Q4_0,  4096, false, &plain,  2, buf, 10240, 0, true  },   // global O, 2 tokens
            { GGML_TYPE_Q4_0,  2560, true,  &normed, 8, buf, 10240, 0, false },   // Q/K/V, gate/up: normed
            { GGML_TYPE_Q4_0, 10240, false, &res,    8, buf, 10240, 0, false },   // a pending residual step
            { GGML_TYPE_F32,  10240, false, &plain,  8, buf, 10240, 0, false },   // float rows: no records
            { GGML_TYPE_Q4_0, 10240, false, &plain,  8, buf,  4096, 0, false },   // wider than the buffer
            { GGML_TYPE_Q4_0, 10240, false, &plain,  8, nullptr, 0, 0, false },   // no buffer
            { GGML_TYPE_Q4_0, 10240, false, &plain,  8, buf, 10240, GGML_MK_VAR_STAGE_EVERY, false },
            { GGML_TYPE_Q4_0,   256, false, &plain,  1, buf, 10240, GGML_MK_VAR_ONCE_ALL, true },
        };
        for (const auto & c : cs) {
            const bool got = mk_once_on(mvr(c.type, c.K, c.norm), *c.x, c.M, c.xrec, c.xrec_k, c.flags);
            if (got != c.want) {
                ++fails;
                printf("FAIL mk_once_on: type %d K=%d M=%d norm %d res %d xrec_k %d flags 0x%x: %d, not %d\n", c.type, c.K,
                       c.M, (int) c.norm, c.x == &res, c.xrec_k, c.flags, (int) got, (int) c.want);
            }
        }
    }
    for (int K : Ks) {
        for (int G : grids) {
            if (G == 132 && K != 10240 && K != 256) {
                continue;   // (the H100's grid on down's width and on slices of nothing: the emulation's slowest runs)
            }
            for (int M : Ms) {
                if (G == 132 && M > 2) {
                    continue;
                }
                const bool geglu = K == 256;
                const int  KG    = mk_kg(K);
                const int  lda   = K + 8, ldb = K + 4;   // (row strides wider than K, multiples of 4)
                std::vector<float> A((size_t) M*lda), B((size_t) M*ldb);
                for (float & v : A) v = 2.0f*nd(rng);
                for (float & v : B) v = nd(rng);
                for (int i = 0; i < 32; ++i) A[i] = 0.0f;   // a group of zeros (d = 0)
                mk_xin x = {};
                x.mode = geglu ? MK_X_GEGLU : MK_X_PLAIN;
                x.a = A.data(); x.lda = lda;
                x.b = geglu ? B.data() : nullptr; x.ldb = ldb;
                x.res_scale = 1.0f;
                // the grid's records, poisoned first: a group no block rounds shows
                std::vector<uint8_t> rec((size_t) M*KG*MK_XQ_REC, 0xa5);
                once_args oa = { x, K, M, rec.data() };
                if (!emu_launch(once_kernel, oa, G, MK_THREADS, 0, "once_kernel")) {
                    printf("FAIL K=%d grid=%d M=%d: deadlock\n", K, G, M);
                    return 1;
                }
                // one pass of all M columns, and a later pass of the last columns (m0 = M/2)
                for (int m0 : { 0, M/2 }) {
                    if (m0 > 0 && M == 1) {
                        continue;
                    }
                    const int Mc = M - m0;
                    const int ob = Mc*KG*MK_XQ_REC;
                    std::vector<char> got(ob), want(ob);
                    copy_args ca = { x, K, m0, Mc, rec.data(), got.data(), ob };
                    copy_args sa = { x, K, m0, Mc, nullptr, want.data(), ob };
                    if (!emu_launch(copy_kernel, ca, 1, MK_THREADS, ob, "copy_kernel") ||
                        !emu_launch(copy_kernel, sa, 1, MK_THREADS, ob, "stage_kernel")) {
                        printf("FAIL K=%d grid=%d M=%d: deadlock\n", K, G, M);
                        return 1;
                    }
                    int bad = -1;
                    size_t n_set = 0;
                    for (int r = 0; r < Mc*KG && bad < 0; ++r) {   // quants, d, sum of q (not the padding)
                        if (memcmp(&got[(size_t) r*MK_XQ_REC], &want[(size_t) r*MK_XQ_REC], 40) != 0) {
                            bad = r;
                        }
                        for (int i = 0; i < 32; ++i) n_set += want[(size_t) r*MK_XQ_REC + i] != 0;
                    }
                    ++cases;
                    // (the block's own staging wrote records: most quants of random values are not 0)
                    if (bad >= 0 || n_set < (size_t) Mc*KG*16) {
                        ++fails;
                        if (bad >= 0) {
                            printf("FAIL K=%d grid=%d M=%d pass m0=%d: record %d (column %d, slot %d) differs from the "
                                   "block's own staging\n", K, G, M, m0, bad, m0 + bad/KG, bad % KG);
                        } else {
                            printf("FAIL K=%d grid=%d M=%d pass m0=%d: the staging wrote nothing\n", K, G, M, m0);
                        }
                    }
                }
            }
        }
    }
    printf("%s inputs staged once for the grid (mk_stage_once, mk_stage_copy) == every block's own staging bitwise: "
           "%d of %d cases differ (K = 10240, 2048, 4096, 6144, 5120, 256, 2080; grids of 3, 7, 17, 132; 1..8 columns)\n",
           fails ? "FAIL" : "OK", fails, cases);
    return fails ? 1 : 0;
}
