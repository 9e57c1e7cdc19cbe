// CPU mat-vec timing driver for harness/bench_cpu.py (built by that script against a llama.cpp build).
//
//   bench_cpu_matvec M K N THREADS ROUNDS REPS TYPE [TYPE ...]
//
// For each ggml TYPE (by name: stq1_0, tq2_0, tq1_0, q4_0, ...) it quantizes one random M x K matrix
// W (uniform [-1, 1), fixed seed) and builds y = W x with x an F32 K x N matrix. All matrices live in
// one process and share one CPU threadpool. Each round times REPS runs of every type, the types in
// forward order on even rounds and in reverse order on odd rounds (balanced AB/BA), and prints
//   round R TYPE MEDIAN_US
// per type and round. The script turns these into per-round ratios and medians.
#include "ggml.h"
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
    size_t mem = (size_t) (k*n + (int64_t) n_types*m*n) * sizeof(float) + (size_t) (4*n_types + 8) * ggml_tensor_overhead() +
                 (size_t) n_types * ggml_graph_overhead() + (1 << 20);
    for (int i = 0; i < n_types; ++i) {
        types[i] = GGML_TYPE_COUNT;
        for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
            const char * name = ggml_type_name((enum ggml_type) t);
            if (name && strcmp(name, argv[7 + i]) == 0) {
                types[i] = (enum ggml_type) t;
                break;
            }
        }
        if (types[i] == GGML_TYPE_COUNT || ggml_blck_size(types[i]) == 0 || k % ggml_blck_size(types[i]) != 0) {
            fprintf(stderr, "%s: unknown type '%s' or K=%lld not a multiple of its block size\n", argv[0], argv[7 + i], (long long) k);
            return 2;
        }
        mem += ggml_row_size(types[i], k) * (size_t) m;
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

    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(n_threads);
    struct ggml_threadpool * tp = ggml_threadpool_new(&tpp);

    struct ggml_cgraph * graphs[MAX_TYPES];
    struct ggml_cplan    plans[MAX_TYPES];
    const int64_t rows_per_chunk = 64;
    float * tmp = malloc(sizeof(float) * (size_t) (k * rows_per_chunk));
    for (int i = 0; i < n_types; ++i) {
        struct ggml_tensor * w = ggml_new_tensor_2d(ctx, types[i], k, m);
        rng_state = 0x9E3779B97F4A7C15ull; // same weights for every type
        for (int64_t r = 0; r < m; r += rows_per_chunk) {
            const int64_t nr = r + rows_per_chunk <= m ? rows_per_chunk : m - r;
            for (int64_t j = 0; j < nr*k; ++j) {
                tmp[j] = rnd();
            }
            ggml_quantize_chunk(types[i], tmp, (char *) w->data + r*ggml_row_size(types[i], k), 0, nr, k, NULL);
        }
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
            printf("round %d %s %.2f\n", r, ggml_type_name(types[i]), t[reps/2]);
            fflush(stdout);
        }
    }
    free(t);

    for (int i = 0; i < n_types; ++i) {
        free(plans[i].work_data);
    }
    ggml_threadpool_free(tp);
    ggml_free(ctx);
    return 0;
}
