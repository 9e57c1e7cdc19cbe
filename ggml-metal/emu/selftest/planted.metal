// Kernels for the metal-emu self-test: each comes as a correct version and a version with a
// planted bug that the emulator must catch.
#include <metal_stdlib>
using namespace metal;

// 1. out-of-bounds read: the buggy version reads one element past the end of src (ASan mode)
kernel void kernel_copy_ok(
        device const float * src,
        device       float * dst,
        uint tpig[[thread_position_in_grid]]) {
    dst[tpig] = src[tpig];
}

kernel void kernel_copy_oob(
        device const float * src,
        device       float * dst,
        uint tpig[[thread_position_in_grid]]) {
    dst[tpig] = src[tpig + 1];
}

// 2. uint32 loads from 42-byte blocks (the STQ1_0 block size): field at byte 40 is 2-mod-4
//    aligned in odd blocks; the correct version loads it as two uint16
kernel void kernel_block_u16(
        device const char * src,
        device       uint * dst,
        uint tpig[[thread_position_in_grid]]) {
    device const ushort * p = (device const ushort *) (src + 42*tpig + 38);
    dst[tpig] = uint(p[0]) | (uint(p[1]) << 16);
}

kernel void kernel_block_u32(
        device const char * src,
        device       uint * dst,
        uint tpig[[thread_position_in_grid]]) {
    device const uint32_t * p = (device const uint32_t *) (src + 42*tpig + 38);
    dst[tpig] = p[0];
}

// 3. threadgroup memory exchange: the buggy version misses the barrier between write and read
kernel void kernel_rotate_ok(
        device const float * src,
        device       float * dst,
        threadgroup  float * shmem [[threadgroup(0)]],
        ushort tiitg[[thread_index_in_threadgroup]],
        ushort ntg[[threads_per_threadgroup]],
        uint   tgpig[[threadgroup_position_in_grid]]) {
    shmem[tiitg] = src[tgpig*ntg + tiitg];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    dst[tgpig*ntg + tiitg] = shmem[(tiitg + 1) % ntg];
}

kernel void kernel_rotate_nobarrier(
        device const float * src,
        device       float * dst,
        threadgroup  float * shmem [[threadgroup(0)]],
        ushort tiitg[[thread_index_in_threadgroup]],
        ushort ntg[[threads_per_threadgroup]],
        uint   tgpig[[threadgroup_position_in_grid]]) {
    shmem[tiitg] = src[tgpig*ntg + tiitg];
    dst[tgpig*ntg + tiitg] = shmem[(tiitg + 1) % ntg];
}

// 4. SIMD-group reduction and kernel-declared threadgroup array (sanity of the runtime)
kernel void kernel_rowsum(
        device const float * src,
        device       float * dst,
        ushort tiitg[[thread_index_in_threadgroup]],
        ushort tiisg[[thread_index_in_simdgroup]],
        ushort sgitg[[simdgroup_index_in_threadgroup]],
        uint   tgpig[[threadgroup_position_in_grid]]) {
    threadgroup float partial[4];
    const float s = simd_sum(src[tgpig*128 + tiitg]);
    if (tiisg == 0) {
        partial[sgitg] = s;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tiitg == 0) {
        dst[tgpig] = partial[0] + partial[1] + partial[2] + partial[3];
    }
}
