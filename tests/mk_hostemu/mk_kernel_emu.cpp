// Host emulation of the CUDA Gemma decode megakernel (megakernel/cuda/mk-kernel.cuh, the kernel's own
// source, run through cuda_emu.h) on a tiny random Gemma-4-shaped model with every supported weight
// type, against an independent float64 reference of the same forward pass (dequantization by ggml's
// to_float). Checks, printing OK/FAIL lines and exiting 1 on any failure:
//  - one-token steps over a sequence that crosses the sliding window: logits vs the reference;
//  - a verify step of M tokens: every row bitwise equal to the one-token steps (lossless);
//  - both KV layouts (plain and transposed V), a shared-KV layer, proportional rope, per-layer inputs.
// `--planted` runs with the grid barriers off (GGML_MK_DEBUG_NO_GRID_BARRIER): that must fail.
// `--smem BYTES`: a block's dynamic shared memory (the host lays it out per step size, mk_smem_plan); the default
// is small enough that a verify step's mat-vecs run in passes of 2 columns with 3 weight stages per warp.
// `--stages N`: at most N weight stages per warp (3 by default, as on the GPU; LLAMA_MEGAKERNEL_STAGES there).
// `--vs-default` (with --variant): every step also runs the default kernel (no variant bits) on a second set of KV caches;
// logits, hidden rows and both caches must be bitwise equal after every step (what test-mk --variant checks on a GPU).
// `--verify M,M,...`: the verify steps checked (4 by default; each M <= 8).
// `--blocks N`: the grid (2 by default; an even grid runs a verify step of 2..8 tokens as clusters (not with variant 0x10000000)
// of 2 blocks, as an sm_90 GPU does: mk_step_cl). `--slow-block B`: block B runs only every 8th pass of the emulation's scheduler,
// so the others run ahead of it up to the next barrier they share.
// `--gemma3`: the other shape of the plan (mk_ref.h: Q scaled after rope, no V norm, V = K projection on the global layer,
// no per-layer inputs).
// The model, the reference and the checks are shared with the Metal kernel's test (mk_ref.h).
#define GGML_COMMON_DECL_C
#define GGML_COMMON_IMPL_C
#include "ggml-common.h"

#include "cuda_emu.h"
// attention groups of 3 chunks (the GPU's: 16): the steps' cells (positions 0..17, chunks of 4: mk_ref.h) span 2 groups, so a step's
// attention combines several groups' results, some of them empty for some tokens (the sliding window)
#define MK_ATT_GROUP 3
#include "mk-kernel.cuh"

#include "mk_ref.h"

#include <cstdio>
#include <cstdlib>
#include <string>

using namespace mk_ref;

int main(int argc, char ** argv) {
    bool planted = false;
    int variant = 0;   // GGML_MK_VAR_* bits (a kernel variant must give the same results)
    int ns_max = MK_NS_MIN;
    int smem = 3*MK_WARPS*MK_STAGE_BYTES + 2*8*(int) MK_XS_GROUP + 2*8*MK_XQ_REC;   // 2 columns of 256 values
    bool vs_default = false, gemma3 = false;
    int n_blocks = 2;
    int att_chunk = 0;   // --chunk: the attention chunk in cells (0: the model's 4, mk_ref.h)
    std::vector<int> verify_m = { 4 };
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--planted") {
            planted = true;
        } else if (a == "--variant" && i + 1 < argc) {
            variant = (int) strtol(argv[++i], nullptr, 0);
        } else if (a == "--smem" && i + 1 < argc) {
            smem = atoi(argv[++i]);
        } else if (a == "--stages" && i + 1 < argc) {
            ns_max = atoi(argv[++i]);
        } else if (a == "--vs-default") {
            vs_default = true;
        } else if (a == "--gemma3") {
            gemma3 = true;
        } else if (a == "--verify" && i + 1 < argc) {
            verify_m.clear();
            for (const char * p = argv[++i]; *p; ) {
                char * e = nullptr;
                const long v = strtol(p, &e, 10);
                if (e == p || v < 1 || v > MK_M) {
                    fprintf(stderr, "--verify: steps of 1..%d tokens, comma-separated: %s\n", MK_M, argv[i]);
                    return 2;
                }
                verify_m.push_back((int) v);
                p = *e == ',' ? e + 1 : e;
            }
        } else if (a == "--blocks" && i + 1 < argc) {
            n_blocks = atoi(argv[++i]);
        } else if (a == "--slow-block" && i + 1 < argc) {
            emu_slow_block = atoi(argv[++i]);
        } else if (a == "--chunk" && i + 1 < argc) {
            att_chunk = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: %s [--planted] [--variant BITS] [--vs-default] [--gemma3] [--smem BYTES] [--stages N] "
                    "[--verify M,...] [--blocks N] [--slow-block B] [--chunk CELLS]\n", argv[0]);
            return 2;
        }
    }
    // Q4_0/Q8_0 mat-vecs round their inputs to 8 bits (llama.cpp's q8_1, dp4a): the reference does the same.
    // Every type appears; gate and up are both Q4_0 in layer 0 and both Q8_0 in layer 2 (the one-token typed
    // pair loop takes such a row pair in one pass)
    const layer_def defs[n_layer] = {
        { true,   64, true,  { GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0,   GGML_TYPE_Q4_0, GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_F32 }, 1.0f },
        { false, 128, true,  { GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_F32,  GGML_TYPE_STQ1_0, GGML_TYPE_Q6_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_F32 }, 0.8f },
        { true,   64, false, { GGML_TYPE_F16,  GGML_TYPE_F16,  GGML_TYPE_F16,  GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q4_0, GGML_TYPE_F32 }, 1.0f },
    };
    model mm;
    build(mm, defs, GGML_TYPE_Q8_0, MK_REF_Q8 | ((variant & GGML_MK_VAR_KQ_FLOAT) ? 0 : MK_REF_KQ8), gemma3);
    ggml_mk_model & M_ = *mm.md;
    if (att_chunk > 0) {
        M_.att_chunk = att_chunk;   // (--chunk 8: a GPU's chunk up to 8192 cells, ggml_mk_att_chunk)
    }
    const int base_flags = planted ? GGML_MK_DEBUG_NO_GRID_BARRIER : 0;
    M_.debug_flags = base_flags | variant;
    if (gemma3) {
        printf("gemma3 plan: no per-layer inputs, Q scaled after rope, no V norm, V = K on the global layer\n");
    }

    // KV caches (mk_ref.h: kv_elems); layer 2 shares layer 0's. [1]: the default kernel's (--vs-default)
    std::vector<half> kvs[2][4];
    for (auto & set : kvs) {
        for (int i = 0; i < 4; ++i) set[i].assign(kv_elems[i], half{0});
    }
    int n_fold = 0, n_two[2] = { 0, 0 }, n_layer_steps = 0, n_cmp = 0, n_cmp_diff = 0, grp_max = 0, n_cl_steps = 0;

    // scratch for the emulated kernel
    const int n_chunk = kv_size/M_.att_chunk + 1;
    std::vector<float> s_part((size_t) MK_M*n_head*n_chunk*(4 + M_.max_head_dim));
    std::vector<unsigned> s_cnt(MK_M*n_head, 0u);
    std::vector<float> s_x(MK_M*n_embd), s_x1(MK_M*n_embd), s_q(MK_M*M_.max_q), s_k(MK_M*M_.max_kv), s_v(MK_M*M_.max_kv), s_att(MK_M*M_.max_q),
        s_h(MK_M*n_embd), s_g(MK_M*n_ff), s_pl(MK_M*n_pl*n_layer), s_plg(MK_M*n_pl), s_lo(MK_M*n_vocab), s_hid(MK_M*n_embd);
    std::vector<uint8_t> s_rec;   // inputs staged once for the grid (mk_args.xrec), sized at the first launch
    unsigned bar[2] = {0, 0};
    int launches = 0;
    std::vector<float> mask0, mask1;

    auto run1 = [&](int p0, int M, int set) {   // tokens p0..p0+M-1 (token i has embedding row i, position i)
        M_.debug_flags = set == 0 ? base_flags | variant : base_flags;
        std::vector<half> & K0 = kvs[set][0], & V0 = kvs[set][1], & K1 = kvs[set][2], & V1 = kvs[set][3];
        mk_dstep ds = {};
        ds.n_tokens = M;
        mm.masks(p0, M, mask0, mask1);
        for (int m = 0; m < M; ++m) {
            const int pos = p0 + m;
            ds.pos[m] = pos; ds.kv_idx[0][m] = pos; ds.kv_idx[1][m] = pos;
        }
        ds.n_kv[0] = ds.n_kv[1] = kv_size;
        for (int il = 0; il < n_layer; ++il) ds.kv[il] = mm.view(il, K0.data(), V0.data(), K1.data(), V1.data());
        const float * masks[2] = { mask0.data(), mask1.data() };
        mk_step_chunks(ds, masks, M, M_.att_chunk, M_.debug_flags);
        grp_max = std::max({ grp_max, ds.n_grp[0], ds.n_grp[1] });
        mk_args a = {};
        a.m = &M_; a.st = &ds; a.mask[0] = mask0.data(); a.mask[1] = mask1.data();
        a.embd = &mm.E[(size_t) p0*n_embd]; a.pl_embd = &mm.PE[(size_t) p0*n_pl*n_layer];
        a.xb[0] = s_x.data(); a.xb[1] = s_x1.data(); a.att_part = s_part.data(); a.att_cnt = s_cnt.data();
        a.max_head = n_head; a.n_chunk = n_chunk; a.q = s_q.data(); a.k = s_k.data(); a.v = s_v.data(); a.att = s_att.data(); a.h = s_h.data();
        a.g = s_g.data(); a.pl_in = s_pl.data(); a.pl_g = s_plg.data(); a.logits = s_lo.data(); a.h_out = s_hid.data();
        a.xrec_k = mk_xrec_k(M_, 0); if (s_rec.empty()) s_rec.assign((size_t) MK_M*(a.xrec_k/32)*MK_XQ_REC, 0); a.xrec = s_rec.data();
        a.bar = bar + launches % 2; a.bar_next = bar + (launches + 1) % 2; ++launches; a.n_pl_all = n_pl*n_layer;
        std::vector<mk_mvr> mvt(mk_mv_count(n_layer));
        mk_mv_table(M_, a, mvt.data());
        a.mvt = mvt.data();
        static bool said_rows[2];
        if (!said_rows[set]) {   // short rows packed to a tile (mk_jr: rpt > 1), the default kernel's and the variant's
            said_rows[set] = true;
            int n_jobs = 0, n_packed = 0, rows_max = 1;
            for (const mk_mvr & R : mvt) {
                for (int j = 0; R.units && j < (R.pair ? 2 : 3); ++j) {
                    if (j > 0 && R.j[j].data == R.j[0].data && R.j[j].y == R.j[0].y) {
                        break;   // (a one-job mat-vec repeats job 0)
                    }
                    ++n_jobs;
                    n_packed += R.j[j].rpt > 1;
                    rows_max  = std::max(rows_max, R.j[j].rpt);
                }
            }
            printf("%s: %d of %d mat-vec jobs in tiles of several rows (up to %d)\n", set == 0 ? "kernel" : "default kernel",
                   n_packed, n_jobs, rows_max);
        }
        const mk_smem L = mk_smem_plan(mvt.data(), (int) mvt.size(), M, smem, ns_max, mk_att_bytes(M_));
        if (L.ns == 0) {
            printf("FAIL the model's mat-vecs do not fit in %d bytes of shared memory\n", smem);
            exit(1);
        }
        static int said[MK_M + 1];
        if (!said[M]++) {
            printf("M=%d: shared memory %d B: inputs %d + 8-bit %d B, %d columns per pass, %d weight stages per warp\n",
                   M, smem, L.xs_bytes, L.xq_bytes, L.cols, L.ns);
        }
        a.xs_bytes = L.xs_bytes; a.xq_bytes = L.xq_bytes; a.ns = L.ns;
        if (set == 0) {
            // the layers whose heads phase the attention takes over (GGML_MK_VAR_FOLD_HEADS: where mk_fold_plan fits)
            for (int il = 0; il < n_layer; ++il) {
                const ggml_mk_layer & Ll = M_.layers[il];
                const bool fold = (M_.debug_flags & GGML_MK_VAR_FOLD_HEADS) && !(M_.debug_flags & GGML_MK_VAR_DEVICE_ATT) &&
                                  mk_fold_plan(Ll, M, ds.n_ch[Ll.is_swa ? 1 : 0], M_.max_head_dim, L.xs_bytes + L.xq_bytes).fits;
                n_fold += fold;
                ++n_layer_steps;
            }
        }
        // the block way's layer steps that take two units a round (mk_attention_blk's question, mk_att_two), the kernel's
        // (set 0) and the default kernel's it is compared with (set 1)
        for (int il = 0; il < n_layer; ++il) {
            const ggml_mk_layer & Ll = M_.layers[il];
            const bool fold = (M_.debug_flags & GGML_MK_VAR_FOLD_HEADS) && !(M_.debug_flags & GGML_MK_VAR_DEVICE_ATT) &&
                              mk_fold_plan(Ll, M, ds.n_ch[Ll.is_swa ? 1 : 0], M_.max_head_dim, L.xs_bytes + L.xq_bytes).fits;
            n_two[set] += !fold && !(M_.debug_flags & (GGML_MK_VAR_DEVICE_ATT | GGML_MK_VAR_CHUNK4)) &&
                          mk_att_two(M_.debug_flags, M*Ll.n_head*ds.n_grp[Ll.is_swa ? 1 : 0], n_blocks, M_.max_head_dim,
                                     L.xs_bytes + L.xq_bytes);
        }
        a.bulk = (M_.debug_flags & GGML_MK_VAR_CP_ASYNC) ? 0 : 1;   // (as ggml_cuda_mk_create on an sm_90 device)
        emu_bulk_engine = a.bulk != 0;   // (0x2000: as an sm_80..89 device, which has no bulk copy engine)
        // clusters of 2 blocks for a verify batch (unless GGML_MK_VAR_NO_CLUSTER_STAGE), as ggml_cuda_mk_eval on an sm_90
        // device (mk_step_cl)
        const int cl = mk_step_cl(M, M_.debug_flags, n_blocks, true);
        n_cl_steps += cl > 1 && set == 0;
        if (!emu_launch(mk_decode_kernel, a, n_blocks, MK_THREADS, smem, "mk_decode_kernel", cl)) {
            printf("FAIL deadlock in mk_decode_kernel\n");
            exit(1);
        }
        std::vector<float> out(s_lo.begin(), s_lo.begin() + (size_t) M*n_vocab);   // logits, then the hidden rows
        out.insert(out.end(), s_hid.begin(), s_hid.begin() + (size_t) M*n_embd);
        return out;
    };
    // FNV-1a over every step's logits and hidden rows: two builds of the kernel (a refactor, another compiler) that
    // print the same digest computed the same bits
    uint64_t digest = 1469598103934665603ull;
    auto run = [&](int p0, int M) {
        std::vector<float> out = run1(p0, M, 0);
        const unsigned char * bytes = (const unsigned char *) out.data();
        for (size_t i = 0; i < out.size()*sizeof(float); ++i) {
            digest = (digest ^ bytes[i])*1099511628211ull;
        }
        if (vs_default) {
            const std::vector<float> ref = run1(p0, M, 1);
            bool same = memcmp(out.data(), ref.data(), out.size()*sizeof(float)) == 0;
            for (int i = 0; i < 4; ++i) {
                same = same && memcmp(kvs[0][i].data(), kvs[1][i].data(), kv_elems[i]*sizeof(half)) == 0;
            }
            if (!same) {
                printf("FAIL variant 0x%x: step of tokens %d..%d differs bitwise from the default kernel\n", variant, p0, p0 + M - 1);
            }
            ++n_cmp;
            n_cmp_diff += !same;
        }
        return out;
    };

    // bound: the Q4_0/Q8_0 mat-vecs round their inputs to 8 bits; the reference rounds its own (float64)
    // inputs, and an input within a last-bit difference of a rounding boundary lands on the other step
    // now and then (~1e-6); a wrong lane mapping, block or barrier costs >= 1e-3
    int fails = check(mm, run, 1e-5, verify_m);
    if (variant & GGML_MK_VAR_FOLD_HEADS) {
        printf("heads folded into the attention: %d of %d layer steps (the others kept the heads phase)\n", n_fold, n_layer_steps);
    }
    printf("attention two units a round (more units than blocks): %d of %d layer steps", n_two[0], n_layer_steps);
    if (vs_default) {
        printf(" (the default kernel: %d)", n_two[1]);
    }
    printf("\n");
    printf("attention groups (%d chunks of %d cells each) in a step's list: up to %d\n",
           (M_.debug_flags & GGML_MK_VAR_HALF_GROUPS) ? MK_ATT_GROUP_HALF : MK_ATT_GROUP, M_.att_chunk, grp_max);
    printf("steps staged over clusters of 2 blocks (mk_step_cl): %d\n", n_cl_steps);
    printf("digest of every step's logits and hidden rows: %016llx\n", (unsigned long long) digest);
    if (vs_default) {
        printf("%s variant 0x%x == default kernel bitwise (logits, hidden rows, KV caches): %d of %d steps differ\n",
               n_cmp_diff ? "FAIL" : "OK", variant, n_cmp_diff, n_cmp);
        fails += n_cmp_diff;
    }
    return fails ? 1 : 0;
}
