// emu-fiber.h - the fibers' context switch, for every emulator that runs GPU threads as fibers on a CPU
// thread: metal-emu's runtime (emu-runtime.cpp) and the tests' CUDA host emulations
// (tests/mk_hostemu/cuda_emu.h, tests/cuda_hostemu/emu_fibers.h).
//
// A switch saves the callee-saved registers and the SSE/x87 control words on the current stack and
// moves to another stack: no system call (swapcontext saves and restores the signal mask with one,
// twice per switch, which made the emulations spend ~40 % of their time in the kernel).
//
//   void * sp = emu_fiber_stack(top, fn, arg);   // a fiber whose first switch runs fn(arg) on the stack below top
//   emu_ctx_switch(&from_sp, to_sp);             // saves the current context in from_sp, resumes to_sp
//
// fn must never return: when the fiber is done it switches away for the last time.
// The symbols are local to each translation unit that includes this header.
#pragma once

#include <cstddef>
#include <cstdint>

#if !defined(__x86_64__)
#error "emu-fiber.h: the fiber context switch is implemented for x86-64 only"
#endif

// void emu_ctx_switch(void ** save_sp, void * new_sp): saves callee-saved registers on the current
// stack, stores rsp in *save_sp, loads new_sp and restores the registers saved there.
extern "C" void emu_ctx_switch(void ** save_sp, void * new_sp);
extern "C" void emu_ctx_trampoline(void);

asm(R"(
    .text
    .type emu_ctx_switch, @function
emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_ctx_switch, .-emu_ctx_switch

    .type emu_ctx_trampoline, @function
emu_ctx_trampoline:
    movq %rbx, %rdi
    callq *%r12
    ud2
    .size emu_ctx_trampoline, .-emu_ctx_trampoline
)");

// the saved context of a fiber that has not run yet: its first switch returns into the trampoline, which
// calls fn(arg) with rsp 16-byte aligned before the call (the ABI's rule)
static inline void * emu_fiber_stack(void * top, void (*fn)(void *), void * arg) {
    uint64_t * sp = (uint64_t *) ((uintptr_t) top & ~(uintptr_t) 15);
    // layout popped by emu_ctx_switch: [mxcsr|fpucw] r15 r14 r13 r12 rbx rbp ret
    // after 'ret' into the trampoline rsp == top (16-byte aligned), so the callee sees rsp % 16 == 8
    *--sp = (uint64_t) &emu_ctx_trampoline;  // ret
    *--sp = 0;                               // rbp
    *--sp = (uint64_t) arg;                  // rbx -> rdi
    *--sp = (uint64_t) fn;                   // r12 -> call target
    *--sp = 0;                               // r13
    *--sp = 0;                               // r14
    *--sp = 0;                               // r15
    uint32_t csr[2];
    __asm__ volatile("stmxcsr %0" : "=m"(csr[0]));
    __asm__ volatile("fnstcw %0" : "=m"(csr[1]));
    *--sp = (uint64_t) csr[0] | ((uint64_t) (csr[1] & 0xffff) << 32);
    return sp;
}
