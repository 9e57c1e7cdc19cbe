// metal-emu persistent-kernel test driver: runs one kernel of persistent.metal on buffers that the
// test writes and reads as files (the expected values come from numpy, not from here).
// usage: persistent_driver residency <threads per threadgroup>
//        persistent_driver scan <kernel> <n_tg> <n_wait> <rounds> <ntg> <in.bin> <out.bin>
//        persistent_driver atomics <n_tg> <ntg> <in.bin> <out.bin>
//        persistent_driver plain_spin
// exit 0 = ran (out.bin written: dst then rev), 4 = the emulator reported an error, 2 = usage
#include "emu-runtime.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <sys/mman.h>

void emu_register_persistent_p0();
void emu_register_all_kernels(void) { emu_register_persistent_p0(); }

// page-aligned device memory registered with the emulator (as the emulated device's buffers are)
static uint32_t * device_alloc(size_t n, uint32_t fill) {
    const size_t bytes = (n*sizeof(uint32_t) + 4095) & ~(size_t) 4095;
    void * p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(3);
    }
    uint32_t * u = (uint32_t *) p;
    for (size_t i = 0; i < bytes/sizeof(uint32_t); ++i) u[i] = fill;
    emu_device_memory_register(p, bytes);
    return u;
}

static const emu_kernel_info * find(const char * name) {
    const emu_kernel_info * k = emu_find_kernel(name);
    if (!k) {
        fprintf(stderr, "kernel %s not found\n", name);
        exit(3);
    }
    return k;
}

int main(int argc, char ** argv) {
    const std::string c = argc > 1 ? argv[1] : "";
    if (c == "residency" && argc == 3) {
        const int ntg = atoi(argv[2]);
        printf("%d\n", emu_max_resident_threadgroups(ntg, (size_t) ntg*sizeof(uint32_t)));
        return 0;
    }
    if (c == "scan" && argc == 9) {
        const int n_tg = atoi(argv[3]), n_wait = atoi(argv[4]), rounds = atoi(argv[5]), ntg = atoi(argv[6]);
        const size_t n = (size_t) n_tg*ntg;
        FILE * fi = fopen(argv[7], "rb");
        if (!fi) {
            perror(argv[7]);
            return 3;
        }
        uint32_t * src  = device_alloc(n, 0);
        if (fread(src, sizeof(uint32_t), n, fi) != n) {
            fprintf(stderr, "%s: short read\n", argv[7]);
            return 3;
        }
        fclose(fi);
        // stale reads show up as this pattern
        uint32_t * dst  = device_alloc(n, 0xA5A5A5A5u);
        uint32_t * part = device_alloc((size_t) n_tg, 0xA5A5A5A5u);
        uint32_t * rev  = device_alloc(n, 0xA5A5A5A5u);
        uint32_t * bar  = device_alloc(2, 0);
        struct { uint32_t n_rounds, n_wait; } args = { (uint32_t) rounds, (uint32_t) n_wait };

        emu_dispatch d = {};
        d.kernel = find(argv[2]);
        void * bufs[] = { &args, src, dst, part, rev, bar };
        for (int i = 0; i < 6; ++i) d.bufs[i] = bufs[i];
        d.tgmem[0] = (size_t) ntg*sizeof(uint32_t);
        d.ntgpg[0] = n_tg; d.ntgpg[1] = 1; d.ntgpg[2] = 1;
        d.ntg[0] = ntg;    d.ntg[1] = 1;   d.ntg[2] = 1;
        if (!emu_run_dispatch(&d)) {
            fprintf(stderr, "dispatch of %s failed\n", argv[2]);
            return 4;
        }
        FILE * fo = fopen(argv[8], "wb");
        if (!fo || fwrite(dst, sizeof(uint32_t), n, fo) != n || fwrite(rev, sizeof(uint32_t), n, fo) != n || fclose(fo) != 0) {
            perror(argv[8]);
            return 3;
        }
        return 0;
    }
    if (c == "atomics" && argc == 6) {
        // atomics <n_tg> <ntg> <in.bin> <out.bin>: out = hist[16] (uint), fsum (float), imax (int), xor (uint)
        const int n_tg = atoi(argv[2]), ntg = atoi(argv[3]);
        const size_t n = (size_t) n_tg*ntg;
        uint32_t * src = device_alloc(n, 0);
        FILE * fi = fopen(argv[4], "rb");
        if (!fi || fread(src, sizeof(uint32_t), n, fi) != n) {
            fprintf(stderr, "%s: cannot read %zu values\n", argv[4], n);
            return 3;
        }
        fclose(fi);
        uint32_t * res = device_alloc(32, 0); // hist[0..15], fsum at 16, imax at 17, xor at 18
        emu_dispatch d = {};
        d.kernel = find("kernel_atomics");
        void * bufs[] = { src, res, res + 16, res + 17, res + 18 };
        for (int i = 0; i < 5; ++i) d.bufs[i] = bufs[i];
        d.ntgpg[0] = n_tg; d.ntgpg[1] = 1; d.ntgpg[2] = 1;
        d.ntg[0] = ntg;    d.ntg[1] = 1;   d.ntg[2] = 1;
        if (!emu_run_dispatch(&d)) {
            return 4;
        }
        FILE * fo = fopen(argv[5], "wb");
        if (!fo || fwrite(res, sizeof(uint32_t), 19, fo) != 19 || fclose(fo) != 0) {
            perror(argv[5]);
            return 3;
        }
        return 0;
    }
    if (c == "plain_spin" && argc == 2) {
        uint32_t * flag = device_alloc(1, 0);
        uint32_t * dst  = device_alloc(4, 0);
        emu_dispatch d = {};
        d.kernel = find("kernel_plain_spin");
        d.bufs[0] = flag;
        d.bufs[1] = dst;
        d.ntgpg[0] = 2; d.ntgpg[1] = 1; d.ntgpg[2] = 1;
        d.ntg[0] = 32;  d.ntg[1] = 1;   d.ntg[2] = 1;
        return emu_run_dispatch(&d) ? 0 : 4;
    }
    fprintf(stderr, "usage: %s residency NTG | scan KERNEL N_TG N_WAIT ROUNDS NTG IN OUT | atomics N_TG NTG IN OUT | plain_spin\n", argv[0]);
    return 2;
}
