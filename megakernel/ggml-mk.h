// ggml-mk.h: the backend-neutral plan of the Gemma decode megakernel (stq-metal).
//
// llama (megakernel/llama-mk.cpp) derives a ggml_mk_model from a loaded gemma3/gemma4 model: one
// ggml_mk_layer per layer with the device addresses of its weights in their GGUF types (read in
// place from llama.cpp's own buffers) and the per-layer shapes; and, for every decode/verify
// ubatch of up to GGML_MK_MAX_TOKENS tokens, a ggml_mk_step: tokens, positions, where each token's
// K/V rows go in llama.cpp's KV cache and which cells each token sees (llama.cpp's own mask).
// A backend that implements the megakernel exports three functions through its registry's
// get_proc_address ("ggml_backend_mk_create", "ggml_backend_mk_eval", "ggml_backend_mk_free"),
// so llama.cpp links no backend symbol and CUDA and Metal plug into the same place.
//
// Plain C, no ggml types beyond the ggml_type numbers, so that kernels can include it. Metal
// Shading Language (ggml-metal/mk/) sees only the constants: the host structs hold pointers.
#pragma once

#ifndef __METAL_VERSION__
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#endif // __METAL_VERSION__

#define GGML_MK_VERSION      5
#define GGML_MK_MAX_TOKENS   8     // decode (1) and verify (k+1 <= 8) batches
#define GGML_MK_MAX_LAYERS   128
#define GGML_MK_MAX_HEAD_DIM 512
#define GGML_MK_N_CACHES     2     // 0: full-attention cache, 1: sliding-window cache (iswa)

enum ggml_mk_arch {
    GGML_MK_ARCH_GEMMA3 = 0,
    GGML_MK_ARCH_GEMMA4 = 1,
};

#ifndef __METAL_VERSION__
// a 2-D weight, read in place: row r (of ne1) starts at data + r*nb1 and holds ne0 values of type
struct ggml_mk_weight {
    const void * data;   // backend address; NULL = absent
    int32_t      type;   // enum ggml_type
    int32_t      ne0;    // inputs (row length)
    int32_t      ne1;    // outputs (rows)
    int32_t      b256;   // bytes of 256 consecutive values (ggml_row_size(type, 256))
    uint64_t     nb1;    // row stride in bytes
};

struct ggml_mk_layer {
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t n_rot;
    int32_t n_ff;
    int32_t is_swa;       // 1: sliding-window layer (cache 1, its mask)
    int32_t has_kv;       // 1: computes and stores its K/V; 0: reads the cache of the layer it shares
    int32_t v_from_k;     // 1: no V projection, V = the K projection (Gemma 4 use_alternative_attention)
    int32_t v_norm;       // 1: V is rms-normalised without weight (Gemma 4)
    int32_t pad0;
    float   rope_base;
    float   rope_scale;   // ggml's freq_scale
    float   q_scale;      // Q is multiplied by this after rope (Gemma 3: 1/sqrt(head_dim); Gemma 4: 1)
    float   out_scale;    // the layer output is multiplied by this (Gemma 4 layer_output_scale; else 1)
    const float * rope_freqs;   // NULL or n_rot/2 frequency factors (Gemma 4 global layers)

    struct ggml_mk_weight wq, wk, wv, wo;
    struct ggml_mk_weight ffn_gate, ffn_up, ffn_down;
    struct ggml_mk_weight pl_gate, pl_proj;        // Gemma 4 per-layer embedding (absent: data NULL)

    const float * attn_norm;
    const float * q_norm;
    const float * k_norm;
    const float * attn_post_norm;
    const float * ffn_norm;
    const float * ffn_post_norm;
    const float * pl_post_norm;
};

struct ggml_mk_model {
    int32_t version;        // GGML_MK_VERSION
    int32_t arch;           // enum ggml_mk_arch
    int32_t device;         // backend device index (CUDA device id)
    int32_t n_layer;
    int32_t n_embd;
    int32_t n_vocab;
    int32_t n_embd_pl;      // Gemma 4 per-layer embedding width (0 = none)
    int32_t max_head_dim;
    int32_t max_q;          // max n_head*head_dim over layers
    int32_t max_kv;         // max n_head_kv*head_dim over layers
    int32_t max_ff;
    int32_t kv_type;        // enum ggml_type of the K and V caches (F16)
    float   norm_eps;
    float   embd_scale;     // sqrt(n_embd)
    float   softcap;        // final logit softcap, 0 = none
    float   attn_factor;    // rope mscale (ggml attn_factor)
    float   kq_scale;       // scale of Q.K (1: Gemma folds it into Q or its norms)
    int32_t debug_flags;    // GGML_MK_DEBUG_*: planted bugs for tests only; GGML_MK_VAR_*: kernel variants
    int32_t by_default;     // 1: on because nobody asked otherwise (LLAMA_MEGAKERNEL unset): the backend declines, with
                            // the reason, a device where the megakernel has not been measured faster than its graph
    int32_t n_ctx;          // KV cells of the context (an upper bound of every step's n_kv)
    int32_t att_chunk;      // attention is split into chunks of this many cells, counted from cell 0
                            // (a power of two fixed for the context: a token's chunks, and so its
                            // bits, do not depend on the step's n_kv; see ggml_mk_att_chunk)

    struct ggml_mk_weight output;
    const float * output_norm;

    // Gemma 4 per-layer embeddings
    struct ggml_mk_weight pl_model_proj; // [n_embd, n_embd_pl*n_layer]
    const float * pl_proj_norm;          // [n_embd_pl]

    struct ggml_mk_layer layers[GGML_MK_MAX_LAYERS];
};
#endif // __METAL_VERSION__

#define GGML_MK_DEBUG_MASK            0x7f   // the bits of the GGML_MK_DEBUG_* planted bugs (LLAMA_MEGAKERNEL_DEBUG only; the
                                             // variants of LLAMA_MEGAKERNEL_VARIANT are the other bits)
#define GGML_MK_DEBUG_NO_GRID_BARRIER 1   // planted bug: grid barriers become block barriers
// kernel variants for A/B runs in one process (LLAMA_MEGAKERNEL_VARIANT=bits, test-mk --variant): off by default,
// each one a candidate not measured yet, or the behaviour a recent change replaced (to measure that change);
// results bitwise equal to the default kernel
#define GGML_MK_VAR_TWO_UNITS         0x80    // the block-per-(token, head, group) attention takes two units a round (warps 0..7
                                              // and 8..15) where a step has more units than blocks: deep contexts (mk_att_two;
                                              // the same bits). Built in session 43, not yet timed on a GPU
#define GGML_MK_VAR_STAGE_EVERY       0x100   // (before) every block stages a plain mat-vec's inputs itself (mk_stage, mk_stage_cols),
                                              // not rounded once for the grid where the step stages them once (mk_once_on:
                                              // each block rounds its slice of the groups to 8-bit records in global memory,
                                              // a grid barrier, then every block copies them); the same bits
#define GGML_MK_VAR_ONCE_ALL          0x200   // every plain mat-vec whose jobs all take the 8-bit records staged once for the grid,
                                              // whatever its width and batch (the default: only where mk_once_on's bound
                                              // says the grid barrier it adds pays); the same bits
#define GGML_MK_VAR_GENERIC_M         0x400   // (before) one-token steps through the mat-vec code made for any batch
#define GGML_MK_VAR_LOAD_PAIRS        0x800   // the block way's attention of 512-dim heads (2 cells a step) loads two steps' cells
                                              // per round trip (transposed V: 8 bytes of a row, 4 cells, not 4 bytes) and reads
                                              // the unit's Q from shared memory (the registers the second step's K/V take); the
                                              // same steps in the same order: the same bits. Session 44 (the bit was
                                              // GGML_MK_VAR_ALL_CHUNKS, attention over every chunk, measured and retired)
#define GGML_MK_VAR_DEVICE_ATT        0x1000  // (before) attention always the device-wide way (partial results through L2, a
                                              // counter per (token, head)), not one block per (token, head) where it fits
#define GGML_MK_VAR_CP_ASYNC          0x2000  // weight tiles as 16-byte cp.async per lane (the path of sm_80..89 devices), not
                                              // through the bulk copy engine (one cp.async.bulk per tile on a per-stage
                                              // mbarrier: sm_90+)
#define GGML_MK_VAR_FOLD_HEADS        0x4000  // no heads phase: the attention's blocks (one per (token, head)) compute their Q and
                                              // the step's new K/V rows of their kv head themselves (the heads phase's own
                                              // function), write the rows to the cache and read them back after a block barrier;
                                              // one grid barrier less per layer (layers whose attention takes the device-wide
                                              // way keep the phase)
#define GGML_MK_VAR_LATE_BEGIN        0x8000  // a mat-vec's first weight tiles issued after its inputs are staged, not before the
                                              // grid barrier that precedes it (measured: 1.003x at M = 1, verify staging not
                                              // cheaper; kept only until a GPU run confirms its removal, which moves the draft
                                              // kernel's register allocation: NOTES.md, session 13)
#define GGML_MK_VAR_ROW_TILES         0x10000 // (before) one row per weight tile also for short Q4_0/Q8_0 rows, not up to 32/l rows
                                              // (l lanes each) per tile: the draft's LM head (K = 256), its layers, the per-layer
                                              // up-projections
#define GGML_MK_VAR_EMBD_BLOCK0       0x20000 // (before) a fused draft step's token embedding row decoded by the first threads of
                                              // block 0 into global memory and scaled there, not one group per thread of every
                                              // block in registers
#define GGML_MK_VAR_ONE_GROUP         0x40000 // (before) attention in one group per (token, head): one block takes all its chunks and
                                              // combines them in chunk order, no groups of MK_ATT_GROUP chunks (the same bits
                                              // only while a step's chunks lie in one group: the groups' combine rounds
                                              // differently; not with GGML_MK_VAR_FOLD_HEADS, whose blocks keep the groups)
#define GGML_MK_VAR_WARP_COMBINE      0x80000 // (before) the attention's block per (token, head, group) combines its chunks, and the
                                              // last of a (token, head)'s groups the groups, in one warp, not the whole block
                                              // (one thread per dimension: the same bits)
#define GGML_MK_VAR_HALF_GROUPS       0x100000 // attention groups of MK_ATT_GROUP/2 chunks (4): twice the blocks, half the warps
                                              // busy in each (other bits past one group, lossless alike)
#define GGML_MK_VAR_BLOCK_UNITS       0x200000 // (before) a mat-vec's units dealt warp by warp within a block (warp w of block b
                                              // starts at unit b*warps + w), not block by block (w*blocks + b): with not many
                                              // more units than warps (o proj, down: 2560 rows on 2112 warps) the second
                                              // round's units filled the first blocks' warps instead of spreading over every
                                              // SM (each row is one warp's either way: the same bits; measured on the H200,
                                              // session 18: the spread order 1.04x whole steps)
#define GGML_MK_VAR_WIDE_M            0x400000 // (before) steps of 2..4 tokens (verify batches of k <= 3) through the mat-vec and
                                              // staging code made for any batch (MK_M columns: the per-column sums of squares
                                              // and norms indexed at run time, in local memory), not the code for at most 4
#define GGML_MK_VAR_ITEM_STAGE        0x800000 // (before) steps of 2..4 tokens stage their inputs item by item (mk_stage: a column's
                                              // slots, then the next column's, MK_SB items per round of loads, the column
                                              // selected from registers at run time), not slot by slot over every column
                                              // (mk_stage_cols, session 26: verify of 3 0.963x, of 4 0.945x); the same bits
                                              // (no effect with 0x400000)
#define GGML_MK_VAR_KQ_FLOAT          0x1000000 // (before) Q4_K / Q6_K weights meet the float inputs (mk_deq32, a float FMA per
                                              // weight), not the 8-bit records with integer dot products (mk_kq_groups, as
                                              // llama.cpp's mmvq); other bits: the 8-bit rounding of the inputs
#define GGML_MK_VAR_PAIR_TAIL         0x2000000 // (before) a tile's last Q4_0/Q8_0 block pairs taken as pairs by fewer lanes, not
                                              // one block per lane where they fill at most half a round (E4B's rows of 2560:
                                              // 40 pairs, lanes 0..7 took a second pair; now lanes 0..15 a block each); other
                                              // bits: a lane's sums
#define GGML_MK_VAR_KQ_TILES          0x4000000 // (before) Q4_K / Q6_K rows of several tiles cut into tiles of equal size, not the
                                              // first tiles in multiples of 32 groups (one per lane) where the last still
                                              // fits (Q6_K rows of 2560: 40 + 40 groups, 4 lane rounds, now 32 + 48, 3); other
                                              // bits: a lane's sums
#define GGML_MK_VAR_FLOAT_GROUPS      0x8000000 // (before) F32 / F16 / BF16 weights a 32-value group per lane (mk_deq32: a lane
                                              // stride of 64 or 128 bytes, every lane on the same shared-memory banks, and
                                              // rows of 256 values on 8 lanes), not 4 consecutive values per lane (the warp
                                              // reads the tile in order); other bits: a lane's sums
#define GGML_MK_VAR_NO_CLUSTER_STAGE  0x10000000 // (before) a verify batch of 2..8 tokens staged whole in every block, not
                                              // over clusters of 2 blocks (CUDA, sm_90: each block of the pair stages
                                              // every other column into its own and its partner's shared memory); the
                                              // same bits. The pairs: verify of 2..5 tokens 0.93-0.94x the launch (H100,
                                              // NOTES.md session 31)
#define GGML_MK_VAR_NO_FLOAT_PACK     0x20000000 // (before) short F32 / F16 / BF16 rows (one tile each, at least 2 to a tile) one to a
                                              // weight tile, not packed several to a tile (E4B's per-layer projection: 2560
                                              // rows of 256 F32 values, 2 to a tile, the warp taking them one after the other
                                              // with the one-row arithmetic: one tile wait and walk for every 2 rows); the same
                                              // bits. Packed: 1.028x tg32, 1.010x and 1.007x after a 405-token prompt (H100,
                                              // session 34)
#define GGML_MK_VAR_STAGE_ROUND1      0x40000000 // (before) a verify batch's staging (mk_stage_cols) loads the pending residual's rows
                                              // for its rms 1 slot a thread per round, not 2 (E4B's rows of 2560: 2 round
                                              // trips, not 1); the same bits. 2 a round: verify kernels of 2..4 tokens
                                              // 0.982-0.984x (H100, session 34)
#define GGML_MK_VAR_CHUNK4            ((int32_t) 0x80000000u) // attention chunks of 4 cells (ggml_mk_att_chunk; contexts up to
                                              // 4096 cells) taken 4 cells a step (CPI) by the head-dim-256 block-per-(token,
                                              // head, group) attention: half the serial instructions a warp, twice the warps
                                              // (a lone warp's chunk body is ~1450 SASS instructions, ~5.5 us of the 270M's
                                              // 13 us attention phase: NOTES.md session 41); other bits (the chunks'
                                              // combine order), lossless alike

// ---- the fused MTP draft (issue 14): k steps of a Gemma 4 MTP assistant (llama.cpp's gemma4-assistant) in one launch ----
//
// One draft step, as the pinned src/models/gemma4-assistant.cpp computes it for one token t at position pos with the
// target's hidden row h (n_embd_bb floats: the target's rmsnorm(x)*output_norm, ggml_mk_step.h_out):
//   x      = tok_embd_bb[t]*embd_scale                       (the TARGET's token embeddings, embd_scale = sqrt(n_embd_bb))
//   cur    = pre*concat(x, h)                                 (nextn_proj_pre: 2*n_embd_bb -> n_embd)
//   per layer: q = rope(rmsnorm(wq*rmsnorm(cur)*attn_norm per head)*q_norm), attention of q into the target's K/V
//          cache of layer kv_layer (no K/V of its own, kq_scale), a = rmsnorm(wo*att)*attn_post_norm + cur,
//          cur = (rmsnorm(down*(gelu(gate*f)*(up*f)))*ffn_post_norm + a)*out_scale with f = rmsnorm(a)*ffn_norm
//   n      = rmsnorm(cur)*output_norm
//   logits = output*n (the assistant's own token embeddings, tied; no softcap), draft = argmax (first index of the max)
//   h_next = post*n                                          (nextn_proj_post: n_embd -> n_embd_bb)
// Step j+1 takes step j's draft as t and its h_next as h, at the SAME position (llama.cpp's draft-mtp drafts every token
// of a shared-KV assistant at pos0, common/speculative.cpp) and with the same KV cells and masks.
#define GGML_MK_DRAFT_VERSION    2
#define GGML_MK_DRAFT_MAX_K      8    // draft steps per launch
#define GGML_MK_DRAFT_MAX_LAYERS 8

#ifndef __METAL_VERSION__
// where one layer's K/V cache lives for this step (element (cell c, kv head h, dim d))
struct ggml_mk_kv_view {
    void *  k;            // F16: k + c*k_sc + h*k_sh + 2*d
    void *  v;            // F16: v + c*v_sc + h*v_sh + d*v_sd (v_sd = 2 unless V is transposed)
    int64_t k_sc, k_sh;
    int64_t v_sc, v_sh, v_sd;
};

struct ggml_mk_step {
    int32_t n_tokens;                               // 1..GGML_MK_MAX_TOKENS
    int32_t n_out;                                  // rows of logits wanted
    int32_t tokens[GGML_MK_MAX_TOKENS];
    int32_t pos[GGML_MK_MAX_TOKENS];
    int32_t out_rows[GGML_MK_MAX_TOKENS];           // which tokens' logits, in output order
    int32_t n_kv[GGML_MK_N_CACHES];                 // cells to look at in each cache
    int64_t kv_idx[GGML_MK_N_CACHES][GGML_MK_MAX_TOKENS]; // cell written by each token
    const float * mask[GGML_MK_N_CACHES];           // host: [n_tokens][n_kv] additive (0 / -INF)
    const float * embd;                             // host: [n_tokens][n_embd] token embedding rows (unscaled)
    const float * pl_embd;                          // host: [n_tokens][n_embd_pl*n_layer] (Gemma 4), or NULL
    struct ggml_mk_kv_view kv[GGML_MK_MAX_LAYERS];

    // the final-norm rows rmsnorm(x)*output_norm (the LM head's input: llama.cpp's t_h_nextn, the hidden states an
    // MTP draft reads), of the tokens h_rows[0..n_h-1] in that order, written to h_out (host, [n_h][n_embd], f32)
    int32_t n_h;                                    // 0: none wanted (h_out may be NULL)
    int32_t h_rows[GGML_MK_MAX_TOKENS];
    float * h_out;

    // NULL, or where the n_out logits rows also go on the device: an address inside one of the backend's own buffers
    // (llama.cpp's tensor for them on its output device, where its backend samplers read them), n_out rows of n_vocab
    // floats one after the other; with it, eval's host logits may be NULL (no copy to the host)
    void * logits_dev;
};

// the attention chunk for a context of n_ctx cells: 8 cells (4 with the kernel variant GGML_MK_VAR_CHUNK4 in flags),
// doubled until at most 1024 chunks
static inline int32_t ggml_mk_att_chunk(int32_t n_ctx, int32_t flags) {
    int32_t c = (flags & GGML_MK_VAR_CHUNK4) ? 4 : 8;
    while ((int64_t) c*1024 < n_ctx) {
        c *= 2;
    }
    return c;
}

typedef void * (*ggml_backend_mk_create_t)(const struct ggml_mk_model * model, char * err, size_t err_size);
// evaluates one step; writes n_out rows of n_vocab logits to logits (host memory; NULL: none) and to
// step->logits_dev (device; NULL: none), and the step's n_h hidden rows to step->h_out; 0 = success
typedef int    (*ggml_backend_mk_eval_t)(void * mk, const struct ggml_mk_step * step, float * logits);
typedef void   (*ggml_backend_mk_free_t)(void * mk);

struct ggml_mk_draft {
    int32_t version;        // GGML_MK_DRAFT_VERSION
    int32_t device;         // backend device index
    int32_t n_layer;        // assistant layers (n_layer_nextn)
    int32_t n_embd;         // assistant hidden size
    int32_t n_embd_bb;      // the target's hidden size (the width of h, of x and of h_next)
    int32_t n_vocab;
    int32_t max_q;          // max n_head*head_dim over layers
    int32_t max_ff;
    int32_t tok_embd_host;  // 1: tok_embd.data is host memory (llama.cpp keeps token embeddings in the input layer's
                            // buffer): a backend makes it readable by the kernel (copy or mapping) when it is created
    int32_t debug_flags;
    int32_t k_max;          // the most draft steps a launch asks for (1..GGML_MK_DRAFT_MAX_K): a backend sizes its buffers
    int32_t kv_type;        // enum ggml_type of the target's K and V caches the layers read (F16)
    int32_t n_ctx;          // the target context's cells (a step's n_kv is at most this; sizes the attention's chunks)
    float   norm_eps;
    float   embd_scale;     // sqrt(n_embd_bb)
    float   kq_scale;       // scale of Q.K (Gemma 4: 1, folded into the norms)
    float   attn_factor;    // rope mscale (ggml attn_factor)

    struct ggml_mk_weight tok_embd;   // the TARGET's token embeddings [n_embd_bb, n_vocab]: one row per step
    struct ggml_mk_weight pre;        // nextn_proj_pre  [2*n_embd_bb -> n_embd]
    struct ggml_mk_weight post;       // nextn_proj_post [n_embd -> n_embd_bb]
    struct ggml_mk_weight output;     // LM head [n_embd -> n_vocab] (the assistant's token_embd, tied)
    const float * output_norm;

    // the assistant's layers in the megakernel's terms: has_kv = 0 (no K/V of their own: wk, wv, k_norm absent; they
    // read the step's views), n_head_kv = the target cache's, q_scale 1, no per-layer inputs (pl_*), v_norm unused
    struct ggml_mk_layer layers[GGML_MK_DRAFT_MAX_LAYERS];
    // the target layer whose K/V cache each layer reads: llama.cpp's share map (src/llama-model.cpp,
    // LLM_ARCH_GEMMA4_ASSISTANT) gives n_layer_target - 2 to sliding-window layers and n_layer_target - 1 to global
    // ones, resolved through the target cache's own layer map (a shared-KV target layer reads its source's tensors)
    int32_t kv_layer[GGML_MK_DRAFT_MAX_LAYERS];
};

// one launch: k draft steps from (token, h) at position pos
struct ggml_mk_draft_step {
    int32_t k;                                      // 1..GGML_MK_DRAFT_MAX_K
    int32_t token;                                  // the last sampled token (not in the cache yet)
    int32_t pos;                                    // its position (every step's)
    int32_t n_kv[GGML_MK_N_CACHES];                 // cells to look at in each cache
    const float * h;                                // host: [n_embd_bb] the target's hidden row of the token before
    const float * mask[GGML_MK_N_CACHES];           // host: [n_kv] llama.cpp's mask row of the query (0 / -INF)
    struct ggml_mk_kv_view kv[GGML_MK_DRAFT_MAX_LAYERS]; // each assistant layer's view of its target cache (kv_layer)

    // outputs (host): k draft tokens; optional (NULL = not wanted) the k rows of logits and of h_next
    int32_t * tokens_out;
    float   * logits_out;                           // [k][n_vocab]
    float   * h_out;                                // [k][n_embd_bb]
};

// the three entry points a backend with a fused draft exports next to the megakernel's (get_proc_address names
// "ggml_backend_mk_draft_create", "ggml_backend_mk_draft_eval", "ggml_backend_mk_draft_free"); eval returns 0 = success
typedef void * (*ggml_backend_mk_draft_create_t)(const struct ggml_mk_draft * draft, char * err, size_t err_size);
typedef int    (*ggml_backend_mk_draft_eval_t)(void * mkd, const struct ggml_mk_draft_step * step);
typedef void   (*ggml_backend_mk_draft_free_t)(void * mkd);

// the assistant's layers and LM head as a megakernel plan: a draft step IS a decode step of this model with
//  - the draft's layers (has_kv = 0: they read the views the step gives them, the target's caches, as the target's
//    shared-KV layers do), no per-layer inputs (n_embd_pl = 0: out_scale then scales the FFN residual, as the
//    assistant does), no softcap;
//  - as its residual stream's start the pre-projected inputs pre*concat(x, h) (no embedding rows: embd_scale unused), and
//    as its hidden rows (h_out) the LM head's input n, from which h_next = post*n.
// So the layer phases of a megakernel serve the draft unchanged; the fused draft adds the pre- and post-projections,
// the argmax and the next step's embedding row around them (CUDA: mk_draft_kernel). m: zero-initialised by the caller
static inline void ggml_mk_draft_model(const struct ggml_mk_draft * d, struct ggml_mk_model * m) {
    m->version     = GGML_MK_VERSION;
    m->arch        = GGML_MK_ARCH_GEMMA4;
    m->device      = d->device;
    m->n_layer     = d->n_layer;
    m->n_embd      = d->n_embd;
    m->n_vocab     = d->n_vocab;
    m->kv_type     = d->kv_type;
    m->norm_eps    = d->norm_eps;
    m->embd_scale  = 1.0f;
    m->attn_factor = d->attn_factor;
    m->kq_scale    = d->kq_scale;
    m->debug_flags = d->debug_flags;
    m->n_ctx       = d->n_ctx;
    m->att_chunk   = ggml_mk_att_chunk(d->n_ctx, 0);   // (chunks of 8 also under GGML_MK_VAR_CHUNK4: 4 cells a step, 2 steps)
    m->output      = d->output;
    m->output_norm = d->output_norm;
    for (int il = 0; il < d->n_layer; ++il) {
        m->layers[il]   = d->layers[il];
        m->max_head_dim = d->layers[il].head_dim > m->max_head_dim ? d->layers[il].head_dim : m->max_head_dim;
    }
    m->max_q  = d->max_q;
    m->max_ff = d->max_ff;
}

#ifdef __cplusplus
}
#endif
#endif // __METAL_VERSION__
