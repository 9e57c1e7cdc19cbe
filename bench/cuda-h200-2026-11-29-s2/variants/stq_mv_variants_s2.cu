// Variant timing for the STQ1_0 mmvq parameters (nwarps, rows per block) with the patch's vec_dot.
// Mirrors the structure of mul_mat_vec_q (ggml-cuda/mmvq.cu): each thread takes chunks tid/(qi/vdr) + k*blocks_per_iter,
// partial sums per (col, row), cross-warp sum through shared memory, then a warp reduction.
#include "common.cuh"
#include "vecdotq.cuh"
#include <cstdio>
#include <vector>
#include <algorithm>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA error %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)


static __device__ __forceinline__ float vd_loadonly(const void * __restrict__ vbq, const block_q8_1 * __restrict__ bq8_1, const int & kbx, const int & iqs) {
    const block_stq1_0 * bq = (const block_stq1_0 *) vbq + kbx;
    const uint16_t * qs16 = (const uint16_t *) bq->qs + 4*iqs;
    const uint8_t  * sb   = bq->sign + 2*iqs;
    const block_q8_1 * ya = bq8_1 + 2*iqs;
    const block_q8_1 * yb = ya + 1;
    int s = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const uint32_t x = qs16[j] ^ (sb[j/2] << 16);
        s = ggml_cuda_dp4a(x, get_int_b4(ya->qs, j), s);
        s = ggml_cuda_dp4a(x, get_int_b4(ya->qs, j + 4), s);
        s = ggml_cuda_dp4a(x, get_int_b4(yb->qs, j), s);
        s = ggml_cuda_dp4a(x, get_int_b4(yb->qs, j + 4), s);
    }
    return __half2float(bq->d) * __low2float(ya->ds) * s + __low2float(yb->ds);
}
static __device__ __forceinline__ float vd_load32(const void * __restrict__ vbq, const block_q8_1 * __restrict__ bq8_1, const int & kbx, const int & iqs) {
    const char * p = (const char *) ((const block_stq1_0 *) vbq + kbx);
    const uint32_t * w = (const uint32_t *) ((uintptr_t) (p + 8*iqs) & ~(uintptr_t) 3);
    const uint32_t a = w[0], b = w[1], c = w[2];
    const uint32_t * ws = (const uint32_t *) ((uintptr_t) (p + 32) & ~(uintptr_t) 3);
    const uint32_t sg = ws[0] ^ ws[1] ^ ws[2];
    const block_q8_1 * ya = bq8_1 + 2*iqs;
    const block_q8_1 * yb = ya + 1;
    int s = 0;
    const uint32_t x[4] = {a ^ sg, b, c, a ^ c};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        s = ggml_cuda_dp4a(x[j], get_int_b4(ya->qs, j), s);
        s = ggml_cuda_dp4a(x[j], get_int_b4(ya->qs, j + 4), s);
        s = ggml_cuda_dp4a(x[j], get_int_b4(yb->qs, j), s);
        s = ggml_cuda_dp4a(x[j], get_int_b4(yb->qs, j + 4), s);
    }
    return __low2float(ya->ds) * s + __low2float(yb->ds);
}

static __device__ __forceinline__ float vd_prev(
    const void * __restrict__ vbq, const block_q8_1 * __restrict__ bq8_1, const int & kbx, const int & iqs) {

    const block_stq1_0 * bq = (const block_stq1_0 *) vbq + kbx;

    // 42-byte blocks: only 2-byte loads are aligned
    const uint16_t * qs16 = (const uint16_t *) bq->qs + 4*iqs;
    const uint8_t  * sb   = bq->sign + 2*iqs;

    const block_q8_1 * ya = bq8_1 + 2*iqs;
    const block_q8_1 * yb = ya + 1;

    int s0 = 0; // lane 0 (x64), first q8_1 block
    int s1 = 0; // lane 1, first q8_1 block
    int s2 = 0; // lane 2 (x4), second q8_1 block
    int s3 = 0; // lane 3 (x16), second q8_1 block
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        // sign bits 4j..4j+3 of the chunk to bits 7, 15, 23, 31 (the partial products never overlap); the
        // shifts are multiplies so that they issue on the FMA pipe, next to the logic ops of the decode
        const uint32_t s8   = sb[j/2];
        const uint32_t s4   = j % 2 == 0 ? __umulhi(s8 << 28, 16) : __umulhi(s8, 1u << 28);
        const uint32_t m    = stq1_0_byte_mask(s4*0x10204080u);
        const uint32_t pat0 = stq1_0_lookup4(qs16[j]);
        const uint32_t pat  = (pat0 & ~m) | ((0xAAAAAAAAu - pat0) & m);

        s0 = stq1_0_dp4a_us(pat & 0xC0C0C0C0, get_int_b4(ya->qs, j + 0), s0);
        s1 = ggml_cuda_dp4a(pat & 0x03030303, get_int_b4(ya->qs, j + 4), s1);
        s2 = ggml_cuda_dp4a(pat & 0x0C0C0C0C, get_int_b4(yb->qs, j + 0), s2);
        s3 = ggml_cuda_dp4a(pat & 0x30303030, get_int_b4(yb->qs, j + 4), s3);
    }

    const int sumia = (s0 >> 6) + s1;        // exact: s0 is a multiple of 64
    const int sumib = (s2 >> 2) + (s3 >> 4); // exact: multiples of 4 and 16

    const float2 dsa = __half22float2(ya->ds);
    const float2 dsb = __half22float2(yb->ds);
    const float  d   = __half2float(bq->d);

    float r = __fmaf_rn(-dsa.x, (float) sumia, dsa.y);
    r = __fmaf_rn(-dsb.x, (float) sumib, r);
    r = __fadd_rn(r, dsb.y);
    return __fmul_rn(d, r);
}


template <int ncols, int nwarps, int rpb, int minb = 1, int unr = 1, int vd = 0>
__launch_bounds__(nwarps*32, minb)
static __global__ void mv(const void * __restrict__ vx, const block_q8_1 * __restrict__ vy, float * __restrict__ dst,
                          const int ncols_x, const int stride_row_x, const int stride_col_y, const int nrows) {
    constexpr int qk = QK_K, qi = 4, vdr = 1;
    const int tid = 32*threadIdx.y + threadIdx.x;
    const int row0 = rpb*blockIdx.x;
    const int blocks_per_row_x = ncols_x/qk;
    constexpr int blocks_per_iter = vdr*nwarps*32/qi;
    float tmp[ncols][rpb] = {{0.0f}};
#pragma unroll unr
    for (int kbx = tid/(qi/vdr); kbx < blocks_per_row_x; kbx += blocks_per_iter) {
        const int kby = kbx*(qk/QK8_1);
        const int kqs = vdr*(tid % (qi/vdr));
#pragma unroll
        for (int j = 0; j < ncols; ++j) {
#pragma unroll
            for (int i = 0; i < rpb; ++i) {
                tmp[j][i] += (vd == 0 ? vec_dot_stq1_0_q8_1 : vd == 1 ? vd_loadonly : vd == 2 ? vd_load32 : vd_prev)(vx, &vy[j*stride_col_y + kby], (row0 + i < nrows ? row0 + i : nrows - 1)*stride_row_x + kbx, kqs);
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

template <int ncols, int nw, int rpb, int minb = 1, int unr = 1, int vd = 0>
static void launch(const void * x, const block_q8_1 * y, float * d, int K, int srx, int scy, int M, cudaStream_t st) {
    mv<ncols, nw, rpb, minb, unr, vd><<<(M + rpb - 1)/rpb, dim3(32, nw), 0, st>>>(x, y, d, K, srx, scy, M);
}

#define V(nc, nw, rpb) Var{"ncols=" #nc " nwarps=" #nw " rpb=" #rpb, launch<nc, nw, rpb>, rpb}
#define VU(nc, nw, rpb, u) Var{"ncols=" #nc " nwarps=" #nw " rpb=" #rpb " unroll=" #u, launch<nc, nw, rpb, 1, u>, rpb}
#define VD(nc, nw, rpb, vd) Var{"ncols=" #nc " nwarps=" #nw " rpb=" #rpb " vd=" #vd, launch<nc, nw, rpb, 1, 1, vd>, rpb}
#define VB(nc, nw, rpb, mb) Var{"ncols=" #nc " nwarps=" #nw " rpb=" #rpb " minb=" #mb, launch<nc, nw, rpb, mb>, rpb}

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
        VD(1,2,4,3), V(1,2,4), VD(1,2,8,3), V(1,2,8), V(1,1,8), V(1,4,8), VD(1,2,8,2), V(4,2,4), V(4,2,8), VD(4,2,4,3),
    });
    run_shape(6144, 8*2048, 16, { VD(1,1,4,3), V(1,1,4), V(1,1,8), V(1,2,8), V(1,2,4) });
    return 0;
}
