// mk_deq_metal.metal: the Metal megakernel's weight decoding (megakernel/mk-deq32.h through ggml-metal/mk/mk-deq.h, the code
// kernel_mk_decode runs) in a plain kernel, for the decoding test (tests/test_megakernel_metal.py,
// driver mk_deq_metal_emu.cpp): thread t decodes the 32-value group t % ngrp of row t / ngrp into
// dst[row][32*group .. 32*group + 31].
#include <metal_stdlib>
using namespace metal;

#include "mk-plan.h"
#include "mk-deq.h"

struct mk_deq_test_args {
    int   type;     // enum ggml_type
    int   K;        // values per row
    int   n_rows;
    int   pad;
    ulong off;      // byte offset of row 0 in src
    ulong nb1;      // row stride in bytes
};

kernel void kernel_mk_deq_test(
        constant mk_deq_test_args & args [[buffer(0)]],
        device const uchar        * src  [[buffer(1)]],
        device       float        * dst  [[buffer(2)]],
        uint tpig [[thread_position_in_grid]]) {
    const int ngrp = (args.K + 31)/32;
    const int t    = (int) tpig;
    if (t < ngrp*args.n_rows) {
        const int r = t / ngrp;
        const int g = t % ngrp;
        float w[32];
        mk_deq32(src + args.off + (ulong) r*args.nb1, args.type, g, min(32, args.K - 32*g), w);
        for (int i = 0; i < 32; ++i) {
            dst[((ulong) r*ngrp + g)*32 + i] = w[i];
        }
    }
}
