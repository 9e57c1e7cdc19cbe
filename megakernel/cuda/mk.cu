// mk.cu: the Gemma decode megakernel for CUDA (stq-metal); the plan it runs is megakernel/ggml-mk.h.
//
// One cooperative launch per decode or verify step: a persistent grid (every block co-resident)
// walks the whole text stack for M = 1..GGML_MK_MAX_TOKENS tokens, phase by phase, with a grid
// barrier between dependent phases and no host round trip. Weights are read in place in their GGUF
// types. Every matrix row is reduced by one warp in a fixed order, and each column's arithmetic is
// the same for every M (explicit fmaf, M only bounds the column loop), so a verify step of M
// tokens gives every token the bits of a one-token step: lossless speculation by construction.
//
// Compiled into ggml-cuda (GGML_MEGAKERNEL_DIR); llama.cpp reaches it through the CUDA registry's
// get_proc_address ("ggml_backend_mk_create" / "_eval" / "_free").

#include "ggml-cuda/common.cuh"
#include "mk.cuh"
#include "mk-device.cuh"
#include "mk-kernel.cuh"

#if __has_include(<cuda_profiler_api.h>)   // (a full toolkit has it; the header-only wheels of the CI's compile check do not)
#include <cuda_profiler_api.h>
#define MK_PROFILER_RANGE 1
#else
#define MK_PROFILER_RANGE 0
#endif

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

// ---------------------------------------------------------------------------------------------
// host side

struct mk_cuda {
    int device = 0;
    cudaStream_t stream = nullptr;
    ggml_mk_model * d_model = nullptr;
    int n_vocab = 0;
    int n_embd  = 0;
    int n_pl_all = 0;
    int grid = 0;
    int n_ctx = 0;
    int att_chunk = 8;
    int  flags = 0;            // the model's debug_flags (mk_step_chunks: GGML_MK_VAR_HALF_GROUPS)
    bool bulk = false;         // weight tiles by cp.async.bulk (sm_90+, not GGML_MK_VAR_CP_ASYNC)
    bool cl_ok = false;        // the grid may run as clusters of 2 blocks (mk_step_cl: a verify batch's staging split
                               // over each pair): sm_90+, an even grid, every pair resident at once
    uint64_t launches = 0;     // the grid barrier's two counts alternate per launch
    int ncu_m = 0;             // LLAMA_MEGAKERNEL_NCU_M=M: only steps of M tokens inside the profiler's range (ncu
                               // --profile-from-start off: one verify launch, not the one-token steps before it)

    // LLAMA_MEGAKERNEL_PROFILE=1: per-phase times of the steps of each size M, or of the draft launches (block 0's
    // view), printed at the end
    unsigned long long * d_prof = nullptr;
    size_t prof_cap = 0;
    std::vector<unsigned long long> h_prof;
    double prof_ns[MK_M + 1][MK_PH_COUNT] = {};
    double prof_kernel_ms[MK_M + 1] = {};
    double prof_step_ms[MK_M + 1] = {};
    int    prof_steps[MK_M + 1] = {};   // [0]: draft launches (prof_draft_steps: their steps)
    int    prof_draft_steps = 0;
    cudaEvent_t ev[2] = { nullptr, nullptr };
    // LLAMA_MEGAKERNEL_PROFILE=2 also: every block's barrier arrivals, summed per phase (mk_gprof_add)
    unsigned long long * d_gprof = nullptr;
    int gprof_cap = 0;
    std::vector<unsigned long long> h_gprof;
    double gprof_ns[MK_M + 1][MK_PH_COUNT][4] = {};   // per M and phase: first, mean and last arrival after the phase began; release lag

    // scratch
    float * scratch = nullptr;
    float * hidden  = nullptr;   // [MK_M][n_embd]: the LM head's inputs of a step whose host wants them (mk_args.h_out)
    mk_args args = {};

    // shared memory: the dynamic part of a block, and its layout for each step size (mk_smem_plan)
    int smem_bytes = 0;
    mk_smem smem[MK_M + 1] = {};

    // upload: [mk_dstep][mask0][mask1][embd][pl_embd] (a draft launch: [mk_dstep][mask0][mask1][h][mk_draft_args])
    char * d_up = nullptr;
    char * h_up = nullptr;
    size_t up_cap = 0;

    // the kernel this handle launches: mk_decode_kernel, or (ggml_cuda_mk_draft_create) the fused MTP draft's
    const void * kernel = nullptr;
    // the fused draft: its launch arguments that do not change between launches (device addresses), its buffers
    bool draft = false;
    mk_draft_args da = {};
    float * draft_buf = nullptr;   // xh [2*n_embd_bb], h_next [k_max][n_embd_bb], tokens [k_max], logits [k_max][n_vocab],
                                   // the blocks' partial picks [grid] (values, indices)
    void  * tok_embd  = nullptr;   // a device copy of the target's token embeddings when llama.cpp keeps them in host memory
    int     k_max     = 0;
};

// the profile's names of the phases (enum mk_phase)
static const char * const mk_phase_names[] = {
    "start", "embedding", "per-layer proj", "per-layer inputs", "q/k/v", "heads (norm, rope, kv)",
    "attention", "o proj", "gate/up", "down", "per-layer gate", "per-layer proj+", "lm head", "attention (global)",
    "(staging: rms of h)", "(staging: loads)", "(staging: norm)", "(staging: 8-bit)",
    "(attention: chunks)", "(attention: combine)", "(attention: groups)", "(staging: rest)",
    "(barrier waits, all)", "staging once (slices)", "(attention: prologue)", "(attention: warp 0's chunks)",
};
static_assert(sizeof(mk_phase_names)/sizeof(mk_phase_names[0]) == MK_PH_COUNT, "a name for every phase tag (enum mk_phase)");

static size_t mk_align(size_t n) {
    return (n + 255) & ~(size_t) 255;
}

#define MK_TRY(call, what)                                                            \
    do {                                                                              \
        cudaError_t e_ = (call);                                                      \
        if (e_ != cudaSuccess) {                                                      \
            snprintf(err, err_size, "%s: %s", what, cudaGetErrorString(e_));          \
            ggml_cuda_mk_free(mk);                                                    \
            return nullptr;                                                           \
        }                                                                             \
    } while (0)

// the launch configuration of the grid as clusters of cl blocks (at: room for 2 attributes; coop: also cooperative,
// every block resident): one spelling for the occupancy query at create and the launches
static cudaLaunchConfig_t mk_cluster_config(const mk_cuda * mk, int cl, bool coop, cudaLaunchAttribute * at) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim          = dim3(mk->grid);
    cfg.blockDim         = dim3(MK_THREADS);
    cfg.dynamicSmemBytes = mk->smem_bytes;
    cfg.stream           = mk->stream;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = cl;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    at[1].id = cudaLaunchAttributeCooperative;
    at[1].val.cooperative = 1;
    cfg.attrs    = at;
    cfg.numAttrs = coop ? 2 : 1;
    return cfg;
}

// a handle for the plan model: its decode/verify kernel, or (d: the draft that model was made of by ggml_mk_draft_model)
// the fused draft kernel with the draft's buffers and mat-vec table
static mk_cuda * mk_cuda_create(const ggml_mk_model * model, const ggml_mk_draft * d, char * err, size_t err_size) {
    if (model->version != GGML_MK_VERSION) {
        snprintf(err, err_size, "plan version %d, kernel version %d", model->version, GGML_MK_VERSION);
        return nullptr;
    }
    if (model->kv_type != GGML_TYPE_F16) {
        snprintf(err, err_size, "KV cache type %d (F16 only)", model->kv_type);
        return nullptr;
    }
    mk_cuda * mk = new mk_cuda();
    mk->kernel   = d ? ggml_cuda_mk_draft_kernel() : (const void *) mk_decode_kernel;
    mk->draft    = d != nullptr;
    mk->device   = model->device;
    mk->n_vocab  = model->n_vocab;
    mk->n_embd   = model->n_embd;
    mk->n_pl_all = model->n_embd_pl*model->n_layer;
    ggml_cuda_set_device(mk->device);

    const ggml_cuda_device_info::cuda_device_info & info = ggml_cuda_info().devices[mk->device];
    if (info.cc < 800) {
        snprintf(err, err_size, "compute capability %d (8.0 or newer needed: asynchronous copies)", info.cc);
        delete mk;
        return nullptr;
    }
    // shapes the kernel assumes (checked once here, not in the kernel)
    {
        // (the weight types were checked by the plan's builder, llama-mk.cpp)
        std::vector<std::pair<std::string, const ggml_mk_weight *>> ws = { { "output", &model->output } };
        if (model->n_embd_pl > 0) {
            ws.push_back({ "per_layer_model_proj", &model->pl_model_proj });
        }
        if (d) {
            ws.push_back({ "nextn.pre_projection", &d->pre });
            ws.push_back({ "nextn.post_projection", &d->post });
        }
        static const char * names[] = { "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "inp_gate", "proj" };
        for (int il = 0; il < model->n_layer; ++il) {
            const ggml_mk_layer & L = model->layers[il];
            if (L.head_dim % 64 != 0 || L.head_dim > GGML_MK_MAX_HEAD_DIM) {
                snprintf(err, err_size, "layer %d: head_dim %d (a multiple of 64 up to %d needed)", il, L.head_dim, GGML_MK_MAX_HEAD_DIM);
                delete mk;
                return nullptr;
            }
            const ggml_mk_weight * lw[] = { &L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_gate, &L.ffn_up, &L.ffn_down, &L.pl_gate, &L.pl_proj };
            for (size_t i = 0; i < sizeof(lw)/sizeof(lw[0]); ++i) {
                if (lw[i]->data) {
                    ws.push_back({ "blk." + std::to_string(il) + "." + names[i], lw[i] });
                }
            }
        }
        for (const auto & [name, w] : ws) {
            if (w->ne0 % 4 != 0) {
                snprintf(err, err_size, "%s has rows of %d values (a multiple of 4 supported)", name.c_str(), w->ne0);
                delete mk;
                return nullptr;
            }
            if (!mk_rec_fits(w->ne0)) {
                snprintf(err, err_size, "%s has rows of %d values (%d groups of 32: the last one's 8-bit record would sit "
                         "past the row's, mk_rec_slot)", name.c_str(), w->ne0, mk_kg(w->ne0));
                delete mk;
                return nullptr;
            }
            // the Q4_K integer dot products read a super-block's quants 16 bytes at a time (mk_q4k_unit); GGUF files
            // align tensor data to 32 bytes and a Q4_K row is a multiple of 144
            if (w->type == GGML_TYPE_Q4_K && ((uintptr_t) w->data % 16 != 0 || w->nb1 % 16 != 0)) {
                snprintf(err, err_size, "%s: Q4_K rows not 16-byte aligned (data %p, row stride %llu bytes)", name.c_str(),
                         w->data, (unsigned long long) w->nb1);
                delete mk;
                return nullptr;
            }
        }
        // the norm vectors are read 16 bytes at a time by the staging
        std::vector<std::pair<std::string, const float *>> nv = { { "output_norm", model->output_norm } };
        for (int il = 0; il < model->n_layer; ++il) {
            const ggml_mk_layer & L = model->layers[il];
            const std::string b = "blk." + std::to_string(il) + ".";
            nv.push_back({ b + "attn_norm", L.attn_norm });
            nv.push_back({ b + "post_attention_norm", L.attn_post_norm });
            nv.push_back({ b + "ffn_norm", L.ffn_norm });
            nv.push_back({ b + "post_ffw_norm", L.ffn_post_norm });
            nv.push_back({ b + "post_norm", L.pl_post_norm });
        }
        for (const auto & [name, v] : nv) {
            if ((uintptr_t) v % 16 != 0) {
                snprintf(err, err_size, "%s is not 16-byte aligned", name.c_str());
                delete mk;
                return nullptr;
            }
        }
    }
    if (model->att_chunk < 4 || model->att_chunk % 4 != 0 ||
        (int64_t) model->att_chunk*MK_CH_MAX < model->n_ctx) {
        snprintf(err, err_size, "attention chunk %d for %d cells (a multiple of 4 and at most %d chunks needed)",
                 model->att_chunk, model->n_ctx, MK_CH_MAX);
        delete mk;
        return nullptr;
    }
    int coop = 0;
    MK_TRY(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, mk->device), "cooperative launch attribute");
    if (!coop) {
        snprintf(err, err_size, "the device has no cooperative launch");
        ggml_cuda_mk_free(mk);
        return nullptr;
    }
    int cc_major = 0;
    MK_TRY(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, mk->device), "compute capability");
    if (cc_major < 8) {
        snprintf(err, err_size, "compute capability %d.x: the kernel needs 8.0 or newer (cp.async)", cc_major);
        ggml_cuda_mk_free(mk);
        return nullptr;
    }
    if (model->by_default && cc_major != 9) {
        // measured faster than the CUDA graph on an H200 only (NOTES.md, session 10)
        snprintf(err, err_size, "compute capability %d.x: on by default only on Hopper (9.x), where it was measured faster "
                 "than the CUDA graph; LLAMA_MEGAKERNEL=1 uses it here", cc_major);
        ggml_cuda_mk_free(mk);
        return nullptr;
    }
    // the weight tiles through the bulk copy engine where there is one (sm_90+), unless variant GGML_MK_VAR_CP_ASYNC
    mk->bulk = cc_major >= 9 && !(model->debug_flags & GGML_MK_VAR_CP_ASYNC);
    // all the shared memory a block may have: the kernel's static arrays, the rest dynamic (inputs and weight stages)
    int optin = 0;
    cudaFuncAttributes fa = {};
    MK_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, mk->device), "shared memory per block");
    MK_TRY(cudaFuncGetAttributes(&fa, mk->kernel), "kernel attributes");
    mk->smem_bytes = (int) ((optin - (int) fa.sharedSizeBytes)/16*16);
    int per_sm = 0;
    MK_TRY(cudaFuncSetAttribute(mk->kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, mk->smem_bytes), "shared memory limit");
    MK_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mk->kernel, MK_THREADS, mk->smem_bytes), "occupancy");
    if (per_sm < 1) {
        snprintf(err, err_size, "the kernel does not fit on a multiprocessor");
        ggml_cuda_mk_free(mk);
        return nullptr;
    }
    int blocks_per_sm = 1;
    if (const char * e = getenv("LLAMA_MEGAKERNEL_BLOCKS_PER_SM")) {
        blocks_per_sm = atoi(e);
    }
    blocks_per_sm = std::max(1, std::min(per_sm, blocks_per_sm));
    mk->grid = info.nsm*blocks_per_sm;
    // fewer blocks (the kernel's loops stride by the grid): compute-sanitizer's racecheck of a whole grid is too slow
    if (const char * e = getenv("LLAMA_MEGAKERNEL_GRID"); e && atoi(e) > 0) {
        mk->grid = std::min(mk->grid, atoi(e));
    }
    // clusters of 2 blocks for verify batches (unless GGML_MK_VAR_NO_CLUSTER_STAGE; the decode/verify kernel, not the fused
    // draft's): only where the device holds the whole grid as pairs at once, since every block waits for every other at
    // the grid barriers
    if (!d && cc_major >= 9 && mk->grid % 2 == 0 && !(model->debug_flags & GGML_MK_VAR_NO_CLUSTER_STAGE)) {
        cudaLaunchAttribute at[2];
        const cudaLaunchConfig_t cfg = mk_cluster_config(mk, 2, false, at);
        int n_cl = 0;
        const cudaError_t e = cudaOccupancyMaxActiveClusters(&n_cl, mk->kernel, &cfg);
        mk->cl_ok = e == cudaSuccess && 2*n_cl >= mk->grid;
        if (!mk->cl_ok) {
            (void) cudaGetLastError();
            fprintf(stderr, "llama_mk: verify batches staged whole in every block, not split over pairs of blocks: the device "
                    "holds %d clusters of 2 at once, the grid is %d blocks (%s)\n", n_cl, mk->grid, cudaGetErrorString(e));
        } else {
            fprintf(stderr, "llama_mk: verify batches of 2..%d tokens staged over clusters of 2 blocks (%d clusters)\n",
                    MK_M, mk->grid/2);
        }
    }

    MK_TRY(cudaStreamCreateWithFlags(&mk->stream, cudaStreamNonBlocking), "stream");
    MK_TRY(cudaMalloc(&mk->d_model, sizeof(ggml_mk_model)), "plan allocation");
    MK_TRY(cudaMemcpy(mk->d_model, model, sizeof(ggml_mk_model), cudaMemcpyHostToDevice), "plan upload");

    // scratch
    const size_t M = MK_M;
    int max_head = 1;
    for (int il = 0; il < model->n_layer; ++il) {
        max_head = std::max(max_head, model->layers[il].n_head);
    }
    const int n_chunk = (model->n_ctx + model->att_chunk - 1)/model->att_chunk + 1;
    const size_t widths[] = {
        (size_t) model->n_embd, (size_t) model->n_embd, (size_t) model->max_q, (size_t) model->max_kv,
        (size_t) model->max_kv, (size_t) model->max_q, (size_t) model->n_embd, (size_t) model->max_ff,
        (size_t) std::max(mk->n_pl_all, 1), (size_t) std::max(model->n_embd_pl, 1), (size_t) model->n_vocab,
        (size_t) max_head*n_chunk*(4 + model->max_head_dim), (size_t) model->n_embd,
    };
    size_t total = 0;
    for (size_t w : widths) {
        total += mk_align(M*w*sizeof(float));
    }
    total += mk_align(M*max_head*sizeof(unsigned)); // attention chunk counters
    // a plain mat-vec's inputs rounded once for the grid (mk_once_on)
    const int xrec_k = mk_xrec_k(*model, d ? d->n_embd_bb : 0);
    const size_t sz_xrec = mk_align(M*(xrec_k/32)*MK_XQ_REC);
    total += sz_xrec;
    total += 256; // barrier
    const int n_mv = d ? mk_mv_draft_count(model->n_layer, d->k_max) : mk_mv_count(model->n_layer);
    const size_t sz_mvt = mk_align(n_mv*sizeof(mk_mvr));
    total += sz_mvt;  // the mat-vec table
    MK_TRY(cudaMalloc(&mk->scratch, total), "scratch allocation");
    MK_TRY(cudaMemset(mk->scratch, 0, total), "scratch clear");
    float ** dst[] = {
        &mk->args.xb[0], &mk->args.xb[1], &mk->args.q, &mk->args.k, &mk->args.v, &mk->args.att, &mk->args.h,
        &mk->args.g, &mk->args.pl_in, &mk->args.pl_g, &mk->args.logits, &mk->args.att_part, &mk->hidden,
    };
    char * p = (char *) mk->scratch;
    for (size_t i = 0; i < sizeof(widths)/sizeof(widths[0]); ++i) {
        *dst[i] = (float *) p;
        p += mk_align(M*widths[i]*sizeof(float));
    }
    mk->args.att_cnt  = (unsigned *) p;
    p += mk_align(M*max_head*sizeof(unsigned));
    mk->args.xrec   = (uint8_t *) p;
    mk->args.xrec_k = xrec_k;
    p += sz_xrec;
    if (const char * e = getenv("LLAMA_MEGAKERNEL_NCU_M")) {
        mk->ncu_m = atoi(e);
    }
    if (const char * e = getenv("LLAMA_MEGAKERNEL_PROFILE"); e && atoi(e) != 0) {
        const int steps = d ? d->k_max : 1;   // a draft launch runs up to k_max steps of its layers
        mk->prof_cap = (64 + 64*(size_t) model->n_layer)*steps;   // entries: ~24 per layer (phase ends, waits, stagings)
        mk->h_prof.resize(1 + 2*mk->prof_cap);
        MK_TRY(cudaMalloc(&mk->d_prof, mk->h_prof.size()*sizeof(unsigned long long)), "profile buffer");
        MK_TRY(cudaEventCreate(&mk->ev[0]), "profile event");
        MK_TRY(cudaEventCreate(&mk->ev[1]), "profile event");
        if (atoi(e) >= 2) {
            mk->gprof_cap = (16 + 12*model->n_layer)*steps;   // barriers: at most 11 per layer (3 of them staging once)
            mk->h_gprof.resize((size_t) mk->gprof_cap*(1 + 2*(size_t) mk->grid));
            MK_TRY(cudaMalloc(&mk->d_gprof, mk->h_gprof.size()*sizeof(unsigned long long)), "grid profile buffer");
        }
    }
    mk->args.prof     = mk->d_prof;
    mk->args.max_head = max_head;
    mk->args.n_chunk  = n_chunk;
    mk->n_ctx = model->n_ctx;
    mk->att_chunk = model->att_chunk;
    mk->flags = model->debug_flags;
    mk->args.bar      = (unsigned *) p;       // (alternate per launch, see ggml_cuda_mk_eval)
    mk->args.bar_next = (unsigned *) p + 1;
    p += 256;
    mk->args.m = mk->d_model;
    mk->args.n_pl_all = mk->n_pl_all;
    if (d) {
        // the draft's buffers; the target's token embeddings where the kernel can read them
        const size_t nb = d->n_embd_bb, kx = d->k_max;
        const size_t sz[] = { 2*nb*sizeof(float), kx*nb*sizeof(float), kx*sizeof(int32_t), kx*(size_t) model->n_vocab*sizeof(float),
                              (size_t) mk->grid*sizeof(float), (size_t) mk->grid*sizeof(unsigned) };
        size_t sz_all = 0;
        for (size_t b : sz) {
            sz_all += mk_align(b);
        }
        MK_TRY(cudaMalloc(&mk->draft_buf, sz_all), "draft buffers");
        char * q = (char *) mk->draft_buf;
        mk->da.xh     = (float *)    q; q += mk_align(sz[0]);
        mk->da.h_next = (float *)    q; q += mk_align(sz[1]);
        mk->da.tokens = (int32_t *)  q; q += mk_align(sz[2]);
        mk->da.logits = (float *)    q; q += mk_align(sz[3]);
        mk->da.pick_v = (float *)    q; q += mk_align(sz[4]);
        mk->da.pick_i = (unsigned *) q;
        mk->da.tok_embd   = d->tok_embd;
        mk->da.embd_scale = d->embd_scale;
        mk->da.n_embd_bb  = d->n_embd_bb;
        mk->da.k          = d->k_max;   // (the table holds the post-projection of every step a launch may ask for)
        mk->k_max         = d->k_max;
        if (d->tok_embd_host) {
            const size_t bytes = d->tok_embd.nb1*(size_t) d->tok_embd.ne1;
            MK_TRY(cudaMalloc(&mk->tok_embd, bytes), "device copy of the target's token embeddings");
            MK_TRY(cudaMemcpy(mk->tok_embd, d->tok_embd.data, bytes, cudaMemcpyHostToDevice), "token embeddings upload");
            mk->da.tok_embd.data = mk->tok_embd;
        }
    }
    {
        // the step's mat-vecs decoded once: the weights' host plan, the outputs' scratch addresses (a draft: and its
        // pre-projection, and the post-projection of every step)
        std::vector<mk_mvr> tab(n_mv);
        if (d) {
            mk_mv_table_draft(*d, *model, mk->args, mk->da, tab.data());
        } else {
            mk_mv_table(*model, mk->args, tab.data());
        }
        MK_TRY(cudaMemcpy(p, tab.data(), tab.size()*sizeof(mk_mvr), cudaMemcpyHostToDevice), "mat-vec table upload");
        mk->args.mvt = (const mk_mvr *) p;
        p += sz_mvt;

        // the shared memory's layout for each step size
        // weight stages per warp: 3 unless LLAMA_MEGAKERNEL_STAGES asks for more (sweeps). More measured slower on
        // the H200 (E4B, one-token step: 3 4 5 6 stages 5357 5474 5514 5578 us; NOTES.md, megakernel session 7)
        int ns_max = MK_NS_MIN;
        if (const char * e = getenv("LLAMA_MEGAKERNEL_STAGES")) {
            ns_max = std::max(MK_NS_MIN, std::min(MK_NS_MAX, atoi(e)));
        }
        for (int m = 1; m <= MK_M; ++m) {
            mk->smem[m] = mk_smem_plan(tab.data(), (int) tab.size(), m, mk->smem_bytes, ns_max, mk_att_bytes(*model));
        }
        if (mk->smem[1].ns == 0) {
            int kmax = 0;
            for (const mk_mvr & R : tab) {
                kmax = std::max(kmax, R.units ? R.j[0].ne0 : 0);
            }
            snprintf(err, err_size, "rows of %d values do not fit in %d bytes of shared memory with %d weight stages per warp",
                     kmax, mk->smem_bytes, MK_NS_MIN);
            ggml_cuda_mk_free(mk);
            return nullptr;
        }
        if (mk->d_prof) {   // LLAMA_MEGAKERNEL_PROFILE=1
            for (int m = 1; m <= MK_M; ++m) {
                fprintf(stderr, "llama_mk: M=%d shared memory %d B: inputs %d + 8-bit %d B (%d columns per pass), %d weight stages per warp\n",
                        m, mk->smem_bytes, mk->smem[m].xs_bytes, mk->smem[m].xq_bytes, mk->smem[m].cols, mk->smem[m].ns);
            }
        }
    }
    return mk;
}

#undef MK_TRY

void * ggml_cuda_mk_create(const ggml_mk_model * model, char * err, size_t err_size) {
    return mk_cuda_create(model, nullptr, err, err_size);
}

void * ggml_cuda_mk_draft_create(const ggml_mk_draft * d, char * err, size_t err_size) {
    if (d->version != GGML_MK_DRAFT_VERSION) {
        snprintf(err, err_size, "draft plan version %d, kernel version %d", d->version, GGML_MK_DRAFT_VERSION);
        return nullptr;
    }
    if (d->k_max < 1 || d->k_max > GGML_MK_DRAFT_MAX_K || d->n_layer < 1 || d->n_layer > GGML_MK_DRAFT_MAX_LAYERS) {
        snprintf(err, err_size, "k_max %d, %d layers (1..%d and 1..%d supported)", d->k_max, d->n_layer, GGML_MK_DRAFT_MAX_K,
                 GGML_MK_DRAFT_MAX_LAYERS);
        return nullptr;
    }
    if (d->n_embd_bb % 32 != 0 || d->tok_embd.ne0 != d->n_embd_bb) {
        snprintf(err, err_size, "the target's token embeddings have rows of %d values for hidden rows of %d (equal, a multiple "
                 "of 32 needed)", d->tok_embd.ne0, d->n_embd_bb);
        return nullptr;
    }
    ggml_mk_model md = {};
    ggml_mk_draft_model(d, &md);
    return mk_cuda_create(&md, d, err, err_size);
}

// LLAMA_MEGAKERNEL_PROFILE: the profile of the steps of M tokens, or (M = 0) of the draft launches (none: nothing)
static void mk_prof_print(const mk_cuda * mk, int M) {
    const int n = mk->prof_steps[M];
    if (n == 0) {
        return;
    }
    double tot = 0.0;
    for (int i = 0; i < MK_PH_COUNT; ++i) {
        tot += mk->prof_ns[M][i];
    }
    char what[96];
    char tag[8];
    if (M == 0) {
        snprintf(tag, sizeof(tag), "draft");
        snprintf(what, sizeof(what), "%d draft launches (%d draft steps in all)", n, mk->prof_draft_steps);
    } else {
        snprintf(tag, sizeof(tag), "M=%d", M);
        snprintf(what, sizeof(what), "%d steps of %d token%s", n, M, M == 1 ? "" : "s");
    }
    fprintf(stderr, "llama_mk profile: %s: kernel %.1f us, whole launch (upload, launch, results) %.1f us; "
            "phases as block 0 saw them (its own work; staging and barrier waits apart):\n", what,
            1e3*mk->prof_kernel_ms[M]/n, 1e3*mk->prof_step_ms[M]/n);
    for (int i = 1; i < MK_PH_COUNT; ++i) {
        if (mk->prof_ns[M][i] > 0) {
            fprintf(stderr, "llama_mk profile:   %s %-24s %9.1f us  %5.1f %%\n", tag, mk_phase_names[i], 1e-3*mk->prof_ns[M][i]/n,
                    100.0*mk->prof_ns[M][i]/tot);
        }
    }
    if (!mk->d_gprof) {
        return;
    }
    fprintf(stderr, "llama_mk grid profile: %s, %d blocks; per phase (us per launch, summed over its barriers): the "
            "first, mean and last block's arrival at the barrier after the phase began (the first release of the barrier "
            "before), and the mean release after the last arrival\n", what, mk->grid);
    double t[4] = {};
    for (int i = 1; i < MK_PH_COUNT; ++i) {
        const double * g = mk->gprof_ns[M][i];
        if (g[2] == 0.0) {
            continue;   // (the staging and wait tags are never barrier tags)
        }
        fprintf(stderr, "llama_mk grid profile:   %s %-24s first %8.1f  mean %8.1f  last %8.1f  release %7.1f\n", tag,
                mk_phase_names[i], 1e-3*g[0]/n, 1e-3*g[1]/n, 1e-3*g[2]/n, 1e-3*g[3]/n);
        for (int k = 0; k < 4; ++k) {
            t[k] += g[k];
        }
    }
    fprintf(stderr, "llama_mk grid profile:   %s %-24s first %8.1f  mean %8.1f  last %8.1f  release %7.1f\n", tag, "(all)",
            1e-3*t[0]/n, 1e-3*t[1]/n, 1e-3*t[2]/n, 1e-3*t[3]/n);
}

void ggml_cuda_mk_free(void * h) {
    mk_cuda * mk = (mk_cuda *) h;
    if (!mk) {
        return;
    }
    ggml_cuda_set_device(mk->device);
    if (mk->stream) {
        cudaStreamSynchronize(mk->stream);
    }
    for (int M = 0; M <= MK_M; ++M) {
        mk_prof_print(mk, M);   // (0: the draft launches of a draft handle)
    }
    cudaFree(mk->d_gprof);
    cudaFree(mk->d_prof);
    for (cudaEvent_t e : mk->ev) {
        if (e) {
            cudaEventDestroy(e);
        }
    }
    cudaFree(mk->d_model);
    cudaFree(mk->scratch);
    cudaFree(mk->draft_buf);
    cudaFree(mk->tok_embd);
    cudaFree(mk->d_up);
    cudaFreeHost(mk->h_up);
    if (mk->stream) {
        cudaStreamDestroy(mk->stream);
    }
    delete mk;
}

// the grid profile of one step: barrier b's phase began when the first block left barrier b-1
static void mk_gprof_add(mk_cuda * mk, int M) {
    const int G = mk->grid;
    const int cap = mk->gprof_cap;
    std::vector<unsigned long long> & g = mk->h_gprof;
    cudaMemcpy(g.data(), mk->d_gprof, g.size()*sizeof(unsigned long long), cudaMemcpyDeviceToHost);
    auto t = [&](int b, int blk, int k) { return g[cap + 2*((size_t) b*G + blk) + k]; };
    for (int b = 1; b < cap; ++b) {
        const unsigned long long tag = g[b];
        if (tag == 0 || tag >= MK_PH_COUNT || t(b, 0, 1) == 0) {
            break;
        }
        unsigned long long start = ~0ull, first = ~0ull, last = 0, last_rel = 0;
        double sum = 0.0, rel = 0.0;
        for (int i = 0; i < G; ++i) {
            start = std::min(start, t(b - 1, i, 1));
            first = std::min(first, t(b, i, 0));
            last  = std::max(last, t(b, i, 0));
            sum  += (double) t(b, i, 0);
        }
        for (int i = 0; i < G; ++i) {
            rel += (double) t(b, i, 1);
            last_rel = std::max(last_rel, t(b, i, 1));
        }
        mk->gprof_ns[M][tag][0] += (double) first - (double) start;
        mk->gprof_ns[M][tag][1] += sum/G - (double) start;
        mk->gprof_ns[M][tag][2] += (double) last - (double) start;
        mk->gprof_ns[M][tag][3] += rel/G - (double) last;
    }
    cudaMemset(mk->d_gprof, 0, g.size()*sizeof(unsigned long long));
}

// the upload buffers (pinned host, device) of at least need bytes; false: out of memory
static bool mk_upload_reserve(mk_cuda * mk, size_t need) {
    if (need > mk->up_cap) {
        cudaStreamSynchronize(mk->stream);
        cudaFree(mk->d_up);
        cudaFreeHost(mk->h_up);
        mk->d_up = nullptr;
        mk->h_up = nullptr;
        const size_t cap = need*2;
        if (cudaMalloc(&mk->d_up, cap) != cudaSuccess || cudaMallocHost(&mk->h_up, cap) != cudaSuccess) {
            mk->up_cap = 0;
            return false;
        }
        mk->up_cap = cap;
    }
    return true;
}

// a launch's arguments: the handle's, with this launch's barrier count (the two alternate) and step size
static mk_args mk_launch_args(mk_cuda * mk, int M) {
    mk_args a = mk->args;
    if (mk->launches++ % 2) {
        std::swap(a.bar, a.bar_next);
    }
    a.xs_bytes = mk->smem[M].xs_bytes;
    a.xq_bytes = mk->smem[M].xq_bytes;
    a.ns       = mk->smem[M].ns;
    a.bulk     = mk->bulk;
    return a;
}

// LLAMA_MEGAKERNEL_PROFILE: a launch's profile buffers (a's; the count reset) and its start event; returns the host clock
static int64_t mk_prof_begin(mk_cuda * mk, mk_args & a) {
    a.prof      = mk->d_prof;
    a.gprof     = mk->d_prof ? mk->d_gprof : nullptr;
    a.gprof_cap = mk->gprof_cap;
    if (!mk->d_prof) {
        return 0;
    }
    cudaMemsetAsync(mk->d_prof, 0, sizeof(unsigned long long), mk->stream);
    cudaEventRecord(mk->ev[0], mk->stream);
    return ggml_time_us();
}

// after the launch (its end event recorded, the stream synchronised): its phases into the profile of slot M (the
// step's tokens; 0: draft launches)
static void mk_prof_end(mk_cuda * mk, int M, int64_t t_step) {
    if (!mk->d_prof) {
        return;
    }
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, mk->ev[0], mk->ev[1]);
    mk->prof_kernel_ms[M] += ms;
    mk->prof_step_ms[M]   += 1e-3*(ggml_time_us() - t_step);
    cudaMemcpy(mk->h_prof.data(), mk->d_prof, mk->h_prof.size()*sizeof(unsigned long long), cudaMemcpyDeviceToHost);
    const unsigned long long n = std::min<unsigned long long>(mk->h_prof[0], mk->prof_cap);
    for (unsigned long long i = 1; i < n; ++i) {
        const unsigned long long tag = mk->h_prof[1 + 2*i];
        if (tag < MK_PH_COUNT) {
            mk->prof_ns[M][tag] += (double) (mk->h_prof[2 + 2*i] - mk->h_prof[2*i]);
        }
    }
    if (mk->d_gprof) {
        mk_gprof_add(mk, M);
    }
    mk->prof_steps[M]++;
}

int ggml_cuda_mk_eval(void * h, const ggml_mk_step * step, float * logits) {
    mk_cuda * mk = (mk_cuda *) h;
    const int M = step->n_tokens;
    if (M < 1 || M > MK_M || step->n_h < 0 || step->n_h > M || (step->n_h > 0 && !step->h_out)) {
        return 1;
    }
    for (int i = 0; i < step->n_h; ++i) {
        if (step->h_rows[i] < 0 || step->h_rows[i] >= M) {
            return 1;
        }
    }
    if (step->n_kv[0] > mk->n_ctx || step->n_kv[1] > mk->n_ctx) {
        fprintf(stderr, "%s: n_kv %d/%d exceeds the context (%d cells)\n", __func__, step->n_kv[0], step->n_kv[1], mk->n_ctx);
        return 7;
    }
    ggml_cuda_set_device(mk->device);

    // one upload: step, masks, embedding rows
    const size_t sz_step = mk_align(sizeof(mk_dstep));
    const size_t sz_mask[GGML_MK_N_CACHES] = {
        mk_align((size_t) M*step->n_kv[0]*sizeof(float)), mk_align((size_t) M*step->n_kv[1]*sizeof(float)) };
    const size_t sz_embd = mk_align((size_t) M*mk->n_embd*sizeof(float));
    const size_t sz_pl   = mk_align((size_t) M*mk->n_pl_all*sizeof(float));
    const size_t need = sz_step + sz_mask[0] + sz_mask[1] + sz_embd + sz_pl;
    if (!mk_upload_reserve(mk, need)) {
        return 2;
    }
    mk_dstep * ds = (mk_dstep *) mk->h_up;
    ds->n_tokens = M;
    for (int i = 0; i < M; ++i) {
        ds->pos[i] = step->pos[i];
    }
    for (int c = 0; c < GGML_MK_N_CACHES; ++c) {
        ds->n_kv[c] = step->n_kv[c];
        for (int i = 0; i < M; ++i) {
            ds->kv_idx[c][i] = step->kv_idx[c][i];
        }
    }
    memcpy(ds->kv, step->kv, sizeof(ds->kv));
    mk_step_chunks(*ds, step->mask, M, mk->att_chunk, mk->flags);
    size_t off = sz_step;
    mk_args a = mk_launch_args(mk, M);
    a.st = (const mk_dstep *) mk->d_up;
    a.h_out = step->n_h > 0 ? mk->hidden : nullptr;
    for (int c = 0; c < GGML_MK_N_CACHES; ++c) {
        if (step->mask[c]) {
            memcpy(mk->h_up + off, step->mask[c], (size_t) M*step->n_kv[c]*sizeof(float));
        }
        a.mask[c] = (const float *) (mk->d_up + off);
        off += sz_mask[c];
    }
    memcpy(mk->h_up + off, step->embd, (size_t) M*mk->n_embd*sizeof(float));
    a.embd = (const float *) (mk->d_up + off);
    off += sz_embd;
    if (mk->n_pl_all > 0) {
        memcpy(mk->h_up + off, step->pl_embd, (size_t) M*mk->n_pl_all*sizeof(float));
    }
    a.pl_embd = (const float *) (mk->d_up + off);
    off += sz_pl;

    if (cudaMemcpyAsync(mk->d_up, mk->h_up, off, cudaMemcpyHostToDevice, mk->stream) != cudaSuccess) {
        return 3;
    }
    const int64_t t_step = mk_prof_begin(mk, a);
    void * kargs[] = { (void *) &a };
    const bool ncu = MK_PROFILER_RANGE && mk->ncu_m == M;
#if MK_PROFILER_RANGE
    if (ncu) {
        cudaProfilerStart();
    }
#endif
    int cl = mk_step_cl(M, mk->flags, mk->grid, mk->cl_ok);
    cudaError_t e = cudaSuccess;
    if (cl > 1) {
        cudaLaunchAttribute at[2];
        const cudaLaunchConfig_t cfg = mk_cluster_config(mk, cl, true, at);
        e = cudaLaunchKernelExC(&cfg, mk->kernel, kargs);
        if (e != cudaSuccess) {
            (void) cudaGetLastError();
            fprintf(stderr, "llama_mk: a launch in clusters of %d blocks failed (%s): verify batches are staged whole in "
                    "every block from now on\n", cl, cudaGetErrorString(e));
            mk->cl_ok = false;
            cl = 1;
        }
    }
    if (cl <= 1) {
        e = cudaLaunchCooperativeKernel(mk->kernel, dim3(mk->grid), dim3(MK_THREADS), kargs, mk->smem_bytes, mk->stream);
    }
#if MK_PROFILER_RANGE
    if (ncu) {
        cudaProfilerStop();
    }
#endif
    if (e != cudaSuccess) {
        fprintf(stderr, "%s: launch failed: %s\n", __func__, cudaGetErrorString(e));
        return 4;
    }
    if (mk->d_prof) {
        cudaEventRecord(mk->ev[1], mk->stream);
    }
    const size_t row_bytes = (size_t) mk->n_vocab*sizeof(float);
    for (int i = 0; i < step->n_out; ++i) {
        const int r = step->out_rows[i];
        if (logits && cudaMemcpyAsync(logits + (size_t) i*mk->n_vocab, a.logits + (size_t) r*mk->n_vocab, row_bytes,
                                      cudaMemcpyDeviceToHost, mk->stream) != cudaSuccess) {
            return 5;
        }
        if (step->logits_dev && cudaMemcpyAsync((char *) step->logits_dev + i*row_bytes, a.logits + (size_t) r*mk->n_vocab,
                                                row_bytes, cudaMemcpyDeviceToDevice, mk->stream) != cudaSuccess) {
            return 5;
        }
    }
    for (int i = 0; i < step->n_h; ++i) {
        const int r = step->h_rows[i];
        if (cudaMemcpyAsync(step->h_out + (size_t) i*mk->n_embd, mk->hidden + (size_t) r*mk->n_embd,
                            (size_t) mk->n_embd*sizeof(float), cudaMemcpyDeviceToHost, mk->stream) != cudaSuccess) {
            return 5;
        }
    }
    e = cudaStreamSynchronize(mk->stream);
    if (e != cudaSuccess) {
        fprintf(stderr, "%s: kernel failed: %s\n", __func__, cudaGetErrorString(e));
        return 6;
    }
    mk_prof_end(mk, M, t_step);
    return 0;
}

// one launch of the fused draft: step->k draft steps from (token, h) at step->pos (mk_draft_kernel)
int ggml_cuda_mk_draft_eval(void * h, const ggml_mk_draft_step * step) {
    mk_cuda * mk = (mk_cuda *) h;
    const int k = step->k;
    if (!mk || !mk->draft || k < 1 || k > mk->k_max || !step->tokens_out || !step->h || step->token < 0 ||
        step->token >= mk->da.tok_embd.ne1) {
        return 1;
    }
    if (step->n_kv[0] > mk->n_ctx || step->n_kv[1] > mk->n_ctx) {
        fprintf(stderr, "%s: n_kv %d/%d exceeds the context (%d cells)\n", __func__, step->n_kv[0], step->n_kv[1], mk->n_ctx);
        return 7;
    }
    ggml_cuda_set_device(mk->device);

    // one upload: step, mask rows, h, the launch's draft arguments
    const int nb = mk->da.n_embd_bb;
    const size_t sz_step = mk_align(sizeof(mk_dstep));
    const size_t sz_mask[GGML_MK_N_CACHES] = {
        mk_align((size_t) step->n_kv[0]*sizeof(float)), mk_align((size_t) step->n_kv[1]*sizeof(float)) };
    const size_t sz_h  = mk_align((size_t) nb*sizeof(float));
    const size_t need  = sz_step + sz_mask[0] + sz_mask[1] + sz_h + mk_align(sizeof(mk_draft_args));
    if (!mk_upload_reserve(mk, need)) {
        return 2;
    }
    mk_dstep * ds = (mk_dstep *) mk->h_up;
    memset(ds, 0, sizeof(*ds));
    ds->n_tokens = 1;
    ds->pos[0]   = step->pos;
    for (int c = 0; c < GGML_MK_N_CACHES; ++c) {
        ds->n_kv[c] = step->n_kv[c];
    }
    for (int il = 0; il < GGML_MK_DRAFT_MAX_LAYERS; ++il) {
        ds->kv[il] = step->kv[il];   // (the draft's layers write no K/V: no cells)
    }
    mk_step_chunks(*ds, step->mask, 1, mk->att_chunk, mk->flags);
    mk_args a = mk_launch_args(mk, 1);
    a.st = (const mk_dstep *) mk->d_up;
    size_t off = sz_step;
    for (int c = 0; c < GGML_MK_N_CACHES; ++c) {
        if (step->mask[c]) {
            memcpy(mk->h_up + off, step->mask[c], (size_t) step->n_kv[c]*sizeof(float));
        }
        a.mask[c] = (const float *) (mk->d_up + off);
        off += sz_mask[c];
    }
    memcpy(mk->h_up + off, step->h, (size_t) nb*sizeof(float));
    mk_draft_args da = mk->da;
    da.h      = (const float *) (mk->d_up + off);
    da.k      = k;
    da.token  = step->token;
    da.logits = step->logits_out ? mk->da.logits : nullptr;
    off += sz_h;
    memcpy(mk->h_up + off, &da, sizeof(da));
    const mk_draft_args * d_da = (const mk_draft_args *) (mk->d_up + off);
    off += mk_align(sizeof(mk_draft_args));
    a.embd    = nullptr;   // (a draft step's residual stream starts from the pre-projection)
    a.pl_embd = nullptr;
    a.h_out   = mk->hidden;   // the LM head's inputs n, which the post-projection reads

    if (cudaMemcpyAsync(mk->d_up, mk->h_up, off, cudaMemcpyHostToDevice, mk->stream) != cudaSuccess) {
        return 3;
    }
    const int64_t t_step = mk_prof_begin(mk, a);
    void * kargs[] = { (void *) &a, (void *) &d_da };
    cudaError_t e = cudaLaunchCooperativeKernel(mk->kernel, dim3(mk->grid), dim3(MK_THREADS), kargs, mk->smem_bytes, mk->stream);
    if (e != cudaSuccess) {
        fprintf(stderr, "%s: launch failed: %s\n", __func__, cudaGetErrorString(e));
        return 4;
    }
    if (mk->d_prof) {
        cudaEventRecord(mk->ev[1], mk->stream);
    }
    bool ok = cudaMemcpyAsync(step->tokens_out, mk->da.tokens, (size_t) k*sizeof(int32_t), cudaMemcpyDeviceToHost, mk->stream) == cudaSuccess;
    if (step->logits_out) {
        ok = ok && cudaMemcpyAsync(step->logits_out, mk->da.logits, (size_t) k*mk->n_vocab*sizeof(float), cudaMemcpyDeviceToHost,
                                   mk->stream) == cudaSuccess;
    }
    if (step->h_out) {
        ok = ok && cudaMemcpyAsync(step->h_out, mk->da.h_next, (size_t) k*nb*sizeof(float), cudaMemcpyDeviceToHost, mk->stream) == cudaSuccess;
    }
    if (!ok) {
        return 5;
    }
    e = cudaStreamSynchronize(mk->stream);
    if (e != cudaSuccess) {
        fprintf(stderr, "%s: kernel failed: %s\n", __func__, cudaGetErrorString(e));
        return 6;
    }
    mk_prof_end(mk, 0, t_step);
    mk->prof_draft_steps += k;
    return 0;
}

void ggml_cuda_mk_draft_free(void * h) {
    ggml_cuda_mk_free(h);
}
