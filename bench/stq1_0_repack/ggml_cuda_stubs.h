// ggml_cuda_stubs.h: what ggml-cuda/stq1_0-rp16.cu needs from the rest of ggml when the benchmarks of this folder
// (rp16_ggml.cu, bulk.cu) compile it on its own (no ggml-cuda build): link stubs, and a pool that keeps what it
// allocated (no cudaFree between calls). Include after stq1_0-rp16.cu.
#pragma once

#include <cstdarg>
#include <vector>

extern "C" void ggml_abort(const char * file, int line, const char * fmt, ...) {
    va_list ap; va_start(ap, fmt);
    fprintf(stderr, "abort %s:%d: ", file, line); vfprintf(stderr, fmt, ap); fprintf(stderr, "\n");
    va_end(ap); exit(2);
}
extern "C" void ggml_log_internal(enum ggml_log_level, const char *, ...) {}
extern "C" bool ggml_is_contiguous(const struct ggml_tensor *) { return true; }
void ggml_cuda_error(const char * stmt, const char * func, const char * file, int line, const char * msg) {
    fprintf(stderr, "CUDA error %s in %s at %s:%d: %s\n", stmt, func, file, line, msg); exit(2);
}
void ggml_cuda_set_device(int device) { cudaSetDevice(device); }
int ggml_cuda_get_device() { return 0; }

struct keep_pool : ggml_cuda_pool { // keeps what it allocated (no cudaFree between calls)
    struct slot { void * p; size_t n; bool used; };
    std::vector<slot> slots;
    void * alloc(size_t size, size_t * actual) override {
        for (auto & s : slots) if (!s.used && s.n >= size) { s.used = true; *actual = s.n; return s.p; }
        void * p; CUDA_CHECK(cudaMalloc(&p, size)); slots.push_back({p, size, true}); *actual = size; return p;
    }
    void free(void * p, size_t) override { for (auto & s : slots) if (s.p == p) s.used = false; }
};
std::unique_ptr<ggml_cuda_pool> ggml_backend_cuda_context::new_pool_for_device(int, int) {
    return std::unique_ptr<ggml_cuda_pool>(new keep_pool());
}
