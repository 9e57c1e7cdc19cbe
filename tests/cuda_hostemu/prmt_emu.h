// PTX prmt.b32 and CUDA's __byte_perm on the host, for the STQ1_0 decode emulations (stq1_0_vecdot_emu.cpp,
// stq1_0_mmv_emu.cpp, stq1_0_mmq_emu.cpp; CI has no GPU).
#pragma once

#include <cstdint>

// PTX prmt.b32 without a mode: selector nibble n picks byte n & 7 of {b, a}; bit 3 replicates that byte's top bit
static uint32_t emu_prmt(uint32_t a, uint32_t b, uint32_t c) {
    const uint64_t in = ((uint64_t) b << 32) | a;
    uint32_t r = 0;
    for (int n = 0; n < 4; ++n) {
        const int sel = (c >> (4*n)) & 0xF;
        uint8_t byte = (in >> (8*(sel & 7))) & 0xFF;
        if (sel & 8) {
            byte = (byte & 0x80) ? 0xFF : 0x00;
        }
        r |= (uint32_t) byte << (8*n);
    }
    return r;
}

// CUDA's __byte_perm uses the low 3 bits of each selector nibble
static uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) { return emu_prmt(x, y, s & 0x7777); }
