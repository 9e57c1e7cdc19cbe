// Host emulation of the CUDA megakernel's integer dot products with the 8-bit inputs (megakernel/cuda/mk-kernel.cuh, through
// cuda_emu.h) at the production widths the kernel emulation's tiny model does not have: Q4_K / Q6_K (mk_kq_groups,
// mk_q4k_unit, mk_q6k_unit) and Q4_0 / Q8_0 (mk_pairs: pairs of blocks per lane; where a tile's last pairs fill at most
// half a round of lanes, one block per lane, mk_pair_block_h) in rows of K = 2560 and 10240 (E4B's hidden and FFN sizes:
// one tile, or several tiles of a row added in order), 256 (the per-layer projection), 1536 (E2B's hidden size), 1024,
// 2048 and 640 (the real Gemma 3 270M's rows), three rows each (Q6_K's 210-byte blocks put every other row 2 bytes off a
// word), weights quantized by ggml's own quantizer, four random input columns rounded to the kernel's 8-bit records
// (llama.cpp's q8_1: d = max|x|/127, q = round(x/d)). One warp walks each row's tiles as mk_mv_run does (the kernel's
// own mk_mvr_of table and mk_tile, each tile copied from its 16-byte aligned start as the weight stages are), lane sums
// added per tile, then the warp's butterfly sum. Checks:
//  - each row and column against a float64 dot product of ggml's dequantized weights with the rounded inputs
//    (relative to sum |w*x|: <= 1e-6; float32 sums land ~1e-8 off);
//  - the code made for 4 columns equals the one-column code bit for bit per column (a verify batch's logits equal its
//    one-token steps'), and so does the any-batch code (MK_M), and so do rows taken in pairs (base1: a gate/up pair or a
//    warp's next row, each record loaded once for both: Q4_K in the code for up to 4 columns, Q4_0 / Q8_0 rows of one
//    tile in all);
//  - the same with the variants' forms (the table made with GGML_MK_VAR_PAIR_TAIL | GGML_MK_VAR_KQ_TILES),
//    and the lines "tail changed the bits of N of M outputs" / "32-group tiles changed ..." say whether the default's
//    form ran at all in a case (a test can require it where it must).
// Prints OK/FAIL per case and a digest of every output (the same bits in every run: for refactors that keep them), exits
// 1 on any failure.
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
    int             mc;     // 1: the code for one column, per column; 4: for MK_MC_SMALL; MK_M: the any-batch code with Mc = NCOL
    int             two;    // rows in pairs where mk_mv_run takes them (the second row's tile beside the first: base1)
    int             flags;  // the variant bits the table is made with (GGML_MK_VAR_*)
    float         * y;      // [row][column]
};

// row (and, two: row + 1 beside it, as mk_mv_run's row pairs) of a, columns col0 .. col0 + Mc - 1, into y[0][..] (and y[1][..])
template <int MC>
static void kq_row(const kq_args & a, const mk_mvr & R, int row, bool two, float (&y)[2][NCOL], int col0, int Mc) {
    MK_SHARED_DYN(uint8_t, stage);
    const int lane = threadIdx.x % WARP_SIZE;
    float acc[2][MC];
    for (int m = 0; m < MC; ++m) acc[0][m] = acc[1][m] = 0.0f;
    int ng = 0, g0 = 0;
    for (int seg = 0; seg < R.j[0].nseg; ++seg) {
        const uint8_t * base[2] = { nullptr, nullptr };
        for (int k = 0; k < 1 + two; ++k) {
            const mk_it it = { row + k, 0, seg, 0, 0, row + k };   // (u, sub, seg, st, job, row)
            int nbytes;
            const uint8_t * src = mk_tile(R, it, nbytes, g0, ng);
            const uint8_t * from = (const uint8_t *) ((uintptr_t) src & ~(uintptr_t) 15);   // (as mk_fetch: the 16-byte aligned start)
            uint8_t * st = stage + k*MK_STAGE_BYTES;
            for (int i = lane; i < (int) (src - from) + nbytes; i += WARP_SIZE) st[i] = from[i];
            base[k] = st + (src - from);
        }
        __syncwarp();
        const uint8_t * xq = a.xq + (size_t) col0*a.cs + (size_t) g0*MK_XQ_REC;
        if (mk_is_kq(a.type)) {
            const auto p = mk_kq_groups<MC>(a.type == GGML_TYPE_Q4_K, base[0], base[1], ng, xq, g0, Mc, a.cs);
            for (int m = 0; m < MC; ++m) {
                acc[0][m] = __fadd_rn(acc[0][m], p.v[m]);
                if (MK_KQ_ROWS(MC) == 2) {
                    acc[1][m] = __fadd_rn(acc[1][m], p.v[(MK_KQ_ROWS(MC) - 1)*MC + m]);
                }
            }
        } else {
            // (mk_mv_run's pair path: an even group count, 4-byte aligned tiles; the rows here are; a row's tiles add into acc)
            if (ng % 2 != 0 || ((uintptr_t) base[0] & 3) != 0) {
                MK_TRAP();
            }
            const bool q4 = a.type == GGML_TYPE_Q4_0;
            if (two) {
                if (q4) mk_pairs<true,  true, MC>(base[0], base[1], ng, xq, g0, Mc, a.cs, acc[0], acc[1], R.tail);
                else    mk_pairs<false, true, MC>(base[0], base[1], ng, xq, g0, Mc, a.cs, acc[0], acc[1], R.tail);
            } else {
                if (q4) mk_pairs<true,  false, MC>(base[0], nullptr, ng, xq, g0, Mc, a.cs, acc[0], acc[1], R.tail);
                else    mk_pairs<false, false, MC>(base[0], nullptr, ng, xq, g0, Mc, a.cs, acc[0], acc[1], R.tail);
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
    mk_mv mv = {};
    mv.jobs[0] = jb;
    mv.n_jobs  = 1;
    // (no packed rows: the one-row path; packing keeps its bits, the kernel emulation checks)
    const mk_mvr R = mk_mvr_of(mv, a.flags | GGML_MK_VAR_ROW_TILES);
    for (int row = 0; row < a.n_rows; ) {
        // (pairs as mk_mv_run takes them: Q4_K rows in the code for up to MK_MC_SMALL columns, Q4_0 / Q8_0 rows of one tile)
        const bool two = a.two && row + 1 < a.n_rows &&
                         (a.type == GGML_TYPE_Q4_K ? a.mc <= MK_MC_SMALL : mk_is_q8dot(a.type) && R.j[0].nseg == 1);
        float y[2][NCOL];
        if (a.mc == 1) {
            for (int m = 0; m < NCOL; ++m) kq_row<1>(a, R, row, two, y, m, 1);
        } else if (a.mc == MK_MC_SMALL) {
            kq_row<MK_MC_SMALL>(a, R, row, two, y, 0, NCOL);
        } else {
            kq_row<MK_M>(a, R, row, two, y, 0, NCOL);
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
    uint64_t digest = 1469598103934665603ull;
    for (int type : { GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q4_0, GGML_TYPE_Q8_0 }) {
        for (int K : { 2560, 10240, 256, 1536, 1024, 2048, 640 }) {
            if (mk_is_kq(type) && K % 256 != 0) {
                continue;
            }
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
                    uint8_t * rec = &xq[m*cs + (size_t) mk_rec_slot(g)*MK_XQ_REC];   // (the staging's place for it)
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
            std::vector<double> ref((size_t) n_rows*NCOL), mag((size_t) n_rows*NCOL);
            for (int r = 0; r < n_rows; ++r) {
                for (int m = 0; m < NCOL; ++m) {
                    double s = 0.0, a = 0.0;
                    for (int i = 0; i < K; ++i) {
                        s += (double) wf[(size_t) r*K + i]*xr[(size_t) m*K + i];
                        a += fabs((double) wf[(size_t) r*K + i]*xr[(size_t) m*K + i]);
                    }
                    ref[r*NCOL + m] = s;
                    mag[r*NCOL + m] = a;
                }
            }
            // each form (form 1: the variants' tail / tiles), runs: one row at a time with the code for 1, 4 and MK_M
            // columns, then rows in pairs with each
            std::vector<float> first[2];
            for (int form = 0; form < 2; ++form) {
                std::vector<float> y[6];
                const int mcs[3] = { 1, MK_MC_SMALL, MK_M };
                for (int k = 0; k < 6; ++k) {
                    y[k].assign((size_t) n_rows*NCOL, -7.0f);
                    kq_args a = { data, type, K, n_rows, rb, xq.data(), cs, mcs[k % 3], k >= 3,
                                   form == 0 ? 0 : GGML_MK_VAR_PAIR_TAIL | GGML_MK_VAR_KQ_TILES, y[k].data() };
                    if (!emu_launch(kq_kernel, a, 1, WARP_SIZE, 2*MK_STAGE_BYTES, "kq_kernel")) {
                        printf("FAIL %s K=%d: deadlock\n", ggml_type_name((ggml_type) type), K);
                        return 1;
                    }
                }
                double worst = 0.0;
                bool same = true;
                for (int i = 0; i < n_rows*NCOL; ++i) {
                    worst = std::max(worst, std::fabs((double) y[0][i] - ref[i])/mag[i]);
                    for (int k = 1; k < 6; ++k) {
                        same = same && memcmp(&y[0][i], &y[k][i], sizeof(float)) == 0;
                    }
                }
                const bool ok = worst <= 1e-6 && same;
                ++cases;
                fails += !ok;
                printf("%s %s K=%d%s, %d rows x %d columns: worst error %.3g of sum |w*x| (bound 1e-6); code for %d and %d columns, "
                       "and rows in pairs, %s the one-column code's bits\n", ok ? "OK" : "FAIL", ggml_type_name((ggml_type) type), K,
                       form ? (mk_is_kq(type) ? " (tiles of equal size)" : " (last pairs as pairs)") : "", n_rows, NCOL,
                       worst, MK_MC_SMALL, MK_M, same ? "==" : "DIFFER from");
                first[form] = y[0];
                if (form == 0) {
                    for (float v : y[0]) {
                        uint32_t b;
                        memcpy(&b, &v, 4);
                        for (int i = 0; i < 4; ++i) digest = (digest ^ ((b >> 8*i) & 0xff))*1099511628211ull;
                    }
                }
            }
            int nd_ = 0;
            for (int i = 0; i < n_rows*NCOL; ++i) nd_ += memcmp(&first[0][i], &first[1][i], sizeof(float)) != 0;
            printf("%s K=%d: %s changed the bits of %d of %d outputs\n", ggml_type_name((ggml_type) type), K,
                   mk_is_kq(type) ? "32-group tiles" : "tail", nd_, n_rows*NCOL);
        }
    }
    printf("digest of every output: %016llx\n", (unsigned long long) digest);
    printf("%s integer dot products: %d of %d cases failed\n", fails ? "FAIL" : "OK", fails, cases);
    return fails ? 1 : 0;
}
