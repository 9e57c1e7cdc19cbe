// floor.cu: the latency floor of the megakernel's design (one grid barrier between dependent phases) on this GPU.
//
// A persistent grid shaped like the megakernel's (one block of MK_THREADS per SM) runs a decode step's phases with the
// megakernel's own grid barrier (mk_grid_arrive_wait) and block sums (mk_block_sums), but none of its arithmetic:
//   mode 0  barriers only
//   mode 1  + the staging's dependency: every block loads the K-float vector the previous phase wrote (through L2) and
//           reduces its sum of squares over the block, then writes its slice of the next vector
//   mode 2  + each phase streams its weight bytes once (16-byte loads spread over every warp, UNROLL in flight per
//           thread), no staging
//   mode 3  both: the floor of a step with this phase list
// The phase list (bytes per phase, in the kernel body's order) comes from a file (bench/megakernel-floor/phases.py makes
// it from a GGUF); a last run streams every byte in one phase (the bandwidth reference). Prints the median time of a
// step over --reps launches, per phase, and the tokens per second it allows.
//
//   nvcc -std=c++17 -O3 -arch=sm_90 -I$SRC/ggml/src -I$SRC/ggml/include -Imegakernel -Imegakernel/cuda \
//        bench/megakernel-floor/floor.cu -o floor && ./floor --phases phases.txt [--reps 20] [--k 2560]
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "mk-device.cuh"
#include "mk-kernel.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#ifndef FLOOR_UNROLL
#define FLOOR_UNROLL 8
#endif

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "floor: %s failed: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)

__global__ void __launch_bounds__(MK_THREADS) floor_kernel(const uint4 * w, const long long * units, int n_phases,
                                                          float * vec, int K, int mode, unsigned * bar,
                                                          unsigned long long * sink) {
    __shared__ float red[MK_WARPS*MK_M];
    const int lane = threadIdx.x % WARP_SIZE;
    // warps SM-first, as the megakernel deals its units
    const long long gw = (long long) (threadIdx.x / WARP_SIZE)*gridDim.x + blockIdx.x;
    const long long nt = (long long) gridDim.x*MK_THREADS;   // threads in the grid
    long long off = 0;
    unsigned acc = 0;
    for (int p = 0; p < n_phases; ++p) {
        const float * in  = vec + (size_t) (p % 2)*K;
        float       * out = vec + (size_t) ((p + 1) % 2)*K;
        float ss[1] = { 0.0f };
        if (mode & 1) {
            for (int i = threadIdx.x; i < K/4; i += MK_THREADS) {
                const float4 v = mk_ldcg4((const float4 *) in + i);
                ss[0] += v.x*v.x + v.y*v.y + v.z*v.z + v.w*v.w;
            }
            mk_block_sums<1>(ss, 1, red);
        }
        if (mode & 2) {
            const long long n = units[p];
            const uint4 * base = w + off;
            for (long long u0 = gw*WARP_SIZE + lane; u0 < n; u0 += nt*FLOOR_UNROLL) {
                uint4 v[FLOOR_UNROLL];
#pragma unroll
                for (int k = 0; k < FLOOR_UNROLL; ++k) {
                    const long long u = u0 + k*nt;
                    v[k] = u < n ? mk_ldcg_u32x4(base + u) : make_uint4(0, 0, 0, 0);
                }
#pragma unroll
                for (int k = 0; k < FLOOR_UNROLL; ++k) {
                    acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
                }
            }
            off += n;
        }
        // the block's slice of the next phase's vector
        const int per = (K + gridDim.x - 1)/gridDim.x;
        for (int i = blockIdx.x*per + threadIdx.x; i < min(K, (blockIdx.x + 1)*per); i += MK_THREADS) {
            out[i] = ss[0]*1e-30f + (float) (acc & 1) + 1.0f;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            mk_grid_arrive_wait(bar, nullptr, 0, 0);
        }
        __syncthreads();
    }
    if (acc == 0x12345678u) {
        sink[0] = acc;   // (keeps the loads)
    }
}

int main(int argc, char ** argv) {
    std::string phases_path;
    int reps = 20, K = 2560;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&]() { if (i + 1 >= argc) { fprintf(stderr, "floor: missing value for %s\n", a.c_str()); exit(2); } return std::string(argv[++i]); };
        if (a == "--phases") phases_path = next();
        else if (a == "--reps") reps = std::stoi(next());
        else if (a == "--k") K = std::stoi(next());
        else { fprintf(stderr, "usage: %s --phases FILE [--reps R] [--k K]\n  FILE: one phase per line, \"BYTES NAME\"\n", argv[0]); return 2; }
    }
    std::ifstream f(phases_path);
    if (!f) {
        fprintf(stderr, "floor: cannot read the phase list %s\n", phases_path.c_str());
        return 2;
    }
    std::vector<long long> units;
    std::string line;
    long long total = 0;
    while (std::getline(f, line)) {
        std::istringstream ls(line);
        long long b;
        if (ls >> b) {
            units.push_back((b + 15)/16);
            total += units.back();
        }
    }
    const int np = (int) units.size();
    if (np == 0) {
        fprintf(stderr, "floor: no phases in %s\n", phases_path.c_str());
        return 2;
    }
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, floor_kernel, MK_THREADS, 0));
    if (per_sm < 1) {
        fprintf(stderr, "floor: the kernel does not fit on an SM\n");
        return 1;
    }
    uint4 * w = nullptr; long long * d_units = nullptr; float * vec = nullptr; unsigned * bar = nullptr;
    unsigned long long * sink = nullptr; long long * d_one = nullptr;
    CK(cudaMalloc(&w, (size_t) total*16));
    CK(cudaMemset(w, 1, (size_t) total*16));
    CK(cudaMalloc(&d_units, np*sizeof(long long)));
    CK(cudaMemcpy(d_units, units.data(), np*sizeof(long long), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&d_one, sizeof(long long)));
    CK(cudaMemcpy(d_one, &total, sizeof(long long), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&vec, 2*K*sizeof(float)));
    CK(cudaMemset(vec, 0, 2*K*sizeof(float)));
    CK(cudaMalloc(&bar, sizeof(unsigned)));
    CK(cudaMalloc(&sink, sizeof(unsigned long long)));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("floor: %d SMs, one block of %d threads each, %d phases, %.3f GB of weights per step, K %d, %d loads in flight per thread\n",
           sms, MK_THREADS, np, total*16/1e9, K, FLOOR_UNROLL);
    auto run = [&](const long long * u, int n, int mode) {
        std::vector<float> t;
        for (int r = 0; r < reps + 2; ++r) {
            CK(cudaMemset(bar, 0, sizeof(unsigned)));
            void * args[] = { &w, (void *) &u, &n, &vec, &K, &mode, &bar, &sink };
            CK(cudaEventRecord(e0));
            CK(cudaLaunchCooperativeKernel((void *) floor_kernel, dim3(sms), dim3(MK_THREADS), args, 0, nullptr));
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (r >= 2) {
                t.push_back(ms*1000.0f);
            }
        }
        std::sort(t.begin(), t.end());
        return t[t.size()/2];
    };
    const char * what[4] = { "barriers only", "barriers + staging dependency", "barriers + weights", "barriers + staging + weights" };
    for (int mode = 0; mode < 4; ++mode) {
        const float us = run(d_units, np, mode);
        printf("mode %d (%s): %.1f us per step, %.2f us per phase, %.0f tok/s", mode, what[mode], us, us/np, 1e6/us);
        if (mode & 2) {
            printf(", %.0f GB/s", total*16/(us*1e3));
        }
        printf("\n");
    }
    const float one = run(d_one, 1, 2);
    printf("one phase, every byte: %.1f us, %.0f GB/s (the streaming loop's bandwidth)\n", one, total*16/(one*1e3));
    return 0;
}
