// Host emulation of the CUDA megakernel's staging of a small verify batch (megakernel/cuda/mk-kernel.cuh through
// cuda_emu.h) at E4B's widths: mk_stage_cols<MK_MC_SMALL> (the default for 2..4 columns) against mk_stage<MK_MC_SMALL>
// (GGML_MK_VAR_ITEM_STAGE) on the same random inputs, one block. The kernel emulation's tiny model has K <= 512, one slot
// per thread and column; here K = 2560, 4096, 10240 (2, 2, 5 slots per thread) and 256 and 2304 (some threads without a
// slot) take the rounds of several slots, the pending residual's separate rms round and its one-round form; 1..4
// columns. Every staged byte (values xs, 8-bit records xq) and the rows block 0 writes (res_out, nw_out) must be equal
// bitwise, and group g's record must sit where the mat-vec reads it (mk_rec_slot: its d from group g's staged values).
// The same for mk_stage_cols and for the any-batch mk_stage<MK_M> split over a cluster of 2 blocks (a launch in clusters of
// 2, the default on sm_90 unless GGML_MK_VAR_NO_CLUSTER_STAGE: each block stages every other column into both blocks' shared memory): both blocks'
// staged bytes and the rows written == mk_stage's. And mk_stage_cols with the pending residual's rms round taking 2
// slots a thread per round (the default, mk_mvr.sr2; K = 10240: rounds of 2, 2, 1), one block and a cluster of
// 2: == mk_stage's likewise.
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

struct stage_args {
    mk_xin x;
    int    K, Mc, cols;   // cols: 1 mk_stage_cols, 2 mk_stage<MK_M> (the any-batch code), else mk_stage<MK_MC_SMALL>
    int    cl;            // mk_stage_cols over a cluster of cl blocks
    bool   sr2;           // mk_stage_cols: its rms round 2 slots a round (mk_mvr.sr2: the default; not GGML_MK_VAR_STAGE_ROUND1)
    bool   q8, direct;
    int    xs_bytes;
    float  eps;
    char * out;          // the block's staged region after the staging
    int    out_bytes;
};

static void stage_kernel(const stage_args a) {
    MK_SHARED_DYN(char, smem);
    float   * xs = (float *) smem;
    uint8_t * xq = a.direct ? (uint8_t *) xs : (uint8_t *) smem + a.xs_bytes;
    if (a.cols == 1) {
        mk_stage_cols<MK_MC_SMALL>(a.x, a.K, 0, a.Mc, a.eps, xs, xq, a.q8, a.direct, a.sr2, nullptr);
    } else if (a.cols == 2) {
        mk_stage<MK_M>(a.x, a.K, 0, a.Mc, a.eps, xs, xq, a.q8, a.direct, nullptr);
    } else {
        mk_stage<MK_MC_SMALL>(a.x, a.K, 0, a.Mc, a.eps, xs, xq, a.q8, a.direct, nullptr);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < a.out_bytes; i += MK_THREADS) {
        a.out[(size_t) blockIdx.x*a.out_bytes + i] = smem[i];
    }
}

int main() {
    std::mt19937 rng(20261204);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto rnd = [&](size_t n, float s) {
        std::vector<float> v(n);
        for (float & e : v) e = s*nd(rng);
        return v;
    };
    // modes: 0 plain + norm, 8-bit (q/k/v, LM head); 1 pending residual + norm, 8-bit (gate/up after the attention);
    // 2 pending residual, no norm, direct (per-layer gate); 3 GEGLU, direct (per-layer proj); 4 plain, no norm, direct
    // (o proj, down); 5 pending residual + norm, values only (a mat-vec of types without 8-bit inputs)
    const char * names[] = { "plain+norm q8", "residual+norm q8", "residual direct", "geglu direct", "plain direct",
                             "residual+norm values" };
    const int Ks[] = { 2560, 4096, 10240, 256, 2304 };
    int fails = 0, cases = 0;
    for (int K : Ks) {
        for (int mode = 0; mode < 6; ++mode) {
            for (int Mc = 1; Mc <= MK_MC_SMALL; ++Mc) {
                const int KG = mk_kg(K);
                const int lda = K + 8, ldb = K + 4;   // (row strides wider than K, multiples of 4)
                std::vector<float> A = rnd((size_t) Mc*lda, 1.0f), Bv = rnd((size_t) Mc*ldb, 1.0f), H = rnd((size_t) Mc*lda, 3.0f);
                std::vector<float> NW = rnd(K, 0.5f), RNW = rnd(K, 0.7f);
                // runs: 0 mk_stage, 1 mk_stage_cols, 2 mk_stage_cols and 3 mk_stage<MK_M> over a cluster of 2 blocks,
                // 4 and 5 mk_stage_cols with its rms round 2 slots a round (sr2), one block and a cluster of 2
                constexpr int NR = 6;
                auto cl_of = [](int run) { return run == 2 || run == 3 || run == 5 ? 2 : 1; };
                std::vector<float> outs[NR][2];   // [run][res_out, nw_out]
                std::vector<char> staged[NR];     // (runs on a cluster: both blocks' regions, one after the other)
                for (int run = 0; run < NR; ++run) {
                    outs[run][0].assign((size_t) Mc*lda, -7.0f);
                    outs[run][1].assign((size_t) Mc*K, -7.0f);
                    mk_xin x = {};
                    x.mode = mode == 3 ? MK_X_GEGLU : MK_X_PLAIN;
                    x.a = A.data(); x.lda = lda;
                    x.b = Bv.data(); x.ldb = ldb;
                    const bool res = mode == 1 || mode == 2 || mode == 5;
                    x.res_h = res ? H.data() : nullptr;
                    x.res_nw = res ? RNW.data() : nullptr;
                    x.res_scale = 0.75f;
                    x.res_out = outs[run][0].data();
                    const bool nw = mode == 0 || mode == 1 || mode == 5;
                    x.nw = nw ? NW.data() : nullptr;
                    x.nw_out = nw ? outs[run][1].data() : nullptr;
                    stage_args a = {};
                    a.x = x; a.K = K; a.Mc = Mc; a.cols = run == 0 ? 0 : run == 3 ? 2 : 1; a.cl = cl_of(run); a.sr2 = run >= 4;
                    a.q8 = mode != 5; a.direct = mode == 2 || mode == 3 || mode == 4;
                    a.eps = 1e-6f;
                    a.xs_bytes = a.direct ? 0 : MK_MC_SMALL*KG*(int) MK_XS_GROUP;
                    const int xq_bytes = MK_MC_SMALL*KG*MK_XQ_REC;
                    a.out_bytes = a.direct ? xq_bytes : a.xs_bytes + xq_bytes;
                    staged[run].assign((size_t) a.cl*a.out_bytes, 0);
                    a.out = staged[run].data();
                    if (!emu_launch(stage_kernel, a, a.cl, MK_THREADS, a.out_bytes, "stage_kernel", a.cl)) {
                        printf("FAIL K=%d %s Mc=%d: deadlock\n", K, names[mode], Mc);
                        return 1;
                    }
                }
                // only the bytes the staging defines: the columns' values (xs, where the mat-vec reads them) and
                // records; the shared memory's unused columns keep the poison of the emulation in both runs
                bool same = true, placed = true, same_cl = true;
                const size_t ob = staged[0].size();   // one block's region
                for (int m = 0; m < Mc; ++m) {
                    const size_t xs0 = (size_t) m*KG*MK_XS_GROUP, xq0 = (size_t) m*KG*MK_XQ_REC;
                    const int xsb = mode == 4 || mode == 2 || mode == 3 ? 0 : KG*(int) MK_XS_GROUP;
                    for (int g = 0; g < KG && xsb; ++g) {   // 32 values of each 36-float group (4 floats of padding)
                        same = same && memcmp(&staged[0][xs0 + g*MK_XS_GROUP], &staged[1][xs0 + g*MK_XS_GROUP], 32*sizeof(float)) == 0;
                        for (int run = 2; run < NR; ++run) {
                            for (int b = 0; b < cl_of(run); ++b) {
                                same_cl = same_cl && memcmp(&staged[0][xs0 + g*MK_XS_GROUP], &staged[run][b*ob + xs0 + g*MK_XS_GROUP], 32*sizeof(float)) == 0;
                            }
                        }
                    }
                    if (mode != 5) {
                        const size_t q0 = (mode == 2 || mode == 3 || mode == 4 ? 0 : (size_t) MK_MC_SMALL*KG*MK_XS_GROUP) + xq0;
                        for (int g = 0; g < KG; ++g) {   // 32 quants, d, sum of q
                            same = same && memcmp(&staged[0][q0 + g*MK_XQ_REC], &staged[1][q0 + g*MK_XQ_REC], 40) == 0;
                            for (int run = 2; run < NR; ++run) {
                                for (int b = 0; b < cl_of(run); ++b) {
                                    same_cl = same_cl && memcmp(&staged[0][q0 + g*MK_XQ_REC], &staged[run][b*ob + q0 + g*MK_XQ_REC], 40) == 0;
                                }
                            }
                        }
                        // where the mat-vec looks for group g's record (mk_rec_slot): the rounding of group g's staged
                        // values (d = max|x|/127), not of another group's
                        for (int g = 0; g < KG && xsb; ++g) {
                            float amax = 0.0f, d;
                            for (int l = 0; l < 32; ++l) {
                                float v;
                                memcpy(&v, &staged[0][xs0 + g*MK_XS_GROUP + 4*l], 4);
                                amax = fmaxf(amax, fabsf(v));
                            }
                            memcpy(&d, &staged[0][q0 + (size_t) mk_rec_slot(g)*MK_XQ_REC + 32], 4);
                            placed = placed && d == amax/127.0f;
                        }
                    }
                }
                same = same && memcmp(outs[0][0].data(), outs[1][0].data(), outs[0][0].size()*sizeof(float)) == 0;
                same = same && memcmp(outs[0][1].data(), outs[1][1].data(), outs[0][1].size()*sizeof(float)) == 0;
                for (int run = 2; run < NR; ++run) {
                    same_cl = same_cl && memcmp(outs[0][0].data(), outs[run][0].data(), outs[0][0].size()*sizeof(float)) == 0;
                    same_cl = same_cl && memcmp(outs[0][1].data(), outs[run][1].data(), outs[0][1].size()*sizeof(float)) == 0;
                }
                // the staging wrote something: a run that left everything alone would compare equal too
                size_t n_set = 0;   // bytes the staging changed from the emulation's poison (0x7f)
                for (char c : staged[0]) n_set += c != 0x7f;
                const bool wrote = n_set > staged[0].size()*Mc/(8*MK_MC_SMALL) && (!(mode == 1 || mode == 2 || mode == 5) || outs[0][0][0] != -7.0f) &&
                                   (!(mode == 0 || mode == 1 || mode == 5) || outs[0][1][0] != -7.0f);
                ++cases;
                if (!same || !wrote || !placed || !same_cl) {
                    ++fails;
                    printf("FAIL K=%d %s Mc=%d: %s\n", K, names[mode], Mc,
                           !wrote   ? "mk_stage_cols and mk_stage wrote nothing"
                         : !placed  ? "the staging put a group's 8-bit record where the mat-vec does not look for it (mk_rec_slot)"
                         : !same    ? "mk_stage_cols differs bitwise from mk_stage"
                                    : "mk_stage_cols over a cluster of 2 blocks or with 2 slots a round (sr2), or mk_stage<MK_M> "
                                      "over a cluster of 2 blocks, differs bitwise from mk_stage (a block's staged bytes or "
                                      "the rows written)");
                }
            }
        }
    }
    printf("%s staging slot by slot (mk_stage_cols, one block and a cluster of 2, its rms round 1 and 2 slots a round) and "
           "the any-batch staging over a cluster "
           "of 2 == mk_stage bitwise: %d of %d cases "
           "differ (K = 2560, 4096, 10240, 256, 2304; 6 modes; 1..%d columns)\n", fails ? "FAIL" : "OK", fails, cases,
           MK_MC_SMALL);
    return fails ? 1 : 0;
}
