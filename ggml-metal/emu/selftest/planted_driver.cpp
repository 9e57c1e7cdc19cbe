// metal-emu self-test driver: runs one kernel of planted.metal and checks its output.
// usage: planted_driver <case>   exit 0 = output correct, 1 = wrong output, other = crash/report
#include "emu-runtime.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

void emu_register_planted_p0();
void emu_register_all_kernels(void) { emu_register_planted_p0(); }

static bool run(const char * name, std::vector<void *> bufs, int ntgpg, int ntg, size_t tgmem = 0) {
    const emu_kernel_info * k = emu_find_kernel(name);
    if (!k) {
        fprintf(stderr, "kernel %s not found\n", name);
        exit(3);
    }
    emu_dispatch d = {};
    d.kernel = k;
    for (size_t i = 0; i < bufs.size(); ++i) d.bufs[i] = bufs[i];
    d.tgmem[0] = tgmem;
    d.ntgpg[0] = ntgpg; d.ntgpg[1] = 1; d.ntgpg[2] = 1;
    d.ntg[0] = ntg; d.ntg[1] = 1; d.ntg[2] = 1;
    return emu_run_dispatch(&d);
}

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s copy_ok|copy_oob|block_u16|block_u32|rotate_ok|rotate_nobarrier|rowsum\n", argv[0]);
        return 2;
    }
    const std::string c = argv[1];
    srand(1234);
    if (c == "copy_ok" || c == "copy_oob") {
        const int n = 64;
        float * src = (float *) malloc(n*sizeof(float)); // exact size: ASan sees src[n]
        std::vector<float> dst(n);
        for (int i = 0; i < n; ++i) src[i] = (float) i;
        run(("kernel_" + c).c_str(), { src, dst.data() }, 2, 32);
        int bad = 0;
        for (int i = 0; i < n; ++i) bad += dst[i] != src[i];
        free(src);
        printf("%s: %d wrong\n", c.c_str(), bad);
        return bad ? 1 : 0;
    }
    if (c == "block_u16" || c == "block_u32") {
        const int n = 16;
        std::vector<uint8_t> buf(42*n + 64);
        uint8_t * src = buf.data() + (16 - ((uintptr_t) buf.data() % 16)) % 16; // 16-byte aligned base
        for (int i = 0; i < 42*n; ++i) src[i] = (uint8_t) (rand() & 0xff);
        std::vector<uint32_t> dst(n);
        run(("kernel_" + c).c_str(), { src, dst.data() }, 1, n);
        int bad = 0;
        for (int i = 0; i < n; ++i) {
            uint32_t ref;
            memcpy(&ref, src + 42*i + 38, 4);
            bad += dst[i] != ref;
        }
        printf("%s: %d wrong\n", c.c_str(), bad);
        return bad ? 1 : 0;
    }
    if (c == "rotate_ok" || c == "rotate_nobarrier") {
        const int ntg = 64, ng = 3;
        std::vector<float> src(ntg*ng), dst(ntg*ng);
        for (auto & v : src) v = (float) (rand() % 1000);
        run(("kernel_" + c).c_str(), { src.data(), dst.data() }, ng, ntg, ntg*sizeof(float));
        int bad = 0;
        for (int g = 0; g < ng; ++g) for (int i = 0; i < ntg; ++i) bad += !(dst[g*ntg + i] == src[g*ntg + (i + 1) % ntg]);
        printf("%s: %d wrong\n", c.c_str(), bad);
        return bad ? 1 : 0;
    }
    if (c == "rowsum") {
        const int ng = 5;
        std::vector<float> src(128*ng), dst(ng);
        for (auto & v : src) v = (float) (rand() % 100);
        run("kernel_rowsum", { src.data(), dst.data() }, ng, 128);
        int bad = 0;
        for (int g = 0; g < ng; ++g) {
            double s = 0;
            for (int i = 0; i < 128; ++i) s += src[g*128 + i];
            bad += std::fabs(dst[g] - s) > 1e-3;
        }
        printf("%s: %d wrong\n", c.c_str(), bad);
        return bad ? 1 : 0;
    }
    fprintf(stderr, "unknown case %s\n", c.c_str());
    return 2;
}
