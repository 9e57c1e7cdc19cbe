// The Metal Gemma decode megakernel (ggml-metal/mk/mk-kernel.metal, translated by metal-emu's
// msl2cpp.py and run by emu-runtime.cpp as a persistent dispatch: all threadgroups co-resident, device
// memory with per-threadgroup store buffers published only by device-scope fences) on the tiny random
// Gemma-4-shaped model of mk_ref.h, with the weight types the Metal kernel decodes, against the same
// float64 reference as the CUDA kernel's emulation (mk_kernel_emu.cpp). The device plan comes from the
// host function of ggml-metal/mk/mk-plan.h; weights live in two weight buffers, the two KV caches in two
// KV buffers, as they would in llama.cpp's Metal buffers. Checks (OK/FAIL lines, exit 1 on failure):
//  - one-token steps over a sequence that crosses the sliding window vs the reference;
//  - verify steps of M tokens: every row bitwise equal to the one-token steps (same pipeline, M at run time).
// usage: mk_metal_emu [--gemma3] [--planted nobarrier|nofence] [--tg N] [--verify 2,4,8] [--unsupported]
//   --gemma3: the other shape of the plan (mk_ref.h): no per-layer inputs, Q scaled after rope, no V
//     norm, V = K projection and a linear rope scale on the global layer, output scale after the FFN
//   --planted: the grid barriers removed, or without their device-scope fences: must fail
//   --full-kv: every step looks at all kv_size cells (default: n_kv grows with the sequence, padded to 8
//     cells as in llama.cpp, so a verify step sees more cells than the one-token steps of its tokens did)
//   --unsupported: a Q4_1 matrix: mk_mtl_plan_make must refuse it, naming the tensor (exit 0 if it does)
#include <ggml.h>

#include "emu-runtime.h"
#include "mk-plan.h"
#include "mk_ref.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <sys/mman.h>

void emu_register_mk_kernel_p0();
void emu_register_all_kernels(void) { emu_register_mk_kernel_p0(); }

using namespace mk_ref;

// page-aligned device memory registered with the emulator (as the emulated device's buffers are)
static uint8_t * device_alloc(size_t n, uint8_t fill) {
    const size_t bytes = (n + 4095) & ~(size_t) 4095;
    void * p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(3);
    }
    memset(p, fill, bytes);
    emu_device_memory_register(p, bytes);
    return (uint8_t *) p;
}

// copies the model's weights and vectors into weight buffers (alternating between the two) and points
// the plan at the copies
struct arena {
    uint8_t * base[2];
    size_t    size[2];
    size_t    used[2] = {0, 0};
    int       next = 0;
    const void * put(const void * src, size_t n) {
        const int b = next;
        next ^= 1;
        if (used[b] + n > size[b]) {
            fprintf(stderr, "arena %d full\n", b);
            exit(3);
        }
        uint8_t * dst = base[b] + used[b];
        memcpy(dst, src, n);
        used[b] = (used[b] + n + 63) & ~(size_t) 63;
        return dst;
    }
    void w(ggml_mk_weight & x) {
        if (x.data) {
            x.data = put(x.data, (size_t) (x.ne1 - 1)*x.nb1 + ggml_row_size((ggml_type) x.type, x.ne0));
        }
    }
    void v(const float * & p, size_t n) {
        if (p) {
            p = (const float *) put(p, n*sizeof(float));
        }
    }
};

int main(int argc, char ** argv) {
    int planted = 0;
    int n_tg = 3;
    bool unsupported = false;
    bool gemma3 = false;
    bool full_kv = false;
    std::vector<int> verify_m = { 2, 4, 8 };
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--planted" && i + 1 < argc) {
            const std::string k = argv[++i];
            planted = k == "nobarrier" ? GGML_MK_DEBUG_NO_GRID_BARRIER : k == "nofence" ? MK_MTL_DEBUG_BARRIER_NO_FENCES : -1;
        } else if (a == "--tg" && i + 1 < argc) {
            n_tg = atoi(argv[++i]);
        } else if (a == "--verify" && i + 1 < argc) {
            verify_m.clear();
            for (const char * p = argv[++i]; *p; ) {
                verify_m.push_back((int) strtol(p, (char **) &p, 10));
                if (*p == ',') ++p;
            }
        } else if (a == "--full-kv") {
            full_kv = true;
        } else if (a == "--gemma3") {
            gemma3 = true;
        } else if (a == "--unsupported") {
            unsupported = true;
        } else {
            planted = -1;
        }
        if (planted < 0) {
            fprintf(stderr, "usage: %s [--gemma3] [--full-kv] [--planted nobarrier|nofence] [--tg N] [--verify 2,4,8] [--unsupported]\n", argv[0]);
            return 2;
        }
    }

    // the types the Metal kernel decodes, every one in several roles; pl_proj rows (16 values) are float
    const layer_def defs[n_layer] = {
        { true,   64, true,  { GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q5_0, GGML_TYPE_Q4_0, GGML_TYPE_F16,  GGML_TYPE_BF16,   GGML_TYPE_STQ1_0, GGML_TYPE_F32,  GGML_TYPE_F32  }, 1.0f },
        { false, 128, true,  { GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_F32,  GGML_TYPE_Q6_K, GGML_TYPE_Q4_K, GGML_TYPE_STQ1_0, GGML_TYPE_F16,    GGML_TYPE_BF16, GGML_TYPE_F16  }, 0.8f },
        { true,   64, false, { GGML_TYPE_Q5_0, GGML_TYPE_F16,  GGML_TYPE_F16,  GGML_TYPE_Q4_0, GGML_TYPE_BF16, GGML_TYPE_Q8_0,   GGML_TYPE_Q4_K,   GGML_TYPE_Q6_K, GGML_TYPE_BF16 }, 1.0f },
    };
    model mm;
    build(mm, defs, GGML_TYPE_Q6_K, 0, gemma3);   // float inputs for every type (no 8-bit input rounding)
    ggml_mk_model md = *mm.md;
    md.debug_flags = planted;

    // weights into two weight buffers
    arena ar;
    size_t total = 0;
    for (const auto & w : mm.keep) total += w.q.size() + 64;
    for (const auto & v : mm.vecs) total += v.size()*4 + 64;
    total += 64*n_layer*4 + 4096;
    for (int b = 0; b < 2; ++b) {
        ar.size[b] = total;
        ar.base[b] = device_alloc(total, 0);
    }
    ar.w(md.output); ar.v(md.output_norm, n_embd); ar.w(md.pl_model_proj); ar.v(md.pl_proj_norm, n_pl);
    for (int il = 0; il < n_layer; ++il) {
        ggml_mk_layer & L = md.layers[il];
        ar.w(L.wq); ar.w(L.wk); ar.w(L.wv); ar.w(L.wo); ar.w(L.ffn_gate); ar.w(L.ffn_up); ar.w(L.ffn_down);
        ar.w(L.pl_gate); ar.w(L.pl_proj);
        ar.v(L.rope_freqs, L.n_rot/2); ar.v(L.attn_norm, n_embd); ar.v(L.q_norm, L.head_dim); ar.v(L.k_norm, L.head_dim);
        ar.v(L.attn_post_norm, n_embd); ar.v(L.ffn_norm, n_embd); ar.v(L.ffn_post_norm, n_embd); ar.v(L.pl_post_norm, n_embd);
    }
    const mk_mtl_range wbufs[2] = { { ar.base[0], ar.size[0] }, { ar.base[1], ar.size[1] } };

    char err[256] = "";
    mk_mtl_plan * P = (mk_mtl_plan *) device_alloc(sizeof(mk_mtl_plan), 0);
    if (unsupported) {
        // a matrix type the Metal kernel does not decode must be refused with the tensor's name
        md.layers[1].ffn_down.type = GGML_TYPE_Q4_1;
        const int rc = mk_mtl_plan_make(&md, wbufs, 2, P, err, sizeof(err));
        const bool ok = rc != 0 && strstr(err, "layer 1 ffn_down") && strstr(err, "q4_1");
        printf("%s unsupported type refused: %s\n", ok ? "OK" : "FAIL", err);
        return ok ? 0 : 1;
    }
    if (mk_mtl_plan_make(&md, wbufs, 2, P, err, sizeof(err)) != 0) {
        printf("FAIL mk_mtl_plan_make: %s\n", err);
        return 1;
    }

    // KV caches: cache 0 (K0, V0) in one KV buffer, cache 1 (K1, V1) in the other
    uint8_t * kvb0 = device_alloc((kv_elems[0] + kv_elems[1])*2, 0);
    uint8_t * kvb1 = device_alloc((kv_elems[2] + kv_elems[3])*2, 0);
    void * K0 = kvb0, * V0 = kvb0 + kv_elems[0]*2, * K1 = kvb1, * V1 = kvb1 + kv_elems[2]*2;
    const mk_mtl_range kvbufs[2] = { { kvb0, (kv_elems[0] + kv_elems[1])*2 }, { kvb1, (kv_elems[2] + kv_elems[3])*2 } };

    // scratch starts as NaN: a read of a value not written (or not published) yet shows
    uint8_t * scr = device_alloc(P->scratch_size, 0xff);
    uint8_t * stp = device_alloc(mk_mtl_step_size(P), 0);
    uint8_t * bar = device_alloc(8, 0);

    const int resident = emu_max_resident_threadgroups(MK_MTL_THREADS, 0);
    if (n_tg > resident) {
        printf("note: %d threadgroups requested, the emulated device keeps %d co-resident: using %d\n", n_tg, resident, resident);
        n_tg = resident;
    }
    printf("kernel_mk_decode (%s): %d threadgroups x %d threads, scratch %zu bytes, plan %zu bytes, step %zu bytes\n", gemma3 ? "gemma3 plan" : "gemma4 plan", n_tg,
           MK_MTL_THREADS, (size_t) P->scratch_size, sizeof(mk_mtl_plan), mk_mtl_step_size(P));

    const emu_kernel_info * kinfo = emu_find_kernel("kernel_mk_decode");
    if (!kinfo || !kinfo->coresident) {
        printf("FAIL kernel_mk_decode not registered as a persistent kernel\n");
        return 1;
    }

    std::vector<float> mask0, mask1, mask_kv[2];
    auto run = [&](int p0, int M) {   // tokens p0..p0+M-1 (token i has embedding row i, position i)
        ggml_mk_step st = {};
        st.n_tokens = M;
        st.n_out = M;
        mm.masks(p0, M, mask0, mask1);
        for (int m = 0; m < M; ++m) {
            const int pos = p0 + m;
            st.pos[m] = pos; st.kv_idx[0][m] = pos; st.kv_idx[1][m] = pos; st.out_rows[m] = m;
        }
        const int n_kv = full_kv ? kv_size : std::min(kv_size, (p0 + M + 7)/8*8);
        for (int c = 0; c < 2; ++c) {   // the first n_kv columns of each mask row
            const std::vector<float> & src = c == 0 ? mask0 : mask1;
            mask_kv[c].resize((size_t) M*n_kv);
            for (int m = 0; m < M; ++m) memcpy(&mask_kv[c][(size_t) m*n_kv], &src[(size_t) m*kv_size], n_kv*sizeof(float));
            st.n_kv[c] = n_kv;
            st.mask[c] = mask_kv[c].data();
        }
        st.embd = &mm.E[(size_t) p0*n_embd]; st.pl_embd = &mm.PE[(size_t) p0*n_pl*n_layer];
        for (int il = 0; il < n_layer; ++il) st.kv[il] = mm.view(il, K0, V0, K1, V1);
        if (mk_mtl_step_fill(P, &st, kvbufs, 2, stp, err, sizeof(err)) != 0) {
            printf("FAIL mk_mtl_step_fill: %s\n", err);
            exit(1);
        }
        emu_dispatch d = {};
        d.kernel = kinfo;
        void * bufs[MK_MTL_N_BUF] = {};
        bufs[MK_MTL_B_PLAN] = P;
        bufs[MK_MTL_B_STEP] = stp;
        for (int i = 0; i < MK_MTL_N_WBUF; ++i) bufs[MK_MTL_B_W0 + i] = ar.base[i % 2];
        bufs[MK_MTL_B_KV0 + 0] = kvb0;
        bufs[MK_MTL_B_KV0 + 1] = kvb1;
        bufs[MK_MTL_B_SCRATCH] = scr;
        bufs[MK_MTL_B_BAR] = bar;
        for (int i = 0; i < MK_MTL_N_BUF; ++i) d.bufs[i] = bufs[i];
        d.ntgpg[0] = n_tg; d.ntgpg[1] = 1; d.ntgpg[2] = 1;
        d.ntg[0] = MK_MTL_THREADS; d.ntg[1] = 1; d.ntg[2] = 1;
        if (!emu_run_dispatch(&d)) {
            printf("FAIL dispatch of kernel_mk_decode (emulator error)\n");
            exit(1);
        }
        const float * lo = (const float *) (scr + P->s_logits);
        const float * xn = (const float *) (scr + P->s_xn);   // the hidden rows (ggml_metal_mk_eval copies them from here)
        std::vector<float> out(lo, lo + (size_t) M*n_vocab);    // logits, then the hidden rows
        out.insert(out.end(), xn, xn + (size_t) M*n_embd);
        return out;
    };

    // bound: float inputs for every type (as llama.cpp's Metal mat-vecs), so only float32 rounding
    // separates the kernel from the float64 reference; a wrong lane mapping, block or barrier costs >= 1e-3
    const int fails = check(mm, run, 1e-8, verify_m);
    return fails ? 1 : 0;
}
