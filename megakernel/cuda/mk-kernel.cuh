// mk-kernel.cuh: the device code of the CUDA Gemma decode megakernel (megakernel/cuda/mk.cu has the
// host side). Written against a few macros so that the very same code also compiles for the CPU in
// the host emulation test (tests/mk_hostemu/): the includer defines
//   MK_DEVICE (inline helpers), MK_DEVICE_FN (larger device functions), MK_HOSTDEV (helpers the host also
//   calls), MK_KERNEL (return type and attributes of the entry point),
//   MK_SHARED(T, name, n) / MK_SHARED_DYN(T, name) (block-shared arrays), MK_UNROLL, MK_TRAP(),
//   mk_f16(bits) -> float, mk_ldcg(p) / mk_ldcg_u32(p) / mk_ldcg4(p) / mk_ldcg_u32x2(p) / mk_ldcg_u32x4(p) (loads through L2, past
//   the non-coherent L1),
//   mk_cp_async16(dst, src) / mk_cp_async_commit() / mk_cp_async_wait<N>() (asynchronous 16-byte copies
//   global -> shared, marked first to leave L2: issue, close a group, wait until at most N groups are pending),
//   mk_mbar_init(bar) / mk_mbar_init_fence() / mk_bulk_copy(dst, src, bytes, bar) / mk_mbar_wait(bar, parity)
//   (the same copies of whole tiles through the bulk copy engine, completing on an mbarrier: sm_90, mk_args.bulk),
// plus the CUDA built-ins it uses (threadIdx, __syncthreads, __shfl_xor_sync, atomics, half, ...).
#pragma once

#include "ggml-mk.h"

#define MK_WARPS   16
#define MK_THREADS (MK_WARPS*WARP_SIZE)
#define MK_M       GGML_MK_MAX_TOKENS

static_assert(MK_M <= MK_WARPS, "one warp per column in the norm prologues");
// steps of 2..MK_MC_SMALL tokens (verify batches of k <= 3 drafts) run the mat-vec code made for at most MK_MC_SMALL
// columns: per-column values in registers, loops over 4 columns, not MK_M (a column's arithmetic is the same)
#define MK_MC_SMALL 4
static_assert(MK_MC_SMALL < MK_M, "the any-batch code covers more columns than the small one");

// The block's shared memory for a step (laid out by the host per step size, mk_smem_plan): the staged
// inputs of a mat-vec (xs), their 8-bit records (xq), and the weight stages (the rest). Fewer columns
// leave more room for weight stages, so one-token steps keep more of every warp's weights in flight.
//
// weights stream through shared memory: every warp keeps ns stages (MK_NS_MIN .. MK_NS_MAX, per step) of up
// to MK_TB bytes of one row in flight (asynchronous 16-byte copies), decoding one stage while the next load
#define MK_NS_MIN      3
#define MK_NS_MAX      8
#define MK_TB          2048
#define MK_STAGE_BYTES (MK_TB + 32)                      // a tile is copied from its 16-byte aligned start

// xs: the block's copy of a mat-vec's inputs: [m][K/32 groups of 36 floats] (32 values + 4 of padding:
// 16-byte aligned groups, conflict-free float4 reads), MK_XS_GROUP bytes per group and column
#define MK_XS_GROUP    (36*sizeof(float))
// (the same memory is the heads phase's scratch: at least one head vector)
#define MK_HEADS_BYTES (GGML_MK_MAX_HEAD_DIM*sizeof(float))
// xq: the same inputs rounded to 8 bits per 32-value group for the integer dot products of Q4_0 and
// Q8_0 weights (llama.cpp's q8_1 rounding: d = max|x|/127, q = round(x*(1/d))): 48-byte records, 32 int8
// values, d, sum of q, padding; group g's record in slot mk_rec_slot(g) of its column
#define MK_XQ_REC      48

// record g of a column sits in slot g ^ ((g >> 3) & 1): in every other run of 8 records the two of each pair swap
// places. A warp that takes a pair of records per lane (mk_pairs: a 96-byte stride, where lanes p and p + 4 met on the
// same banks) then reads them without shared-memory bank conflicts, and a warp that takes a record per lane (the
// K-quants, the tail, odd tiles) still does (ncu, session 25: 2-way conflicts on the records' 16-byte reads in the pair
// loop, 4-way on the 8-byte ones: ~2.4 times the wavefronts they need). Only the places move, never the bits
MK_HOSTDEV int mk_rec_slot(int g) {
    return g ^ ((g >> 3) & 1);
}

// the 32-value groups of a row of K values (its records; its staged values' groups of MK_XS_GROUP bytes)
MK_HOSTDEV int mk_kg(int K) {
    return (K + 31)/32;
}

// whether a row of K values has its records in its own slots: the last group of an odd count in a run that swaps
// (KG % 16 = 9, 11, 13, 15: K = 288, 2336, ...) would sit in slot KG, past the column (in the next column's first
// slot, or past the staged region). Gemma's widths are multiples of 256 (KG a multiple of 8); the host refuses the rest
// (mk.cu), found by tests/mk_hostemu/mk_once_emu.cpp (session 36)
MK_HOSTDEV bool mk_rec_fits(int K) {
    const int KG = mk_kg(K);
    return mk_rec_slot(KG - 1) < KG;
}

// the same for local record l of a tile whose first group g0 is a multiple of 8 (every tile's: mk_jr.tg = 8*sgps):
// slot mk_rec_slot(g0 + l) = g0 + (l ^ mk_rec_swap(l, g0))
MK_HOSTDEV int mk_rec_swap(int l, int g0) {
    return ((l ^ g0) >> 3) & 1;
}

// attention chunks per cache of a step at most (ggml_mk_att_chunk keeps a context within 1024 chunks)
#define MK_CH_MAX 1024

// attention groups: chunk ch belongs to group ch / MK_ATT_GROUP (its number, not its place in a step's list, so a token's
// groups are the same in every step); a group's chunks are combined in chunk order, then the groups in group order. One
// block takes a (token, head, group): a warp per chunk, one round (MK_ATT_GROUP <= MK_WARPS). 8 chunks, half the block's
// warps: measured on the H200 (session 16) against 16, a block's every warp: 1.00x at 32 tokens of context, 1.03x at
// 1024 and after a 390-token prompt: a step's attention spread over twice the SMs, each with half the warps' work. (Tests
// build the host emulation with small groups, so that several groups meet within its short context)
#ifndef MK_ATT_GROUP
#define MK_ATT_GROUP 8
#endif
static_assert(MK_ATT_GROUP <= MK_WARPS, "a group's chunks: one warp each, one round");
// (variant GGML_MK_VAR_HALF_GROUPS: groups of MK_ATT_GROUP/2 chunks, at least 1)
#define MK_ATT_GROUP_HALF (MK_ATT_GROUP/2 > 0 ? MK_ATT_GROUP/2 : 1)
#define MK_GRP_MAX (MK_CH_MAX/MK_ATT_GROUP_HALF + 2)

// the chunk slots one block holds for a step whose chunk list has nch entries: one group's at most
#define MK_GRP_SLOTS(nch) ((nch) < MK_ATT_GROUP ? (nch) : MK_ATT_GROUP)

// the per-step data on the device (uploaded with the masks and embedding rows in one copy)
struct mk_dstep {
    int32_t n_tokens;
    int32_t pos[MK_M];
    int32_t n_kv[GGML_MK_N_CACHES];
    int64_t kv_idx[GGML_MK_N_CACHES][MK_M];
    // the attention chunks holding a cell that some token of the step sees, ascending (mk_step_chunks); the
    // others hold nothing for any token, and skipping them changes no bit of the result
    int32_t  n_ch[GGML_MK_N_CACHES];
    uint16_t ch[GGML_MK_N_CACHES][MK_CH_MAX];
    // the list's groups (MK_ATT_GROUP): group g is list entries grp[g] .. grp[g + 1] - 1
    int32_t  n_grp[GGML_MK_N_CACHES];
    uint16_t grp[GGML_MK_N_CACHES][MK_GRP_MAX];
    ggml_mk_kv_view kv[GGML_MK_MAX_LAYERS];
};

// host: fill ds.n_ch/ds.ch from the step's masks ([M][n_kv] additive, -INFINITY = not seen; NULL = cache not
// used); at least one chunk per cache (a cache nobody sees gives chunk 0, all masked: zeros, as before).
// flags: the model's debug_flags (GGML_MK_VAR_HALF_GROUPS: groups of MK_ATT_GROUP_HALF chunks)
static inline void mk_step_chunks(mk_dstep & ds, const float * const * mask, int M, int CH, int flags) {
    const int G = (flags & GGML_MK_VAR_HALF_GROUPS) ? MK_ATT_GROUP_HALF : MK_ATT_GROUP;
    for (int c = 0; c < GGML_MK_N_CACHES; ++c) {
        const int n_kv = ds.n_kv[c];
        int n = 0;
        for (int k = 0; k*CH < n_kv && n < MK_CH_MAX; ++k) {
            const int i1 = (k + 1)*CH < n_kv ? (k + 1)*CH : n_kv;
            bool seen = false;
            for (int m = 0; m < M && mask[c] && !seen; ++m) {
                const float * row = mask[c] + (size_t) m*n_kv;
                for (int i = k*CH; i < i1; ++i) {
                    if (row[i] != -INFINITY) {
                        seen = true;
                        break;
                    }
                }
            }
            if (seen) {
                ds.ch[c][n++] = (uint16_t) k;
            }
        }
        if (n == 0) {
            ds.ch[c][n++] = 0;
        }
        ds.n_ch[c] = n;
        int g = 0;
        for (int k = 0; k < n; ++k) {
            if (k == 0 || ds.ch[c][k]/G != ds.ch[c][k - 1]/G) {
                ds.grp[c][g++] = (uint16_t) k;
            }
        }
        ds.grp[c][g] = (uint16_t) n;
        ds.n_grp[c] = g;
    }
}

struct mk_mvr;

// a fused MTP draft launch (ggml-mk.h: ggml_mk_draft): k decode steps of the plan ggml_mk_draft_model makes of the
// assistant, each fed pre*concat(tok_embd[t]*embd_scale, h) (t, h: the launch's, then the step before's draft and
// h_next: mk_draft_inputs) and followed by h_next = post*n and the argmax of the logits (mk_draft_pick). The mat-vec
// table holds a decode step's, then pre, then post once per step (its output row moves with the step: mk_mv_table_draft)
struct mk_draft_args {
    ggml_mk_weight tok_embd;   // the target's token embeddings, readable by the kernel
    float   embd_scale;        // sqrt(n_embd_bb)
    int     n_embd_bb;
    int     k;
    int     token;             // the last sampled token
    const float * h;           // [n_embd_bb] the target's hidden row of the token before
    float   * xh;              // scratch [2*n_embd_bb]: the pre-projection's input
    float   * h_next;          // [k][n_embd_bb] each step's post*n
    int32_t * tokens;          // [k] the drafts
    float   * pick_v;          // [grid] each block's largest logit of its slice of the vocabulary (mk_draft_pick)
    unsigned* pick_i;          // [grid] its index (the first on ties)
    float   * logits;          // NULL, or [k][n_vocab] every step's logits
};

// the kernel body's residual stream (thread 0's, in shared memory): xc the stream now, xn where the next residual step
// writes it, nw/scale the step still to apply (x = (x + h*rms(h)*nw)*scale; nw NULL: none)
struct mk_res {
    float       * xc;
    float       * xn;
    const float * nw;
    float         scale;
};

struct mk_args {
    const ggml_mk_model * m;     // device copy of the plan
    const mk_dstep      * st;    // device copy of the step
    const float * mask[GGML_MK_N_CACHES];  // [n_tokens][n_kv]
    const float * embd;          // [M][n_embd]
    const float * pl_embd;       // [M][n_pl_all]

    // scratch, each [MK_M][width]
    float * xb[2];  // residual stream, two buffers: a residual step writes the other one (n_embd)
    float * q;      // max_q
    float * k;      // max_kv
    float * v;      // max_kv
    float * att;    // max_q
    float * h;      // n_embd
    float * g;      // max_ff: gelu(gate)*up
    float * pl_in;  // n_pl_all (Gemma 4: per-layer inputs)
    float * pl_g;   // n_embd_pl
    float * logits; // n_vocab
    float * h_out;  // NULL, or the LM head's input rmsnorm(x)*output_norm of every token (n_embd), for the host
    float * att_part;    // attention chunks: [MK_M][max_head][n_chunk][4 + max_head_dim] (max, sum, -, -, acc)
    unsigned * att_cnt;  // [MK_M][max_head] chunks done (the last one combines and resets it)
    uint8_t  * xrec;     // NULL, or a plain mat-vec's inputs as 8-bit records rounded once for the grid (mk_stage_once):
                         //   [MK_M][xrec_k/32] records of MK_XQ_REC bytes, a column's in mk_rec_slot order
    int        xrec_k;   // the values a column of xrec holds (a multiple of 32)
    unsigned * bar;       // grid barrier: arrivals in this launch (zero at the start: the launch before zeroed it)
    unsigned * bar_next;  // the next launch's count (the two alternate), zeroed by block 0 at the start
    unsigned long long * prof;  // NULL, or phase timestamps: [0] count, then (tag, globaltimer ns) pairs
    unsigned long long * gprof; // NULL, or every block's grid barrier times (LLAMA_MEGAKERNEL_PROFILE=2): [gprof_cap] tags,
                                //   then [gprof_cap][grid] (arrival, release) pairs in globaltimer ns
    int gprof_cap;              // barriers gprof holds
    const struct mk_mvr * mvt;  // the step's mat-vecs, decoded once by the host (mk_mv_table)
    int n_pl_all;
    int max_head;
    int n_chunk;
    int xs_bytes;   // the step's shared memory (mk_smem_plan): staged inputs, their 8-bit records, then
    int xq_bytes;   //   ns weight stages per warp
    int ns;
    int bulk;       // 1: weight tiles through the bulk copy engine (sm_90+), 0: 16-byte cp.async per lane
    int flags;      // the plan's debug_flags (GGML_MK_VAR_*, GGML_MK_DEBUG_*), copied by the kernel itself into its shared
                    //   copy of the arguments (mk_step; the host leaves it 0) and read there, not through m (after a grid
                    //   barrier's acquire a load from global memory is an L2 round trip, and the checks sit next to the
                    //   barriers: before arriving, after leaving)
};

// the cluster size a launch of M tokens runs with (the kernel reads it from the launch: mk_cluster_size): unless
// GGML_MK_VAR_NO_CLUSTER_STAGE, 2 for a verify batch whose staging splits
// over a pair of blocks (mk_stage_cols for 2..MK_MC_SMALL tokens, the any-batch mk_stage for more or under
// GGML_MK_VAR_WIDE_M; not the item-by-item mk_stage<MK_MC_SMALL> of GGML_MK_VAR_ITEM_STAGE) on a device that
// co-schedules the whole grid as pairs (can: sm_90+, every pair resident at once) of an even grid; else 1
MK_HOSTDEV int mk_step_cl(int M, int flags, int grid, bool can) {
    const bool item = M <= MK_MC_SMALL && (flags & GGML_MK_VAR_ITEM_STAGE) && !(flags & GGML_MK_VAR_WIDE_M);
    return can && !(flags & GGML_MK_VAR_NO_CLUSTER_STAGE) && !item && M >= 2 && grid % 2 == 0 ? 2 : 1;
}

// ---------------------------------------------------------------------------------------------
// grid barrier: one count of arrivals in this launch that only grows: the arrival that makes it a multiple of
// the grid ends the barrier, so a block waits until the count reaches the next multiple of the grid above its
// own arrival. One atomic round trip per block, no generation word, nothing on the last arrival's path; the
// arrival is a release (and acquire) add and the poll an acquire load, which carry the phases' data. Launches
// alternate between two counts: this launch's block 0 zeroes the next one's (nobody uses it now: the launch before
// has ended)

// phases, for the optional profile (LLAMA_MEGAKERNEL_PROFILE=1): the tag names the phase that ends
enum mk_phase {
    MK_PH_START = 0, MK_PH_EMBD, MK_PH_PL_PROJ, MK_PH_PL_IN, MK_PH_QKV, MK_PH_HEADS, MK_PH_ATTN, MK_PH_WO,
    MK_PH_FFN, MK_PH_DOWN, MK_PH_PL_GATE, MK_PH_PL_LAYER, MK_PH_LM_HEAD, MK_PH_ATTN_G,
    MK_PH_ST_RMS,  // staging of a mat-vec's inputs (block 0's; counted out of the mat-vec phases):
    MK_PH_ST_LOAD, //   rms of the pending residual, the loads (+ residual), the norm, the 8-bit rounding,
    MK_PH_ST_NORM, //   the rest
    MK_PH_ST_Q8,
    MK_PH_AT_CHUNKS, // the attention's block-per-(token, head, group) way (block 0's first unit of each layer): its chunks
    MK_PH_AT_COMB,   //   (q, K/V loads, online softmax), the group's combine in the block (+ its result out and the
    MK_PH_AT_GROUPS, //   arrival count), the groups' combine (by the last block of the (token, head) only); the
                     //   phase's tag (attention, attention (global)) keeps the rest
    MK_PH_STAGE,
    MK_PH_WAIT,    // grid barrier waits (block 0 done until all blocks are)
    MK_PH_ONCE,    // a plain mat-vec's inputs rounded once for the grid, each block its slice (mk_stage_once)
    MK_PH_AT_PRO,   // the attention's block-per-(token, head, group) way, before MK_PH_AT_CHUNKS: from the phase's start
    MK_PH_AT_WARP0, //   to its first unit (the layer's and the step's fields, the checks), warp 0's own chunks (with
                    //   GGML_MK_VAR_FOLD_HEADS also the fold's Q and K/V rows); MK_PH_AT_CHUNKS then keeps the block's
                    //   barrier (its other warps' chunks)
    MK_PH_COUNT,
};

MK_DEVICE void mk_prof_at(unsigned long long * prof, int tag) {
    if (prof && blockIdx.x == 0 && threadIdx.x == 0) {
        const unsigned long long i = prof[0]++;
        prof[1 + 2*i] = (unsigned long long) tag;
        prof[2 + 2*i] = mk_clock_ns();
    }
}

MK_DEVICE void mk_prof(const mk_args & a, int tag) {
    mk_prof_at(a.prof, tag);
}

// (thread 0 of each block; out of line: one copy of the code, not one at every barrier of the kernel body)
MK_DEVICE_FN void mk_grid_arrive_wait(unsigned * bar, unsigned long long * gprof, int gprof_cap, int tag) {
    const unsigned n = gridDim.x;
    const unsigned long long t0 = gprof ? mk_clock_ns() : 0;
    // release: the block's writes (ordered before by __syncthreads) go first; acquire: the last arrival sees the
    // others' writes
    const unsigned old = mk_atomic_add_acq_rel(bar, 1u);
    const unsigned end = old - old % n + n;
    if (old + 1 != end) {
        while (*(volatile unsigned *) bar < end) {
            __nanosleep(20);
        }
        (void) mk_ld_acquire(bar);   // one acquire after the relaxed polls (each acquire load empties L1)
    }
    // the grid profile: this block's arrival and release at barrier number old/n of the launch
    if (gprof && (int) (old / n) < gprof_cap) {
        const size_t b = old / n;
        if (blockIdx.x == 0) {
            gprof[b] = (unsigned long long) tag;
        }
        unsigned long long * t = gprof + gprof_cap + 2*(b*n + blockIdx.x);
        t[0] = t0;
        t[1] = mk_clock_ns();
    }
}

MK_DEVICE void mk_grid_sync(const mk_args & a, int tag) {
    __syncthreads();
    mk_prof(a, tag);
    if (a.flags & GGML_MK_DEBUG_NO_GRID_BARRIER) {
        return; // planted bug for the tests: phases race
    }
    if (threadIdx.x == 0) {
        mk_grid_arrive_wait(a.bar, a.gprof, a.gprof_cap, tag);
    }
    mk_prof(a, MK_PH_WAIT);
    __syncthreads();
}

// ---------------------------------------------------------------------------------------------
// weights: 32 consecutive values of a row (group g = values 32g..32g+31), any supported type

#include "mk-deq.cuh"

// ---------------------------------------------------------------------------------------------
// mat-vec over M columns: y[m][r] = sum_k W[r][k] * X(m, k)

enum mk_xmode {
    MK_X_PLAIN = 0,   // X = a[m][k]                 (then the residual and the norm below, if given)
    MK_X_GEGLU = 1,   // X = gelu(a[m][k]) * b[m][k]
};

// the inputs of a mat-vec, staged by every block into its shared memory
struct mk_xin {
    int           mode;
    const float * a;  int lda;
    const float * b;  int ldb;
    // pending residual (res_h != NULL): a' = (a + res_h * rms(res_h) * res_nw) * res_scale, the new residual
    // stream, which block 0 also writes to res_out (lda wide) for later phases
    const float * res_h;
    const float * res_nw;
    float         res_scale;
    float       * res_out;
    const float * nw;  // != NULL: the input is rmsnorm(a') * nw
    float       * nw_out;  // != NULL (with nw): block 0 also writes the normed columns there (K wide)
    const uint8_t * rec;   // != NULL: the inputs' 8-bit records, staged once for the grid (mk_once; a step's
                           //   fx() leaves it NULL): every block copies them (mk_stage_copy) instead of staging
};

struct mk_job {
    ggml_mk_weight w;
    float * y;  int ldy;
    float softcap;   // 0 = none
};

// one mat-vec: up to 3 jobs over the same inputs; pair: jobs[0] = gate and jobs[1] = up with the same
// rows, one warp computes both rows r and writes gelu(gate)*up to jobs[0].y
struct mk_mv {
    mk_job jobs[3];
    int    n_jobs;
    int    pair;
    int    norm;   // its inputs are rmsnorm'ed (mk_xin.nw): staged as floats first, never the direct records
};

// explicit rounding intrinsics: never contracted into FMAs differently at different call sites
MK_DEVICE float mk_gelu(float x) {
    const float GELU_COEF_A    = 0.044715f;
    const float SQRT_2_OVER_PI = 0.79788456080286535587989211986876f;
    const float inner = __fmul_rn(__fmul_rn(SQRT_2_OVER_PI, x), __fadd_rn(1.0f, __fmul_rn(__fmul_rn(GELU_COEF_A, x), x)));
    return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(inner)));
}

// a mat-vec row's output from its warp sum(s): gelu(gate)*up for a gate/up pair, else the sum under the job's
// softcap (0: none); every path that ends a row goes through these
MK_DEVICE float mk_geglu(float gate, float up) {
    return __fmul_rn(mk_gelu(gate), up);
}
MK_DEVICE float mk_softcap(float s, float cap) {
    return cap != 0.0f ? tanhf(s/cap)*cap : s;
}

MK_DEVICE float mk_warp_sum(float v) {
#pragma unroll
    for (int o = WARP_SIZE/2; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffff, v, o);
    }
    return v;
}

// mk_warp_sum of a in lanes 0..15 and of b in lanes 16..31, bit for bit (the butterfly's first step adds the pairs
// (l, l^16) of a in the low half and of b in the high half, in either order the same bits; its other steps stay
// inside a half): 5 shuffles for two sums instead of 10
MK_DEVICE float mk_warp_sum2(float a, float b) {
    const bool hi = (threadIdx.x % WARP_SIZE) >= WARP_SIZE/2;
    float v = (hi ? b : a) + __shfl_xor_sync(0xffffffff, hi ? a : b, WARP_SIZE/2);
#pragma unroll
    for (int o = WARP_SIZE/4; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffff, v, o);
    }
    return v;
}

// the sum over each group of l consecutive lanes (l a power of 2 <= WARP_SIZE), returned to the group's lanes; where
// the other lanes of the warp hold zeros, it is mk_warp_sum's over the group bit for bit (the butterfly's wider
// steps would add only zeros)
MK_DEVICE float mk_lane_sum(float v, int l) {
    for (int o = l/2; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffff, v, o);
    }
    return v;
}

MK_HOSTDEV bool mk_is_q8dot(int type) {
    return type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q8_0;
}

// K-quants whose integer dot product with the 8-bit inputs the mat-vec has (mk_q4k_unit, mk_q6k_unit: the types of
// llama.cpp's Q4_K_M / Q4_K_S files, beside Q4_0 / Q8_0)
MK_HOSTDEV bool mk_is_kq(int type) {
    return type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K;
}

// a job's parameters in registers (read once per mat-vec, never indexed at run time): a row is cut
// into nseg tiles of sgps*256 values (the last one shorter), each at most MK_TB bytes: a full tile is tb bytes
// and tg 32-value groups, the last one lb bytes and lg groups
//
// short rows (Q4_0/Q8_0, one tile each, at most 16 block pairs) are packed rpt > 1 to a tile: consecutive rows,
// lpr lanes per row (a power of 2 >= the row's pairs, so lane p still takes pair p and the lane group's sum adds the
// same numbers in the same order as a whole warp's over one row: the bits do not change); unless GGML_MK_VAR_NO_FLOAT_PACK,
// short F32 / F16 / BF16 rows (f4: 4 values per lane) likewise rpt to a tile, taken one after the other by the whole warp
// (lpr = WARP_SIZE: each row the one-row path's arithmetic; the tile's wait and bookkeeping once for rpt rows; E4B's
// per-layer projection, 2560 rows of 256 F32 values, 2 to a tile); nu: the job's tiles (units) of rows
struct mk_jr {
    const uint8_t * data;
    float         * y;
    uint64_t        nb1;
    int             ne0, ne1, type, ldy, nseg;
    int             tb, tg, lb, lg;
    int             rpt, lpr, nu;
    float           softcap;
};

// pack: rows may be packed (the default; GGML_MK_VAR_ROW_TILES turns it off); kq32: K-quant tiles in multiples of 32
// groups (the default; GGML_MK_VAR_KQ_TILES turns it off); fpack: float rows may be packed too (the default;
// GGML_MK_VAR_NO_FLOAT_PACK turns it off; with pack and the float rows' 4 values per lane, mk_mvr.f4, which their packed
// tiles need: aligned for mk_deq4 by the checks below)
MK_HOSTDEV mk_jr mk_jr_of(const mk_job & jb, bool pack, bool kq32, bool fpack) {
    mk_jr r;
    r.data    = (const uint8_t *) jb.w.data;
    r.y       = jb.y;
    r.nb1     = jb.w.nb1;
    r.ne0     = jb.w.ne0;
    r.ne1     = jb.w.ne1;
    r.type    = jb.w.type;
    r.ldy     = jb.ldy;
    r.softcap = jb.softcap;
    const int b256 = jb.w.b256;   // from the plan (ggml_row_size): exact for any multiple of the block size
    const int nsg   = (r.ne0 + 255)/256;
    const int bytes = (int) (((int64_t) r.ne0*b256)/256);
    r.nseg = (bytes + MK_TB - 1)/MK_TB;
    int sgps = (nsg + r.nseg - 1)/r.nseg;   // 256-value groups per tile
    if (kq32 && mk_is_kq(r.type) && r.nseg > 1 && sgps > 4 && sgps % 4 != 0 &&
        (nsg - (r.nseg - 1)*(sgps/4*4))*b256 <= MK_TB) {
        // K-quants take a 32-value group per lane: the first tiles in whole rounds of lanes (4 super-blocks each), the
        // rest in the last tile where it fits (Q6_K rows of 2560 values: 32 + 48 groups, 3 rounds, not 40 + 40, 4)
        sgps = sgps/4*4;
    }
    r.tb   = sgps*b256;
    r.tg   = sgps*8;
    const int v0 = (r.nseg - 1)*sgps*256;   // the last tile's first value
    r.lg   = (r.ne0 - v0 + 31)/32;
    r.lb   = bytes - (r.nseg - 1)*r.tb;
    r.rpt  = 1;
    r.lpr  = WARP_SIZE;
    const int np = r.lg/2;   // a one-tile row's block pairs
    if (pack && r.nseg == 1 && mk_is_q8dot(r.type) && r.lg % 2 == 0 && np <= WARP_SIZE/2 && r.nb1 == (uint64_t) bytes &&
        bytes % 4 == 0 && ((uintptr_t) r.data & 3) == 0) {
        int l = 1;
        while (l < np) {
            l *= 2;
        }
        const int fit = MK_TB/bytes;   // (a tile's copy starts at its 16-byte aligned start: MK_STAGE_BYTES covers it)
        r.rpt = WARP_SIZE/l < fit ? WARP_SIZE/l : fit;
        r.lpr = r.rpt > 1 ? l : WARP_SIZE;
        r.rpt = r.rpt > 1 ? r.rpt : 1;
    }
    const int al = r.type == GGML_TYPE_F32 ? 16 : 8;   // (mk_deq4_ok's alignment; a tile's copy keeps the offset mod 16)
    if (fpack && r.nseg == 1 && (r.type == GGML_TYPE_F32 || r.type == GGML_TYPE_F16 || r.type == GGML_TYPE_BF16) &&
        2*bytes <= MK_TB && r.nb1 == (uint64_t) bytes && bytes % al == 0 && ((uintptr_t) r.data % al) == 0) {
        r.rpt = MK_TB/bytes;   // (lpr stays WARP_SIZE: the warp takes the tile's rows one after the other)
    }
    r.nu   = (r.ne1 + r.rpt - 1)/r.rpt;
    return r;
}

// (the kernel reads it in place, from the block's copy in shared memory: no per-thread copy in registers or local
// memory, and fields of job j indexed directly)
struct mk_mvr {
    mk_jr j[3];
    int   pair, units, norm;
    int   spread;   // units dealt block by block (mk_it_first), unless GGML_MK_VAR_BLOCK_UNITS
    int   small;    // steps of 2..MK_MC_SMALL tokens run mk_mv_run<MK_MC_SMALL>, unless GGML_MK_VAR_WIDE_M (0); 2: with
                    // the staging slot by slot over every column (mk_stage_cols), 1: item by item (mk_stage,
                    // GGML_MK_VAR_ITEM_STAGE)
    int   kq;       // Q4_K / Q6_K jobs take the 8-bit inputs (integer dot products), unless GGML_MK_VAR_KQ_FLOAT (0:
                    // the float inputs and mk_deq32, the way before)
    int   tail;     // a tile's last Q4_0/Q8_0 pairs one block per lane where they fill at most half a round (mk_pairs),
                    // unless GGML_MK_VAR_PAIR_TAIL (0: as pairs)
    int   f4;       // F32 / F16 / BF16 jobs 4 consecutive values per lane (mk_deq4), unless GGML_MK_VAR_FLOAT_GROUPS (0: a
                    // 32-value group per lane, mk_deq32)
    int   sr2;      // mk_stage_cols's rms round of the pending residual 2 slots a thread per round (the default;
                    // 0: one, GGML_MK_VAR_STAGE_ROUND1)
};

// field f of job j (0..2) of R
#define MK_J(R, jb, f) ((R).j[jb].f)

// flags: the model's debug_flags (GGML_MK_VAR_ROW_TILES: one row per tile)
MK_HOSTDEV mk_mvr mk_mvr_of(const mk_mv & mv, int flags) {
    mk_mvr R = {};
    if (mv.n_jobs == 0) {
        return R;   // (a weight the model does not have: never run)
    }
    const bool pack = !mv.pair && !(flags & GGML_MK_VAR_ROW_TILES);   // (a gate/up pair: one row of each per unit)
    const bool kq32 = !(flags & GGML_MK_VAR_KQ_TILES);
    const bool f4   = (flags & GGML_MK_VAR_FLOAT_GROUPS) == 0;
    const bool fpk  = pack && f4 && !(flags & GGML_MK_VAR_NO_FLOAT_PACK);
    R.j[0]    = mk_jr_of(mv.jobs[0], pack, kq32, fpk);
    R.j[1]    = mv.n_jobs > 1 ? mk_jr_of(mv.jobs[1], pack, kq32, fpk) : R.j[0];
    R.j[2]    = mv.n_jobs > 2 ? mk_jr_of(mv.jobs[2], pack, kq32, fpk) : R.j[0];
    R.pair  = mv.pair;
    R.norm  = mv.norm;
    R.spread = (flags & GGML_MK_VAR_BLOCK_UNITS) == 0;
    R.small  = (flags & GGML_MK_VAR_WIDE_M) ? 0 : (flags & GGML_MK_VAR_ITEM_STAGE) ? 1 : 2;
    R.kq     = (flags & GGML_MK_VAR_KQ_FLOAT) == 0;
    R.tail   = (flags & GGML_MK_VAR_PAIR_TAIL) == 0;
    R.f4     = f4;
    R.sr2    = (flags & GGML_MK_VAR_STAGE_ROUND1) == 0;
    R.units = mv.pair ? R.j[0].ne1 : R.j[0].nu + (mv.n_jobs > 1 ? R.j[1].nu : 0) + (mv.n_jobs > 2 ? R.j[2].nu : 0);
    return R;
}

// the mat-vecs of a step, in the order the kernel runs them: [0] the per-layer projection (Gemma 4), then
// MK_MV_PER_LAYER per layer, then the LM head. The host decodes them once (mk_mv_table, at create) into the
// table the kernel reads (mk_args.mvt): no block or warp works them out again at every phase
enum { MK_MV_QKV, MK_MV_O, MK_MV_FFN, MK_MV_DOWN, MK_MV_PL_GATE, MK_MV_PL_PROJ, MK_MV_PER_LAYER };

MK_HOSTDEV int mk_mv_index(int il, int k) { return 1 + il*MK_MV_PER_LAYER + k; }
MK_HOSTDEV int mk_mv_count(int n_layer)    { return 2 + n_layer*MK_MV_PER_LAYER; }

// host: the descriptor of mat-vec idx; its outputs are the scratch buffers of a
static inline mk_mv mk_mv_desc(const ggml_mk_model & md, const mk_args & a, int idx) {
    mk_mv mv = {};
    auto one = [&](const ggml_mk_weight & w, float * y, int ldy, float softcap) {
        if (w.data) {
            mv.jobs[0] = { w, y, ldy, softcap };
            mv.n_jobs  = 1;
        }
    };
    if (idx == 0) {
        if (md.n_embd_pl > 0) {
            one(md.pl_model_proj, a.pl_in, a.n_pl_all, 0.0f);
        }
        return mv;
    }
    if (idx == mk_mv_count(md.n_layer) - 1) {
        one(md.output, a.logits, md.n_vocab, md.softcap);
        mv.norm = 1;   // output_norm
        return mv;
    }
    const ggml_mk_layer & L = md.layers[(idx - 1)/MK_MV_PER_LAYER];
    switch ((idx - 1) % MK_MV_PER_LAYER) {
        case MK_MV_QKV:
            mv.norm = 1;   // attn_norm
            mv.jobs[mv.n_jobs++] = { L.wq, a.q, md.max_q, 0.0f };
            if (L.has_kv) {
                mv.jobs[mv.n_jobs++] = { L.wk, a.k, md.max_kv, 0.0f };
                if (!L.v_from_k) {
                    mv.jobs[mv.n_jobs++] = { L.wv, a.v, md.max_kv, 0.0f };
                }
            }
            break;
        case MK_MV_O:    one(L.wo, a.h, md.n_embd, 0.0f); break;
        case MK_MV_FFN:
            // gate and up: one warp computes row r of both and writes gelu(gate)*up
            mv.jobs[0] = { L.ffn_gate, a.g, md.max_ff, 0.0f };
            mv.jobs[1] = { L.ffn_up,   a.g, md.max_ff, 0.0f };
            mv.n_jobs  = 2;
            mv.pair    = 1;
            mv.norm    = 1;   // ffn_norm
            break;
        case MK_MV_DOWN: one(L.ffn_down, a.h, md.n_embd, 0.0f); break;
        case MK_MV_PL_GATE:
            if (md.n_embd_pl > 0) {
                one(L.pl_gate, a.pl_g, md.n_embd_pl, 0.0f);
            }
            break;
        case MK_MV_PL_PROJ:
            if (md.n_embd_pl > 0) {
                one(L.pl_proj, a.h, md.n_embd, 0.0f);
            }
            break;
    }
    return mv;
}

// host: the whole table (mk_mv_count(md.n_layer) entries)
static inline void mk_mv_table(const ggml_mk_model & md, const mk_args & a, mk_mvr * tab) {
    for (int i = 0; i < mk_mv_count(md.n_layer); ++i) {
        tab[i] = mk_mvr_of(mk_mv_desc(md, a, i), md.debug_flags);
    }
}

// a draft launch's table (mk_mv_draft_count entries): a decode step's of md (ggml_mk_draft_model of d), then the
// pre-projection (into the residual stream), then the post-projection of each step j (into da.h_next row j)
MK_HOSTDEV int mk_mv_draft_pre(int n_layer)         { return mk_mv_count(n_layer); }
MK_HOSTDEV int mk_mv_draft_post(int n_layer, int j) { return mk_mv_count(n_layer) + 1 + j; }
MK_HOSTDEV int mk_mv_draft_count(int n_layer, int k) { return mk_mv_count(n_layer) + 1 + k; }

static inline void mk_mv_table_draft(const ggml_mk_draft & d, const ggml_mk_model & md, const mk_args & a, const mk_draft_args & da,
                                     mk_mvr * tab) {
    mk_mv_table(md, a, tab);
    mk_mv pre = {};
    pre.jobs[0] = { d.pre, a.xb[0], md.n_embd, 0.0f };
    pre.n_jobs  = 1;
    tab[mk_mv_draft_pre(md.n_layer)] = mk_mvr_of(pre, md.debug_flags);
    for (int j = 0; j < da.k; ++j) {
        mk_mv post = {};
        post.jobs[0] = { d.post, da.h_next + (size_t) j*d.n_embd_bb, d.n_embd_bb, 0.0f };
        post.n_jobs  = 1;
        tab[mk_mv_draft_post(md.n_layer, j)] = mk_mvr_of(post, md.debug_flags);
    }
}

// a mat-vec's inputs as the kernel stages them: the 8-bit records alone (direct: every job takes them, mk_q8in: Q4_0,
// Q8_0, Q4_K, Q6_K, and no norm: the records made as the values arrive), or floats (xs) plus, if a job takes them, the
// records (xq)
MK_HOSTDEV bool mk_q8in(const mk_mvr & R, int type) {   // a job of this type takes the 8-bit inputs
    return mk_is_q8dot(type) || (R.kq && mk_is_kq(type));
}
MK_HOSTDEV bool mk_mv_q8(const mk_mvr & R) {
    return mk_q8in(R, R.j[0].type) || mk_q8in(R, R.j[1].type) || mk_q8in(R, R.j[2].type);
}
MK_HOSTDEV bool mk_mv_direct(const mk_mvr & R) {
    return mk_q8in(R, R.j[0].type) && mk_q8in(R, R.j[1].type) && mk_q8in(R, R.j[2].type) && !R.norm;
}

// the columns of a mat-vec with K-value inputs that one pass stages, given the step's layout
MK_HOSTDEV int mk_mv_cols(const mk_mvr & R, int xs_bytes, int xq_bytes) {
    const int KG = (R.j[0].ne0 + 31)/32;
    if (mk_mv_direct(R)) {
        return (xs_bytes + xq_bytes)/(KG*MK_XQ_REC);
    }
    const int c = xs_bytes/(KG*(int) MK_XS_GROUP);
    return mk_mv_q8(R) ? (c < xq_bytes/(KG*MK_XQ_REC) ? c : xq_bytes/(KG*MK_XQ_REC)) : c;
}

// host: the shared-memory layout of a step of M columns within `total` bytes: xs and xq big enough for the largest
// M' <= M such that every mat-vec stages M' columns in one pass and MK_NS_MIN weight stages per warp still fit (a
// mat-vec with more columns runs in passes), and together at least att_bytes where that fits too (the attention's
// partial results); the rest are weight stages, at most ns_max. ns = 0: not even one
// column fits (too long a row for the shared memory)
struct mk_smem {
    int xs_bytes, xq_bytes, ns, cols;
};

// the shared memory the attention would like for its partial results (one block per (token, head)): MK_ATT_SLOTS
// chunks (two per warp; 256 cells at 8 per chunk); longer chunk lists take the device-wide way
#define MK_ATT_SLOTS 32
static inline int mk_att_bytes(const ggml_mk_model & md) {
    return MK_ATT_SLOTS*(4 + md.max_head_dim)*(int) sizeof(float);
}

static inline mk_smem mk_smem_plan(const mk_mvr * tab, int n_mv, int M, int total, int ns_max, int att_bytes) {
    const int stage = MK_WARPS*MK_STAGE_BYTES;
    for (int c = M; c >= 1; --c) {
        int xs = (int) MK_HEADS_BYTES, xq = 0, dir = 0;
        for (int i = 0; i < n_mv; ++i) {
            const mk_mvr & R = tab[i];
            if (R.units == 0) {
                continue;
            }
            const int KG = (R.j[0].ne0 + 31)/32;
            if (mk_mv_direct(R)) {
                dir = dir > c*KG*MK_XQ_REC ? dir : c*KG*MK_XQ_REC;
            } else {
                xs = xs > c*KG*(int) MK_XS_GROUP ? xs : c*KG*(int) MK_XS_GROUP;
                if (mk_mv_q8(R)) {
                    xq = xq > c*KG*MK_XQ_REC ? xq : c*KG*MK_XQ_REC;
                }
            }
        }
        if (xs + xq < dir) {
            xq = dir - xs;
        }
        xs = (xs + 15)/16*16;
        xq = (xq + 15)/16*16;
        if (xs + xq < att_bytes && att_bytes + MK_NS_MIN*stage <= total) {
            xs = (att_bytes - xq + 15)/16*16;
        }
        if (xs + xq + MK_NS_MIN*stage <= total) {
            int ns = (total - xs - xq)/stage;
            ns = ns < ns_max ? ns : ns_max;
            ns = ns < MK_NS_MAX ? ns : MK_NS_MAX;
            ns = ns > MK_NS_MIN ? ns : MK_NS_MIN;
            return { xs, xq, ns, c };
        }
    }
    return { 0, 0, 0, 0 };
}

// where a warp is in its walk over the mat-vec: row unit u (pair: row u of both jobs), sub-row, tile
// of the row, the tile's stage st (its count modulo the warp's ns stages, kept as a wrapping counter: no
// division per tile, ncu session 17: three run-time `% ns` were a quarter of the mat-vec's instructions with
// the rest of the walk); job and row follow from u and sub
struct mk_it {
    int u, sub, seg, st, job, row;
};

MK_DEVICE void mk_it_set(const mk_mvr & R, mk_it & it) {
    if (R.pair) {
        it.job = it.sub;
        it.row = it.u;
        return;
    }
    int r = it.u;
    int j = 0;
    if (r >= R.j[0].nu) {
        r -= R.j[0].nu;
        j = 1;
        if (r >= R.j[1].nu) {
            r -= R.j[1].nu;
            j = 2;
        }
    }
    it.job = j;
    it.row = r*MK_J(R, j, rpt);   // (the tile's first row)
}

// a warp's first unit: warp w of block b starts at unit w*blocks + b, so units past the first round of warps go to
// every SM's warps in turn, not to the first blocks' (the phase lasts as long as the busiest SM: measured 1.04x on
// the H200, session 18); R.spread = 0 (GGML_MK_VAR_BLOCK_UNITS): b*warps + w, the order before
MK_DEVICE mk_it mk_it_first(const mk_mvr & R) {
    const int w = threadIdx.x / WARP_SIZE;
    mk_it it = { R.spread ? (int) (w*gridDim.x + blockIdx.x) : (int) (blockIdx.x*MK_WARPS + w), 0, 0, 0, 0, 0 };
    mk_it_set(R, it);
    return it;
}

MK_DEVICE void mk_it_next(const mk_mvr & R, mk_it & it, int ns) {
    it.st = it.st + 1 < ns ? it.st + 1 : 0;
    if (++it.seg < MK_J(R, it.job, nseg)) {
        return;
    }
    it.seg = 0;
    if (R.pair && ++it.sub < 2) {
        it.job = 1;
        return;
    }
    it.sub = 0;
    it.u  += gridDim.x*MK_WARPS;
    mk_it_set(R, it);
}

// the tile's bytes and groups: groups g0 .. g0+ng-1 (32 values each) of the row
MK_DEVICE const uint8_t * mk_tile(const mk_mvr & R, const mk_it & it, int & nbytes, int & g0, int & ng) {
    const int  tb   = MK_J(R, it.job, tb);
    const bool last = it.seg == MK_J(R, it.job, nseg) - 1;
    g0     = it.seg*MK_J(R, it.job, tg);
    ng     = last ? MK_J(R, it.job, lg) : MK_J(R, it.job, tg);
    nbytes = last ? MK_J(R, it.job, lb) : tb;
    const int rpt = MK_J(R, it.job, rpt);
    if (rpt > 1) {   // packed rows (one tile each, back to back): ng and g0 are one row's
        nbytes *= min(rpt, MK_J(R, it.job, ne1) - it.row);
    }
    return MK_J(R, it.job, data) + (size_t) it.row*MK_J(R, it.job, nb1) + it.seg*tb;
}

// this warp's stage st (< ns stages per warp)
MK_DEVICE uint8_t * mk_stage_buf(uint8_t * ws, int ns, int st) {
    return ws + ((threadIdx.x / WARP_SIZE)*ns + st)*MK_STAGE_BYTES;
}

// wait until at most n (< MK_NS_MAX) copy groups of this thread are pending
MK_DEVICE void mk_cp_async_wait_n(int n) {
    switch (n) {
        case 0:  mk_cp_async_wait<0>(); break;
        case 1:  mk_cp_async_wait<1>(); break;
        case 2:  mk_cp_async_wait<2>(); break;
        case 3:  mk_cp_async_wait<3>(); break;
        case 4:  mk_cp_async_wait<4>(); break;
        case 5:  mk_cp_async_wait<5>(); break;
        case 6:  mk_cp_async_wait<6>(); break;
        default: mk_cp_async_wait<MK_NS_MAX - 1>(); break;
    }
}
static_assert(MK_NS_MAX == 8, "mk_cp_async_wait_n covers n < MK_NS_MAX");

// a warp's bulk copies (mk_args.bulk): one mbarrier per stage, and the parity of each stage's next
// completion (bit s: stage s), kept in a register by the mat-vec that waits and written back when it ends
struct mk_bulk {
    unsigned long long bar[MK_NS_MAX];
    unsigned ph;
    unsigned pad;
};

// start the copy of one tile into its stage (16-byte pieces from the aligned-down start); one commit group,
// or with bk (the block's mk_bulk per warp, mk_args.bulk) one bulk copy by lane 0
MK_DEVICE void mk_fetch(const mk_mvr & R, const mk_it & it, uint8_t * ws, int ns, mk_bulk * bk) {
    if (bk != nullptr && threadIdx.x % WARP_SIZE != 0) {
        return;
    }
    if (it.u < R.units) {
        int nbytes, g0, ng;
        const uint8_t * src = mk_tile(R, it, nbytes, g0, ng);
        const uintptr_t a0 = (uintptr_t) src & ~(uintptr_t) 15;
        const uintptr_t a1 = ((uintptr_t) src + nbytes + 15) & ~(uintptr_t) 15;
        const int n16 = (int) ((a1 - a0)/16);
        uint8_t * dst = mk_stage_buf(ws, ns, it.st);
        if (bk != nullptr) {
            mk_bulk_copy(dst, (const void *) a0, (unsigned) (16*n16), &bk[threadIdx.x / WARP_SIZE].bar[it.st]);
            return;
        }
        // marked first to leave L2: the weights stream through once per step, and they pushed code, KV rows and
        // activations out of L2 (measured 1.065x the whole step on E4B against L2's normal policy)
        for (int c = threadIdx.x % WARP_SIZE; c < n16; c += WARP_SIZE) {
            mk_cp_async16(dst + 16*c, (const void *) (a0 + 16*c));
        }
    }
    if (bk == nullptr) {
        mk_cp_async_commit();
    }
}

// wait until this warp's tile in stage st is there: pend = the copy groups committed after it; with bk, on the
// stage's mbarrier (ph: this warp's parities, see mk_bulk); then the warp's lanes may read the stage
MK_DEVICE void mk_tile_wait(mk_bulk * bk, unsigned & ph, int st, int pend) {
    if (bk != nullptr) {
        mk_mbar_wait(&bk[threadIdx.x / WARP_SIZE].bar[st], (ph >> st) & 1u);
        ph ^= 1u << st;
    } else {
        mk_cp_async_wait_n(pend);
    }
    __syncwarp();
}

// issue this warp's first ns - 1 tiles of a mat-vec: may run before the grid barrier that
// precedes it (the weights do not depend on the barrier), so the loads overlap the wait. Returns where the
// fetches go on (the tile after them), for mk_mv_run: it need not walk the first ns - 1 tiles again
MK_DEVICE_FN mk_it mk_mv_begin(const mk_mvr & R, uint8_t * ws, int ns, mk_bulk * bk) {
    mk_it it = mk_it_first(R);
    for (int i = 0; i < ns - 1; ++i) {
        mk_fetch(R, it, ws, ns, bk);
        if (it.u < R.units) {
            mk_it_next(R, it, ns);
        }
    }
    return it;
}

// staged inputs: [m][KG groups of 36 floats], KG = mk_kg(K); values past K are zero
// the staging works on 4 consecutive values at a time ("slots"): column m's slot f (values 4f .. 4f+3) belongs
// to thread f % MK_THREADS for every m and M, so each column's sums have the same order in any batch.
// MK_SB slots per thread are loaded at a time (all their loads in flight before the first is used)
#ifndef MK_SB
#define MK_SB 2
#endif

MK_DEVICE float4 mk_f4(float a, float b, float c, float d) {
    float4 r;
    r.x = a; r.y = b; r.z = c; r.w = d;
    return r;
}

// inputs are read as 16-byte vectors: every row length and leading dimension of a mat-vec input is a multiple
// of 4 and every input and norm vector is 16-byte aligned (ggml_backend_mk_create refuses a plan otherwise)
MK_DEVICE float mk_sq4(const float4 & v, float s) {
    s = fmaf(v.x, v.x, s);
    s = fmaf(v.y, v.y, s);
    s = fmaf(v.z, v.z, s);
    return fmaf(v.w, v.w, s);
}

MK_DEVICE float4 mk_mul4(const float4 & a, const float4 & b) {
    return mk_f4(__fmul_rn(a.x, b.x), __fmul_rn(a.y, b.y), __fmul_rn(a.z, b.z), __fmul_rn(a.w, b.w));
}

MK_DEVICE float4 mk_scale4(const float4 & a, float s) {
    return mk_f4(__fmul_rn(a.x, s), __fmul_rn(a.y, s), __fmul_rn(a.z, s), __fmul_rn(a.w, s));
}

// a staging item's arithmetic, one copy for mk_stage and mk_stage_cols: slot f of column mm's inputs: va from x.a, vb from
// x.b (GEGLU) or the pending residual's h (zeros where !ok) ...
MK_DEVICE void mk_stage_ld(const mk_xin & x, size_t mm, int f, bool ok, float4 & va, float4 & vb) {
    const float4 z4 = mk_f4(0.0f, 0.0f, 0.0f, 0.0f);
    const bool gl  = x.mode == MK_X_GEGLU;
    const bool res = x.res_h != nullptr;
    va = ok ? mk_ldcg4((const float4 *) (x.a + mm*x.lda) + f) : z4;
    vb = ok && gl  ? mk_ldcg4((const float4 *) (x.b + mm*x.ldb) + f)
       : ok && res ? mk_ldcg4((const float4 *) (x.res_h + mm*x.lda) + f) : z4;
}

// ... and the slot's value: gelu(a)*b, or the residual step (a + h*rms(h)*res_nw)*res_scale (rh = rms(h), vw = res_nw's
// slot), or a
MK_DEVICE float4 mk_stage_val(const mk_xin & x, const float4 & va, const float4 & vb, const float4 & vw, float rh) {
    if (x.mode == MK_X_GEGLU) {
        return mk_f4(__fmul_rn(mk_gelu(va.x), vb.x), __fmul_rn(mk_gelu(va.y), vb.y),
                     __fmul_rn(mk_gelu(va.z), vb.z), __fmul_rn(mk_gelu(va.w), vb.w));
    }
    if (x.res_h != nullptr) {
        const float4 hn = mk_mul4(mk_scale4(vb, rh), vw);
        return mk_scale4(mk_f4(__fadd_rn(va.x, hn.x), __fadd_rn(va.y, hn.y), __fadd_rn(va.z, hn.z), __fadd_rn(va.w, hn.w)),
                         x.res_scale);
    }
    return va;
}

// where slot f of column m sits in the staged values (MK_XS_GROUP bytes per 32-value group)
MK_DEVICE float4 * mk_stage_xs(float * xs, int m, int KG, int f) {
    return (float4 *) (xs + (size_t) m*KG*36 + (f/8)*36 + 4*(f%8));
}

// the 8-bit rounding of slot f (values 4f .. 4f+3) into its group's record (llama.cpp's q8_1: d = max|x|/127,
// q = round(x*(1/d)): one division per slot, not four); the group's 8 slots are on 8 consecutive lanes, and every
// lane of the warp must call this (shuffles); ok = false: a lane with no slot here (it still takes part in the shuffles);
// pair: the same record also into the cluster partner's inputs (a staging split over a pair of blocks)
MK_DEVICE void mk_q8_slot(const float4 & v, int f, bool ok, uint8_t * rec, bool pair = false) {
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    MK_UNROLL
    for (int o = 1; o < 8; o <<= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, o));
    }
    const float d  = amax/127.0f;
    const float id = amax != 0.0f ? 1.0f/d : 0.0f;
    int q[4];
    q[0] = __float2int_rn(__fmul_rn(v.x, id));
    q[1] = __float2int_rn(__fmul_rn(v.y, id));
    q[2] = __float2int_rn(__fmul_rn(v.z, id));
    q[3] = __float2int_rn(__fmul_rn(v.w, id));
    float sq = (float) (q[0] + q[1] + q[2] + q[3]);   // exact: |sum| <= 32*127
    MK_UNROLL
    for (int o = 1; o < 8; o <<= 1) {
        sq += __shfl_xor_sync(0xffffffff, sq, o);
    }
    if (ok) {
        const unsigned w = (unsigned) (q[0] & 0xff) | (unsigned) (q[1] & 0xff) << 8 |
                           (unsigned) (q[2] & 0xff) << 16 | (unsigned) (q[3] & 0xff) << 24;
        ((unsigned *) rec)[f % 8] = w;
        if (pair) {
            mk_cluster_st((unsigned *) rec + f % 8, mk_cluster_rank() ^ 1, w);
        }
        if (f % 8 == 0) {
            ((float *) (rec + 32))[0] = d;
            ((float *) (rec + 32))[1] = sq;
            if (pair) {
                mk_cluster_st((float *) (rec + 32), mk_cluster_rank() ^ 1, d);
                mk_cluster_st((float *) (rec + 32) + 1, mk_cluster_rank() ^ 1, sq);
            }
        }
    }
}

// the rest of a staging item of column m (of the pass at m0), slot f, with its value v: the new residual row (wr: this
// block writes column m's rows; block 0 without clusters), the norm's sum of squares ss and vector slot vn, then the
// 8-bit record (direct: every lane of the warp comes here) or the staged value. F4, F: the slots with values, with
// padding. pair: a staging split over a pair of blocks (mk_stage_pass): the partner's inputs get every final value
// too (the staged value only if no norm scales it later, mk_stage_round); its addresses are made at each store (no
// registers held across the staging: mk_mv_run's registers around the call stay as they are)
MK_DEVICE void mk_stage_put(const mk_xin & x, float4 v, const float4 & vn, float & ss, int m0, int m, int f, int F4, int F,
                            int KG, bool direct, float * xs, uint8_t * xq, bool wr, bool pair = false) {
    const bool ok = f < F;   // (zeros past K; a lane past F still runs the shuffles of the direct rounding)
    if (x.res_h != nullptr && x.mode != MK_X_GEGLU && wr && f < F4) {
        ((float4 *) (x.res_out + (size_t) (m0 + m)*x.lda))[f] = v;
    }
    if (x.nw) {
        ss = mk_sq4(v, ss);
        v = mk_mul4(v, vn);
    }
    if (direct) {
        uint8_t * rec = xq + (size_t) (m*KG + mk_rec_slot(f/8))*MK_XQ_REC;
        mk_q8_slot(v, f, ok, rec, pair);
    } else if (ok) {
        float4 * p = mk_stage_xs(xs, m, KG, f);
        *p = v;
        if (pair && !x.nw) {
            mk_cluster_st(p, mk_cluster_rank() ^ 1, v);
        }
    }
}

// the second round of a staging item: its staged value scaled by the norm's 1/rms sc (the block that writes column m's
// rows, wr, also writes it to nw_out), then rounded to 8 bits (q8: every lane of the warp comes here); pair as in
// mk_stage_put
MK_DEVICE void mk_stage_round(const mk_xin & x, float sc, int m0, int m, int f, int K, int F, int KG, bool q8, float * xs,
                              uint8_t * xq, bool wr, bool pair = false) {
    const bool ok = f < F;
    float4 * p = mk_stage_xs(xs, m, KG, f);
    float4 v = ok ? *p : mk_f4(0.0f, 0.0f, 0.0f, 0.0f);
    if (x.nw) {
        v = mk_scale4(v, sc);
        if (ok) {
            *p = v;
            if (pair) {
                mk_cluster_st(p, mk_cluster_rank() ^ 1, v);
            }
        }
        if (x.nw_out && wr && f < K/4) {
            ((float4 *) (x.nw_out + (size_t) (m0 + m)*K))[f] = v;
        }
    }
    if (q8) {
        uint8_t * rec = xq + (size_t) (m*KG + mk_rec_slot(f/8))*MK_XQ_REC;
        mk_q8_slot(v, f, ok, rec, pair);
    }
}

// a plain mat-vec's inputs staged once for the grid, not by every block: where every job takes the 8-bit records
// (mk_mv_direct) and no residual step is pending (O's, down's, the per-layer projection's inputs, a draft's pre/post
// projections), each block rounds its slice of the groups of every column to records in global memory (mk_stage_once:
// the arithmetic of every block's own staging, the same bits), a grid barrier, and every block copies all of them
// (mk_stage_copy) instead of loading and rounding all of a column's values itself. The barrier costs ~1.3 us (H100,
// floor.cu's staging study, session 35), so by default only where a step stages at least MK_ONCE_MIN values that way
// (E4B: down's 10240 at every M, O's 2048 from 4 tokens on); GGML_MK_VAR_ONCE_ALL: always, GGML_MK_VAR_STAGE_EVERY:
// never. A column wider than the host's buffer (xrec_k) is staged by every block
#define MK_ONCE_MIN 8192
MK_HOSTDEV bool mk_once_on(const mk_mvr & R, const mk_xin & x, int M, const uint8_t * xrec, int xrec_k, int flags) {
    const int K = R.j[0].ne0;
    return R.units > 0 && xrec != nullptr && mk_mv_direct(R) && x.res_h == nullptr && !(flags & GGML_MK_VAR_STAGE_EVERY) &&
           mk_kg(K)*32 <= xrec_k && ((flags & GGML_MK_VAR_ONCE_ALL) || M*K >= MK_ONCE_MIN);
}

// host: mk_args.xrec_k for a model (draft: the draft launch's n_embd_bb, whose pre-projection takes 2*n_embd_bb values;
// 0 for a decode kernel): the widest mat-vec input of a step, in whole groups; its buffer: MK_M*xrec_k/32 records
static inline int mk_xrec_k(const ggml_mk_model & md, int n_embd_bb) {
    int k = md.n_embd > md.max_q ? md.n_embd : md.max_q;
    k = k > md.max_ff ? k : md.max_ff;
    k = k > md.n_embd_pl ? k : md.n_embd_pl;
    k = k > 2*n_embd_bb ? k : 2*n_embd_bb;
    return mk_kg(k)*32;
}

// this block's slice of a plain mat-vec's inputs (mk_once_on): groups KG*b/grid .. KG*(b + 1)/grid - 1 of each of the M
// columns, 8 consecutive slots of a group on 8 consecutive lanes (mk_q8_slot), into rec ([M][KG] records)
MK_DEVICE_FN void mk_stage_once(const mk_xin & x, int K, int M, uint8_t * rec) {
    const int KG = mk_kg(K);
    const int g0 = (int) ((long long) KG*blockIdx.x/gridDim.x);
    const int g1 = (int) ((long long) KG*(blockIdx.x + 1)/gridDim.x);
    const int F  = (g1 - g0)*8;   // the slice's slots per column, padding included
    const int F4 = K/4;           // slots with values
    const int NI = F*M;
    const float4 z4 = mk_f4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int i0 = 0; i0 < NI; i0 += MK_THREADS) {   // (every lane of a warp takes every round: the rounding's shuffles)
        const int  i  = i0 + (int) threadIdx.x;
        const bool ok = i < NI;   // (whole groups: NI and MK_THREADS are multiples of 8)
        const int  m  = ok ? i/F : 0;
        const int  f  = g0*8 + (ok ? i % F : 0);
        float4 va, vb;
        mk_stage_ld(x, (size_t) m, f, ok && f < F4, va, vb);
        mk_q8_slot(mk_stage_val(x, va, vb, z4, 0.0f), f, ok, rec + ((size_t) m*KG + mk_rec_slot(f/8))*MK_XQ_REC);
    }
}

// a pass's records staged once for the grid (after the grid barrier behind mk_stage_once) into this block's inputs: n bytes
// (a multiple of 16) from src, 4 loads of 16 bytes in flight per thread; then the block's barrier. Out of line, as the
// stagings are: mk_mv_run sits at the register cap
MK_DEVICE_FN void mk_stage_copy(const uint8_t * src, uint8_t * dst, int n) {
    const uint4 * s4 = (const uint4 *) src;
    uint4       * d4 = (uint4 *) dst;
    const int n16 = n/16;
    int i = threadIdx.x;
    for (; i + 3*MK_THREADS < n16; i += 4*MK_THREADS) {
        const uint4 v0 = mk_ldcg_u32x4(s4 + i);
        const uint4 v1 = mk_ldcg_u32x4(s4 + i + MK_THREADS);
        const uint4 v2 = mk_ldcg_u32x4(s4 + i + 2*MK_THREADS);
        const uint4 v3 = mk_ldcg_u32x4(s4 + i + 3*MK_THREADS);
        d4[i] = v0;
        d4[i + MK_THREADS] = v1;
        d4[i + 2*MK_THREADS] = v2;
        d4[i + 3*MK_THREADS] = v3;
    }
    for (; i < n16; i += MK_THREADS) {
        d4[i] = mk_ldcg_u32x4(s4 + i);
    }
    __syncthreads();
}

// f(m) for each column m < Mc of a pass (Mc <= MC): for MC <= MK_MC_SMALL unrolled, so that per-column arrays
// indexed by m stay in registers; else a run-time loop (small code: the staging runs from a cold instruction cache)
template <int MC, typename F>
MK_DEVICE void mk_cols(int Mc, F f) {
    if constexpr (MC <= MK_MC_SMALL) {
        MK_UNROLL
        for (int m = 0; m < MC; ++m) {
            if (MC == 1 || m < Mc) {
                f(m);
            }
        }
    } else {
#pragma unroll 1
        for (int m = 0; m < Mc; ++m) {
            f(m);
        }
    }
}

// v[m] of a per-column array, m known at run time only: selects over registers where MC <= MK_MC_SMALL
template <int MC>
MK_DEVICE float mk_col_get(const float (&v)[MC], int m) {
    if constexpr (MC <= MK_MC_SMALL) {
        float r = v[0];
        MK_UNROLL
        for (int c = 1; c < MC; ++c) {
            r = c == m ? v[c] : r;
        }
        return r;
    } else {
        return v[m];
    }
}

template <int MC>
MK_DEVICE void mk_col_set(float (&v)[MC], int m, float x) {
    if constexpr (MC <= MK_MC_SMALL) {
        MK_UNROLL
        for (int c = 0; c < MC; ++c) {
            v[c] = c == m ? x : v[c];
        }
    } else {
        v[m] = x;
    }
}

// ss[m] (m < Mc <= MC) = the block's sum of every thread's ss[m], in a fixed order (warp butterflies, then the
// warps in order), returned to every thread; red: MK_WARPS*MK_M floats not in use by another sum. own (MC <=
// MK_MC_SMALL): only the columns m whose bit is set (the others' ss are left as they are)
template <int MC>
MK_DEVICE void mk_block_sums(float (&ss)[MC], int Mc, float * red, unsigned own = ~0u) {
    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    mk_cols<MC>(Mc, [&](int m) {
        if (MC > MK_MC_SMALL || ((own >> m) & 1)) {
            const float s = mk_warp_sum(ss[m]);
            if (lane == 0) {
                red[warp*MK_M + m] = s;
            }
        }
    });
    __syncthreads();
    mk_cols<MC>(Mc, [&](int m) {
        if (MC <= MK_MC_SMALL && !((own >> m) & 1)) {
            return;
        }
        float t = 0.0f;
        for (int w = 0; w < MK_WARPS; ++w) {
            t += red[w*MK_M + m];
        }
        ss[m] = t;
    });
}

// a thread's staging items in order: item i is column i / NJ, slot t + (i % NJ)*MK_THREADS; walked with a cursor
// (no run-time division per item: ncu of session 14 found them costly; session 26 found a verify step's staging bound
// by its dependent rounds of loads more than by its instructions, see mk_stage_cols)
struct mk_item {
    int m;   // column
    int f;   // slot
};

MK_DEVICE void mk_item_next(mk_item & it, int t, int fe, int cs = 1) {   // fe = t + NJ*MK_THREADS; cs: column step
    it.f += MK_THREADS;
    if (it.f >= fe) {
        it.f = t;
        it.m += cs;
    }
}

// the fused draft kernel's launches are never clustered (mk_step_cl is the decode/verify launch's): its module
// (GGML_MK_DRAFT_KERNEL) leaves the split stagings out, so that its code stays that of the unclustered staging
#ifdef GGML_MK_DRAFT_KERNEL
#define MK_CLUSTERS 0
#else
#define MK_CLUSTERS 1
#endif

// a staging split over a pair of blocks (pair: a launch in clusters of 2, mk_stage_cols and the any-batch mk_stage):
// a later pass of a mat-vec first waits for the partner to be done with the inputs of the pass before (the staging
// writes into its shared memory too); the end of a staging is a cluster barrier, after which both halves are in both
// blocks (else the block's barrier)
MK_DEVICE void mk_stage_pass(bool pair, int m0) {
    if (pair && m0 > 0) {
        mk_cluster_sync();
    }
}
// the rank of the pair's block that stages column m of a pass (0 without a pair): the blocks take the columns by
// parity; the rows for the host and the next residual step come from that rank's block of cluster 0, i.e. the block
// whose index is this rank
MK_DEVICE int mk_stage_owner(bool pair, int m) {
    return pair ? (m & 1) : 0;
}
MK_DEVICE void mk_stage_end(bool pair) {
    if (pair) {
        mk_cluster_sync();   // (also the block's barrier)
    } else {
        __syncthreads();
    }
}

// stage columns m0 .. m0+Mc-1 of the inputs into xs (every block its own copy), and into xq if q8; direct (no
// norm, only 8-bit inputs wanted): the records are made from registers and xs is not written. With a pending
// residual the column is a' = (a + h*rms(h)*res_nw)*res_scale (block 0 also writes a' to res_out); with nw it
// is rmsnorm(a')*nw (block 0 also writes it to nw_out, if given). Global round trips: one for rms(h) (if any),
// one for the values (MK_SB slots per thread in flight); the norm scale and the 8-bit rounding then work on
// shared memory and registers only. Small code on purpose (the columns of the any-batch code are a run-time loop):
// every phase runs it once per block, from a cold instruction cache. MC: the bound of Mc the code is made for (1:
// one-token steps; MK_MC_SMALL: small verify batches, both with the per-column values in registers; MK_M: any
// batch); a column's arithmetic is the same in all. MK_SB: the items per thread whose loads are in flight at once in the
// pending residual's rms round and in the values' round (other batches of the same items in the same order would give
// the same sums, the same bits). In a launch as clusters of 2 blocks (mk_step_cl), the
// any-batch code (MC > MK_MC_SMALL) stages only the columns of its rank's parity, into both blocks' shared memory, as
// mk_stage_cols does for small batches.
// the block sums' scratch of mk_stage: one array for all its instances (a static array in each would be one more block
// of static shared memory per instance, held by every block of the launch and taken from the dynamic region; session
// 20 measured the one array against one per instance: no difference in speed, A/B)
MK_DEVICE float * mk_stage_red() {
    MK_SHARED(float, red, 2*MK_WARPS*MK_M);
    return red;
}

template <int MC>
MK_DEVICE_FN void mk_stage(const mk_xin & x, int K, int m0, int Mc, float eps, float * xs, uint8_t * xq, bool q8,
                           bool direct, unsigned long long * prof) {
    float * red = mk_stage_red();
    const int  KG  = mk_kg(K);
    const int  F   = KG*8;                                  // slots per column, padding included
    const int  F4  = K/4;                                   // slots with values
    const int  NJ  = (F + MK_THREADS - 1)/MK_THREADS;      // slots per thread per column
    // a pair of blocks (the any-batch code only): this block's columns are c0, c0 + 2, ... (its rank's parity)
    const bool pair = MK_CLUSTERS && MC > MK_MC_SMALL && mk_cluster_size() > 1;
    const int  c0   = pair ? mk_cluster_rank() : 0;   // (the columns m with mk_stage_owner(pair, m) == c0)
    const int  cs   = pair ? 2 : 1;
    const int  NI  = (Mc - c0 + cs - 1)/cs*NJ;             // this block's items
    const int  t   = threadIdx.x;
    const bool res = x.res_h != nullptr;
    const bool gl  = x.mode == MK_X_GEGLU;
    const float4 z4 = mk_f4(0.0f, 0.0f, 0.0f, 0.0f);
    float ss[MC];   // per column: sums of squares, then 1/rms (in registers for MC <= MK_MC_SMALL: mk_cols, mk_col_get)
    float rh[MC];
#define MK_COL(it) (MC == 1 ? 0 : (it).m)   // an item's column (a one-column pass: 0)
    const int  fe  = t + NJ*MK_THREADS;                     // (mk_item_next)
    mk_stage_pass(pair, m0);
    // every item in one batch (a one-token step's column): the pending residual's rms is taken from the batch's
    // loads below (the same values and sums in the same order as this separate round of loads)
    const bool one = NI <= MK_SB;

    if (res && !one) {
        mk_cols<MC>(Mc, [&](int m) { ss[m] = 0.0f; });
        mk_item it = { c0, t };
#pragma unroll 1
        for (int i0 = 0; i0 < NI; i0 += MK_SB) {
            float4 v[MK_SB];
            int    mb[MK_SB];
            MK_UNROLL
            for (int b = 0; b < MK_SB; ++b) {
                mb[b] = MK_COL(it);
                v[b] = i0 + b < NI && it.f < F4 ? mk_ldcg4((const float4 *) (x.res_h + (size_t) (m0 + mb[b])*x.lda) + it.f) : z4;
                mk_item_next(it, t, fe, cs);
            }
            MK_UNROLL
            for (int b = 0; b < MK_SB; ++b) {
                if (i0 + b < NI) {
                    mk_col_set<MC>(ss, mb[b], mk_sq4(v[b], mk_col_get<MC>(ss, mb[b])));
                }
            }
        }
        mk_block_sums<MC>(ss, Mc, red);
        mk_cols<MC>(Mc, [&](int m) { rh[m] = 1.0f/sqrtf(ss[m]/K + eps); });
        mk_prof_at(prof, MK_PH_ST_RMS);
    }

    mk_cols<MC>(Mc, [&](int m) { ss[m] = 0.0f; });
    mk_item it = { c0, t };
#pragma unroll 1
    for (int i0 = 0; i0 < NI; i0 += MK_SB) {
        float4 va[MK_SB], vb[MK_SB], vw[MK_SB], vn[MK_SB];
        int    mb[MK_SB], fb[MK_SB];   // the items' columns and slots
        MK_UNROLL
        for (int b = 0; b < MK_SB; ++b) {   // every load of the batch first
            const int i = i0 + b;
            const int f = it.f;
            mb[b] = MK_COL(it);
            fb[b] = f;
            mk_item_next(it, t, fe, cs);
            const bool ok = i < NI && f < F4;
            mk_stage_ld(x, (size_t) (m0 + mb[b]), f, ok, va[b], vb[b]);
            vw[b] = ok && res  ? ((const float4 *) x.res_nw)[f] : z4;
            vn[b] = ok && x.nw ? ((const float4 *) x.nw)[f] : z4;
        }
        if (res && one) {
            mk_cols<MC>(Mc, [&](int m) { ss[m] = 0.0f; });
            MK_UNROLL
            for (int b = 0; b < MK_SB; ++b) {   // (i0 = 0: the batch holds every item)
                if (b < NI) {
                    mk_col_set<MC>(ss, mb[b], mk_sq4(vb[b], mk_col_get<MC>(ss, mb[b])));
                }
            }
            mk_block_sums<MC>(ss, Mc, red);
            mk_cols<MC>(Mc, [&](int m) {
                rh[m] = 1.0f/sqrtf(ss[m]/K + eps);
                ss[m] = 0.0f;
            });
            mk_prof_at(prof, MK_PH_ST_RMS);
        }
        MK_UNROLL
        for (int b = 0; b < MK_SB; ++b) {
            const int i = i0 + b;
            if (i >= NI) {
                continue;
            }
            const int m = mb[b];
            float s = mk_col_get<MC>(ss, m);
            mk_stage_put(x, mk_stage_val(x, va[b], vb[b], vw[b], res && !gl ? mk_col_get<MC>(rh, m) : 0.0f), vn[b], s, m0, m,
                         fb[b], F4, F, KG, direct, xs, xq, (int) blockIdx.x == mk_stage_owner(pair, m), pair);
            if (x.nw) {
                mk_col_set<MC>(ss, m, s);
            }
        }
    }
    mk_prof_at(prof, MK_PH_ST_LOAD);
    if (direct) {
        mk_stage_end(pair);
        return;
    }
    if (x.nw) {
        mk_block_sums<MC>(ss, Mc, red + MK_WARPS*MK_M);
        mk_cols<MC>(Mc, [&](int m) { ss[m] = 1.0f/sqrtf(ss[m]/K + eps); });
    } else {
        __syncthreads();
    }
    mk_prof_at(prof, MK_PH_ST_NORM);

    // the norm's scale, and the 8-bit rounding of each 32-value group (8 consecutive lanes hold one group;
    // every lane of a warp runs the shuffles)
    if (x.nw || q8) {
        mk_item it = { c0, t };
#pragma unroll 1
        for (int i = 0; i < NI; ++i, mk_item_next(it, t, fe, cs)) {
            const int m = MK_COL(it);
            mk_stage_round(x, x.nw ? mk_col_get<MC>(ss, m) : 0.0f, m0, m, it.f, K, F, KG, q8, xs, xq,
                           (int) blockIdx.x == mk_stage_owner(pair, m), pair);
        }
        mk_stage_end(pair);
        mk_prof_at(prof, MK_PH_ST_Q8);
    } else if (pair) {
        mk_cluster_sync();
    }
#undef MK_COL
}

// mk_stage for a small verify batch (Mc <= MC <= MK_MC_SMALL columns) slot by slot: each round of loads takes this
// thread's slot j of every column at once (the norm vectors' slot once for all columns), and the columns are
// compile-time indices (their sums and scales stay in registers, no selects), so a batch of Mc columns needs NJ
// dependent round trips, not Mc*NJ/MK_SB, and the columns' 8-bit roundings (shuffles) interleave. A column's slots are
// still taken in order j = 0, 1, ... by the same thread with mk_stage's arithmetic (mk_stage_ld, mk_stage_val,
// mk_stage_put, mk_stage_round), and its sums go through the same mk_block_sums: the same bits as mk_stage. Measured on
// the H200 (E4B, session 26) against mk_stage<MK_MC_SMALL> (GGML_MK_VAR_ITEM_STAGE): verify of 3 tokens 0.963x, of 4
// 0.945x. (Two slots a round for up to 2 columns, and batches of 5..8 in groups of 4, were measured too and dropped:
// another call site of these functions cost the any-batch mat-vec registers, its steps of 5 ran ~10 % slower;
// NOTES.md session 26.)
// r[m] = 1/rms of columns m < Mc whose per-thread sums of squares of K values are ss[m] (block-wide, mk_block_sums;
// r may be ss itself; own: the columns taken, mk_block_sums)
template <int MC>
MK_DEVICE void mk_cols_rms(float (&ss)[MC], float (&r)[MC], int Mc, int K, float eps, float * red, unsigned own) {
    mk_block_sums<MC>(ss, Mc, red, own);
    MK_UNROLL
    for (int m = 0; m < MC; ++m) {
        r[m] = 1.0f/sqrtf(ss[m]/K + eps);
    }
}

// In a launch as clusters of 2 blocks (mk_step_cl; mk_cluster_size() == 2), each block of
// the pair takes every other column of the pass (column m: the block of rank m % 2), the whole of each column's
// arithmetic as above (the same bits), and stores every final byte (staged values, 8-bit records) into its own and its
// partner's shared memory; the cluster barrier at the end makes both halves whole in both blocks. The rows written for
// the host and the next residual step (res_out, nw_out) come from the block of cluster 0 that staged the column. Measured
// (H100, NOTES.md session 31): verify launches of 2..5 tokens 0.93-0.94x those staged whole in every block, bits equal
template <int MC>
MK_DEVICE_FN void mk_stage_cols(const mk_xin & x, int K, int m0, int Mc, float eps, float * xs, uint8_t * xq, bool q8,
                                bool direct, bool sr2, unsigned long long * prof) {
    static_assert(MC <= MK_MC_SMALL, "the columns in registers");
    float * red = mk_stage_red();
    const bool pair = MK_CLUSTERS && mk_cluster_size() > 1;   // (of 2: mk_step_cl)
    // the columns this block stages, and the same as a bit per column (the rank is read where it is needed: nothing held
    // in registers)
    auto on  = [&](int m) { return m < Mc && mk_stage_owner(pair, m) == (pair ? mk_cluster_rank() : 0); };
    auto own = [&]() { return pair ? (mk_cluster_rank() ? 0xAAAAu : 0x5555u) : ~0u; };   // (mk_stage_owner's parity)
    mk_stage_pass(pair, m0);
    const int  KG  = mk_kg(K);
    const int  F   = KG*8;                                  // slots per column, padding included
    const int  F4  = K/4;                                   // slots with values
    const int  NJ  = (F + MK_THREADS - 1)/MK_THREADS;      // slots per thread per column
    const int  t   = threadIdx.x;
    const bool res = x.res_h != nullptr;
    const bool gl  = x.mode == MK_X_GEGLU;
    const float4 z4 = mk_f4(0.0f, 0.0f, 0.0f, 0.0f);
    float ss[MC];
    float rh[MC];
    // every slot in one round: the pending residual's rms is taken from that round's loads
    const bool one = NJ == 1;

    if (res && !one) {
        MK_UNROLL
        for (int m = 0; m < MC; ++m) {
            ss[m] = 0.0f;
        }
        // RB slots a round (mk_mvr.sr2: 2, the default; 1 under GGML_MK_VAR_STAGE_ROUND1): E4B's rows of 2560 (2 slots a
        // thread) in one round trip instead of 2, the same registers as the values' round below (2 x MC float4); the
        // sums in slot order either way (the same bits)
        const int RB = sr2 ? 2 : 1;
#pragma unroll 1
        for (int j0 = 0; j0 < NJ; j0 += RB) {
            float4 v[2][MC];
            MK_UNROLL
            for (int b = 0; b < 2; ++b) {
                const int j = j0 + b;
                const int f = t + j*MK_THREADS;
                MK_UNROLL
                for (int m = 0; m < MC; ++m) {
                    v[b][m] = on(m) && f < F4 && b < RB && j < NJ ? mk_ldcg4((const float4 *) (x.res_h + (size_t) (m0 + m)*x.lda) + f) : z4;
                }
            }
            MK_UNROLL
            for (int b = 0; b < 2; ++b) {
                if (b < RB && j0 + b < NJ) {
                    MK_UNROLL
                    for (int m = 0; m < MC; ++m) {
                        ss[m] = mk_sq4(v[b][m], ss[m]);
                    }
                }
            }
        }
        mk_cols_rms<MC>(ss, rh, Mc, K, eps, red, own());
        mk_prof_at(prof, MK_PH_ST_RMS);
    }

    MK_UNROLL
    for (int m = 0; m < MC; ++m) {
        ss[m] = 0.0f;
    }
#pragma unroll 1
    for (int j = 0; j < NJ; ++j) {
        const int  f   = t + j*MK_THREADS;
        const bool okv = f < F4;
        float4 va[MC], vb[MC];
        MK_UNROLL
        for (int m = 0; m < MC; ++m) {   // every load of the round first
            mk_stage_ld(x, (size_t) (m0 + m), f, on(m) && okv, va[m], vb[m]);
        }
        const float4 vw = okv && res  ? ((const float4 *) x.res_nw)[f] : z4;
        const float4 vn = okv && x.nw ? ((const float4 *) x.nw)[f] : z4;
        if (res && one) {
            MK_UNROLL
            for (int m = 0; m < MC; ++m) {
                ss[m] = mk_sq4(vb[m], ss[m]);
            }
            mk_cols_rms<MC>(ss, rh, Mc, K, eps, red, own());
            MK_UNROLL
            for (int m = 0; m < MC; ++m) {
                ss[m] = 0.0f;
            }
            mk_prof_at(prof, MK_PH_ST_RMS);
        }
        MK_UNROLL
        for (int m = 0; m < MC; ++m) {
            if (on(m)) {
                mk_stage_put(x, mk_stage_val(x, va[m], vb[m], vw, res && !gl ? rh[m] : 0.0f), vn, ss[m], m0, m, f, F4, F, KG,
                             direct, xs, xq, (int) blockIdx.x == mk_stage_owner(pair, m), pair);
            }
        }
    }
    mk_prof_at(prof, MK_PH_ST_LOAD);
    if (direct) {
        mk_stage_end(pair);
        return;
    }
    if (x.nw) {
        mk_cols_rms<MC>(ss, ss, Mc, K, eps, red + MK_WARPS*MK_M, own());
    } else {
        __syncthreads();
    }
    mk_prof_at(prof, MK_PH_ST_NORM);

    if (x.nw || q8) {
#pragma unroll 1
        for (int j = 0; j < NJ; ++j) {
            MK_UNROLL
            for (int m = 0; m < MC; ++m) {
                if (on(m)) {
                    mk_stage_round(x, ss[m], m0, m, t + j*MK_THREADS, K, F, KG, q8, xs, xq,
                                   (int) blockIdx.x == mk_stage_owner(pair, m), pair);
                }
            }
        }
        mk_stage_end(pair);
        mk_prof_at(prof, MK_PH_ST_Q8);
    } else if (pair) {
        mk_cluster_sync();
    }
}

MK_DEVICE unsigned mk_u32_2a(const uint8_t * p) { // 4 bytes at a 2-byte aligned address
    return (unsigned) *(const uint16_t *) p | ((unsigned) *(const uint16_t *) (p + 2) << 16);
}

// the quants of a Q4_0 block (values 4k.. for k < 4, 16+4(k-4).. after) or a Q8_0 block as 8 words for dp4a,
// from its 16 or 32 quant bytes given as words q[0..] (the caller aligns them)
MK_DEVICE void mk_unpack_q(const unsigned * q, bool is_q4, unsigned (&wq)[8]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        wq[k] = is_q4 ? (k < 4 ? (q[k] & 0x0F0F0F0F) : ((q[k - 4] >> 4) & 0x0F0F0F0F)) : q[k];
    }
}

// block 2p+h (h = 0, 1) of a 4-byte aligned tile, a pair of blocks being 9 words for Q4_0 (d0 | q0[0..1],
// q0[2..13], q0[14..15] | d1, q1) or 17 for Q8_0 (d0 | q0[0..1], ..., q0[30..31] | d1, q1): block 0's quants sit
// 2 bytes off a word, block 1's on words. Without branches, so that h may vary across a warp's lanes (a tile's last
// blocks, mk_pairs): the words from the block's d on, shifted by 16 bits (h = 0) or 32 (h = 1: __funnelshift_rc clamps
// the shift, the next word whole); with h known at compile time this is the code of the two cases written apart
MK_DEVICE float mk_pair_block(const uint8_t * base, int p, int h, bool is_q4, unsigned (&wq)[8]) {
    const int nq = is_q4 ? 4 : 8;   // quant words of a block
    const unsigned * w = (const unsigned *) (base + 4*(2*nq + 1)*p) + h*nq;
    const int sh = 16 + 16*h;
    unsigned v[9];
    unsigned q[8];
#pragma unroll
    for (int k = 0; k < 9; ++k) {
        v[k] = k <= nq ? w[k] : 0;
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        q[k] = k < nq ? __funnelshift_rc(v[k], v[k + 1], sh) : 0;
    }
    mk_unpack_q(q, is_q4, wq);
    return mk_f16((uint16_t) ((v[0] >> (16*h)) & 0xffff));
}

// F32 / F16 / BF16 weights read 4 values at a time (mk_mv_run): the type, and the tile's copy aligned for it (16 bytes
// for F32, 8 for the halves: every such row is, its length a multiple of 4 like every mat-vec input's)
MK_DEVICE bool mk_deq4_ok(int type, const uint8_t * base) {
    return type == GGML_TYPE_F32 ? ((uintptr_t) base & 15) == 0
         : (type == GGML_TYPE_F16 || type == GGML_TYPE_BF16) && ((uintptr_t) base & 7) == 0;
}

// values v .. v+3 of such a tile (mk_deq32's conversions)
MK_DEVICE float4 mk_deq4(const uint8_t * base, int type, int v) {
    if (type == GGML_TYPE_F32) {
        return *(const float4 *) (base + 4*v);
    }
    const uint2 h = *(const uint2 *) (base + 2*v);
    if (type == GGML_TYPE_F16) {
        return mk_f4(mk_f16((uint16_t) (h.x & 0xffff)), mk_f16((uint16_t) (h.x >> 16)),
                     mk_f16((uint16_t) (h.y & 0xffff)), mk_f16((uint16_t) (h.y >> 16)));
    }
    return mk_f4(mk_bf16((uint16_t) (h.x & 0xffff)), mk_bf16((uint16_t) (h.x >> 16)),
                 mk_bf16((uint16_t) (h.y & 0xffff)), mk_bf16((uint16_t) (h.y >> 16)));
}

// a float tile's row (F32 / F16 / BF16, 4 consecutive values per lane: values v = 4*lane, +128, ... < nv; groups from
// g0) against the staged inputs' float4 of the same values, into acc (one sum per column, every column of the pass)
template <int MC>
MK_DEVICE void mk_f4_row(const uint8_t * base, int type, int nv, int g0, int Mc, int KG, float * xs, float (&acc)[MC]) {
    for (int v = 4*(threadIdx.x % WARP_SIZE); v < nv; v += 4*WARP_SIZE) {
        const float4 w = mk_deq4(base, type, v);
        const int    f = 8*g0 + v/4;   // the inputs' slot of values v .. v+3 of the tile
#pragma unroll
        for (int m = 0; m < MC; ++m) {
            if (MC == 1 || m < Mc) {
                const float4 xv = *mk_stage_xs(xs, m, KG, f);
                acc[m] = fmaf(w.x, xv.x, acc[m]);
                acc[m] = fmaf(w.y, xv.y, acc[m]);
                acc[m] = fmaf(w.z, xv.z, acc[m]);
                acc[m] = fmaf(w.w, xv.w, acc[m]);
            }
        }
    }
}

// a block's 8-bit inputs as staged (MK_XQ_REC bytes): 32 values, then d and the sum of q
struct mk_rec {
    int4   x0, x1;
    float4 dq;   // d, sum of q
};

MK_DEVICE mk_rec mk_rec_at(const uint8_t * rec) {
    mk_rec r;
    r.x0 = ((const int4 *) rec)[0];
    r.x1 = ((const int4 *) rec)[1];
    r.dq = ((const float4 *) rec)[2];
    return r;
}

// sum_i w_i*q_i over a block's 32 8-bit inputs (r) in halves: s0 of values 0..15 (wq[0..3]), s1 of 16..31 (two
// independent chains)
MK_DEVICE void mk_dot_halves(const unsigned (&wq)[8], const mk_rec & r, int & s0, int & s1) {
    s0 = __dp4a((int) wq[0], r.x0.x, 0);
    s1 = __dp4a((int) wq[4], r.x1.x, 0);
    s0 = __dp4a((int) wq[1], r.x0.y, s0);
    s1 = __dp4a((int) wq[5], r.x1.y, s1);
    s0 = __dp4a((int) wq[2], r.x0.z, s0);
    s1 = __dp4a((int) wq[6], r.x1.z, s1);
    s0 = __dp4a((int) wq[3], r.x0.w, s0);
    s1 = __dp4a((int) wq[7], r.x1.w, s1);
}

// acc + d_w*d_x*(sum_i w_i*q_i) for one block (Q4_0: w_i = nibble - 8, from the sum of q), with r the block's
// 8-bit inputs
MK_DEVICE float mk_dot_rec(const unsigned (&wq)[8], float dw, const mk_rec & r, bool is_q4, float acc) {
    // two independent chains of 4 (integer sums are exact: the same si in any order), half the dependent latency
    int sa, sb;
    mk_dot_halves(wq, r, sa, sb);
    const int si = sa + sb;
    const float sf = is_q4 ? __fsub_rn((float) si, __fmul_rn(8.0f, r.dq.y)) : (float) si;
    return fmaf(__fmul_rn(dw, r.dq.x), sf, acc);
}

MK_DEVICE float mk_dot_q8(const unsigned (&wq)[8], float dw, const uint8_t * rec, bool is_q4, float acc) {
    return mk_dot_rec(wq, dw, mk_rec_at(rec), is_q4, acc);
}

// 8 words at a 2-byte aligned address p (a Q6_K block is 210 bytes): the aligned words around it, funnel-shifted
MK_DEVICE void mk_words8_2a(const uint8_t * p, unsigned (&w)[8]) {
    // (the aligned words by pointer arithmetic, not an integer cast: nvcc then still knows p's address space and reads
    // a weight stage with shared loads; through the cast it emitted generic 64-bit loads, LD.E, for every word)
    const int        ob = (int) ((uintptr_t) p & 3);
    const unsigned * a  = (const unsigned *) (p - ob);
    const int        sh = 8*ob;
    unsigned v[9];
    MK_UNROLL
    for (int k = 0; k < 9; ++k) {
        v[k] = a[k];
    }
    MK_UNROLL
    for (int k = 0; k < 8; ++k) {
        w[k] = __funnelshift_r(v[k], v[k + 1], sh);
    }
}

// The K-quants' integer dot products with the 8-bit inputs (as llama.cpp's mmvq does for them): one 32-value group g
// of a tile per lane and call, decoded once for every column. Q4_K (144 bytes per 256: d, dmin, 12 bytes of 6-bit
// scales and mins, 128 bytes of nibbles; group g of a super-block: the low (g even) or high nibbles of the 32 bytes of
// its 64-value chunk), w = d*sc*q - dmin*mn: sum_i w_i*x_i = dx*(d*sc*sum_i q_i*xq_i - dmin*mn*sum_i xq_i)
MK_DEVICE void mk_q4k_unit(const uint8_t * base, int g, unsigned (&wq)[8], float & a, float & b) {
    const unsigned * w  = (const unsigned *) (base + 144*(g/8));   // (16-byte aligned: mk_cuda_create checks)
    const int        j  = g % 8;
    const int        sm = mk_q4k_scale_min((const uint8_t *) (w + 1), j);   // (mk-deq32.h)
    const int sh = 4*(j % 2);
    const uint4 * qv = (const uint4 *) (w + 4 + 8*(j/2));   // the chunk's 32 bytes in two 16-byte loads
    const uint4 q0 = qv[0];
    const uint4 q1 = qv[1];
    const unsigned q[8] = { q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w };
    MK_UNROLL
    for (int k = 0; k < 8; ++k) {
        wq[k] = (q[k] >> sh) & 0x0F0F0F0F;
    }
    a = __fmul_rn(mk_f16((uint16_t) (w[0] & 0xffff)), (float) (sm & 0xff));
    b = __fmul_rn(mk_f16((uint16_t) (w[0] >> 16)), (float) (sm >> 8));
}

MK_DEVICE float mk_q4k_dot(const unsigned (&wq)[8], float a, float b, const mk_rec & r, float acc) {
    int s0, s1;
    mk_dot_halves(wq, r, s0, s1);
    const float t = __fsub_rn(__fmul_rn(a, (float) (s0 + s1)), __fmul_rn(b, r.dq.y));
    return fmaf(r.dq.x, t, acc);
}

// Q6_K (210 bytes per 256: ql[128], qh[64], int8 scales[16], d; group g = 4n + qd of a block: the low (qd < 2) or high
// nibbles of ql[64n + 32(qd % 2) ..], bits 2qd of qh[32n ..], a scale per 16 values), w = d*sc*(q - 32): the words
// hold 4*(q - 32) as int8 (the 6-bit q in bits 2..7 with the top bit flipped: 4q - 128, no sign extension to build),
// so the dot products are 4 times q - 32's and d comes back divided by 4 (exact: the same bits in the end, unless
// d*dx fell below float's normal range, ~1e-38, where the quarter would round); sc0, sc1 the two halves' scales
MK_DEVICE void mk_q6k_unit(const uint8_t * base, int g, unsigned (&wq)[8], float & d, int & sc0, int & sc1) {
    const uint8_t * blk = base + 210*(g/8);   // (2-byte aligned)
    const int n  = (g % 8)/4;
    const int qd = g % 4;
    // the low 4 bits to bits 2..5 of each byte, the high 2 to bits 6..7
    const int lsh = 4*(qd/2);
    const int hsh = 6 - 2*qd;
    mk_words8_2a(blk + 64*n + 32*(qd % 2), wq);
    MK_UNROLL
    for (int k = 0; k < 8; ++k) {
        wq[k] = ((wq[k] >> lsh) & 0x0F0F0F0F) << 2;
    }
    unsigned h[8];
    mk_words8_2a(blk + 128 + 32*n, h);
    MK_UNROLL
    for (int k = 0; k < 8; ++k) {
        wq[k] = (wq[k] | ((h[k] << hsh) & 0xC0C0C0C0)) ^ 0x80808080;
    }
    const unsigned sc = *(const uint16_t *) (blk + 192 + 8*n + 2*qd);
    sc0 = (int) (int8_t) (sc & 0xff);
    sc1 = (int) (int8_t) (sc >> 8);
    d   = __fmul_rn(mk_f16(*(const uint16_t *) (blk + 208)), 0.25f);
}

// (d: mk_q6k_unit's, a quarter of the block's; the sums 4 times q - 32's: d*dx*t is exactly the product with the true ones)
MK_DEVICE float mk_q6k_dot(const unsigned (&wq)[8], float d, int sc0, int sc1, const mk_rec & r, float acc) {
    int s0, s1;
    mk_dot_halves(wq, r, s0, s1);
    const float t = __fadd_rn(__fmul_rn((float) sc0, (float) s0), __fmul_rn((float) sc1, (float) s1));
    return fmaf(__fmul_rn(d, r.dq.x), t, acc);
}

// a lane's sums of the columns, returned by a function of its own (in registers; a struct argument would travel
// through the stack, local memory)
template <int MC>
struct mk_accs {
    float v[MC];
};

// the rows a call of the code for MC columns can take: 2 up to MK_MC_SMALL columns, 1 in the any-batch code (base1 null)
#define MK_KQ_ROWS(MC) ((MC) <= MK_MC_SMALL ? 2 : 1)

// the ng 32-value groups of a Q4_K (Q4K) or Q6_K tile at base0 (Q4_K: 16-byte aligned), lane-strided, for columns 0 .. Mc-1
// whose input records start at xq + m*cs (the tile's first group g0: records in mk_rec_slot order): the lane's sum
// over them per column in v[m] (the caller adds it to the row's);
// base1 (Q4_K, MK_KQ_ROWS 2): also the tile of a second row with the same groups (a gate/up row pair, or the warp's next
// row), each record loaded once for both, its sums in v[MC + m]. A column's groups are added in the same order whatever
// MC, Mc and base1 are (a verify batch's column is bit for bit its one-token step)

template <bool Q4K, int MC>
MK_DEVICE mk_accs<MK_KQ_ROWS(MC)*MC> mk_kq_tile(const uint8_t * base0, const uint8_t * base1, int ng, const uint8_t * xq,
                                                int g0, int Mc, size_t cs) {
    constexpr bool TWO = MK_KQ_ROWS(MC) == 2;
    mk_accs<MK_KQ_ROWS(MC)*MC> acc;
#pragma unroll
    for (int m = 0; m < MK_KQ_ROWS(MC)*MC; ++m) {
        acc.v[m] = 0.0f;
    }
    for (int g = threadIdx.x % WARP_SIZE; g < ng; g += WARP_SIZE) {
        unsigned wq0[8], wq1[8] = {};   // (wq1 set on every path: a maybe-unset array went to local memory, 16 spills)
        float a0, b0 = 0.0f, a1 = 0.0f, b1 = 0.0f;   // Q4_K: d*sc, dmin*mn; Q6_K: d
        int   s00 = 0, s01 = 0;                      // Q6_K: the halves' scales
        if (Q4K) {
            mk_q4k_unit(base0, g, wq0, a0, b0);
        } else {
            mk_q6k_unit(base0, g, wq0, a0, s00, s01);
        }
        if (TWO && Q4K && base1) {   // (Q6_K: one row at a time; its rows of E4B's widths are several tiles anyway)
            mk_q4k_unit(base1, g, wq1, a1, b1);
        }
#pragma unroll
        for (int m = 0; m < MC; ++m) {
            if (MC == 1 || m < Mc) {
                const mk_rec r = mk_rec_at(xq + m*cs + (size_t) (g ^ mk_rec_swap(g, g0))*MK_XQ_REC);
                acc.v[m] = Q4K ? mk_q4k_dot(wq0, a0, b0, r, acc.v[m]) : mk_q6k_dot(wq0, a0, s00, s01, r, acc.v[m]);
                if (TWO && Q4K && base1) {   // (TWO ? MC : 0: an index in range where this is dead code)
                    acc.v[(TWO ? MC : 0) + m] = mk_q4k_dot(wq1, a1, b1, r, acc.v[(TWO ? MC : 0) + m]);
                }
            }
        }
    }
    return acc;
}

// mk_kq_tile of a Q4_K (q4k) or Q6_K tile. Out of line, one call site per mat-vec instance: inlined into the mat-vec,
// which sits at the register cap, it cost the one-token code's other paths spills (clang SASS, session 27: mk_mv_run<1>
// 3 -> 19 spill instructions)
template <int MC>
MK_DEVICE_FN mk_accs<MK_KQ_ROWS(MC)*MC> mk_kq_groups(bool q4k, const uint8_t * base0, const uint8_t * base1, int ng,
                                                     const uint8_t * xq, int g0, int Mc, size_t cs) {
    if (q4k) {
        if ((((uintptr_t) base0 | (uintptr_t) base1) & 15) != 0) {
            MK_TRAP();   // (mk_cuda_create refuses such Q4_K rows, naming the tensor)
        }
        return mk_kq_tile<true, MC>(base0, base1, ng, xq, g0, Mc, cs);
    }
    return mk_kq_tile<false, MC>(base0, base1, ng, xq, g0, Mc, cs);
}

// the pairs of Q4_0 (IS_Q4) or Q8_0 blocks of a 4-byte aligned tile at base0, for columns 0 .. Mc-1 (MC: the bound
// of Mc the code is made for) whose input records start at xq + m*cs (g0: the tile's first group, for the records'
// places, mk_rec_swap), into acc0[m]; TWO: also the tile at base1 with
// the same groups (a second row: the up row of a gate/up pair, or the warp's next row) into acc1[m], each input
// record loaded once for both rows. Each block's weights are decoded once for every column; a column's blocks are
// added in the same order whatever MC, Mc and TWO are (lane-strided pairs, the pair's two blocks in order, then the
// lane's block of the tail), so a verify batch's column is bit for bit its one-token step. p0, ps: this lane's first
// pair and the stride, a power of 2 (a packed tile's row: the lane's place in its group of ps lanes). tail
// (mk_mvr.tail): where the pairs past the last full round of lanes are at most half a round, those take one block per
// lane instead, after the full rounds (E4B's rows of 2560 values, 40 pairs: lanes 0..15 a block each, not lanes 0..7 a
// pair each; only rows of more than ps pairs, so a packed row keeps the bits of the same row unpacked)
template <bool IS_Q4, bool TWO, int MC>
MK_DEVICE void mk_pairs(const uint8_t * base0, const uint8_t * base1, int ng, const uint8_t * xq, int g0, int Mc, size_t cs,
                        float (&acc0)[MC], float (&acc1)[MC], bool tail, int p0 = threadIdx.x % WARP_SIZE, int ps = WARP_SIZE) {
    const int np = ng/2;
    // the pairs taken whole (Q8_0: all; its tiles hold at most MK_TB/34 blocks, fewer than a round of pairs), then the
    // tail's blocks (block 2*pw + p0 for the lanes p0 < nt: one more pass of the loop, its second block skipped)
    const int pw = IS_Q4 && tail && np > ps && 2*(np & (ps - 1)) <= ps ? np - (np & (ps - 1)) : np;
    const int nt = 2*(np - pw);
    // where the lane's records of pair p are (mk_rec_swap): 2p at 96p + os, 2p + 1 at 96p + 48 - os; one os for all the
    // lane's pairs (ps a multiple of 8 keeps bit 2 of p; a packed row, ps < 8, gives a lane one pair), the tail's own
    int os = MK_XQ_REC*mk_rec_swap(2*p0, g0);
    for (int p = p0, last = 0; !last; p += ps) {
        int h0 = 0;
        if (p >= pw) {
            if (p0 >= nt) {
                break;
            }
            p    = pw + p0/2;
            h0   = p0 % 2;
            last = 1;
            os   = MK_XQ_REC*mk_rec_swap(2*p, g0);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            if (h == 1 && last) {
                break;
            }
            unsigned wq[8];
            unsigned wu[8];
            const int hb = h == 0 ? h0 : 1;
            const int ob = hb == 0 ? os : MK_XQ_REC - os;
            const float dw = mk_pair_block(base0, p, hb, IS_Q4, wq);
            const float du = TWO ? mk_pair_block(base1, p, hb, IS_Q4, wu) : 0.0f;
#pragma unroll
            for (int m = 0; m < MC; ++m) {
                if (MC == 1 || m < Mc) {
                    const mk_rec r = mk_rec_at(xq + m*cs + (size_t) (2*p)*MK_XQ_REC + ob);
                    acc0[m] = mk_dot_rec(wq, dw, r, IS_Q4, acc0[m]);
                    if (TWO) {
                        acc1[m] = mk_dot_rec(wu, du, r, IS_Q4, acc1[m]);
                    }
                }
            }
        }
    }
}

// the mat-vec; the caller issued mk_mv_begin(mv) before (and, typically, before the grid barrier) and passes
// what it returned as fe0, unless late (GGML_MK_VAR_LATE_BEGIN: this function issues them after the staging).
// MC: the bound of M the code is made for (1: one-token steps, no per-column loops; MK_MC_SMALL: verify batches of
// up to 4; MK_M: any batch); a column's arithmetic is the same in all, so a verify batch still equals its one-token
// steps bit for bit. COLS: the staging slot by slot over every column (mk_stage_cols; the default for small batches,
// R.small == 2; else mk_stage, GGML_MK_VAR_ITEM_STAGE)
template <int MC, bool COLS = false>
MK_DEVICE_FN void mk_mv_run(const mk_mvr & R, const mk_xin & x, int M, float eps, float * xs, int xs_bytes, int xq_bytes,
                            uint8_t * ws, int ns, mk_bulk * bk, unsigned long long * prof, bool late, const mk_it & fe0) {
    if ((x.nw != nullptr) != (R.norm != 0)) {
        MK_TRAP();   // the table (mk_mv_desc) and the call disagree: the step's layout (mk_smem_plan) would be wrong
    }
    if constexpr (MC > MK_MC_SMALL) {
        // a small verify batch: the code made for at most MK_MC_SMALL columns (called from here, not from the step,
        // so that the kernel's body keeps two call sites per mat-vec and its register allocation)
        if (M > 1 && M <= MK_MC_SMALL && R.small) {
            if (R.small == 2) {
                mk_mv_run<MK_MC_SMALL, true>(R, x, M, eps, xs, xs_bytes, xq_bytes, ws, ns, bk, prof, late, fe0);
            } else {
                mk_mv_run<MK_MC_SMALL>(R, x, M, eps, xs, xs_bytes, xq_bytes, ws, ns, bk, prof, late, fe0);
            }
            return;
        }
    }
    const bool q8 = mk_mv_q8(R);
    // only 8-bit inputs are needed (every job Q4_0/Q8_0) and there is no norm: the records alone, made as the
    // values arrive, in the whole inputs region (xs and xq)
    const bool direct = mk_mv_direct(R);
    uint8_t * xq = direct ? (uint8_t *) xs : (uint8_t *) xs + xs_bytes;
    const int K    = R.j[0].ne0;
    const int lane = threadIdx.x % WARP_SIZE;
    const int KG   = mk_kg(K);
    // (mk_smem_plan: at least 1 fits; one-token code: no divisions)
    const int Mcap = MC == 1 ? 1 : max(1, min(M, mk_mv_cols(R, xs_bytes, xq_bytes)));
    unsigned ph = bk != nullptr ? bk[threadIdx.x / WARP_SIZE].ph : 0u;

    for (int m0 = 0; m0 < M; m0 += Mcap) {
        const int Mc = min(Mcap, M - m0);
        mk_it fe = m0 == 0 && !late ? fe0 : mk_it{};   // fetch: ns - 1 tiles ahead of the consumer
        if (m0 > 0 && !late) {
            fe = mk_mv_begin(R, ws, ns, bk);  // another pass over the weights for the next columns
        }
        if (x.rec != nullptr) {
            mk_stage_copy(x.rec + (size_t) m0*KG*MK_XQ_REC, xq, Mc*KG*MK_XQ_REC);   // (staged once for the grid: mk_once)
        } else if constexpr (COLS && MC <= MK_MC_SMALL) {
            mk_stage_cols<MC>(x, K, m0, Mc, eps, xs, xq, q8, direct, R.sr2, m0 == 0 ? prof : nullptr);
        } else {
            mk_stage<MC>(x, K, m0, Mc, eps, xs, xq, q8, direct, m0 == 0 ? prof : nullptr);
        }
        if (late) {
            fe = mk_mv_begin(R, ws, ns, bk);  // (GGML_MK_VAR_LATE_BEGIN: the first tiles only now; the staging ended with a block barrier)
        }
        if (m0 == 0) {
            mk_prof_at(prof, MK_PH_STAGE);
        }
        float acc[MC];
        float gs[MC];
#pragma unroll
        for (int m = 0; m < MC; ++m) {
            acc[m] = 0.0f;
            gs[m]  = 0.0f;
        }
        for (mk_it it = mk_it_first(R); it.u < R.units; ) {
            mk_fetch(R, fe, ws, ns, bk);
            if (fe.u < R.units) {
                mk_it_next(R, fe, ns);
            }
            mk_tile_wait(bk, ph, it.st, ns - 1);

            int nbytes, g0, ng;
            const uint8_t * src  = mk_tile(R, it, nbytes, g0, ng);
            const uint8_t * base = mk_stage_buf(ws, ns, it.st) + ((uintptr_t) src & 15);
            int rl = 0;   // a tile of packed float rows: its last row (stored with a one-row tile's code below)
            const int type = MK_J(R, it.job, type);
            const bool kq = R.kq && mk_is_kq(type);   // Q4_K/Q6_K: a 32-value group per lane (mk_kq_groups)
            if (kq || (mk_is_q8dot(type) && ng % 2 == 0 && ((uintptr_t) base & 3) == 0)) {
                // Q4_0/Q8_0 pairs of blocks: integer dot products with the 8-bit inputs (llama.cpp's mmvq arithmetic,
                // per 32-value block), one pair of consecutive blocks per lane (36 or 68 bytes: 32-bit shared loads,
                // conflict-free strides of 9 or 17 words), every column of the pass. Two rows of one tile each are
                // taken together, each input record loaded once for both: a gate/up row pair, or this warp's next row
                // of the mat-vec; the second row's tile is the next one (ns - 2 tiles ahead of it are in flight)
                // Q4_K/Q6_K (kq): the same walk and row pairs, a 32-value group per lane (mk_kq_groups)
                const bool is_q4 = type == GGML_TYPE_Q4_0;
                const size_t cs = (size_t) KG*MK_XQ_REC;
                mk_it nx = it;
                mk_it_next(R, nx, ns);
                const int rpt = MK_J(R, it.job, rpt);
                if (rpt > 1) {
                    // packed short rows (mk_jr): lane group gi (lpr lanes) takes row it.row + gi of the tile, lane p of
                    // the group pair p, p + lpr, ... of it: each row's sum is the one-row path's bit for bit
                    const int lpr = MK_J(R, it.job, lpr);
                    const int gi  = lane/lpr;
                    const int nr  = min(rpt, MK_J(R, it.job, ne1) - it.row);
                    const uint8_t * rb = base + (size_t) (gi < nr ? gi : 0)*MK_J(R, it.job, nb1);
                    if (gi < nr) {
                        if (is_q4) {
                            mk_pairs<true, false, MC>(rb, nullptr, ng, xq + (size_t) g0*MK_XQ_REC, g0, Mc, cs, acc, acc, false, lane % lpr, lpr);
                        } else {
                            mk_pairs<false, false, MC>(rb, nullptr, ng, xq + (size_t) g0*MK_XQ_REC, g0, Mc, cs, acc, acc, false, lane % lpr, lpr);
                        }
                    }
                    __syncwarp(); // the stage is refilled ns - 1 tiles later
                    const mk_it r0 = it;
                    mk_it_next(R, it, ns);
                    float * y = MK_J(R, r0.job, y);
                    const int   ldy = MK_J(R, r0.job, ldy);
                    const float cap = MK_J(R, r0.job, softcap);
#pragma unroll
                    for (int m = 0; m < MC; ++m) {
                        if (MC == 1 || m < Mc) {
                            const float s = mk_lane_sum(acc[m], lpr);
                            acc[m] = 0.0f;
                            if (gi < nr && lane % lpr == 0) {
                                y[(size_t) (m0 + m)*ldy + r0.row + gi] = mk_softcap(s, cap);
                            }
                        }
                    }
                    continue;
                }
                const bool try2 = nx.u < R.units && MK_J(R, it.job, nseg) == 1 && MK_J(R, nx.job, nseg) == 1 &&
                                  MK_J(R, nx.job, rpt) == 1 &&
                                  MK_J(R, nx.job, type) == type && (!R.pair || it.sub == 0);
                int nb1 = 0, g1 = 0, ng1 = 0;
                const uint8_t * src1  = try2 ? mk_tile(R, nx, nb1, g1, ng1) : nullptr;
                const uint8_t * base1 = src1 ? mk_stage_buf(ws, ns, nx.st) + ((uintptr_t) src1 & 15) : nullptr;
                // (K-quant row pairs: Q4_K in the code for up to MK_MC_SMALL columns only, mk_kq_tile: a second row's sums
                // cost the any-batch code registers, and E4B's Q6_K rows are several tiles; a row's bits are the same
                // either way)
                const bool two = src1 && ng1 == ng && ((uintptr_t) base1 & 3) == 0 &&
                                 (!kq || (type == GGML_TYPE_Q4_K && MK_KQ_ROWS(MC) == 2));
                float acc1[MC];
#pragma unroll
                for (int m = 0; m < MC; ++m) {
                    acc1[m] = 0.0f;
                }
                if (two) {
                    mk_tile_wait(bk, ph, nx.st, ns - 2);
                }
                if (kq) {
                    // (one call site for one and two rows: each call site of a function of its own costs the callers
                    // registers)
                    const auto a = mk_kq_groups<MC>(type == GGML_TYPE_Q4_K, base, two ? base1 : nullptr, ng,
                                                    xq + (size_t) g0*MK_XQ_REC, g0, Mc, cs);
#pragma unroll
                    for (int m = 0; m < MC; ++m) {
                        acc[m] = __fadd_rn(acc[m], a.v[m]);   // (a row of several tiles: the tiles' sums in order)
                        if (MK_KQ_ROWS(MC) == 2) {
                            acc1[m] = __fadd_rn(acc1[m], a.v[(MK_KQ_ROWS(MC) - 1)*MC + m]);
                        }
                    }
                } else if (two) {
                    if (is_q4) {
                        mk_pairs<true, true, MC>(base, base1, ng, xq + (size_t) g0*MK_XQ_REC, g0, Mc, cs, acc, acc1, R.tail);
                    } else {
                        mk_pairs<false, true, MC>(base, base1, ng, xq + (size_t) g0*MK_XQ_REC, g0, Mc, cs, acc, acc1, R.tail);
                    }
                } else if (is_q4) {
                    mk_pairs<true, false, MC>(base, nullptr, ng, xq + (size_t) g0*MK_XQ_REC, g0, Mc, cs, acc, acc1, R.tail);
                } else {
                    mk_pairs<false, false, MC>(base, nullptr, ng, xq + (size_t) g0*MK_XQ_REC, g0, Mc, cs, acc, acc1, R.tail);
                }
                if (two) {
                    __syncwarp();
                    // one more tile in flight (into the first tile's stage, read): ns - 1 ahead again
                    mk_fetch(R, fe, ws, ns, bk);
                    if (fe.u < R.units) {
                        mk_it_next(R, fe, ns);
                    }
                    const mk_it r0 = it;
                    it = nx;
                    mk_it_next(R, it, ns);
#pragma unroll
                    for (int m = 0; m < MC; ++m) {
                        if (MC == 1 || m < Mc) {
                            const float s = mk_warp_sum2(acc[m], acc1[m]);   // lanes 0..15: the first row's, 16..31: the second's
                            acc[m] = 0.0f;
                            const size_t mm = (size_t) (m0 + m);
                            if (R.pair) {
                                const float s1 = __shfl_sync(0xffffffff, s, WARP_SIZE/2);
                                if (lane == 0) {
                                    MK_J(R, 0, y)[mm*MK_J(R, 0, ldy) + r0.row] = mk_geglu(s, s1);
                                }
                            } else if (lane % (WARP_SIZE/2) == 0) {
                                const mk_it & o = lane == 0 ? r0 : nx;
                                MK_J(R, o.job, y)[mm*MK_J(R, o.job, ldy) + o.row] = mk_softcap(s, MK_J(R, o.job, softcap));
                            }
                        }
                    }
                    continue;
                }
            } else if (mk_is_q8dot(type)) {
                // the same per block, for tiles with an odd block count or 2-byte alignment: two blocks per lane
                // at a time (i and i + 32), 16-bit loads
                const bool is_q4 = type == GGML_TYPE_Q4_0;
                const int  bs    = is_q4 ? 18 : 34;
                for (int i = lane; i < ng; i += 2*WARP_SIZE) {
                    const bool two = i + WARP_SIZE < ng;
                    float    dw[2];
                    unsigned wq[2][8];
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const uint8_t * b = base + bs*(i + h*WARP_SIZE);
                        dw[h] = 0.0f;
#pragma unroll
                        for (int k = 0; k < 8; ++k) {
                            wq[h][k] = 0;
                        }
                        if (h == 1 && !two) {
                            continue;
                        }
                        dw[h] = mk_f16(*(const uint16_t *) b);
#pragma unroll
                        for (int k = 0; k < 8; ++k) {
                            if (is_q4) {
                                const unsigned v = mk_u32_2a(b + 2 + 4*(k % 4));
                                wq[h][k] = k < 4 ? (v & 0x0F0F0F0F) : ((v >> 4) & 0x0F0F0F0F); // values 4k.. / 16+4(k-4)..
                            } else {
                                wq[h][k] = mk_u32_2a(b + 2 + 4*k);
                            }
                        }
                    }
#pragma unroll
                    for (int m = 0; m < MC; ++m) {
                        if (MC == 1 || m < Mc) {
#pragma unroll
                            for (int h = 0; h < 2; ++h) {
                                if (h == 1 && !two) {
                                    continue;
                                }
                                const int l = i + h*WARP_SIZE;
                                acc[m] = mk_dot_q8(wq[h], dw[h], xq + (size_t) (m*KG + g0 + (l ^ mk_rec_swap(l, g0)))*MK_XQ_REC, is_q4, acc[m]);
                            }
                        }
                    }
                }
            } else if (R.f4 && mk_deq4_ok(type, base)) {
                // F32 / F16 / BF16: 4 consecutive values per lane, the warp's 128 in a row (the tile read in order: no
                // bank conflicts; a row of 256 values on every lane), against the staged inputs' float4 of them. Packed
                // rows (rpt > 1, mk_jr; not under GGML_MK_VAR_NO_FLOAT_PACK): the tile's rows one after the other, each the one-row
                // arithmetic; the rows before the last are summed and stored here, the last one below as a one-row
                // tile's (the same bits)
                const int nv  = min(32*ng, K - 32*g0);   // (a multiple of 4: mat-vec inputs are)
                const int rpt = MK_J(R, it.job, rpt);
                const int nr  = rpt > 1 ? min(rpt, MK_J(R, it.job, ne1) - it.row) : 1;
                for (int r = 0; ; ++r) {
                    mk_f4_row<MC>(base + (size_t) r*MK_J(R, it.job, nb1), type, nv, g0, Mc, KG, xs, acc);
                    if (r == nr - 1) {
                        rl = r;
                        break;
                    }
#pragma unroll
                    for (int m = 0; m < MC; ++m) {
                        if (MC == 1 || m < Mc) {
                            const float s = mk_warp_sum(acc[m]);
                            acc[m] = 0.0f;
                            if (lane == 0) {
                                MK_J(R, it.job, y)[(size_t) (m0 + m)*MK_J(R, it.job, ldy) + it.row + r] =
                                    mk_softcap(s, MK_J(R, it.job, softcap));
                            }
                        }
                    }
                }
            } else {
                for (int i = lane; i < ng; i += WARP_SIZE) {
                    const int g = g0 + i;
                    float w[32];
                    mk_deq32(base, type, i, min(32, K - 32*g), w);
#pragma unroll
                    for (int m = 0; m < MC; ++m) {
                        if (MC == 1 || m < Mc) {
                            const float4 * xp = (const float4 *) (xs + m*KG*36 + g*36);
#pragma unroll
                            for (int q = 0; q < 8; ++q) {
                                const float4 xv = xp[q];
                                acc[m] = fmaf(w[4*q + 0], xv.x, acc[m]);
                                acc[m] = fmaf(w[4*q + 1], xv.y, acc[m]);
                                acc[m] = fmaf(w[4*q + 2], xv.z, acc[m]);
                                acc[m] = fmaf(w[4*q + 3], xv.w, acc[m]);
                            }
                        }
                    }
                }
            }
            __syncwarp(); // the stage is refilled ns - 1 tiles later

            const bool row_done = it.seg == MK_J(R, it.job, nseg) - 1;
            const int  sub  = it.sub;
            const int  oj   = R.pair ? 0 : it.job;   // the job whose output this row is
            const int  orow = it.row + rl;   // (rl: packed float rows)
            mk_it_next(R, it, ns);
            if (!row_done) {
                continue;
            }
            float * y = MK_J(R, oj, y);
            const int   ldy = MK_J(R, oj, ldy);
            const float cap = MK_J(R, oj, softcap);
#pragma unroll
            for (int m = 0; m < MC; ++m) {
                if (MC == 1 || m < Mc) {
                    float s = mk_warp_sum(acc[m]);
                    acc[m] = 0.0f;
                    if (R.pair && sub == 0) {
                        gs[m] = s;
                        continue;
                    }
                    s = R.pair ? mk_geglu(gs[m], s) : mk_softcap(s, cap);
                    if (lane == 0) {
                        y[(size_t) (m0 + m)*ldy + orow] = s;
                    }
                }
            }
        }
        mk_cp_async_wait<0>();
        __syncthreads(); // xs is restaged by the next pass or mat-vec
    }
    if (bk != nullptr && threadIdx.x % WARP_SIZE == 0) {
        bk[threadIdx.x / WARP_SIZE].ph = ph;   // (every lane holds the same)
    }
}

// ---------------------------------------------------------------------------------------------
// per-head work: Q/K/V norms, rope, KV cache writes

// a head vector of the step: token m, kind 0 Q / 1 K / 2 V, head h (of its kind), packed into one int
MK_HOSTDEV int mk_hv(int m, int kind, int h) { return m | kind << 4 | h << 8; }

// block-wide: the norms and rope of n head vectors of layer il (job0, then more[0 .. n-2], packed by mk_hv) from the
// q/k/v mat-vec's outputs into sm[v*head_dim + d] (n*head_dim floats; red: n*head_dim/32 floats of scratch); ends with a
// block barrier. Element d of a vector is reduced as if thread d of a block held it alone (its 32-value group's warp sum,
// then the groups in order; the old block-wide sum also added the empty warps' zeros, which changes no bit), so a
// vector's bits do not depend on n, on the block or on what else the block computes: the heads phase (mk_heads, one
// vector at a time) and the attention that folds it in (GGML_MK_VAR_FOLD_HEADS: its Q and K/V rows at once) run this one
// out-of-line function, so they agree bit for bit also where the compiler contracts or approximates (fast math).
MK_DEVICE_FN void mk_head_vecs(const mk_args & a, int il, int n, int job0, const int * more, float * sm, float * red) {
    const ggml_mk_layer & L = a.m->layers[il];
    const mk_dstep & st = *a.st;
    const int lane  = threadIdx.x % WARP_SIZE;
    const int hd    = L.head_dim;
    const int ng    = hd / WARP_SIZE;   // 32-value groups per vector
    const int ne    = n*hd;             // (a multiple of 64: a warp's lanes are all in or all out)
    const float eps = a.m->norm_eps;
    const float theta_scale = powf(L.rope_base, -2.0f/L.n_rot);

    for (int e = threadIdx.x; e < ne; e += MK_THREADS) {
        const int v    = e / hd;
        const int jb   = v == 0 ? job0 : more[v - 1];
        const int m    = jb & 15;
        const int kind = (jb >> 4) & 15;
        const int h    = jb >> 8;
        const float * src;
        if (kind == 0) {
            src = a.q + (size_t) m*a.m->max_q + h*hd;
        } else if (kind == 1 || L.v_from_k) {
            src = a.k + (size_t) m*a.m->max_kv + h*hd;
        } else {
            src = a.v + (size_t) m*a.m->max_kv + h*hd;
        }
        const float t = mk_ldcg(src + (e - v*hd));
        sm[e] = t;
        float ss = fmaf(t, t, 0.0f);
        ss = mk_warp_sum(ss);
        if (lane == 0) {
            red[e / WARP_SIZE] = ss;
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < ne; e += MK_THREADS) {
        const int v    = e / hd;
        const int d    = e - v*hd;
        const int jb   = v == 0 ? job0 : more[v - 1];
        const int kind = (jb >> 4) & 15;
        float tot = 0.0f;
        for (int w = 0; w < ng; ++w) {
            tot += red[v*ng + w];
        }
        const float r = 1.0f/sqrtf(tot/hd + eps);
        const float * nw = kind == 0 ? L.q_norm : kind == 1 ? L.k_norm : nullptr;
        if (kind != 2 || L.v_norm) {
            sm[e] = nw ? sm[e]*r*nw[d] : sm[e]*r;
        }
    }
    __syncthreads();
    // NEOX rope of Q and K: pairs (i, i + n_rot/2), one thread per pair
    const int nr = L.n_rot/2;
    for (int p = threadIdx.x; p < n*nr; p += MK_THREADS) {
        const int v    = p / nr;
        const int i    = p - v*nr;
        const int jb   = v == 0 ? job0 : more[v - 1];
        const int m    = jb & 15;
        const int kind = (jb >> 4) & 15;
        if (kind == 2) {
            continue;
        }
        float * x = sm + v*hd;
        const int pos = st.pos[m];
        const float theta_base = pos*powf(theta_scale, (float) i);
        const float ff = L.rope_freqs ? L.rope_freqs[i] : 1.0f;
        const float theta = L.rope_scale*(theta_base/ff);
        const float c  = cosf(theta)*a.m->attn_factor;
        const float sn = sinf(theta)*a.m->attn_factor;
        const float x0 = x[i];
        const float x1 = x[i + nr];
        x[i]      = x0*c - x1*sn;
        x[i + nr] = x0*sn + x1*c;
    }
    __syncthreads();
}

// a new K (kind 1) or V (kind 2) value into the cache: cell, kv head h, dimension d (the heads phase and the fold's writer)
MK_DEVICE void mk_kv_put(const ggml_mk_kv_view & kv, int kind, int64_t cell, int h, int d, half hv) {
    if (kind == 1) {
        *(half *) ((char *) kv.k + cell*kv.k_sc + h*kv.k_sh + 2*d) = hv;
    } else {
        *(half *) ((char *) kv.v + cell*kv.v_sc + h*kv.v_sh + d*kv.v_sd) = hv;
    }
}

// the heads phase: Q/K/V norms, rope, Q back to a.q (times q_scale), the new K/V rows into the cache (F16); one block
// per head vector (sm: block scratch)
MK_DEVICE_FN void mk_heads(const mk_args & a, int il, int M, float * sm) {
    MK_SHARED(float, red, MK_WARPS);
    const ggml_mk_layer & L = a.m->layers[il];
    const mk_dstep & st = *a.st;
    const int hd     = L.head_dim;
    const int n_kvh  = L.has_kv ? L.n_head_kv : 0;
    const int per_m  = L.n_head + 2*n_kvh;
    const int cache  = L.is_swa ? 1 : 0;

    for (int u = blockIdx.x; u < M*per_m; u += gridDim.x) {
        const int m  = u / per_m;
        int h        = u % per_m;
        int kind     = 0; // 0 q, 1 k, 2 v
        if (h >= L.n_head) {
            h -= L.n_head;
            kind = 1 + h / n_kvh;
            h %= n_kvh;
        }
        mk_head_vecs(a, il, 1, mk_hv(m, kind, h), nullptr, sm, red);
        if (kind == 0) {
            float * dst = a.q + (size_t) m*a.m->max_q + h*hd;
            for (int d = threadIdx.x; d < hd; d += MK_THREADS) {
                dst[d] = sm[d]*L.q_scale;
            }
        } else {
            const int64_t cell = st.kv_idx[cache][m];
            for (int d = threadIdx.x; d < hd; d += MK_THREADS) {
                mk_kv_put(st.kv[il], kind, cell, h, d, __float2half(sm[d]));
            }
        }
        __syncthreads(); // sm and red are reused by the next head
    }
}

// the attention with the heads phase folded in (GGML_MK_VAR_FOLD_HEADS): a block's area for a (token, head) at the start
// of the staged-inputs region, in floats: q: its Q (normed, roped, times q_scale); red: the norms' scratch; jobs (ints):
// mk_head_vecs's K and V jobs of the step's tokens; slots: the chunks' partial results, before them the head vectors'
// scratch (max of both; the slots of one attention group: nch, the step's chunk list, or MK_ATT_GROUP if fewer). fits: the
// staged-inputs region holds it (a step's sizes alone: the same answer in every block; else the layer keeps its heads phase)
struct mk_fold {
    int q, red, jobs, slots, fits;
};
MK_HOSTDEV mk_fold mk_fold_plan(const ggml_mk_layer & L, int M, int nch, int max_head_dim, int bytes) {
    const int hd  = L.head_dim;
    const int nkv = L.has_kv ? M : 0;
    const int nv  = 1 + 2*nkv;   // head vectors at most
    mk_fold f;
    f.q     = 0;
    f.red   = hd;
    f.jobs  = f.red + nv*hd/WARP_SIZE;
    f.slots = (f.jobs + 2*nkv + 3)/4*4;   // (16-byte aligned)
    const int ps   = 4 + max_head_dim;
    const int ns   = MK_GRP_SLOTS(nch);
    const int need = ns*ps > nv*hd ? ns*ps : nv*hd;
    f.fits = (f.slots + need)*(int) sizeof(float) <= bytes;
    return f;
}

// variant GGML_MK_VAR_TWO_UNITS: the block-per-(token, head, group) attention takes two units a round, warps
// 0..MK_ATT_GROUP-1 the first and the next MK_ATT_GROUP warps the second (otherwise idle), where a step has more units
// (n_units: tokens x heads x groups) than blocks: deep contexts, e.g. E4B's global layers at ~7200-7500 cells, ~900-940
// units on 132 blocks, 4 rounds of a chunk's latency instead of 7-8 (where the step is 0.76x the graph's: NOTES.md session 43). Each chunk
// and each combine as in one unit a round, in the same order: the same bits. Not for the list as one group
// (GGML_MK_VAR_ONE_GROUP: chunks past the warps) or the warp's combine (GGML_MK_VAR_WARP_COMBINE), and only where two
// groups' chunk slots fit in bytes
// (with GGML_MK_VAR_LOAD_PAIRS also both units' Q rows, mk_att_q_floats)
MK_HOSTDEV int mk_att_q_floats(int flags, int units, int max_head_dim) {
    return (flags & GGML_MK_VAR_LOAD_PAIRS) ? units*max_head_dim : 0;
}
MK_HOSTDEV bool mk_att_two(int flags, int n_units, int blocks, int max_head_dim, int bytes) {
    return (flags & GGML_MK_VAR_TWO_UNITS) && 2*MK_ATT_GROUP <= MK_WARPS && n_units > blocks &&
           !(flags & (GGML_MK_VAR_ONE_GROUP | GGML_MK_VAR_WARP_COMBINE)) &&
           (2*MK_ATT_GROUP*(4 + max_head_dim) + mk_att_q_floats(flags, 2, max_head_dim))*(int) sizeof(float) <= bytes;
}

// ---------------------------------------------------------------------------------------------
// attention, split over the cells: one warp per (token, head, chunk of att_chunk cells counted from
// cell 0), online softmax over the chunk's visible cells CPI at a time; the chunks' partial results are
// combined in chunk order within their group (MK_ATT_GROUP chunks), the groups' in group order. Where a group's
// chunks fit in a block's shared memory, one block takes a (token, head, group) and combines in shared memory;
// else the chunks spread over the whole grid and the warp that finishes a (token, head) last combines. Chunk
// and group bounds and order are fixed by the cell numbers alone, so a token's result does not depend on the
// step's n_kv or M, nor on which way ran; only the chunks with a cell some token of the step sees run (the
// step's list), the rest would add nothing (nor would a group none of whose cells the token sees: empty
// results are skipped, and one non-empty group's result passes the groups' combine unchanged: weight exp(0) = 1).
// Lanes own dimension pairs d = 2*lane + 64*i (+1), i < NP.

MK_DEVICE float mk_lo(unsigned u) { return __half2float(__ushort_as_half((unsigned short) (u & 0xffff))); }
MK_DEVICE float mk_hi(unsigned u) { return __half2float(__ushort_as_half((unsigned short) (u >> 16))); }

template <bool B> struct mk_bool { static constexpr bool value = B; };

// head dims up to MK_ATT_HD4 take the attention's instantiation of 4 dimension pairs a lane (NP = 4, 8 cells a step),
// larger ones NP = GGML_MK_MAX_HEAD_DIM/64 (2 cells a step: E4B's 512-dim global layers). (A second kernel emulation
// builds with 64: its 128-dim global layer then takes the larger one's code)
#ifndef MK_ATT_HD4
#define MK_ATT_HD4 256
#endif

// a value of the attention's partial results: in this block's shared memory (SH) or written by other blocks (L2)
template <bool SH>
MK_DEVICE float mk_ld_part(const float * p) {
    if constexpr (SH) {
        return *p;
    } else {
        return mk_ldcg(p);
    }
}

// the attention's block-wide combine (mk_attention's combine_blk): two floats per entry (a group's chunks, or a (token,
// head)'s groups) and the block's "last of the groups" flag; one array for every instantiation
#define MK_ATT_W (MK_GRP_MAX > MK_ATT_GROUP ? MK_GRP_MAX : MK_ATT_GROUP)
MK_DEVICE_FN float * mk_att_scratch() {
    MK_SHARED(float, s_att_w, 2*MK_ATT_W + 1);
    return s_att_w;
}
static_assert(GGML_MK_MAX_HEAD_DIM <= MK_THREADS, "the block-wide combine: one thread per dimension");

// the layer's attention folds its heads phase in (GGML_MK_VAR_FOLD_HEADS on): the block-per-(token, head) way and the fold
// fit (out of line: the kernel body keeps its registers)
MK_DEVICE_FN bool mk_fold_on(const mk_args & a, int il, int M) {
    const ggml_mk_layer & L = a.m->layers[il];
    return !(a.flags & GGML_MK_VAR_DEVICE_ATT) &&
           mk_fold_plan(L, M, a.st->n_ch[L.is_swa ? 1 : 0], a.m->max_head_dim, a.xs_bytes + a.xq_bytes).fits;
}

// BLK: one block per (token, head) (returns false, having done nothing, when the step's chunk list is longer than the
// block's shared memory holds); else the device-wide way. Two instantiations, each with its own registers.
// FOLD (with BLK; GGML_MK_VAR_FOLD_HEADS, only where mk_fold_plan fits: the caller asks first): no heads phase before; each
// block computes its (token, head)'s Q into shared memory and the new K/V rows of its kv head for every token of the step
// (mk_head_vecs, the heads phase's own function), writes those rows to the cache itself and reads them back from there
// after a block barrier: a block reads no cell of the step that it did not write itself (the other blocks of the kv head
// write the same bits to the same cells), so no grid barrier is needed in between; later layers sharing this cache and
// later steps read them after the grid barriers as before)
// CPI_: cells a step (0: the default for NP; GGML_MK_VAR_CHUNK4's instantiation takes 4)
// TWO (with BLK, not FOLD; where mk_att_two says so: the caller, mk_attention_blk, asks first): two units a round
// LD2 (with BLK, not FOLD; GGML_MK_VAR_LOAD_PAIRS): two steps' cells per load round trip, the unit's Q in shared memory
template <int NP, bool BLK, bool FOLD = false, int CPI_ = 0, bool TWO = false, bool LD2 = false>
MK_DEVICE_FN bool mk_attention(const mk_args & a, int il, int M, float * sm) {
    static_assert(!FOLD || BLK, "the fold is the block-per-(token, head) way's");
    static_assert(!TWO || (BLK && !FOLD && 2*MK_ATT_GROUP <= MK_WARPS), "two units a round: the block way's, a group a half");
    static_assert(!LD2 || (BLK && !FOLD), "load pairs: the block way's (the unit's Q staged in shared memory)");
    constexpr int CPI = CPI_ > 0 ? CPI_ : (NP > 4 ? 2 : 8);   // cells per step (registers: K and V of CPI cells)
    constexpr int LDS = LD2 ? 2 : 1;                          // steps per load round trip
    constexpr int CL  = CPI*LDS;                              // cells per load round trip
    static_assert(CL <= WARP_SIZE && CPI % 2 == 0, "one lane per cell for the mask; transposed V: cell pairs");
    const ggml_mk_layer & L = a.m->layers[il];
    const mk_dstep & st = *a.st;
    const int lane   = threadIdx.x % WARP_SIZE;
    // units to warps SM-first: a head's chunks load through the load/store units of many SMs instead of a few
    // (transposed V: 32 lines per warp load; measured 1.07x the whole step against block-by-block units)
    const int warp   = (int) ((threadIdx.x / WARP_SIZE)*gridDim.x + blockIdx.x);
    const int nwarps = gridDim.x*MK_WARPS;
    const int hd     = L.head_dim;
    const int np     = hd/64;
    const int cache  = L.is_swa ? 1 : 0;
    const int n_kv   = st.n_kv[cache];
    const int CH     = a.m->att_chunk;
    const int nch    = st.n_ch[cache];   // the chunks someone sees (the others would add nothing)
    const ggml_mk_kv_view & kv = st.kv[il];
    const int gqa    = L.n_head / L.n_head_kv;
    const bool vt    = kv.v_sd != 2;   // transposed V: the CPI cells of one dimension are contiguous
    // transposed V rows b-byte aligned at multiples of b/2 cells: b-byte loads of b/2 cells (a load may pass n_kv,
    // never the row)
    auto vt_loads = [&](int b) {
        return vt && kv.v_sd % b == 0 && kv.v_sc == 2 && ((uintptr_t) kv.v % b) == 0 && (kv.v_sh % b) == 0 &&
               (n_kv + b/2 - 1)/(b/2)*(b/2) <= (int) (kv.v_sd/2);
    };
    const bool vt16  = vt_loads(16);        // 8 cells (CL 8)
    const bool vt8   = LD2 && vt_loads(8);  // 4 cells (LD2 with 2 cells a step)
    const int PS     = 4 + a.m->max_head_dim;
    // FOLD: the block's area (mk_fold_plan): its Q, the chunks' slots after the fold's scratch
    const mk_fold F  = mk_fold_plan(L, M, nch, a.m->max_head_dim, a.xs_bytes + a.xq_bytes);
    float * slots    = FOLD ? sm + F.slots : sm;
    float * fq       = sm + F.q;

    // chunk ck (of the step's list) of (token, head) mh: its running max, sum and weighted V sum. qs (LD2): the
    // (token, head)'s Q in shared memory, read where the scores use it (the default holds it in registers)
    auto chunk = [&](int mh, int ck, float & mx, float & l, float (&a0)[NP], float (&a1)[NP], const float * qs) {
        const int ch  = st.ch[cache][ck];
        const int m   = mh / L.n_head;
        const int h   = mh % L.n_head;
        const int hkv = h / gqa;
        const float * q    = a.q + (size_t) m*a.m->max_q + h*hd;
        const float * mask = a.mask[cache] + (size_t) m*n_kv;

        float q0[NP], q1[NP];
#pragma unroll
        for (int i = 0; i < NP; ++i) {
            if constexpr (FOLD) {
                q0[i] = i < np ? fq[2*lane + 64*i]     : 0.0f;
                q1[i] = i < np ? fq[2*lane + 64*i + 1] : 0.0f;
            } else if constexpr (LD2) {
                (void) qs;   // (read below)
            } else {
                q0[i] = i < np ? mk_ldcg(q + 2*lane + 64*i)     : 0.0f;
                q1[i] = i < np ? mk_ldcg(q + 2*lane + 64*i + 1) : 0.0f;
            }
            a0[i] = 0.0f;
            a1[i] = 0.0f;
        }
        mx = -INFINITY;
        l  = 0.0f;
        // the view's strides as locals: each load below is an asm statement with a "memory" clobber, after which fields
        // read through kv would be loaded again (and every address recomputed from them)
        const int64_t k_sc = kv.k_sc;
        const int64_t v_sc = kv.v_sc;
        const char * kb = (const char *) kv.k + hkv*kv.k_sh + 4*lane;
        const char * vb = (const char *) kv.v + hkv*kv.v_sh;
        const int c0 = ch*CH;
        const int c1 = min(n_kv, c0 + CH);
        for (int c = c0; c < c1; c += CL) {
            // the mask of the round trip's cells (one load per lane) and their K and V rows are loaded together (cells
            // below n_kv are valid memory, masked or not): one round trip per LDS steps; masked cells are skipped below
            const float mlane = lane < CL && c + lane < c1 ? mask[c + lane] : -INFINITY;
            unsigned kr[CL][NP];
            unsigned vr[CL][NP];   // plain V: cell j, dims (d, d+1); transposed: [w] cells 2w, 2w+1 of d, [CL/2 + w] of d+1
            // cell c + j's rows through running pointers (a 64-bit multiply per cell and stream would hold every cell's
            // address in registers at once)
            const char * kp = kb + c*k_sc;
            const char * vp = vb + c*v_sc + 4*lane;
#pragma unroll
            for (int j = 0; j < CL; ++j) {
#pragma unroll
                for (int i = 0; i < NP; ++i) {
                    kr[j][i] = 0;
                    vr[j][i] = 0;
                    if (i < np && c + j < c1) {
                        kr[j][i] = mk_ldcg_u32((const unsigned *) (kp + 128*i));
                        if (!vt) {
                            vr[j][i] = mk_ldcg_u32((const unsigned *) (vp + 128*i));
                        }
                    }
                }
                kp += k_sc;
                vp += v_sc;
            }
            if (vt) {
                // dimension d = 2*lane + 64*i's row of V at cell c, and d + 1's
                const int64_t v_sd = kv.v_sd;
                const char * vd = vb + 2*lane*v_sd + c*v_sc;
#pragma unroll
                for (int i = 0; i < NP; ++i, vd += 64*v_sd) {
                    if (i < np) {
                        const unsigned * p0 = (const unsigned *) vd;
                        const unsigned * p1 = (const unsigned *) (vd + v_sd);
                        if (CL == 8 && vt16 && c % 8 == 0) {
                            // the 8 cells of a dimension in one 16-byte load (the cells past c1 are
                            // inside the cache row and never used)
                            const uint4 x0 = mk_ldcg_u32x4((const uint4 *) p0);
                            const uint4 x1 = mk_ldcg_u32x4((const uint4 *) p1);
                            vr[0][i] = x0.x; vr[1 % CL][i] = x0.y; vr[2 % CL][i] = x0.z; vr[3 % CL][i] = x0.w;
                            vr[CL/2][i] = x1.x; vr[(CL/2 + 1) % CL][i] = x1.y; vr[(CL/2 + 2) % CL][i] = x1.z; vr[(CL/2 + 3) % CL][i] = x1.w;
                            continue;
                        }
                        if (LD2 && CL == 4 && vt8 && c % 4 == 0) {
                            // (LD2) the 4 cells of a dimension in one 8-byte load (as above)
                            const uint2 x0 = mk_ldcg_u32x2((const uint2 *) p0);
                            const uint2 x1 = mk_ldcg_u32x2((const uint2 *) p1);
                            vr[0][i] = x0.x; vr[1 % CL][i] = x0.y;
                            vr[(CL/2) % CL][i] = x1.x; vr[(CL/2 + 1) % CL][i] = x1.y;
                            continue;
                        }
#pragma unroll
                        for (int w = 0; w < CL/2; ++w) {
                            if (c + 2*w < c1) {
                                vr[w][i]        = mk_ldcg_u32(p0 + w);
                                vr[CL/2 + w][i] = mk_ldcg_u32(p1 + w);
                            }
                        }
                    }
                }
            }
            // the round trip's steps s of CPI cells each (cells c + s*CPI + jj, jj < CPI), in cell order
#pragma unroll
            for (int s = 0; s < LDS; ++s) {
                float mv[CPI];
                bool any = false;
#pragma unroll
                for (int jj = 0; jj < CPI; ++jj) {
                    mv[jj] = __shfl_sync(0xffffffff, mlane, s*CPI + jj);
                    any = any || mv[jj] != -INFINITY;
                }
                if (!any) {
                    continue;
                }
                float sc[CPI];
#pragma unroll
                for (int jj = 0; jj < CPI; ++jj) {
                    const int j = s*CPI + jj;
                    float sv = 0.0f;
#pragma unroll
                    for (int i = 0; i < NP; ++i) {
                        float qa, qb;
                        if constexpr (LD2) {
                            qa = i < np ? qs[2*lane + 64*i]     : 0.0f;
                            qb = i < np ? qs[2*lane + 64*i + 1] : 0.0f;
                        } else {
                            qa = q0[i];
                            qb = q1[i];
                        }
                        sv = fmaf(qa, mk_lo(kr[j][i]), sv);
                        sv = fmaf(qb, mk_hi(kr[j][i]), sv);
                    }
                    sc[jj] = sv;
                }
#pragma unroll
                for (int jj = 0; jj < CPI; ++jj) {
                    sc[jj] = mk_warp_sum(sc[jj]);
                }
                float mn = mx;
#pragma unroll
                for (int jj = 0; jj < CPI; ++jj) {
                    sc[jj] = fmaf(sc[jj], a.m->kq_scale, mv[jj]);
                    if (mv[jj] != -INFINITY) {
                        mn = fmaxf(mn, sc[jj]);
                    }
                }
                const float corr = expf(mx - mn);
                l = l*corr;
#pragma unroll
                for (int i = 0; i < NP; ++i) {
                    a0[i] *= corr;
                    a1[i] *= corr;
                }
#pragma unroll
                for (int jj = 0; jj < CPI; ++jj) {
                    if (mv[jj] == -INFINITY) {
                        continue;
                    }
                    const int j = s*CPI + jj;
                    const float p = expf(sc[jj] - mn);
                    l += p;
#pragma unroll
                    for (int i = 0; i < NP; ++i) {
                        float v0, v1;
                        if (vt) {
                            const unsigned w0 = vr[j/2][i];          // dim d:   cells (j&~1, j|1) in word j/2
                            const unsigned w1 = vr[CL/2 + j/2][i];   // dim d+1
                            v0 = (j & 1) ? mk_hi(w0) : mk_lo(w0);
                            v1 = (j & 1) ? mk_hi(w1) : mk_lo(w1);
                        } else {
                            v0 = mk_lo(vr[j][i]);
                            v1 = mk_hi(vr[j][i]);
                        }
                        a0[i] = fmaf(p, v0, a0[i]);
                        a1[i] = fmaf(p, v1, a1[i]);
                    }
                }
                mx = mn;
            }
        }

    };
    // a chunk's partial result: [max, sum, -, -, weighted V sum]
    auto put = [&](float * P, float mx, float l, const float (&a0)[NP], const float (&a1)[NP]) {
        if (lane == 0) {
            P[0] = mx;
            P[1] = l;
        }
#pragma unroll
        for (int i = 0; i < NP; ++i) {
            if (i < np) {
                P[4 + 2*lane + 64*i]     = a0[i];
                P[4 + 2*lane + 64*i + 1] = a1[i];
            }
        }
    };
    // the n partial results at part (a group's chunks, or a (token, head)'s groups), combined in their order: their
    // max gm, sum gl and weighted V sum (a0, a1); the headers are read one per lane; then every entry's loads are
    // issued unconditionally (4 in flight) and only the arithmetic skips empty entries, so the result does not depend
    // on how many empty entries follow. The partial results are in global memory (SH false: loads through L2) or in
    // this block's shared memory (SH true)
    auto combine = [&](const float * part, int n, auto sh, float & gm, float & gl, float (&a0)[NP], float (&a1)[NP]) {
        constexpr bool SH = decltype(sh)::value;
#define MK_LD(p) mk_ld_part<SH>(p)
        gm = -INFINITY;
        for (int k0 = 0; k0 < n; k0 += WARP_SIZE) {
            const int k = k0 + lane;
            if (k < n) {
                const float lk = MK_LD(part + (size_t) k*PS + 1);
                const float mk = MK_LD(part + (size_t) k*PS);
                if (lk > 0.0f) {
                    gm = fmaxf(gm, mk);
                }
            }
        }
#pragma unroll
        for (int o = WARP_SIZE/2; o > 0; o >>= 1) {
            gm = fmaxf(gm, __shfl_xor_sync(0xffffffff, gm, o));
        }
        gl = 0.0f;
#pragma unroll
        for (int i = 0; i < NP; ++i) {
            a0[i] = 0.0f;
            a1[i] = 0.0f;
        }
#pragma unroll 4
        for (int k = 0; k < n; ++k) {
            const float * Pk = part + (size_t) k*PS;
            const float lk = MK_LD(Pk + 1);
            const float mk = MK_LD(Pk);
            float c0[NP], c1[NP];
#pragma unroll
            for (int i = 0; i < NP; ++i) {
                c0[i] = i < np ? MK_LD(Pk + 4 + 2*lane + 64*i)     : 0.0f;
                c1[i] = i < np ? MK_LD(Pk + 4 + 2*lane + 64*i + 1) : 0.0f;
            }
            if (!(lk > 0.0f)) {
                continue;
            }
            const float w = expf(mk - gm);
            gl = fmaf(lk, w, gl);
#pragma unroll
            for (int i = 0; i < NP; ++i) {
                a0[i] = fmaf(w, c0[i], a0[i]);
                a1[i] = fmaf(w, c1[i], a1[i]);
            }
        }
#undef MK_LD
    };
    // (token, head) mh's output: the combined sums normalised, into a.att
    auto finish = [&](int mh, float gl, const float (&a0)[NP], const float (&a1)[NP]) {
        const int m = mh / L.n_head;
        const int h = mh % L.n_head;
        float * out = a.att + (size_t) m*a.m->max_q + h*hd;
        const float inv = gl > 0.0f ? 1.0f/gl : 0.0f;
#pragma unroll
        for (int i = 0; i < NP; ++i) {
            if (i < np) {
                out[2*lane + 64*i]     = a0[i]*inv;
                out[2*lane + 64*i + 1] = a1[i]*inv;
            }
        }
    };
    // the same combine by the whole block, thread d taking dimension d (d < hd; the others help with the weights): per
    // dimension the same operations in the same order as a lane of the warp's combine, so the same bits. Entry k's
    // header is read once, by thread k, and its weight expf(m_k - gm) computed once, into the block's scratch (w);
    // every thread then adds its dimension over the entries (one load each, all in flight, instead of one warp's
    // n x 2 x NP loads). Returns this thread's weighted V sum; gm and gl (the same in every thread)
    auto combine_blk = [&](const float * part, int n, auto sh, float * w, float & gm, float & gl) {
        constexpr bool SH = decltype(sh)::value;
        for (int k = threadIdx.x; k < n; k += MK_THREADS) {
            w[2*k]     = mk_ld_part<SH>(part + (size_t) k*PS);       // m_k
            w[2*k + 1] = mk_ld_part<SH>(part + (size_t) k*PS + 1);   // l_k
        }
        __syncthreads();
        gm = -INFINITY;
        for (int k = 0; k < n; ++k) {
            if (w[2*k + 1] > 0.0f) {
                gm = fmaxf(gm, w[2*k]);
            }
        }
        __syncthreads();   // (every thread read the maxima before they become weights)
        for (int k = threadIdx.x; k < n; k += MK_THREADS) {
            w[2*k] = w[2*k + 1] > 0.0f ? expf(w[2*k] - gm) : 0.0f;
        }
        __syncthreads();
        gl = 0.0f;
        float acc = 0.0f;
        const int d = threadIdx.x;
#pragma unroll 8
        for (int k = 0; k < n; ++k) {
            const float c  = d < hd ? mk_ld_part<SH>(part + (size_t) k*PS + 4 + d) : 0.0f;
            const float lk = w[2*k + 1];
            if (!(lk > 0.0f)) {
                continue;
            }
            const float wk = w[2*k];
            gl  = fmaf(lk, wk, gl);
            acc = fmaf(wk, c, acc);
        }
        return acc;
    };
    // combine_blk's result: into a.att (finish_blk) or as a group's partial result (put_blk)
    auto finish_blk = [&](int mh, float gl, float acc) {
        const int m = mh / L.n_head;
        const int h = mh % L.n_head;
        const float inv = gl > 0.0f ? 1.0f/gl : 0.0f;
        if ((int) threadIdx.x < hd) {
            a.att[(size_t) m*a.m->max_q + h*hd + threadIdx.x] = acc*inv;
        }
    };
    auto put_blk = [&](float * P, float gm, float gl, float acc) {
        if (threadIdx.x == 0) {
            P[0] = gm;
            P[1] = gl;
        }
        if ((int) threadIdx.x < hd) {
            P[4 + threadIdx.x] = acc;
        }
    };
    // after the block wrote a group's result of (token, head) mh (put_blk): counts it; true (in every thread) for the
    // block whose group was the last of n
    auto arrive_last_blk = [&](int mh, int n, float * w) {
        __threadfence();
        __syncthreads();
        unsigned * flag = (unsigned *) (w + 2*MK_ATT_W);
        if (threadIdx.x == 0) {
            *flag = atomicAdd(a.att_cnt + mh, 1u) == (unsigned) n - 1;
        }
        __syncthreads();
        const bool last = *flag != 0;
        if (last) {
            __threadfence();
        }
        return last;
    };
    // after the warp wrote a partial result of (token, head) mh to global memory: counts it; true for the warp whose
    // result was the last of n (it then sees all of them; it combines them and resets the counter: mh_done)
    auto arrive_last = [&](int mh, int n) {
        __threadfence();
        __syncwarp();
        unsigned done = 0;
        if (lane == 0) {
            done = atomicAdd(a.att_cnt + mh, 1u);
        }
        done = __shfl_sync(0xffffffff, done, 0);
        if (done != (unsigned) n - 1) {
            return false;
        }
        __threadfence();
        return true;
    };
    auto mh_done = [&](int mh) {
        if (lane == 0) {
            atomicExch(a.att_cnt + mh, 0u);
        }
    };
    // the groups (GGML_MK_VAR_ONE_GROUP: the whole list as one, the attention before the groups)
    const bool one_group = !FOLD && (a.flags & GGML_MK_VAR_ONE_GROUP);
    const uint16_t grp1[2] = { 0, (uint16_t) nch };
    const int ng = one_group ? 1 : st.n_grp[cache];
    const uint16_t * grp = one_group ? grp1 : st.grp[cache];

    if constexpr (BLK) {
        // one block per (token, head, group), its warps take the group's chunks, their partial results stay in the
        // block's shared memory (the staged-inputs region, free between mat-vecs) and warp 0 combines them: no L2
        // round trips for the chunks' results. One group: that is the (token, head)'s output; several: each block
        // writes its group's result to global memory and the last of them combines those (arrive_last). The same
        // chunk and combine arithmetic as the device-wide way, so the same bits
        const int gmax = one_group ? nch : MK_GRP_SLOTS(nch);
        // LD2: the units' Q after the slots (mk_att_two counted two units' where TWO)
        const int nq = mk_att_q_floats(LD2 ? GGML_MK_VAR_LOAD_PAIRS : 0, 1, a.m->max_head_dim);
        if (FOLD ? !F.fits : gmax*PS + nq > (a.xs_bytes + a.xq_bytes)/(int) sizeof(float)) {
            return false;
        }
        float * qs0 = slots + (size_t) (TWO ? 2*MK_ATT_GROUP : gmax)*PS;
        // LD2: (token, head) mh's Q into shared memory at dst (every thread; a block barrier before the chunks read it)
        auto stage_q = [&](int mh, float * dst) {
            const int m = mh / L.n_head;
            const int h = mh % L.n_head;
            const float * q = a.q + (size_t) m*a.m->max_q + h*hd;
            for (int d = threadIdx.x; d < hd; d += MK_THREADS) {
                dst[d] = mk_ldcg(q + d);
            }
        };
        const int wb = threadIdx.x / WARP_SIZE;
        if constexpr (TWO) {
            // units u0 and u0 + gridDim.x in one round (the units a block took one after the other before): warp wb
            // takes chunk wc of unit hw's group into that unit's slots; then the block combines the first unit's
            // group, then the second's, each as below (the last block of a (token, head) also combines its groups).
            // (The combine steps repeat the one-unit loop's below while the variant is measured: if it wins, this loop
            // takes one unit a round too and the other goes)
            const int nu = M*L.n_head*ng;
            const int hw = wb / MK_ATT_GROUP;   // (2 and up: idle warps where MK_WARPS > 2*MK_ATT_GROUP)
            const int wc = wb - hw*MK_ATT_GROUP;
            float * w = mk_att_scratch();
            for (int u0 = blockIdx.x; u0 < nu; u0 += 2*gridDim.x) {
                unsigned long long * prof = u0 == (int) blockIdx.x ? a.prof : nullptr;   // (block 0's first round)
                mk_prof_at(prof, MK_PH_AT_PRO);
                if constexpr (LD2) {
                    for (int k = 0; k < 2 && u0 + k*(int) gridDim.x < nu; ++k) {
                        stage_q((u0 + k*gridDim.x) / ng, qs0 + (size_t) k*a.m->max_head_dim);
                    }
                    __syncthreads();
                }
                const int uw = u0 + hw*gridDim.x;
                if (hw < 2 && uw < nu) {
                    const int mh = uw / ng;
                    const int ck = grp[uw - mh*ng] + wc;
                    if (ck < grp[uw - mh*ng + 1]) {
                        float mx, l, a0[NP], a1[NP];
                        chunk(mh, ck, mx, l, a0, a1, qs0 + (size_t) hw*a.m->max_head_dim);
                        put(slots + (size_t) (hw*MK_ATT_GROUP + wc)*PS, mx, l, a0, a1);
                    }
                }
                mk_prof_at(prof, MK_PH_AT_WARP0);
                __syncthreads();
                mk_prof_at(prof, MK_PH_AT_CHUNKS);
                for (int k = 0; k < 2 && u0 + k*(int) gridDim.x < nu; ++k) {
                    const int u  = u0 + k*gridDim.x;
                    const int mh = u / ng;
                    const int g  = u - mh*ng;
                    if (k > 0) {
                        __syncthreads();   // (the first unit's combines read w, which this one rewrites)
                    }
                    float gm, gl;
                    const float acc = combine_blk(slots + (size_t) k*MK_ATT_GROUP*PS, grp[g + 1] - grp[g], mk_bool<true>(),
                                                  w, gm, gl);
                    if (ng == 1) {
                        finish_blk(mh, gl, acc);
                        continue;
                    }
                    float * part = a.att_part + (size_t) mh*a.n_chunk*PS;
                    put_blk(part + (size_t) g*PS, gm, gl, acc);
                    if (arrive_last_blk(mh, ng, w)) {
                        const float acc_g = combine_blk(part, ng, mk_bool<false>(), w, gm, gl);
                        finish_blk(mh, gl, acc_g);
                        if (threadIdx.x == 0) {
                            atomicExch(a.att_cnt + mh, 0u);
                        }
                    }
                }
                mk_prof_at(prof, MK_PH_AT_COMB);   // (both units' combines, the groups' too: no MK_PH_AT_GROUPS here)
                __syncthreads();   // the slots and w are rewritten in the next round
            }
            return true;
        }
        for (int u = blockIdx.x; u < M*L.n_head*ng; u += gridDim.x) {
            const int mh = u / ng;   // (a (token, head)'s groups go to consecutive blocks)
            const int g  = u - mh*ng;
            unsigned long long * prof = u == (int) blockIdx.x ? a.prof : nullptr;   // (the profile: block 0's first unit)
            mk_prof_at(prof, MK_PH_AT_PRO);
            if constexpr (FOLD) {
                const int m   = mh / L.n_head;
                const int h   = mh % L.n_head;
                const int hkv = h / gqa;
                const int nkv = L.has_kv ? M : 0;
                int * jobs    = (int *) (sm + F.jobs);
                if (threadIdx.x < 2*nkv) {
                    jobs[threadIdx.x] = mk_hv(threadIdx.x/2, 1 + (threadIdx.x & 1), hkv);
                }
                __syncthreads();
                float * hv = slots;   // the head vectors' scratch (the chunks' slots come after them)
                mk_head_vecs(a, il, 1 + 2*nkv, mk_hv(m, 0, h), jobs, hv, sm + F.red);
                for (int d = threadIdx.x; d < hd; d += MK_THREADS) {
                    fq[d] = hv[d]*L.q_scale;
                }
                // the step's K/V rows of kv head hkv into the cache, F16 (every token's: the default reads each of the
                // step's cells after the heads phase wrote it; a cell the token does not see adds nothing either way)
                for (int e = threadIdx.x; e < 2*nkv*hd; e += MK_THREADS) {
                    const int v = e / hd;   // 2 token + K/V
                    mk_kv_put(kv, 1 + (v & 1), st.kv_idx[cache][v/2], hkv, e - v*hd, __float2half(hv[hd + e]));
                }
                __syncthreads();   // (the block's cache writes before its chunks read them back, through L2 as all cells)
            }
            if constexpr (LD2) {
                stage_q(mh, qs0);
                __syncthreads();
            }
            const int k0 = grp[g];
            const int k1 = grp[g + 1];
            for (int ck = k0 + wb; ck < k1; ck += MK_WARPS) {
                float mx, l, a0[NP], a1[NP];
                chunk(mh, ck, mx, l, a0, a1, qs0);
                put(slots + (size_t) (ck - k0)*PS, mx, l, a0, a1);
            }
            mk_prof_at(prof, MK_PH_AT_WARP0);   // (thread 0: warp 0's own chunks done; the rest waits for the other warps)
            __syncthreads();
            mk_prof_at(prof, MK_PH_AT_CHUNKS);
            if (!(a.flags & GGML_MK_VAR_WARP_COMBINE)) {
                // the whole block combines (combine_blk: the same bits as warp 0's combine below)
                float * w = mk_att_scratch();
                float gm, gl;
                const float acc = combine_blk(slots, k1 - k0, mk_bool<true>(), w, gm, gl);
                if (ng == 1) {
                    finish_blk(mh, gl, acc);
                    mk_prof_at(prof, MK_PH_AT_COMB);
                } else {
                    float * part = a.att_part + (size_t) mh*a.n_chunk*PS;
                    put_blk(part + (size_t) g*PS, gm, gl, acc);
                    const bool last = arrive_last_blk(mh, ng, w);
                    mk_prof_at(prof, MK_PH_AT_COMB);
                    if (last) {
                        const float acc_g = combine_blk(part, ng, mk_bool<false>(), w, gm, gl);
                        finish_blk(mh, gl, acc_g);
                        if (threadIdx.x == 0) {
                            atomicExch(a.att_cnt + mh, 0u);
                        }
                        mk_prof_at(prof, MK_PH_AT_GROUPS);
                    }
                }
            } else if (wb == 0) {
                float gm, gl, a0[NP], a1[NP];
                combine(slots, k1 - k0, mk_bool<true>(), gm, gl, a0, a1);
                if (ng == 1) {
                    finish(mh, gl, a0, a1);
                } else {
                    // the group's result to global memory; the last of the (token, head)'s combines them in group order
                    float * part = a.att_part + (size_t) mh*a.n_chunk*PS;
                    put(part + (size_t) g*PS, gm, gl, a0, a1);
                    if (arrive_last(mh, ng)) {
                        combine(part, ng, mk_bool<false>(), gm, gl, a0, a1);
                        finish(mh, gl, a0, a1);
                        mh_done(mh);
                    }
                }
            }
            __syncthreads();   // the slots are rewritten for the next unit
        }
        return true;
    }

    for (int u = warp; u < M*L.n_head*nch; u += nwarps) {
        const int ck = u % nch;               // the ck-th chunk of the list: its partial result's slot
        const int mh = u / nch;
        float mx, l, a0[NP], a1[NP];
        chunk(mh, ck, mx, l, a0, a1, nullptr);

        // this chunk's partial result, then the (token, head)'s chunk count
        float * part = a.att_part + (size_t) mh*a.n_chunk*PS;
        put(part + (size_t) ck*PS, mx, l, a0, a1);
        if (!arrive_last(mh, nch)) {
            continue;
        }
        // the last chunk of (m, h): each group's chunks combined in chunk order (a group's result written over a slot
        // already read: slot g <= grp[g]), then the groups in group order, as the block-per-(token, head, group) way
        float gm, gl;   // (a0, a1: this chunk's, put above, now the sums)
        if (ng > 1) {
            for (int g = 0; g < ng; ++g) {
                combine(part + (size_t) grp[g]*PS, grp[g + 1] - grp[g], mk_bool<false>(), gm, gl, a0, a1);
                __syncwarp();
                put(part + (size_t) g*PS, gm, gl, a0, a1);
                __threadfence();
                __syncwarp();
            }
        }
        combine(part, ng > 1 ? ng : nch, mk_bool<false>(), gm, gl, a0, a1);
        finish(mh, gl, a0, a1);
        mh_done(mh);
    }
    return true;
}

// the block-per-(token, head, group) attention of head dim 64*NP (one call site each): two units a round where
// mk_att_two says so (GGML_MK_VAR_TWO_UNITS), else one (false: the device-wide way's turn, as mk_attention<NP, true>)
// LD2 (GGML_MK_VAR_LOAD_PAIRS; 512-dim heads, 2 cells a step): two steps a load round trip, the unit's Q in shared memory
template <int NP>
MK_DEVICE_FN bool mk_attention_blk(const mk_args & a, int il, int M, float * sm) {
    const ggml_mk_layer & L = a.m->layers[il];
    const int nu = M*L.n_head*a.st->n_grp[L.is_swa ? 1 : 0];
    constexpr bool LD2_OK = NP > 4;   // (the default's 2 cells a step; NP <= 4 takes 8 already)
    if (LD2_OK && (a.flags & GGML_MK_VAR_LOAD_PAIRS)) {
        if (mk_att_two(a.flags, nu, gridDim.x, a.m->max_head_dim, a.xs_bytes + a.xq_bytes)) {
            return mk_attention<NP, true, false, 0, true, LD2_OK>(a, il, M, sm);
        }
        return mk_attention<NP, true, false, 0, false, LD2_OK>(a, il, M, sm);
    }
    if (mk_att_two(a.flags, nu, gridDim.x, a.m->max_head_dim, a.xs_bytes + a.xq_bytes)) {
        return mk_attention<NP, true, false, 0, true>(a, il, M, sm);
    }
    return mk_attention<NP, true>(a, il, M, sm);
}

// the block-per-(token, head, group) attention of head dim <= 256 with 4 cells a step (GGML_MK_VAR_CHUNK4; one call site)
MK_DEVICE_FN bool mk_attention_c4(const mk_args & a, int il, int M, float * sm) {
    return mk_attention<4, true, false, 4>(a, il, M, sm);
}

// the attention with the heads phase folded in (one call site in the kernel body: each call site costs it stack)
MK_DEVICE_FN void mk_attention_fold(const mk_args & a, int il, int M, float * sm) {
    if (a.m->layers[il].head_dim <= MK_ATT_HD4) {
        mk_attention<4, true, true>(a, il, M, sm);
    } else {
        mk_attention<GGML_MK_MAX_HEAD_DIM/64, true, true>(a, il, M, sm);
    }
}

// ---------------------------------------------------------------------------------------------
// Gemma 4 per-layer inputs: pl_in[m][il][j] = (rmsnorm(P x / sqrt(n_embd)) * w + e*sqrt(n_pl)) / sqrt(2)

MK_DEVICE_FN void mk_pl_inputs(const mk_args & a, int M) {
    const ggml_mk_model & md = *a.m;
    const int lane   = threadIdx.x % WARP_SIZE;
    const int warp   = blockIdx.x*MK_WARPS + threadIdx.x / WARP_SIZE;
    const int nwarps = gridDim.x*MK_WARPS;
    const int npl    = md.n_embd_pl;
    const float s_proj = 1.0f/sqrtf((float) md.n_embd);
    const float s_tok  = sqrtf((float) npl);
    const float s_out  = 1.0f/sqrtf(2.0f);
    for (int u = warp; u < M*md.n_layer; u += nwarps) {
        const int m  = u / md.n_layer;
        const int il = u % md.n_layer;
        float * p = a.pl_in + (size_t) m*a.n_pl_all + il*npl;
        const float * e = a.pl_embd + (size_t) m*a.n_pl_all + il*npl;
        float ss = 0.0f;
        for (int j = lane; j < npl; j += WARP_SIZE) {
            const float t = mk_ldcg(p + j)*s_proj;
            ss = fmaf(t, t, ss);
        }
        ss = mk_warp_sum(ss);
        const float r = 1.0f/sqrtf(ss/npl + md.norm_eps);
        for (int j = lane; j < npl; j += WARP_SIZE) {
            const float t = mk_ldcg(p + j)*s_proj;
            p[j] = (t*r*md.pl_proj_norm[j] + e[j]*s_tok)*s_out;
        }
    }
}

// ---------------------------------------------------------------------------------------------

// the block's largest (value, index) pair, on a tie the smaller index: over the lanes, then over the warps; the result in
// thread 0. The whole block calls it
MK_DEVICE void mk_argmax_block(float & best, unsigned & bi) {
    MK_SHARED(float,    s_v, MK_WARPS);
    MK_SHARED(unsigned, s_i, MK_WARPS);
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    for (int o = WARP_SIZE/2; o > 0; o /= 2) {
        const float    v = __shfl_xor_sync(0xffffffff, best, o);
        const unsigned i = __shfl_sync(0xffffffff, bi, lane ^ o);
        if (v > best || (v == best && i < bi)) {
            best = v;
            bi   = i;
        }
    }
    if (lane == 0) {
        s_v[warp] = best;
        s_i[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < MK_WARPS; ++w) {
            if (s_v[w] > best || (s_v[w] == best && s_i[w] < bi)) {
                best = s_v[w];
                bi   = s_i[w];
            }
        }
    }
    __syncthreads();   // (s_v, s_i are read before the next call writes them)
}

// the draft of step j from the blocks' partial picks (after the grid barrier that follows mk_draft_pick): the largest
// value, on a tie the smaller index = the first index of the largest logit. Every block reduces the same partials in
// the same order, so all get the same token; block 0 also stores it for the host. The whole block calls it
MK_DEVICE int mk_draft_token(const mk_draft_args & da, int j) {
    MK_SHARED(int, s_tok, 1);
    float    best = -INFINITY;
    unsigned bi   = 0xffffffffu;
    for (int b = threadIdx.x; b < (int) gridDim.x; b += MK_THREADS) {
        const float    v = mk_ldcg(da.pick_v + b);
        const unsigned i = mk_ldcg_u32(da.pick_i + b);
        if (v > best || (v == best && i < bi)) {
            best = v;
            bi   = i;
        }
    }
    mk_argmax_block(best, bi);
    if (threadIdx.x == 0) {
        const int t = bi < (unsigned) da.tok_embd.ne1 ? (int) bi : 0;   // (every logit -inf or NaN: token 0)
        s_tok[0] = t;
        if (blockIdx.x == 0) {
            da.tokens[j] = t;
        }
    }
    __syncthreads();
    const int t = s_tok[0];
    __syncthreads();   // (s_tok is read before the next call writes it)
    return t;
}

// a draft step's pre-projection input concat(tok_embd[t]*embd_scale, h) (t, h: the launch's, or step j-1's draft and
// h_next, written before the last grid barrier)
MK_DEVICE_FN void mk_draft_inputs(const mk_draft_args & da, int j, int flags) {
    const int nb = da.n_embd_bb;
    const int t  = j == 0 ? da.token : mk_draft_token(da, j - 1);
    const uint8_t * row = (const uint8_t *) da.tok_embd.data + (size_t) t*da.tok_embd.nb1;
    // one 32-value group per thread, decoded in registers, the groups dealt to the blocks in turn (thread 0 of every
    // block first). (Before, GGML_MK_VAR_EMBD_BLOCK0: the groups went to the first threads of block 0, each decoding
    // into the output in global memory and scaling it there; the E4B-shaped draft's embedding phase 118 -> 104 us per
    // k = 3 launch, NOTES.md session 13)
    const int nt  = gridDim.x*MK_THREADS;
    const int tid = blockIdx.x*MK_THREADS + threadIdx.x;
    if (flags & GGML_MK_VAR_EMBD_BLOCK0) {
        for (int g = tid; g < nb/32; g += nt) {
            float * x = da.xh + 32*g;
            mk_deq32(row, da.tok_embd.type, g, 32, x);
            for (int i = 0; i < 32; ++i) {
                x[i] = __fmul_rn(x[i], da.embd_scale);
            }
        }
    } else {
        for (int g = threadIdx.x*gridDim.x + blockIdx.x; g < nb/32; g += nt) {
            float w[32];
            mk_deq32(row, da.tok_embd.type, g, 32, w);
            float * x = da.xh + 32*g;
            MK_UNROLL
            for (int i = 0; i < 32; ++i) {
                x[i] = __fmul_rn(w[i], da.embd_scale);
            }
        }
    }
    for (int i = tid; i < nb; i += nt) {
        da.xh[nb + i] = j == 0 ? da.h[i] : mk_ldcg(da.h_next + (size_t) (j - 1)*nb + i);
    }
}

// every block: the largest logit of its slice of the vocabulary and its first index into da.pick_v/pick_i[blockIdx.x]
// (and the slice's logits to the host, if wanted); the step's draft is reduced from them after the grid barrier that
// follows (mk_draft_token). (Before: block 0 alone scanned all logits, every thread's 512 loads from L2 one after
// another; a k = 1 launch on the small synthetic pair took ~390 us on the H200, most of it likely that scan)
MK_DEVICE_FN void mk_draft_pick(const mk_args & a, const mk_draft_args & da, int j) {
    const int nv  = a.m->n_vocab;
    const int per = (nv + (int) gridDim.x - 1)/(int) gridDim.x;
    const int i0  = blockIdx.x*per;
    const int i1  = i0 + per < nv ? i0 + per : nv;
    float    best = -INFINITY;
    unsigned bi   = (unsigned) nv;   // (an empty slice or only -inf: loses every comparison)
    for (int i = i0 + threadIdx.x; i < i1; i += MK_THREADS) {
        const float v = mk_ldcg(a.logits + i);
        if (da.logits) {
            da.logits[(size_t) j*nv + i] = v;
        }
        if (v > best) {
            best = v;
            bi   = i;
        }
    }
    mk_argmax_block(best, bi);
    if (threadIdx.x == 0) {
        da.pick_v[blockIdx.x] = best;
        da.pick_i[blockIdx.x] = bi;
    }
}

// the mat-vec about to run (R, its inputs x: the block's copies in shared memory) staged once for the grid where
// mk_once_on says so: this block's slice of its records, x.rec set (thread 0), then the grid barrier after which every
// block may copy them (mk_mv_run reads x.rec). Out of line: the kernel body's call sites of its mat-vecs stay small
MK_DEVICE_FN void mk_once(const mk_args & a, const mk_mvr & R, mk_xin & x, int M) {
    if (!mk_once_on(R, x, M, a.xrec, a.xrec_k, a.flags)) {
        return;
    }
    mk_stage_once(x, R.j[0].ne0, M, a.xrec);
    if (threadIdx.x == 0) {
        x.rec = a.xrec;   // (seen by the block after mk_grid_sync's block barrier; the next in() writes NULL again)
    }
    mk_grid_sync(a, MK_PH_ONCE);
}

// one step of a launch, the whole grid: a decode/verify step (DRAFT = false: mk_decode_kernel), or step j of a fused MTP
// draft (mk_draft_kernel; da: a device copy of its mk_draft_args), which adds its inputs and its pick around the step.
// A decode step's code does not see the draft's: it compiles to the kernel it was before the draft (SASS compared)
template <bool DRAFT>
MK_DEVICE void mk_step(const mk_args & ka, const mk_draft_args * da, int j) {
    MK_SHARED_DYN(float4, smem);
    // the launch's arguments and the descriptors of the mat-vecs live in shared memory: one copy per block.
    // (Passed by reference to the phases, a per-thread copy would be local memory: a few hundred bytes x 512
    // threads per call, far more than the L1 left beside the shared memory, so every phase paid L2 round trips.)
    MK_SHARED(mk_args, s_a, 1);
    MK_SHARED(mk_xin,  s_xin, 1);  // the inputs of the mat-vec being run
    MK_SHARED(mk_mvr,  s_mv, 1);   // its descriptor (from the table)
    MK_SHARED(mk_bulk, s_bulk, MK_WARPS);   // per warp: the mbarriers of its bulk copies (mk_args.bulk)
    MK_SHARED(mk_it,   s_fe, MK_WARPS);     // per warp: where its fetches of the mat-vec begun last go on (mk_mv_begin)
    MK_SHARED(mk_res,  s_res, 1);           // the residual stream's bookkeeping, thread 0's (in(fx) below)
    if (threadIdx.x == 0) {
        s_a[0] = ka;
        s_a[0].flags = ka.m->debug_flags;   // (one load, here: mk_args.flags)
        s_res[0] = { ka.xb[0], ka.xb[1], nullptr, 1.0f };
    }
    if (j == 0 && ka.bulk && threadIdx.x < MK_WARPS*ka.ns) {
        mk_mbar_init(&s_bulk[threadIdx.x / ka.ns].bar[threadIdx.x % ka.ns]);   // (the stages in use)
    }
    if (j == 0 && threadIdx.x < MK_WARPS) {
        s_bulk[threadIdx.x].ph = 0;   // (a draft's steps go on with the phases of the step before)
    }
    if (j == 0 && ka.bulk) {
        mk_mbar_init_fence();   // (sm_90 only: on older devices mk_args.bulk is 0 and this would trap)
    }
    __syncthreads();
    const mk_args & a = s_a[0];
    if (j == 0 && blockIdx.x == 0 && threadIdx.x == 0) {
        *a.bar_next = 0;   // the next launch's barrier count
    }
    float   * xs = (float *) smem;                                // staged mat-vec inputs; the heads' scratch
    uint8_t * ws = (uint8_t *) smem + a.xs_bytes + a.xq_bytes;   // weight stages (a.ns per warp)
    mk_bulk * bk = a.bulk ? s_bulk : nullptr;

    const ggml_mk_model & md = *a.m;
    const int M = a.st->n_tokens;
    const int n = md.n_embd;
    const float eps = md.norm_eps;
    mk_prof(a, MK_PH_START);

    // x = token embedding * sqrt(n_embd) (a draft step: pre*concat(x, h), below)
    if (!DRAFT) {
        const int tid = blockIdx.x*MK_THREADS + threadIdx.x;
        for (int i = tid; i < M*n; i += gridDim.x*MK_THREADS) {
            a.xb[0][i] = a.embd[i]*md.embd_scale;   // (the residual stream starts in xb[0]: s_res)
        }
    }

    const bool ple = md.n_embd_pl > 0;

    // begin(idx): every warp issues its first weight tiles of mat-vec idx (mk_mv_index; typically before the
    // barrier that precedes it; late: run does, after the staging); run(fx): thread 0 writes the inputs fx() makes,
    // then the mat-vec begun last
    const bool late = (a.flags & GGML_MK_VAR_LATE_BEGIN) != 0;
    auto begin = [&](int idx) {
        // (the mat-vec before has ended: its last barrier is behind every thread)
        static_assert(sizeof(mk_mvr) % sizeof(unsigned) == 0, "mk_mvr is copied in words");
        const unsigned * src = (const unsigned *) (a.mvt + idx);
        for (int i = threadIdx.x; i < (int) (sizeof(mk_mvr)/sizeof(unsigned)); i += MK_THREADS) {
            ((unsigned *) s_mv)[i] = src[i];
        }
        __syncthreads();
        if (!late) {
            const mk_it fe = mk_mv_begin(s_mv[0], ws, a.ns, bk);
            if (threadIdx.x % WARP_SIZE == 0) {
                s_fe[threadIdx.x / WARP_SIZE] = fe;   // (read by the warp's lanes after run's block barrier)
            }
        }
    };
    // in(fx): thread 0 writes the inputs fx() makes for the next mat-vec, before the grid barrier in front of it (the
    // barrier's block barriers make them seen; the mat-vec before has ended, begin's block barrier is behind every
    // thread, and no other phase reads s_xin), so that fx()'s loads of the model's fields (global memory) are not on
    // the path after the barrier; go(): the mat-vec begun last, with those inputs (every call follows a grid barrier)
    auto in = [&](auto fx) {
        if (threadIdx.x == 0) {
            s_xin[0] = fx();
        }
    };
    auto go = [&]() {
        mk_once(a, s_mv[0], s_xin[0], M);   // (inputs staged once for the grid where mk_once_on says so)
        // one column: the code made for it (the same arithmetic per column as the any-batch code)
        if (M == 1 && !(a.flags & GGML_MK_VAR_GENERIC_M)) {
            mk_mv_run<1>(s_mv[0], s_xin[0], M, eps, xs, a.xs_bytes, a.xq_bytes, ws, a.ns, bk, a.prof, late,
                         s_fe[threadIdx.x / WARP_SIZE]);
        } else {   // (2..MK_MC_SMALL tokens: mk_mv_run<MK_M> calls the code made for them)
            mk_mv_run<MK_M>(s_mv[0], s_xin[0], M, eps, xs, a.xs_bytes, a.xq_bytes, ws, a.ns, bk, a.prof, late,
                            s_fe[threadIdx.x / WARP_SIZE]);
        }
    };
    auto plain = [&](const float * src, int ld) {
        return [=]() {
            mk_xin xi = { MK_X_PLAIN, src, ld, nullptr, 0, nullptr, nullptr, 1.0f, nullptr, nullptr, nullptr };
            return xi;
        };
    };

    // the residual step still to apply: x = (x + h*rms(h)*nw)*scale, done by the next staging (s_res: xc the stream now,
    // xn where the next residual step writes it). Only thread 0 keeps it, in shared memory: the other threads carry none
    // of it through the layers (registers the kernel body would spill, and reload from local memory after a barrier)
    auto set_res = [&](const float * nw, float scale) {
        if (threadIdx.x == 0) {
            s_res[0].nw    = nw;
            s_res[0].scale = scale;
        }
    };
    // the inputs of a mat-vec that applies the pending residual step, then the stream is the new one (thread 0, in in())
    auto in_res = [&](const float * nw, float * nw_out = nullptr) {
        in([&]() {
            mk_res & r = s_res[0];
            mk_xin xi = { MK_X_PLAIN, r.xc, n, nullptr, 0, r.nw ? a.h : nullptr, r.nw, r.scale, r.xn, nw, nw_out };
            if (r.nw) {
                float * t = r.xc; r.xc = r.xn; r.xn = t;
                r.nw = nullptr;
            }
            return xi;
        });
    };

    if (DRAFT) {
        mk_draft_inputs(*da, j, a.flags);
        begin(mk_mv_draft_pre(md.n_layer));
        in(plain(da->xh, 2*da->n_embd_bb));
        mk_grid_sync(a, MK_PH_EMBD);
        go();
    }
    if (ple) {
        begin(0);
        in(plain(a.xb[0], n));   // (no residual step yet: the stream is xb[0])
        mk_grid_sync(a, MK_PH_EMBD);
        go();
        begin(mk_mv_index(0, MK_MV_QKV));
        mk_grid_sync(a, MK_PH_PL_PROJ);
        mk_pl_inputs(a, M);
    } else {
        begin(mk_mv_index(0, MK_MV_QKV));
    }
    in_res(md.layers[0].attn_norm);
    mk_grid_sync(a, ple ? MK_PH_PL_IN : MK_PH_EMBD);

    for (int il = 0; il < md.n_layer; ++il) {
        const ggml_mk_layer & L = md.layers[il];

        // Q, K, V of rmsnorm(x) * attn_norm (its inputs put before the barrier above)
        go();
        begin(mk_mv_index(il, MK_MV_O));
        mk_grid_sync(a, MK_PH_QKV);

        // Q/K/V norms, rope, the new K/V rows into the cache: a phase of their own, or (variant GGML_MK_VAR_FOLD_HEADS, where
        // the attention takes its block-per-(token, head) way and the fold fits: mk_fold_plan) done by the attention's
        // blocks themselves, one grid barrier less
        const bool fold = (a.flags & GGML_MK_VAR_FOLD_HEADS) && mk_fold_on(a, il, M);
        if (!fold) {
            mk_heads(a, il, M, xs);
            mk_grid_sync(a, MK_PH_HEADS);
        }

        if (fold) {
            mk_attention_fold(a, il, M, xs);
        } else if (L.head_dim <= MK_ATT_HD4) {
            const bool blk = !(a.flags & GGML_MK_VAR_DEVICE_ATT) &&
                             ((a.flags & GGML_MK_VAR_CHUNK4) ? mk_attention_c4(a, il, M, xs) : mk_attention_blk<4>(a, il, M, xs));
            if (!blk) {
                mk_attention<4, false>(a, il, M, xs);
            }
        } else {
            if ((a.flags & GGML_MK_VAR_DEVICE_ATT) || !mk_attention_blk<GGML_MK_MAX_HEAD_DIM/64>(a, il, M, xs)) {
                mk_attention<GGML_MK_MAX_HEAD_DIM/64, false>(a, il, M, xs);
            }
        }
        in(plain(a.att, md.max_q));
        mk_grid_sync(a, L.is_swa ? MK_PH_ATTN : MK_PH_ATTN_G);

        go();   // O
        begin(mk_mv_index(il, MK_MV_FFN));
        set_res(L.attn_post_norm, 1.0f);
        // gelu(gate) * up of rmsnorm(x) * ffn_norm, after the attention residual
        in_res(L.ffn_norm);
        mk_grid_sync(a, MK_PH_WO);

        go();   // gate/up
        begin(mk_mv_index(il, MK_MV_DOWN));
        in(plain(a.g, md.max_ff));
        mk_grid_sync(a, MK_PH_FFN);

        go();   // down
        set_res(L.ffn_post_norm, ple ? 1.0f : L.out_scale);

        if (ple) {
            begin(mk_mv_index(il, MK_MV_PL_GATE));
            in_res(nullptr);
            mk_grid_sync(a, MK_PH_DOWN);
            go();   // per-layer gate
            begin(mk_mv_index(il, MK_MV_PL_PROJ));
            in([&]() {
                mk_xin xi = { MK_X_GEGLU, a.pl_g, md.n_embd_pl, a.pl_in + il*md.n_embd_pl, a.n_pl_all,
                              nullptr, nullptr, 1.0f, nullptr, nullptr, nullptr };
                return xi;
            });
            mk_grid_sync(a, MK_PH_PL_GATE);
            go();   // per-layer proj
            set_res(L.pl_post_norm, L.out_scale);
        }
        begin(il + 1 < md.n_layer ? mk_mv_index(il + 1, MK_MV_QKV) : mk_mv_count(md.n_layer) - 1);
        // the next layer's Q, K, V inputs; after the last layer the LM head's: rmsnorm(x) * output_norm after the last
        // residual (also to a.h_out when the host wants the hidden states, an MTP draft's)
        if (il + 1 < md.n_layer) {
            in_res(md.layers[il + 1].attn_norm);
        } else {
            in_res(md.output_norm, a.h_out);
        }
        mk_grid_sync(a, ple ? MK_PH_PL_LAYER : MK_PH_DOWN);
    }

    // LM head, final softcap
    go();
    if (DRAFT) {
        // h_next = post*n (n: the LM head's inputs, a.h_out), the draft = the argmax of the logits
        begin(mk_mv_draft_post(md.n_layer, j));
        in(plain(a.h_out, n));
        mk_grid_sync(a, MK_PH_LM_HEAD);
        go();
        mk_draft_pick(a, *da, j);
        mk_grid_sync(a, MK_PH_LM_HEAD);
        return;
    }
    if (a.prof) {
        mk_grid_sync(a, MK_PH_LM_HEAD);
    }
}

// One kernel per module: a module that carries both kernels gets other code for the shared phases (nvcc and clang:
// the decode kernel's SASS changes), so mk.cu compiles the decode/verify kernel and mk-draft.cu (GGML_MK_DRAFT_KERNEL)
// the fused draft; the host emulation builds each where it needs it
#ifndef GGML_MK_DRAFT_KERNEL
MK_KERNEL mk_decode_kernel(const mk_args ka) {
    mk_step<false>(ka, nullptr, 0);
}
#else
// the fused MTP draft: da->k steps of the assistant in one launch (da: a device copy of the launch's draft arguments)
MK_KERNEL mk_draft_kernel(const mk_args ka, const mk_draft_args * da) {
    for (int j = 0; j < da->k; ++j) {
        mk_step<true>(ka, da, j);
    }
    if (blockIdx.x == 0) {
        mk_draft_token(*da, da->k - 1);   // the last draft for the host (the others: each next step reduced them)
    }
}
#endif
