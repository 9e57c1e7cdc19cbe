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

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#define MK_DEVICE    static __device__ __forceinline__
#define MK_DEVICE_FN static __device__ __noinline__   // phases: own register allocation, no spills in hot loops
#define MK_HOSTDEV   static __host__ __device__ inline
#define MK_KERNEL    __global__ void __launch_bounds__(MK_THREADS)
#define MK_SHARED(T, name, n)   __shared__ T name[n]
#define MK_SHARED_DYN(T, name)  extern __shared__ T name[]
#define MK_UNROLL    _Pragma("unroll")
#define MK_TRAP()    __trap()

static __device__ __forceinline__ float mk_f16(uint16_t u) {
    return __half2float(__ushort_as_half(u));
}

// loads of data that other blocks wrote earlier in this launch: through L2 only (L1 is not coherent)
#if defined(__clang__)
// clang's CUDA headers lack the float/ushort __ldcg overloads: the same instruction, spelled out
static __device__ __forceinline__ float mk_ldcg(const float * p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
    return v;
}
#else
static __device__ __forceinline__ float          mk_ldcg(const float * p)          { return __ldcg(p); }
#endif
static __device__ __forceinline__ float4 mk_ldcg4(const float4 * p) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ uint4 mk_ldcg_u32x4(const uint4 * p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ unsigned mk_ldcg_u32(const unsigned * p) {
    unsigned v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// weights into shared memory without a register round trip (sm_80+), cached in L2 only and marked first to leave
// it: the weights stream through once per step (code, KV rows and activations stay)
// (sm_80+: ggml_backend_mk_create declines older devices; code built for them traps)
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define MK_ASYNC_ASM(...) asm volatile(__VA_ARGS__)
#else
#define MK_ASYNC_ASM(...) __trap()
#endif
static __device__ __forceinline__ void mk_cp_async16(void * dst, const void * src) {
    const unsigned s = (unsigned) __cvta_generic_to_shared(dst);
    unsigned long long pol = 0;
    (void) pol;
    MK_ASYNC_ASM("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    MK_ASYNC_ASM("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" :: "r"(s), "l"(src), "l"(pol) : "memory");
}
static __device__ __forceinline__ void mk_cp_async_commit() {
    MK_ASYNC_ASM("cp.async.commit_group;" ::: "memory");
}
template <int N>
static __device__ __forceinline__ void mk_cp_async_wait() {
    MK_ASYNC_ASM("cp.async.wait_group %0;" :: "n"(N) : "memory");
}

// the same weights through the bulk copy engine (TMA, sm_90+; mk_args.bulk, the host sets it on such devices unless
// variant GGML_MK_VAR_CP_ASYNC): one instruction copies a whole tile and completes on an mbarrier in shared memory
// (one per warp and stage, expecting one arrival). Measured 1.036x the whole step on E4B, 1.012x on Gemma 3 270M
// against the 16-byte cp.async (H200, NOTES.md session 10). Code for older devices traps: the kernel calls none of
// these unless mk_args.bulk
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define MK_BULK_ASM(...) asm volatile(__VA_ARGS__)
#else
#define MK_BULK_ASM(...) __trap()
#endif
static __device__ __forceinline__ void mk_mbar_init(unsigned long long * bar) {
    MK_BULK_ASM("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"((unsigned) __cvta_generic_to_shared(bar)) : "memory");
}
static __device__ __forceinline__ void mk_mbar_init_fence() {
    MK_BULK_ASM("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// bytes (a multiple of 16, src and dst 16-byte aligned) from global to shared memory; bar's phase completes when
// they have landed
static __device__ __forceinline__ void mk_bulk_copy(void * dst, const void * src, unsigned bytes, unsigned long long * bar) {
    const unsigned d = (unsigned) __cvta_generic_to_shared(dst);
    const unsigned b = (unsigned) __cvta_generic_to_shared(bar);
    unsigned long long pol = 0;
    (void) pol;
    MK_BULK_ASM("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    MK_BULK_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(b), "r"(bytes) : "memory");
    MK_BULK_ASM("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                :: "r"(d), "l"(src), "r"(bytes), "r"(b), "l"(pol) : "memory");
}
// wait until the phase of bar with this parity has completed
static __device__ __forceinline__ void mk_mbar_wait(unsigned long long * bar, unsigned parity) {
    const unsigned b = (unsigned) __cvta_generic_to_shared(bar);
    unsigned done = 0;
    do {
        MK_BULK_ASM("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done) : "r"(b), "r"(parity) : "memory");
    } while (!done);
}

// the grid barrier's arrival (release: the block's writes, ordered before it by __syncthreads, go first; acquire:
// the last arrival sees the others' writes) and poll (acquire: what the other blocks wrote before their arrivals is
// seen after it), GPU scope
static __device__ __forceinline__ unsigned mk_atomic_add_acq_rel(unsigned * p, unsigned v) {
    unsigned old;
    asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
static __device__ __forceinline__ unsigned mk_ld_acquire(const unsigned * p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

static __device__ __forceinline__ unsigned long long mk_clock_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

#include "mk-kernel.cuh"

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
    bool all_chunks = false;   // GGML_MK_VAR_ALL_CHUNKS
    bool bulk = false;         // weight tiles by cp.async.bulk (sm_90+, not GGML_MK_VAR_CP_ASYNC)
    uint64_t launches = 0;     // the grid barrier's two counts alternate per launch

    // LLAMA_MEGAKERNEL_PROFILE=1: per-phase times of one-token steps (block 0's view), printed at the end
    unsigned long long * d_prof = nullptr;
    size_t prof_cap = 0;
    std::vector<unsigned long long> h_prof;
    double prof_ns[MK_PH_COUNT] = {};
    double prof_kernel_ms = 0.0;
    double prof_step_ms = 0.0;
    int    prof_steps = 0;
    cudaEvent_t ev[2] = { nullptr, nullptr };
    // LLAMA_MEGAKERNEL_PROFILE=2 also: every block's barrier arrivals, summed per phase (mk_gprof_add)
    unsigned long long * d_gprof = nullptr;
    int gprof_cap = 0;
    std::vector<unsigned long long> h_gprof;
    double gprof_ns[MK_PH_COUNT][4] = {};   // per phase: first, mean and last arrival after the phase began; release lag

    // scratch
    float * scratch = nullptr;
    float * hidden  = nullptr;   // [MK_M][n_embd]: the LM head's inputs of a step whose host wants them (mk_args.h_out)
    mk_args args = {};

    // shared memory: the dynamic part of a block, and its layout for each step size (mk_smem_plan)
    int smem_bytes = 0;
    mk_smem smem[MK_M + 1] = {};

    // upload: [mk_dstep][mask0][mask1][embd][pl_embd]
    char * d_up = nullptr;
    char * h_up = nullptr;
    size_t up_cap = 0;
};

// the profile's names of the phases (enum mk_phase)
static const char * const mk_phase_names[MK_PH_COUNT] = {
    "start", "embedding", "per-layer proj", "per-layer inputs", "q/k/v", "heads (norm, rope, kv)",
    "attention", "o proj", "gate/up", "down", "per-layer gate", "per-layer proj+", "lm head", "attention (global)",
    "(staging: rms of h)", "(staging: loads)", "(staging: norm)", "(staging: 8-bit)", "(staging: rest)",
    "(barrier waits, all)",
};

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

void * ggml_cuda_mk_create(const ggml_mk_model * model, char * err, size_t err_size) {
    if (model->version != GGML_MK_VERSION) {
        snprintf(err, err_size, "plan version %d, kernel version %d", model->version, GGML_MK_VERSION);
        return nullptr;
    }
    if (model->kv_type != GGML_TYPE_F16) {
        snprintf(err, err_size, "KV cache type %d (F16 only)", model->kv_type);
        return nullptr;
    }
    mk_cuda * mk = new mk_cuda();
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
    MK_TRY(cudaFuncGetAttributes(&fa, mk_decode_kernel), "kernel attributes");
    mk->smem_bytes = (int) ((optin - (int) fa.sharedSizeBytes)/16*16);
    int per_sm = 0;
    MK_TRY(cudaFuncSetAttribute(mk_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, mk->smem_bytes), "shared memory limit");
    MK_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mk_decode_kernel, MK_THREADS, mk->smem_bytes), "occupancy");
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
    total += 256; // barrier
    const size_t sz_mvt = mk_align(mk_mv_count(model->n_layer)*sizeof(mk_mvr));
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
    if (const char * e = getenv("LLAMA_MEGAKERNEL_PROFILE"); e && atoi(e) != 0) {
        mk->prof_cap = 64 + 64*(size_t) model->n_layer;   // entries: ~24 per layer (phase ends, waits, stagings)
        mk->h_prof.resize(1 + 2*mk->prof_cap);
        MK_TRY(cudaMalloc(&mk->d_prof, mk->h_prof.size()*sizeof(unsigned long long)), "profile buffer");
        MK_TRY(cudaEventCreate(&mk->ev[0]), "profile event");
        MK_TRY(cudaEventCreate(&mk->ev[1]), "profile event");
        if (atoi(e) >= 2) {
            mk->gprof_cap = 16 + 12*model->n_layer;   // barriers: at most 8 per layer
            mk->h_gprof.resize((size_t) mk->gprof_cap*(1 + 2*(size_t) mk->grid));
            MK_TRY(cudaMalloc(&mk->d_gprof, mk->h_gprof.size()*sizeof(unsigned long long)), "grid profile buffer");
        }
    }
    mk->args.prof     = mk->d_prof;
    mk->args.max_head = max_head;
    mk->args.n_chunk  = n_chunk;
    mk->n_ctx = model->n_ctx;
    mk->att_chunk = model->att_chunk;
    mk->all_chunks = (model->debug_flags & GGML_MK_VAR_ALL_CHUNKS) != 0;
    mk->args.bar      = (unsigned *) p;       // (alternate per launch, see ggml_cuda_mk_eval)
    mk->args.bar_next = (unsigned *) p + 1;
    p += 256;
    mk->args.m = mk->d_model;
    mk->args.n_pl_all = mk->n_pl_all;
    {
        // the step's mat-vecs decoded once: the weights' host plan, the outputs' scratch addresses
        std::vector<mk_mvr> tab(mk_mv_count(model->n_layer));
        mk_mv_table(*model, mk->args, tab.data());
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

void ggml_cuda_mk_free(void * h) {
    mk_cuda * mk = (mk_cuda *) h;
    if (!mk) {
        return;
    }
    ggml_cuda_set_device(mk->device);
    if (mk->stream) {
        cudaStreamSynchronize(mk->stream);
    }
    if (mk->prof_steps > 0) {
        double tot = 0.0;
        for (int i = 0; i < MK_PH_COUNT; ++i) {
            tot += mk->prof_ns[i];
        }
        fprintf(stderr, "llama_mk profile: %d one-token steps: kernel %.1f us, whole step (upload, launch, logits) %.1f us; "
                "phases as block 0 saw them (its own work; staging and barrier waits apart):\n", mk->prof_steps,
                1e3*mk->prof_kernel_ms/mk->prof_steps, 1e3*mk->prof_step_ms/mk->prof_steps);
        for (int i = 1; i < MK_PH_COUNT; ++i) {
            if (mk->prof_ns[i] > 0) {
                fprintf(stderr, "llama_mk profile:   %-24s %9.1f us  %5.1f %%\n", mk_phase_names[i], 1e-3*mk->prof_ns[i]/mk->prof_steps,
                        100.0*mk->prof_ns[i]/tot);
            }
        }
    }
    if (mk->d_gprof && mk->prof_steps > 0) {
        fprintf(stderr, "llama_mk grid profile: %d one-token steps, %d blocks; per phase (us per step, summed over its "
                "barriers): the first, mean and last block's arrival at the barrier after the phase began (the first "
                "release of the barrier before), and the mean release after the last arrival\n", mk->prof_steps, mk->grid);
        double tot[4] = {};
        for (int i = 1; i < MK_PH_COUNT; ++i) {
            if (mk->gprof_ns[i][2] == 0.0) {
                continue;   // (the staging and wait tags are never barrier tags)
            }
            fprintf(stderr, "llama_mk grid profile:   %-24s first %8.1f  mean %8.1f  last %8.1f  release %7.1f\n", mk_phase_names[i],
                    1e-3*mk->gprof_ns[i][0]/mk->prof_steps, 1e-3*mk->gprof_ns[i][1]/mk->prof_steps,
                    1e-3*mk->gprof_ns[i][2]/mk->prof_steps, 1e-3*mk->gprof_ns[i][3]/mk->prof_steps);
            for (int k = 0; k < 4; ++k) {
                tot[k] += mk->gprof_ns[i][k];
            }
        }
        fprintf(stderr, "llama_mk grid profile:   %-24s first %8.1f  mean %8.1f  last %8.1f  release %7.1f\n", "(all)",
                1e-3*tot[0]/mk->prof_steps, 1e-3*tot[1]/mk->prof_steps, 1e-3*tot[2]/mk->prof_steps, 1e-3*tot[3]/mk->prof_steps);
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
    cudaFree(mk->d_up);
    cudaFreeHost(mk->h_up);
    if (mk->stream) {
        cudaStreamDestroy(mk->stream);
    }
    delete mk;
}

// the grid profile of one step: barrier b's phase began when the first block left barrier b-1
static void mk_gprof_add(mk_cuda * mk) {
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
        mk->gprof_ns[tag][0] += (double) first - (double) start;
        mk->gprof_ns[tag][1] += sum/G - (double) start;
        mk->gprof_ns[tag][2] += (double) last - (double) start;
        mk->gprof_ns[tag][3] += rel/G - (double) last;
    }
    cudaMemset(mk->d_gprof, 0, g.size()*sizeof(unsigned long long));
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
    if (need > mk->up_cap) {
        cudaStreamSynchronize(mk->stream);
        cudaFree(mk->d_up);
        cudaFreeHost(mk->h_up);
        mk->d_up = nullptr;
        mk->h_up = nullptr;
        const size_t cap = need*2;
        if (cudaMalloc(&mk->d_up, cap) != cudaSuccess || cudaMallocHost(&mk->h_up, cap) != cudaSuccess) {
            mk->up_cap = 0;
            return 2;
        }
        mk->up_cap = cap;
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
    mk_step_chunks(*ds, step->mask, M, mk->att_chunk, mk->all_chunks);
    size_t off = sz_step;
    mk_args a = mk->args;
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
    const bool prof = mk->d_prof != nullptr && M == 1;
    a.prof = prof ? mk->d_prof : nullptr;
    a.gprof = prof ? mk->d_gprof : nullptr;
    a.gprof_cap = mk->gprof_cap;
    const int64_t t_step = prof ? ggml_time_us() : 0;
    if (prof) {
        cudaMemsetAsync(mk->d_prof, 0, sizeof(unsigned long long), mk->stream);
        cudaEventRecord(mk->ev[0], mk->stream);
    }
    if (mk->launches++ % 2) {
        std::swap(a.bar, a.bar_next);
    }
    a.xs_bytes = mk->smem[M].xs_bytes;
    a.xq_bytes = mk->smem[M].xq_bytes;
    a.ns       = mk->smem[M].ns;
    a.bulk     = mk->bulk;
    void * kargs[] = { (void *) &a };
    cudaError_t e = cudaLaunchCooperativeKernel((const void *) mk_decode_kernel, dim3(mk->grid), dim3(MK_THREADS), kargs, mk->smem_bytes, mk->stream);
    if (e != cudaSuccess) {
        fprintf(stderr, "%s: launch failed: %s\n", __func__, cudaGetErrorString(e));
        return 4;
    }
    if (prof) {
        cudaEventRecord(mk->ev[1], mk->stream);
    }
    for (int i = 0; i < step->n_out; ++i) {
        const int r = step->out_rows[i];
        if (cudaMemcpyAsync(logits + (size_t) i*mk->n_vocab, a.logits + (size_t) r*mk->n_vocab,
                            (size_t) mk->n_vocab*sizeof(float), cudaMemcpyDeviceToHost, mk->stream) != cudaSuccess) {
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
    if (prof) {
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, mk->ev[0], mk->ev[1]);
        mk->prof_kernel_ms += ms;
        mk->prof_step_ms   += 1e-3*(ggml_time_us() - t_step);
        cudaMemcpy(mk->h_prof.data(), mk->d_prof, mk->h_prof.size()*sizeof(unsigned long long), cudaMemcpyDeviceToHost);
        const unsigned long long n = std::min<unsigned long long>(mk->h_prof[0], mk->prof_cap);
        for (unsigned long long i = 1; i < n; ++i) {
            const unsigned long long tag = mk->h_prof[1 + 2*i];
            if (tag < MK_PH_COUNT) {
                mk->prof_ns[tag] += (double) (mk->h_prof[2 + 2*i] - mk->h_prof[2*i]);
            }
        }
        if (mk->d_gprof) {
            mk_gprof_add(mk);
        }
        mk->prof_steps++;
    }
    return 0;
}
