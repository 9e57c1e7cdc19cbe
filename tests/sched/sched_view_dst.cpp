// Minimal reproducer of issue 15 (patch 0064): an op whose result is a view (SET_ROWS) of a tensor that the
// scheduler placed on another backend. The graph is the DSA attention mask of llama-graph.cpp (build_attn with
// top_k) at toy size, next to a MUL_MAT whose weight lives on the device, so that the scheduler expands the
// device onto SET_ROWS:
//
//     y    = mul_mat(w, x)                                   // device (weight in a device buffer)
//     mall = fill(mask, -INF)                                // F16: a backend without FILL F16 -> CPU
//     m    = set_rows(view_4d(mall, 1 x n_kv x n_tok), zeros, top_k)   // result: a view of mall
//     out  = add(cast(view back to n_kv x n_tok, F32), y)
//
// Without 0064 the device encodes SET_ROWS into the CPU's compute buffer (metal-emu: "tensor ' (view) (view)'
// is not inside its buffer", SIGSEGV). With it, SET_ROWS runs where mall lives and out is exact.
//
// usage: sched_view_dst DEVICE (e.g. MTL0); prints "ok" and exits 0 when out matches the host reference.
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

int main(int argc, char ** argv) {
    const char * dev_name = argc > 1 ? argv[1] : "MTL0";
    const int n_kv = 16, n_tok = 4, n_top = 3;

    ggml_backend_dev_t dev = ggml_backend_dev_by_name(dev_name);
    if (!dev) {
        fprintf(stderr, "no device %s\n", dev_name);
        return 2;
    }
    ggml_backend_t gpu = ggml_backend_dev_init(dev, nullptr);
    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);

    // the weight, in a device buffer marked as weights
    ggml_init_params wp = { ggml_tensor_overhead()*4, nullptr, true };
    ggml_context * wctx = ggml_init(wp);
    ggml_tensor * w = ggml_new_tensor_2d(wctx, GGML_TYPE_F32, n_kv, n_kv);
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors(wctx, gpu);
    ggml_backend_buffer_set_usage(wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    std::vector<float> wv(n_kv*n_kv);
    for (int i = 0; i < n_kv*n_kv; ++i) {
        wv[i] = (float) ((i*7) % 5) - 2.0f;
    }
    ggml_backend_tensor_set(w, wv.data(), 0, ggml_nbytes(w));

    ggml_init_params gp = { ggml_tensor_overhead()*64 + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(gp);
    ggml_tensor * x    = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_kv, n_tok);
    ggml_tensor * mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_kv, n_tok);
    ggml_tensor * topk = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, n_top, n_tok);
    ggml_set_input(x);
    ggml_set_input(mask);
    ggml_set_input(topk);

    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_tensor * y = ggml_mul_mat(ctx, w, x);
    ggml_build_forward_expand(gf, y);

    ggml_tensor * mall  = ggml_fill(ctx, mask, -INFINITY);
    ggml_tensor * mall4 = ggml_view_4d(ctx, mall, 1, n_kv, n_tok, 1, mall->nb[0], mall->nb[1], mall->nb[2], 0);
    ggml_tensor * top3  = ggml_view_4d(ctx, topk, n_top, n_tok, 1, 1, topk->nb[1], topk->nb[2], topk->nb[3], 0);
    ggml_tensor * zeros = ggml_fill(ctx, ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1, n_top, n_tok, 1), 0.0f);
    ggml_tensor * sr    = ggml_set_rows(ctx, mall4, zeros, top3);
    ggml_tensor * m     = ggml_view_2d(ctx, sr, n_kv, n_tok, sr->nb[2], 0);
    ggml_tensor * out = ggml_add(ctx, ggml_cast(ctx, m, GGML_TYPE_F32), y);
    ggml_set_output(out);
    ggml_build_forward_expand(gf, out);

    ggml_backend_t backends[2] = { gpu, cpu };
    ggml_backend_sched_t sched = ggml_backend_sched_new(backends, nullptr, 2, GGML_DEFAULT_GRAPH_SIZE, false, true);
    if (!ggml_backend_sched_alloc_graph(sched, gf)) {
        fprintf(stderr, "alloc_graph failed\n");
        return 1;
    }
    printf("SET_ROWS on %s, FILL on %s\n",
           ggml_backend_name(ggml_backend_sched_get_tensor_backend(sched, sr)),
           ggml_backend_name(ggml_backend_sched_get_tensor_backend(sched, mall)));

    std::vector<float> xv(n_kv*n_tok);
    for (int i = 0; i < n_kv*n_tok; ++i) {
        xv[i] = (float) ((i*3) % 4) - 1.5f;
    }
    std::vector<ggml_fp16_t> mv(n_kv*n_tok, ggml_fp32_to_fp16(0.0f));
    std::vector<int32_t> tv(n_top*n_tok);
    for (int t = 0; t < n_tok; ++t) {
        for (int k = 0; k < n_top; ++k) {
            tv[t*n_top + k] = (t*5 + k*4) % n_kv;
        }
    }
    ggml_backend_tensor_set(x, xv.data(), 0, ggml_nbytes(x));
    ggml_backend_tensor_set(mask, mv.data(), 0, ggml_nbytes(mask));
    ggml_backend_tensor_set(topk, tv.data(), 0, ggml_nbytes(topk));

    if (ggml_backend_sched_graph_compute(sched, gf) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "graph_compute failed\n");
        return 1;
    }
    std::vector<float> ov(n_kv*n_tok);
    ggml_backend_tensor_get(out, ov.data(), 0, ggml_nbytes(out));

    int bad = 0;
    for (int t = 0; t < n_tok; ++t) {
        for (int r = 0; r < n_kv; ++r) {
            float yr = 0.0f;
            for (int c = 0; c < n_kv; ++c) {
                yr += wv[r*n_kv + c]*xv[t*n_kv + c];
            }
            bool sel = false;
            for (int k = 0; k < n_top; ++k) {
                sel = sel || tv[t*n_top + k] == r;
            }
            const float ref = sel ? yr : -INFINITY;
            const float got = ov[t*n_kv + r];
            if (!(got == ref || std::fabs(got - ref) <= 1e-4f*(1.0f + std::fabs(ref)))) {
                if (bad++ < 8) {
                    fprintf(stderr, "out[%d][%d] = %g, expected %g\n", t, r, got, ref);
                }
            }
        }
    }

    ggml_backend_sched_free(sched);
    ggml_free(ctx);
    ggml_backend_buffer_free(wbuf);
    ggml_free(wctx);
    ggml_backend_free(cpu);
    ggml_backend_free(gpu);
    if (bad) {
        fprintf(stderr, "%d wrong values\n", bad);
        return 1;
    }
    printf("ok\n");
    return 0;
}
