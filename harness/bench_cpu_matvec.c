// CPU mat-vec timing driver for harness/bench_cpu.py (built by that script against a llama.cpp build).
//
//   bench_cpu_matvec M K N THREADS ROUNDS REPS TYPE[:plain] [TYPE[:plain] ...]
//
// For each ggml TYPE (by name: stq1_0, tq2_0, tq1_0, q4_0, ...) it quantizes one random M x K matrix
// W (uniform [-1, 1), fixed seed) and builds y = W x with x an F32 K x N matrix. The weights are
// placed as llama.cpp places model weights by default: in the first of the CPU backend's extra
// buffer types (CPU_REPACK, ...) that supports the MUL_MAT, else in a plain CPU buffer; TYPE:plain
// forces the plain CPU buffer (the unrepacked vec_dot path), so both can be compared in one run.
// It prints `path LABEL BUFFER_TYPE` per entry. All matrices live in one process and share one CPU
// threadpool. Each round times REPS runs of every entry, in forward order on even rounds and in
// reverse order on odd rounds (balanced AB/BA), and prints
//   round R LABEL MEDIAN_US
// per entry and round. The script turns these into per-round ratios and medians.
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_TYPES 16

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec*1e6 + ts.tv_nsec*1e-3;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static float rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float) ((double) (rng_state >> 40) / (double) (1 << 23)) - 1.0f;
}

static int cmp_double(const void * a, const void * b) {
    const double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

int main(int argc, char ** argv) {
    if (argc < 8) {
        fprintf(stderr, "usage: %s M K N THREADS ROUNDS REPS TYPE [TYPE ...]\n", argv[0]);
        return 2;
    }
    const int64_t m = atoll(argv[1]), k = atoll(argv[2]), n = atoll(argv[3]);
    const int n_threads = atoi(argv[4]), rounds = atoi(argv[5]), reps = atoi(argv[6]);
    const int n_types = argc - 7;
    if (m <= 0 || k <= 0 || n <= 0 || n_threads <= 0 || rounds <= 0 || reps <= 0 || n_types > MAX_TYPES) {
        fprintf(stderr, "%s: bad arguments (M, K, N, THREADS, ROUNDS, REPS must be > 0, at most %d types)\n", argv[0], MAX_TYPES);
        return 2;
    }

    enum ggml_type types[MAX_TYPES];
    bool plain[MAX_TYPES];
    size_t mem = (size_t) (k*n + (int64_t) n_types*m*n) * sizeof(float) + (size_t) (4*n_types + 8) * ggml_tensor_overhead() +
                 (size_t) n_types * ggml_graph_overhead() + (1 << 20);
    for (int i = 0; i < n_types; ++i) {
        const char * label = argv[7 + i];
        const char * colon = strchr(label, ':');
        const size_t name_len = colon ? (size_t) (colon - label) : strlen(label);
        plain[i] = colon != NULL && strcmp(colon, ":plain") == 0;
        types[i] = GGML_TYPE_COUNT;
        for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
            const char * name = ggml_type_name((enum ggml_type) t);
            if (name && strlen(name) == name_len && strncmp(name, label, name_len) == 0) {
                types[i] = (enum ggml_type) t;
                break;
            }
        }
        if ((colon && !plain[i]) || types[i] == GGML_TYPE_COUNT || ggml_blck_size(types[i]) == 0 || k % ggml_blck_size(types[i]) != 0) {
            fprintf(stderr, "%s: unknown type '%s' (expected TYPE or TYPE:plain) or K=%lld not a multiple of its block size\n",
                    argv[0], label, (long long) k);
            return 2;
        }
    }

    ggml_cpu_init();
    struct ggml_init_params ip = { mem, NULL, false };
    struct ggml_context * ctx = ggml_init(ip);
    if (!ctx) {
        fprintf(stderr, "%s: cannot allocate %zu bytes\n", argv[0], mem);
        return 1;
    }

    struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
    for (int64_t i = 0; i < k*n; ++i) {
        ((float *) x->data)[i] = rnd();
    }

    // the buffer types llama.cpp tries for a weight: the CPU device's extra ones, then the plain CPU one
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!dev) {
        fprintf(stderr, "%s: no CPU backend device\n", argv[0]);
        return 1;
    }
    ggml_backend_buffer_type_t bufts[16];
    int n_bufts = 0;
    {
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
        ggml_backend_dev_get_extra_bufts_t get_extra = (ggml_backend_dev_get_extra_bufts_t)
            ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
        ggml_backend_buffer_type_t * extra = get_extra ? get_extra(dev) : NULL;
        for (; extra && *extra && n_bufts < 15; ++extra) {
            bufts[n_bufts++] = *extra;
        }
        bufts[n_bufts++] = ggml_backend_cpu_buffer_type();
    }

    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(n_threads);
    struct ggml_threadpool * tp = ggml_threadpool_new(&tpp);

    struct ggml_cgraph * graphs[MAX_TYPES];
    struct ggml_cplan    plans[MAX_TYPES];
    struct ggml_context * wctx[MAX_TYPES];
    ggml_backend_buffer_t wbuf[MAX_TYPES];
    const int64_t rows_per_chunk = 64;
    float * tmp = malloc(sizeof(float) * (size_t) (k * rows_per_chunk));
    for (int i = 0; i < n_types; ++i) {
        struct ggml_init_params wp = { (size_t) (n_bufts + 2) * ggml_tensor_overhead(), NULL, true };
        wctx[i] = ggml_init(wp);
        struct ggml_tensor * w = ggml_new_tensor_2d(wctx[i], types[i], k, m);

        // first buffer type whose device supports y = W x with W in it (as llama.cpp's loader does)
        ggml_backend_buffer_type_t buft = ggml_backend_cpu_buffer_type();
        for (int b = plain[i] ? n_bufts - 1 : 0; b < n_bufts; ++b) {
            ggml_backend_buffer_t probe = ggml_backend_buft_alloc_buffer(bufts[b], 0);
            if (!probe) {
                continue;
            }
            w->buffer = probe;
            const bool ok = ggml_backend_dev_supports_op(dev, ggml_mul_mat(wctx[i], w, x));
            w->buffer = NULL;
            ggml_backend_buffer_free(probe);
            if (ok) {
                buft = bufts[b];
                break;
            }
        }
        wbuf[i] = ggml_backend_alloc_ctx_tensors_from_buft(wctx[i], buft);
        if (!wbuf[i]) {
            fprintf(stderr, "%s: cannot allocate %s weights in %s\n", argv[0], argv[7 + i], ggml_backend_buft_name(buft));
            return 1;
        }
        printf("path %s %s\n", argv[7 + i], ggml_backend_buft_name(buft));

        const size_t row_size = ggml_row_size(types[i], k);
        char * q = malloc(row_size * (size_t) m);
        rng_state = 0x9E3779B97F4A7C15ull; // same weights for every type
        for (int64_t r = 0; r < m; r += rows_per_chunk) {
            const int64_t nr = r + rows_per_chunk <= m ? rows_per_chunk : m - r;
            for (int64_t j = 0; j < nr*k; ++j) {
                tmp[j] = rnd();
            }
            ggml_quantize_chunk(types[i], tmp, q + r*row_size, 0, nr, k, NULL);
        }
        ggml_backend_tensor_set(w, q, 0, ggml_nbytes(w)); // a repacking buffer converts the layout here
        free(q);
        graphs[i] = ggml_new_graph(ctx);
        ggml_build_forward_expand(graphs[i], ggml_mul_mat(ctx, w, x));
        plans[i] = ggml_graph_plan(graphs[i], n_threads, tp);
        plans[i].work_data = plans[i].work_size ? malloc(plans[i].work_size) : NULL;
        ggml_graph_compute(graphs[i], &plans[i]); // warm-up
    }
    free(tmp);

    double * t = malloc(sizeof(double) * (size_t) reps);
    for (int r = 0; r < rounds; ++r) {
        for (int o = 0; o < n_types; ++o) {
            const int i = r % 2 == 0 ? o : n_types - 1 - o;
            for (int j = 0; j < reps; ++j) {
                const double t0 = now_us();
                ggml_graph_compute(graphs[i], &plans[i]);
                t[j] = now_us() - t0;
            }
            qsort(t, (size_t) reps, sizeof(double), cmp_double);
            printf("round %d %s %.2f\n", r, argv[7 + i], t[reps/2]);
            fflush(stdout);
        }
    }
    free(t);

    for (int i = 0; i < n_types; ++i) {
        free(plans[i].work_data);
        ggml_backend_buffer_free(wbuf[i]);
        ggml_free(wctx[i]);
    }
    ggml_threadpool_free(tp);
    ggml_free(ctx);
    return 0;
}
