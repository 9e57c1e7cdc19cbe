// cluster_probe.cu (stq-metal, session 30): can the megakernel's persistent grid (one 512-thread block per SM, most of
// the shared memory each) run as clusters of 2 or 4 blocks, every block co-resident, and what does a cluster barrier
// cost next to a block barrier? Prints, per cluster size: cudaOccupancyMaxActiveClusters, whether a launch with the
// cooperative and the cluster attributes together is accepted, whether every block of such a grid arrives at a grid
// barrier (bounded spin: a grid that is not co-resident reports "NOT RESIDENT" instead of hanging), that each block
// reads its partner's shared memory (map_shared_rank), and the cycles of 4096 cluster syncs vs 4096 __syncthreads.
// Build and run on the device: nvcc -std=c++17 -arch=sm_90 -o /tmp/cluster_probe cluster_probe.cu && /tmp/cluster_probe
#include <cooperative_groups.h>
#include <cstdio>
#include <cuda_runtime.h>

namespace cg = cooperative_groups;

#define THREADS 512

__global__ void probe(unsigned * bar, int * out, long long * cyc, int spin_max) {
    extern __shared__ float sm[];
    cg::cluster_group cl = cg::this_cluster();
    const unsigned r = cl.block_rank();
    const unsigned n = cl.num_blocks();
    if (threadIdx.x == 0) {
        sm[0] = (float) blockIdx.x;
    }
    cl.sync();
    const float * p = cl.map_shared_rank(sm, (r + 1) % n);
    int v = (int) p[0];
    cl.sync();   // (the partner keeps its shared memory until every block of the cluster has read it)
    // grid barrier with a bounded spin
    int ok = 1;
    if (threadIdx.x == 0) {
        atomicAdd(bar, 1u);
        int s = 0;
        while (atomicAdd(bar, 0u) < gridDim.x && s < spin_max) {
            ++s;
            __nanosleep(100);
        }
        ok = atomicAdd(bar, 0u) >= gridDim.x;
    }
    // cost of the barriers (block 0 only times, every block runs the loops)
    long long t0 = clock64();
    for (int i = 0; i < 4096; ++i) {
        cl.sync();
    }
    long long t1 = clock64();
    for (int i = 0; i < 4096; ++i) {
        __syncthreads();
    }
    long long t2 = clock64();
    if (threadIdx.x == 0) {
        out[2*blockIdx.x]     = v;
        out[2*blockIdx.x + 1] = ok;
        if (blockIdx.x == 0) {
            cyc[0] = t1 - t0;
            cyc[1] = t2 - t1;
        }
    }
}

int main() {
    int dev = 0, nsm = 0, optin = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    const size_t smem = (size_t) optin - 8*1024;   // most of it, as the megakernel takes
    cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem);
    printf("cluster_probe: %d SMs, %d B opt-in shared memory per block, probe takes %zu B, %d threads\n", nsm, optin, smem, THREADS);
    unsigned * bar; int * out; long long * cyc;
    cudaMalloc(&bar, 4);
    cudaMalloc(&out, 2*4*nsm);
    cudaMalloc(&cyc, 16);
    for (int c : {1, 2, 4}) {
        const int grid = nsm/c*c;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(grid);
        cfg.blockDim = dim3(THREADS);
        cfg.dynamicSmemBytes = smem;
        cudaLaunchAttribute at[2];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = c; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
        at[1].id = cudaLaunchAttributeCooperative;
        at[1].val.cooperative = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        int ncl = -1;
        cudaError_t e = cudaOccupancyMaxActiveClusters(&ncl, probe, &cfg);
        printf("cluster %d: grid %d, max active clusters %d (%s) = %d blocks co-resident\n", c, grid, ncl,
               cudaGetErrorString(e), ncl*c);
        for (int coop = 1; coop >= 0; --coop) {
            cfg.numAttrs = coop ? 2 : 1;
            cudaMemset(bar, 0, 4);
            cudaMemset(out, 0, 2*4*nsm);
            e = cudaLaunchKernelEx(&cfg, probe, bar, out, cyc, 2000000);
            cudaError_t e2 = cudaDeviceSynchronize();
            if (e != cudaSuccess || e2 != cudaSuccess) {
                printf("  cooperative %d: launch %s, sync %s\n", coop, cudaGetErrorString(e), cudaGetErrorString(e2));
                cudaGetLastError();
                continue;
            }
            int h[2*1024]; long long hc[2];
            cudaMemcpy(h, out, 2*4*grid, cudaMemcpyDeviceToHost);
            cudaMemcpy(hc, cyc, 16, cudaMemcpyDeviceToHost);
            int wrong = 0, late = 0;
            for (int b = 0; b < grid; ++b) {
                const int want = b/c*c + (b % c + 1) % c;
                wrong += h[2*b] != want;
                late  += h[2*b + 1] != 1;
            }
            printf("  cooperative %d: ok; partner reads wrong in %d blocks; %s (%d blocks missed the grid barrier); "
                   "4096 cluster syncs %lld cycles (%.1f each), 4096 __syncthreads %lld (%.1f each)\n", coop, wrong,
                   late ? "NOT RESIDENT" : "all co-resident", late, hc[0], hc[0]/4096.0, hc[1], hc[1]/4096.0);
        }
    }
    return 0;
}
