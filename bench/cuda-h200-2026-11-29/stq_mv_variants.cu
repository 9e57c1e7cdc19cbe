// Variant timing for the STQ1_0 mmvq parameters (nwarps, rows per block) with the patch's vec_dot.
// Mirrors the structure of mul_mat_vec_q (ggml-cuda/mmvq.cu): each thread takes chunks tid/(qi/vdr) + k*blocks_per_iter,
// partial sums per (col, row), cross-warp sum through shared memory, then a warp reduction.
#include "common.cuh"
#include "vecdotq.cuh"
#include <cstdio>
#include <vector>
#include <algorithm>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA error %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)

template <int ncols, int nwarps, int rpb>
__launch_bounds__(nwarps*32, 1)
static __global__ void mv(const void * __restrict__ vx, const block_q8_1 * __restrict__ vy, float * __restrict__ dst,
                          const int ncols_x, const int stride_row_x, const int stride_col_y, const int nrows) {
    constexpr int qk = QK_K, qi = 4, vdr = 1;
    const int tid = 32*threadIdx.y + threadIdx.x;
    const int row0 = rpb*blockIdx.x;
    const int blocks_per_row_x = ncols_x/qk;
    constexpr int blocks_per_iter = vdr*nwarps*32/qi;
    float tmp[ncols][rpb] = {{0.0f}};
    for (int kbx = tid/(qi/vdr); kbx < blocks_per_row_x; kbx += blocks_per_iter) {
        const int kby = kbx*(qk/QK8_1);
        const int kqs = vdr*(tid % (qi/vdr));
#pragma unroll
        for (int j = 0; j < ncols; ++j) {
#pragma unroll
            for (int i = 0; i < rpb; ++i) {
                tmp[j][i] += vec_dot_stq1_0_q8_1(vx, &vy[j*stride_col_y + kby], (row0 + i < nrows ? row0 + i : nrows - 1)*stride_row_x + kbx, kqs);
            }
        }
    }
    __shared__ float tmp_shared[nwarps-1 > 0 ? nwarps-1 : 1][ncols][rpb][32];
    if (threadIdx.y > 0) {
#pragma unroll
        for (int j = 0; j < ncols; ++j)
#pragma unroll
            for (int i = 0; i < rpb; ++i) tmp_shared[threadIdx.y-1][j][i][threadIdx.x] = tmp[j][i];
    }
    __syncthreads();
    if (threadIdx.y > 0) return;
#pragma unroll
    for (int j = 0; j < ncols; ++j) {
#pragma unroll
        for (int i = 0; i < rpb; ++i) {
#pragma unroll
            for (int l = 0; l < nwarps-1; ++l) tmp[j][i] += tmp_shared[l][j][i][threadIdx.x];
            tmp[j][i] = warp_reduce_sum<32>(tmp[j][i]);
            if (threadIdx.x == i && row0 + i < nrows) dst[j*nrows + row0 + i] = tmp[j][i];
        }
    }
}

static __global__ void fill_w(uint8_t * w, size_t nblocks, uint32_t seed) {
    for (size_t b = blockIdx.x*(size_t)blockDim.x + threadIdx.x; b < nblocks; b += (size_t)gridDim.x*blockDim.x) {
        uint32_t h = (uint32_t)b*2654435761u ^ seed;
        uint8_t * p = w + b*42;
        for (int i = 0; i < 40; ++i) { h ^= h << 13; h ^= h >> 17; h ^= h << 5; p[i] = h & 0xFF; }
        const half d = __float2half(0.001f + (h % 1000)*1e-5f);
        memcpy(p + 40, &d, 2);
    }
}
static __global__ void fill_y(block_q8_1 * y, int n, uint32_t seed) {
    for (int b = blockIdx.x*blockDim.x + threadIdx.x; b < n; b += gridDim.x*blockDim.x) {
        uint32_t h = b*2246822519u ^ seed; int s = 0;
        for (int i = 0; i < 32; ++i) { h ^= h << 13; h ^= h >> 17; h ^= h << 5; y[b].qs[i] = (int8_t)((int)(h % 255) - 127); s += y[b].qs[i]; }
        const float d = 0.01f; y[b].ds = make_half2(__float2half(d), __float2half(d*s));
    }
}

struct Var { const char * name; void (*launch)(const void *, const block_q8_1 *, float *, int, int, int, int, cudaStream_t); int rpb; };

template <int ncols, int nw, int rpb>
static void launch(const void * x, const block_q8_1 * y, float * d, int K, int srx, int scy, int M, cudaStream_t st) {
    mv<ncols, nw, rpb><<<(M + rpb - 1)/rpb, dim3(32, nw), 0, st>>>(x, y, d, K, srx, scy, M);
}

#define V(nc, nw, rpb) Var{"ncols=" #nc " nwarps=" #nw " rpb=" #rpb, launch<nc, nw, rpb>, rpb}

static void run_shape(const int K, const int M, const int NCOPY, std::vector<Var> vars) {
    const size_t wbytes = (size_t)M*(K/256)*42;
    std::vector<uint8_t *> W(NCOPY);
    for (auto & w : W) { CK(cudaMalloc(&w, wbytes)); fill_w<<<1024, 256>>>(w, wbytes/42, (uint32_t)(uintptr_t)w); }
    block_q8_1 * Y; CK(cudaMalloc(&Y, 8*(K/32)*sizeof(block_q8_1))); fill_y<<<64, 256>>>(Y, 8*(K/32), 7);
    float * D; CK(cudaMalloc(&D, 8*M*sizeof(float)));
    CK(cudaDeviceSynchronize());
    std::vector<float> ref1(M), ref4(4*M), out(8*M);
    bool have1 = false, have4 = false;
    cudaStream_t st; CK(cudaStreamCreate(&st));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    printf("K=%d M=%d weights %.1f MB x %d copies\n", K, M, wbytes/1e6, NCOPY);
    for (auto & v : vars) {
        const int nc = v.name[6] - '0';
        v.launch(W[0], Y, D, K, K/256, K/32, M, st);
        CK(cudaStreamSynchronize(st)); CK(cudaGetLastError());
        CK(cudaMemcpy(out.data(), D, nc*M*sizeof(float), cudaMemcpyDeviceToHost));
        std::vector<float> & ref = nc == 1 ? ref1 : ref4;
        bool & have = nc == 1 ? have1 : have4;
        if (!have) { std::copy(out.begin(), out.begin() + nc*M, ref.begin()); have = true; }
        double err = 0, nrm = 0;
        for (int i = 0; i < nc*M; ++i) { err += (out[i]-ref[i])*(double)(out[i]-ref[i]); nrm += ref[i]*(double)ref[i]; }
        std::vector<float> ts;
        for (int rep = 0; rep < 7; ++rep) {
            const int N = 40;
            CK(cudaEventRecord(e0, st));
            for (int i = 0; i < N; ++i) v.launch(W[i % NCOPY], Y, D, K, K/256, K/32, M, st);
            CK(cudaEventRecord(e1, st)); CK(cudaEventSynchronize(e1));
            float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); ts.push_back(ms*1000/N);
        }
        std::sort(ts.begin(), ts.end());
        printf("  %-28s %8.2f us  %6.0f GB/s  nmse-vs-first %.2e\n", v.name, ts[3], wbytes/(ts[3]*1e3), nrm > 0 ? err/nrm : 0.0);
    }
    for (auto & w : W) CK(cudaFree(w));
    CK(cudaFree(Y)); CK(cudaFree(D));
}

int main() {
    {   // device-to-device copy bandwidth (bytes read + written), for the %-of-copy figures
        const size_t n = (size_t)2 << 30;
        void * a; void * b; CK(cudaMalloc(&a, n)); CK(cudaMalloc(&b, n)); CK(cudaMemset(a, 1, n));
        cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
        std::vector<float> ts;
        for (int r = 0; r < 7; ++r) {
            CK(cudaEventRecord(e0)); for (int i = 0; i < 5; ++i) CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice));
            CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1));
            float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); ts.push_back(ms/5);
        }
        std::sort(ts.begin(), ts.end());
        printf("cudaMemcpy D2D 2 GiB: %.3f ms, %.0f GB/s (read + write)\n", ts[3], 2.0*n/(ts[3]*1e6));
        CK(cudaFree(a)); CK(cudaFree(b));
    }
    run_shape(16384, 32768, 4, {
        V(1,4,1), V(1,4,2), V(1,4,4), V(1,2,2), V(1,2,4), V(1,1,2), V(1,1,4), V(1,1,8), V(1,2,8), V(1,4,8),
        V(4,4,1), V(4,4,2), V(4,2,2), V(4,2,4), V(4,1,4),
    });
    // the routed shape: 8 experts of 6144 x 2048 per call (the MoE kernel is one warp per block)
    run_shape(6144, 8*2048, 16, { V(1,1,2), V(1,1,4), V(1,1,8), V(1,2,4), V(1,4,1), V(1,4,4) });
    return 0;
}
