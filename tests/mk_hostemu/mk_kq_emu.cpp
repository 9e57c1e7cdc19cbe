// Host emulation of the CUDA megakernel's Q4_K / Q6_K integer dot products (megakernel/cuda/mk-kernel.cuh: mk_kq_groups,
// mk_q4k_unit, mk_q6k_unit, through cuda_emu.h) at the production widths the kernel emulation's tiny model does not
// have: rows of K = 2560 and 10240 (E4B's hidden and FFN sizes: one tile, or several tiles of a row added in order),
// 256 (the per-layer projection), 1536 (E2B's hidden size), 1024 and 2048 (the real Gemma 3 270M's Q4_K attn_output and
// Q6_K ffn_down rows), three rows each (Q6_K's 210-byte blocks put every other row 2 bytes off a word), weights
// quantized by ggml's own quantizer, four random input columns rounded to the kernel's 8-bit records (llama.cpp's q8_1:
// d = max|x|/127, q = round(x/d)). One warp walks each row's tiles as mk_mv_run does (mk_jr_of's tiles, each copied from its 16-byte
// aligned start as the weight stages are), lane sums added per tile, then the warp's butterfly sum. Checks:
//  - each row and column against a float64 dot product of ggml's dequantized weights with the rounded inputs
//    (relative to sum |w*x|: <= 1e-6; float32 sums land ~1e-8 off);
//  - the code made for 4 columns (mk_kq_groups<4>) equals the one-column code (mk_kq_groups<1>) bit for bit per
//    column (a verify batch's logits equal its one-token steps'), and so does the any-batch code (MK_M), and so do
//    Q4_K rows taken in pairs (base1: a gate/up pair or a warp's next row, each record loaded once for both).
// Prints OK/FAIL per case, exits 1 on any failure.
#define GGML_COMMON_DECL_C
#define GGML_COMMON_IMPL_C
#include "ggml-common.h"

#include "cuda_emu.h"
#define MK_ATT_GROUP 3
#include "mk-kernel.cuh"
#include "ggml.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <random>
#include <vector>

static const int NCOL = 4;

struct kq_args {
    const uint8_t * data;   // the rows
    int             type, K, n_rows;
    uint64_t        nb1;
    const uint8_t * xq;     // NCOL columns of records, cs bytes apart
    size_t          cs;
    int             mc;     // 1: mk_kq_groups<1> per column; 4: <4>; MK_M: <MK_M> with Mc = NCOL
    int             two;    // Q4_K rows in pairs in the code for up to 4 columns (the second row's tile beside the first: base1)
    float         * y;      // [row][column]
};

// row (and, two: row + 1 beside it, as mk_mv_run's row pairs) of a, columns col0 .. col0 + Mc - 1, into y[0][..] (and y[1][..])
template <int MC>
static void kq_row(const kq_args & a, const mk_jr & jr, int row, bool two, float (&y)[2][NCOL], int col0, int Mc) {
    MK_SHARED_DYN(uint8_t, stage);
    const int lane = threadIdx.x % WARP_SIZE;
    float acc[2][MC];
    for (int m = 0; m < MC; ++m) acc[0][m] = acc[1][m] = 0.0f;
    for (int seg = 0; seg < jr.nseg; ++seg) {
        const bool last = seg == jr.nseg - 1;
        const int nbytes = last ? jr.lb : jr.tb, ng = last ? jr.lg : jr.tg, g0 = seg*jr.tg;
        const uint8_t * base[2] = { nullptr, nullptr };
        for (int k = 0; k < 1 + two; ++k) {
            const uint8_t * src = a.data + (size_t) (row + k)*a.nb1 + (size_t) seg*jr.tb;
            const uint8_t * from = (const uint8_t *) ((uintptr_t) src & ~(uintptr_t) 15);   // (as mk_fetch: the 16-byte aligned start)
            uint8_t * st = stage + k*MK_STAGE_BYTES;
            for (int i = lane; i < (int) (src - from) + nbytes; i += WARP_SIZE) st[i] = from[i];
            base[k] = st + (src - from);
        }
        __syncwarp();
        const auto p = mk_kq_groups<MC>(a.type == GGML_TYPE_Q4_K, base[0], base[1], ng,
                                        a.xq + (size_t) col0*a.cs + (size_t) g0*MK_XQ_REC, Mc, a.cs);
        for (int m = 0; m < MC; ++m) {
            acc[0][m] = __fadd_rn(acc[0][m], p.v[m]);
            if (MK_KQ_ROWS(MC) == 2) {
                acc[1][m] = __fadd_rn(acc[1][m], p.v[(MK_KQ_ROWS(MC) - 1)*MC + m]);
            }
        }
        __syncwarp();
    }
    for (int k = 0; k < 1 + two; ++k) {
        for (int m = 0; m < Mc; ++m) {
            y[k][col0 + m] = mk_warp_sum(acc[k][m]);
        }
    }
}

static void kq_kernel(const kq_args a) {
    mk_job jb = {};
    jb.w.data = a.data; jb.w.type = a.type; jb.w.ne0 = a.K; jb.w.ne1 = a.n_rows; jb.w.nb1 = a.nb1;
    jb.w.b256 = (int32_t) ggml_row_size((ggml_type) a.type, 256);
    const mk_jr jr = mk_jr_of(jb, true);
    for (int row = 0; row < a.n_rows; ) {
        // (pairs as mk_mv_run takes them: Q4_K rows, in the code for up to MK_MC_SMALL columns)
        const bool two = a.two && row + 1 < a.n_rows && a.type == GGML_TYPE_Q4_K && a.mc <= MK_MC_SMALL;
        float y[2][NCOL];
        if (a.mc == 1) {
            for (int m = 0; m < NCOL; ++m) kq_row<1>(a, jr, row, two, y, m, 1);
        } else if (a.mc == MK_MC_SMALL) {
            kq_row<MK_MC_SMALL>(a, jr, row, two, y, 0, NCOL);
        } else {
            kq_row<MK_M>(a, jr, row, two, y, 0, NCOL);
        }
        if (threadIdx.x == 0) {
            for (int k = 0; k < 1 + two; ++k) {
                for (int m = 0; m < NCOL; ++m) a.y[(size_t) (row + k)*NCOL + m] = y[k][m];
            }
        }
        row += 1 + two;
    }
}

int main() {
    static_assert(NCOL == MK_MC_SMALL, "the small-batch code takes all the columns in one call");
    std::mt19937 rng(20261205);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    int fails = 0, cases = 0;
    for (int type : { GGML_TYPE_Q4_K, GGML_TYPE_Q6_K }) {
        for (int K : { 2560, 10240, 256, 1536, 1024, 2048 }) {
            const int n_rows = 3;
            const size_t rb = ggml_row_size((ggml_type) type, K);
            std::vector<float> w((size_t) n_rows*K), wf((size_t) n_rows*K);
            for (float & e : w) e = nd(rng)/sqrtf((float) K);
            std::vector<uint8_t> q(n_rows*rb + 64);
            uint8_t * data = q.data() + (32 - ((uintptr_t) q.data() & 31));   // 32-byte aligned, as ggml's buffers
            ggml_quantize_chunk((ggml_type) type, w.data(), data, 0, n_rows, K, nullptr);
            for (int r = 0; r < n_rows; ++r) ggml_get_type_traits((ggml_type) type)->to_float(data + r*rb, &wf[(size_t) r*K], K);
            // the inputs: NCOL columns (one of them with a zero group) rounded to the kernel's records
            const int KG = mk_kg(K);
            const size_t cs = (size_t) KG*MK_XQ_REC;
            std::vector<uint8_t> xq(NCOL*cs, 0);
            std::vector<double> xr((size_t) NCOL*K);
            for (int m = 0; m < NCOL; ++m) {
                for (int g = 0; g < K/32; ++g) {
                    float x[32], amax = 0.0f;
                    for (int l = 0; l < 32; ++l) {
                        x[l] = m == 2 && g == 1 ? 0.0f : (1 + m)*nd(rng);
                        amax = fmaxf(amax, fabsf(x[l]));
                    }
                    const float d = amax/127.0f, id = amax != 0.0f ? 1.0f/d : 0.0f;
                    uint8_t * rec = &xq[m*cs + (size_t) g*MK_XQ_REC];
                    int sq = 0;
                    for (int l = 0; l < 32; ++l) {
                        const int v = (int) nearbyintf(x[l]*id);
                        rec[l] = (uint8_t) (int8_t) v;
                        sq += v;
                        xr[(size_t) m*K + 32*g + l] = (double) v*d;
                    }
                    memcpy(rec + 32, &d, 4);
                    const float sf = (float) sq;
                    memcpy(rec + 36, &sf, 4);
                }
            }
            // runs: one row at a time with the code for 1, 4 and MK_M columns, then rows in pairs with each
            std::vector<float> y[6];
            const int mcs[3] = { 1, MK_MC_SMALL, MK_M };
            for (int k = 0; k < 6; ++k) {
                y[k].assign((size_t) n_rows*NCOL, -7.0f);
                kq_args a = { data, type, K, n_rows, rb, xq.data(), cs, mcs[k % 3], k >= 3, y[k].data() };
                if (!emu_launch(kq_kernel, a, 1, WARP_SIZE, 2*MK_STAGE_BYTES, "kq_kernel")) {
                    printf("FAIL %s K=%d: deadlock\n", ggml_type_name((ggml_type) type), K);
                    return 1;
                }
            }
            double worst = 0.0;
            bool same = true;
            for (int r = 0; r < n_rows; ++r) {
                for (int m = 0; m < NCOL; ++m) {
                    double ref = 0.0, mag = 0.0;
                    for (int i = 0; i < K; ++i) {
                        ref += (double) wf[(size_t) r*K + i]*xr[(size_t) m*K + i];
                        mag += fabs((double) wf[(size_t) r*K + i]*xr[(size_t) m*K + i]);
                    }
                    worst = std::max(worst, std::fabs((double) y[0][r*NCOL + m] - ref)/mag);
                    for (int k = 1; k < 6; ++k) {
                        same = same && memcmp(&y[0][r*NCOL + m], &y[k][r*NCOL + m], sizeof(float)) == 0;
                    }
                }
            }
            const bool ok = worst <= 1e-6 && same;
            ++cases;
            fails += !ok;
            printf("%s %s K=%d, %d rows x %d columns: worst error %.3g of sum |w*x| (bound 1e-6); code for %d and %d columns, "
                   "and rows in pairs, %s the one-column code's bits\n", ok ? "OK" : "FAIL", ggml_type_name((ggml_type) type), K, n_rows, NCOL,
                   worst, MK_MC_SMALL, MK_M, same ? "==" : "DIFFER from");
        }
    }
    printf("%s K-quant integer dot products: %d of %d cases failed\n", fails ? "FAIL" : "OK", fails, cases);
    return fails ? 1 : 0;
}
