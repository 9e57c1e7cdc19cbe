// emu-runtime.cpp - runs translated Metal kernels on the CPU with GPU semantics
//
// - every GPU thread of a threadgroup is a fiber with its own stack (hand-written x86-64 context
//   switch below, not swapcontext); SIMD-group operations and threadgroup barriers are the only
//   places where a fiber yields, so a threadgroup behaves like lock-stepped SIMD groups at every
//   synchronisation point
// - threadgroups of a dispatch are spread over a pool of worker threads, except for kernels that
//   synchronise threadgroups through device memory (persistent kernels): their threadgroups are
//   co-resident fibers of one thread, up to the emulated GPU's residency limit, with device atomics
//   and fences as scheduling points, per-threadgroup store buffers and deadlock detection
//   (PERSISTENT.md)
// - threadgroup memory is filled with a poison pattern before every threadgroup
// - env GGML_METAL_EMU_THREADS (workers), GGML_METAL_EMU_ORDER=fwd|rev|shuffle (lane resume order)
// - lockstep points around lane-dependent branches (emu_simd_lockstep; GGML_METAL_EMU_LOCKSTEP=0 off)

#include "emu-runtime.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#endif

#ifdef EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

// ---- context switch: emu-fiber.h (shared with the tests' CUDA host emulations) -----------------
#include "emu-fiber.h"

// ---- registry -----------------------------------------------------------------------------------
namespace {

struct fc_slot { int idx; void * ptr; size_t size; };

std::vector<emu_kernel_info> & kernels() { static std::vector<emu_kernel_info> v; return v; }
std::map<std::string, int>   & kernel_index() { static std::map<std::string, int> m; return m; }
std::vector<fc_slot>         & fc_slots() { static std::vector<fc_slot> v; return v; }

}

void emu_register_kernel(const char * name, emu_kernel_fn fn, const char * file, bool coresident) {
    auto & idx = kernel_index();
    if (idx.count(name)) {
        // kernels defined in shared sources (fa_common.metal, ...) are seen by several files
        return;
    }
    idx[name] = (int) kernels().size();
    kernels().push_back({ name, fn, file, coresident });
}

void emu_register_fc(int idx, void * ptr, size_t size) {
    fc_slots().push_back({ idx, ptr, size });
}

const emu_kernel_info * emu_find_kernel(const char * name) {
    static std::once_flag once;
    std::call_once(once, [] { emu_register_all_kernels(); });
    auto it = kernel_index().find(name);
    return it == kernel_index().end() ? nullptr : &kernels()[it->second];
}

bool emu_have_file(const char * file) {
    (void) emu_find_kernel("");
    for (const emu_kernel_info & k : kernels()) {
        if (strcmp(k.file, file) == 0) return true;
    }
    return false;
}

int emu_n_kernels(void) {
    return (int) kernels().size();
}

// ---- fibers -------------------------------------------------------------------------------------
namespace {

constexpr size_t STACK_SIZE = 256*1024;
constexpr size_t GUARD_SIZE = 4096;
constexpr int    MAX_THREADS = 1024;
constexpr uint8_t POISON = 0xFF; // NaN for f32/f16/bf16, -1 for integers

struct sg_state {
    int      active;
    int      arrived;
    uint64_t gen;
    uint32_t mask;         // lanes whose deposits the current SIMD operation reads
    uint32_t exited;       // lanes that exited since the last release (leave 'mask' at the next one)
    uint64_t coll_done;
    int      ls_arrived;   // lanes waiting at a lockstep point (emu_simd_lockstep)
    uint64_t ls_gen;
    alignas(64) uint8_t slots[2][32*EMU_SIMD_SLOT_BYTES];
    alignas(64) float coll_result[64];
};

struct fiber {
    void *   sp;
    uint8_t * stack_lo;
    int      tid;
    int      lane;
    int      sg;
    uint32_t tpitg[3];
    bool     done;
    bool     waiting;
    int      parity;
    uint64_t coll_n;
    // persistent dispatches: a fiber is 'stalled' when it is about to repeat an atomic operation on
    // the address it last observed, and nothing in device memory changed since it looked
    bool         stalled;
    bool         soft;       // yielded at a fence right after such an observation
    const void * last_addr;
    uint64_t     last_epoch;
};

// one page of device memory written by a threadgroup of a persistent dispatch (PERSISTENT.md):
// twin = the published content the threadgroup's stores apply to, mine = its view while it is not
// running
struct dirty_page {
    uint8_t * page;
    uint8_t * twin;
    uint8_t * mine;
};

struct store_buffer {
    std::vector<dirty_page> pages;
    std::unordered_map<uintptr_t, size_t> index;
};

struct worker;

struct tg_key { const void * key; void * ptr; };

struct worker {
    void *   sched_sp = nullptr;
    uint8_t * stacks = nullptr;
    size_t   stacks_size = 0;
    fiber    fibers[MAX_THREADS];
    sg_state sgs[MAX_THREADS/32];
    int      n_threads = 0;
    int      n_sg = 0;
    int      tg_active = 0;
    int      tg_arrived = 0;
    uint64_t tg_gen = 0;
    uint64_t progress = 0;
    fiber *  cur = nullptr;
    uint32_t tgpig[3];

    std::vector<uint8_t> tgmem;
    size_t   tgmem_off[EMU_MAX_TGMEM];
    size_t   arena_off = 0;
    size_t   arena_end = 0;
    std::vector<tg_key> keys;

    const emu_dispatch * disp = nullptr;
    bool     error = false;
    store_buffer sb;        // persistent dispatches: plain device stores not yet published
    int64_t  tg_linear = -1;
    uint64_t acq_seq = 0;   // persistent dispatches: publications this threadgroup has acquired
    uint64_t rng = 0x9E3779B97F4A7C15ull;

#ifdef EMU_ASAN
    void *   asan_fake = nullptr;
    const void * asan_main_bottom = nullptr;
    size_t   asan_main_size = 0;
#endif
};

thread_local worker * W = nullptr;

int g_order = -1; // 0 fwd, 1 rev, 2 shuffle

int lane_order() {
    if (g_order < 0) {
        const char * s = getenv("GGML_METAL_EMU_ORDER");
        g_order = 0;
        if (s && strcmp(s, "rev") == 0) g_order = 1;
        if (s && strcmp(s, "shuffle") == 0) g_order = 2;
    }
    return g_order;
}

void switch_to_fiber(worker * w, fiber * f) {
    w->cur = f;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(&w->asan_fake, f->stack_lo, STACK_SIZE);
#endif
    emu_ctx_switch(&w->sched_sp, f->sp);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(w->asan_fake, nullptr, nullptr);
#endif
    w->cur = nullptr;
}

void yield_to_sched(worker * w) {
    fiber * f = w->cur;
#ifdef EMU_ASAN
    void * fake = nullptr;
    __sanitizer_start_switch_fiber(f->done ? nullptr : &fake, w->asan_main_bottom, w->asan_main_size);
#endif
    emu_ctx_switch(&f->sp, w->sched_sp);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, &w->asan_main_bottom, &w->asan_main_size);
#endif
}

void sg_release(sg_state & s, worker * w) {
    s.mask &= ~s.exited;
    s.exited = 0;
    s.arrived = 0;
    s.gen++;
    w->progress++;
}

void ls_release(sg_state & s, worker * w) {
    s.ls_arrived = 0;
    s.ls_gen++;
    w->progress++;
}

void tg_release(worker * w) {
    w->tg_arrived = 0;
    w->tg_gen++;
    w->progress++;
}

void fiber_exit(worker * w, fiber * f) {
    f->done = true;
    sg_state & s = w->sgs[f->sg];
    s.active--;
    s.exited |= 1u << f->lane; // lanes still reading the last operation need this lane's deposit
    if (s.arrived > 0 && s.arrived >= s.active) sg_release(s, w);
    if (s.ls_arrived > 0 && s.ls_arrived >= s.active) ls_release(s, w);
    w->tg_active--;
    if (w->tg_arrived > 0 && w->tg_arrived >= w->tg_active) tg_release(w);
    w->progress++;
}

[[noreturn]] void emu_fiber_main(fiber * f) {
    worker * w = W;
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &w->asan_main_bottom, &w->asan_main_size);
#endif
    w->disp->kernel->fn();
    fiber_exit(w, f);
    yield_to_sched(w);
    __builtin_trap();
}

void fiber_init(worker * w, fiber * f, int i) {
    uint8_t * lo = w->stacks + (size_t) i*(STACK_SIZE + GUARD_SIZE) + GUARD_SIZE;
    f->stack_lo = lo;
    f->sp = emu_fiber_stack(lo + STACK_SIZE, [](void * p) { emu_fiber_main((fiber *) p); }, f);
}

[[noreturn]] void emu_fatal(const char * msg) {
    worker * w = W;
    if (w && w->disp) {
        fprintf(stderr, "metal-emu: %s (kernel %s, file %s, threadgroup (%u,%u,%u), thread %d)\n", msg,
                w->disp->kernel->name, w->disp->kernel->file, w->tgpig[0], w->tgpig[1], w->tgpig[2], w->cur ? w->cur->tid : -1);
    } else {
        fprintf(stderr, "metal-emu: %s\n", msg);
    }
    fflush(stderr);
    abort();
}

void ensure_stacks(worker * w, int n) {
    const size_t need = (size_t) n*(STACK_SIZE + GUARD_SIZE);
    if (w->stacks_size >= need) return;
    if (w->stacks) munmap(w->stacks, w->stacks_size);
    void * p = mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) emu_fatal("cannot allocate fiber stacks");
    w->stacks = (uint8_t *) p;
    w->stacks_size = need;
    for (int i = 0; i < n; ++i) {
        mprotect(w->stacks + (size_t) i*(STACK_SIZE + GUARD_SIZE), GUARD_SIZE, PROT_NONE);
    }
}

uint64_t rnd(worker * w) {
    w->rng ^= w->rng << 13; w->rng ^= w->rng >> 7; w->rng ^= w->rng << 17;
    return w->rng;
}

void tg_begin(worker * w, const emu_dispatch * d, uint32_t x, uint32_t y, uint32_t z) {
    const int nt = d->ntg[0]*d->ntg[1]*d->ntg[2];
    w->tgpig[0] = x; w->tgpig[1] = y; w->tgpig[2] = z;
    w->n_threads = nt;
    w->n_sg = (nt + 31)/32;
    w->tg_active = nt;
    w->tg_arrived = 0;
    for (int s = 0; s < w->n_sg; ++s) {
        sg_state & sg = w->sgs[s];
        sg.active = std::min(32, nt - 32*s);
        sg.arrived = 0;
        sg.mask = sg.active == 32 ? 0xffffffffu : ((1u << sg.active) - 1);
        sg.exited = 0;
        sg.coll_done = 0;
        sg.ls_arrived = 0;
        memset(sg.slots, POISON, sizeof(sg.slots));
    }
    // poison threadgroup memory (dispatch-declared and kernel-declared)
    memset(w->tgmem.data(), POISON, w->tgmem.size());
    w->arena_off = w->tgmem_off[EMU_MAX_TGMEM - 1];
    w->keys.clear();

    for (int i = 0; i < nt; ++i) {
        fiber & f = w->fibers[i];
        f.tid = i;
        f.lane = i % 32;
        f.sg = i / 32;
        f.tpitg[0] = i % d->ntg[0];
        f.tpitg[1] = (i / d->ntg[0]) % d->ntg[1];
        f.tpitg[2] = i / (d->ntg[0]*d->ntg[1]);
        f.done = false;
        f.waiting = false;
        f.parity = 0;
        f.coll_n = 0;
        f.stalled = false;
        f.soft = false;
        f.last_addr = nullptr;
        f.last_epoch = 0;
        fiber_init(w, &f, i);
    }
}

struct pass_result {
    int  live;        // threads of the threadgroup that have not exited
    bool progressed;  // a thread exited, a barrier/SIMD operation completed or a thread did new work
    bool blocked;     // every live thread waits at a barrier/SIMD operation or is a stalled spinner
    bool stalled;     // ... and at least one of them is a stalled spinner (persistent dispatches)
    bool soft;        // a thread yielded at a fence right after an observation that saw no news: no
                      // progress yet, but its next pass may make some
};

// runs every live thread of the threadgroup once, up to its next scheduling point
pass_result tg_pass(worker * w) {
    const int nt = w->n_threads;
    int order[MAX_THREADS];
    for (int i = 0; i < nt; ++i) order[i] = lane_order() == 1 ? nt - 1 - i : i;
    if (lane_order() == 2) {
        for (int i = nt - 1; i > 0; --i) std::swap(order[i], order[rnd(w) % (i + 1)]);
    }
    const uint64_t p0 = w->progress;
    pass_result r = { 0, false, true, false, false };
    for (int k = 0; k < nt; ++k) {
        fiber & f = w->fibers[order[k]];
        if (f.done) continue;
        switch_to_fiber(w, &f);
        if (f.done) {
            r.progressed = true;
            continue;
        }
        r.live++;
        if (f.waiting) continue;
        if (f.stalled || f.soft) {
            r.stalled = true;
            r.soft = r.soft || f.soft;
        } else {
            r.blocked = false;
            r.progressed = true;
        }
    }
    if (w->progress != p0) r.progressed = true;
    return r;
}

// every live thread waits at a barrier or SIMD-group operation and nothing moved: lockstep points are
// best effort, lanes waiting at one while the others wait at a barrier or SIMD-group operation
// (divergent code) are let go; otherwise the threadgroup is deadlocked
bool tg_release_lockstep(worker * w) {
    bool freed = false;
    for (int s = 0; s < w->n_sg; ++s) {
        if (w->sgs[s].ls_arrived > 0) {
            ls_release(w->sgs[s], w);
            freed = true;
        }
    }
    return freed;
}

void tg_unblock_or_die(worker * w) {
    if (!tg_release_lockstep(w)) {
        emu_fatal("deadlock: every live thread waits at a barrier or SIMD-group operation that the others never reach");
    }
}

void run_threadgroup(worker * w, const emu_dispatch * d, uint32_t x, uint32_t y, uint32_t z) {
    tg_begin(w, d, x, y, z);
    for (;;) {
        const pass_result r = tg_pass(w);
        if (r.live == 0) break;
        if (r.blocked && !r.progressed) tg_unblock_or_die(w);
    }
}

void prepare(worker * w, const emu_dispatch * d) {
    w->disp = d;
    size_t off = 0;
    for (int i = 0; i < EMU_MAX_TGMEM - 1; ++i) {
        w->tgmem_off[i] = off;
        off += (d->tgmem[i] + 15) & ~(size_t) 15;
    }
    w->tgmem_off[EMU_MAX_TGMEM - 1] = off;
    const size_t arena = 64*1024; // kernel-declared threadgroup arrays
    w->arena_end = off + arena;
    if (w->tgmem.size() != w->arena_end) w->tgmem.assign(w->arena_end, 0);
    ensure_stacks(w, d->ntg[0]*d->ntg[1]*d->ntg[2]);
}

// ---- thread pool -----------------------------------------------------------------------------
struct pool {
    std::vector<std::thread> threads;
    std::vector<worker *>    workers;
    std::mutex               mtx;
    std::condition_variable  cv_start;
    std::condition_variable  cv_done;
    const emu_dispatch *     disp = nullptr;
    uint64_t                 epoch = 0;
    int                      n_busy = 0;
    std::atomic<int64_t>     next{0};
    int64_t                  n_total = 0;
    std::atomic<bool>        error{false};
    bool                     quit = false;

    void work(worker * w) {
        const emu_dispatch * d = disp;
        prepare(w, d);
        W = w;
        const int64_t gx = d->ntgpg[0], gy = d->ntgpg[1];
        for (;;) {
            const int64_t i = next.fetch_add(1);
            if (i >= n_total) break;
            run_threadgroup(w, d, (uint32_t) (i % gx), (uint32_t) ((i / gx) % gy), (uint32_t) (i / (gx*gy)));
        }
        W = nullptr;
        w->disp = nullptr;
    }

    void loop(worker * w) {
        uint64_t seen = 0;
        for (;;) {
            {
                std::unique_lock<std::mutex> lk(mtx);
                cv_start.wait(lk, [&] { return quit || epoch != seen; });
                if (quit) return;
                seen = epoch;
            }
            work(w);
            {
                std::lock_guard<std::mutex> lk(mtx);
                if (--n_busy == 0) cv_done.notify_all();
            }
        }
    }

    void init() {
        int n = (int) std::thread::hardware_concurrency();
        if (const char * s = getenv("GGML_METAL_EMU_THREADS")) n = atoi(s);
        n = std::max(1, std::min(n, 64));
        workers.push_back(new worker()); // the calling thread
        for (int i = 1; i < n; ++i) {
            worker * w = new worker();
            workers.push_back(w);
            threads.emplace_back([this, w] { loop(w); });
        }
    }

    bool run(const emu_dispatch * d) {
        n_total = (int64_t) d->ntgpg[0]*d->ntgpg[1]*d->ntgpg[2];
        if (n_total <= 0) return true;
        next = 0;
        disp = d;
        const int n_helpers = (int) std::min<int64_t>((int64_t) threads.size(), n_total - 1);
        if (n_helpers > 0) {
            std::lock_guard<std::mutex> lk(mtx);
            n_busy = (int) threads.size();
            epoch++;
            cv_start.notify_all();
        }
        work(workers[0]);
        if (n_helpers > 0) {
            std::unique_lock<std::mutex> lk(mtx);
            cv_done.wait(lk, [&] { return n_busy == 0; });
        }
        disp = nullptr;
        return true;
    }
};

// Integer division by zero (and INT_MIN/-1) does not trap on the GPU: kernels compute e.g.
// 'i % args.nef1[1]' for fused operands that the variant never uses. x86 raises #DE (SIGFPE);
// inside a kernel fiber the handler skips the div/idiv instruction with quotient = remainder = 0.
struct sigaction g_old_fpe;

void fpe_handler(int sig, siginfo_t * info, void * uctx) {
    ucontext_t * uc = (ucontext_t *) uctx;
    worker * w = W;
    const uint8_t * p = (const uint8_t *) uc->uc_mcontext.gregs[REG_RIP];
    bool ok = w != nullptr && w->cur != nullptr && info->si_code != FPE_FLTDIV;
    if (ok) {
        while (*p == 0x66 || *p == 0x67 || *p == 0xF2 || *p == 0xF3 || *p == 0x2E || *p == 0x3E ||
               *p == 0x26 || *p == 0x64 || *p == 0x65 || *p == 0x36) p++;
        if (*p >= 0x40 && *p <= 0x4F) p++;
        ok = (*p == 0xF6 || *p == 0xF7);
    }
    if (ok) {
        p++;
        const uint8_t modrm = *p++;
        const int mod = modrm >> 6, rm = modrm & 7, op = (modrm >> 3) & 7;
        ok = op == 6 || op == 7;
        if (mod != 3 && rm == 4) {
            const uint8_t sib = *p++;
            if (mod == 0 && (sib & 7) == 5) p += 4;
        }
        if (mod == 0 && rm == 5) p += 4;
        if (mod == 1) p += 1;
        if (mod == 2) p += 4;
    }
    if (!ok) {
        sigaction(SIGFPE, &g_old_fpe, nullptr);
        raise(sig);
        return;
    }
    uc->uc_mcontext.gregs[REG_RAX] = 0;
    uc->uc_mcontext.gregs[REG_RDX] = 0;
    uc->uc_mcontext.gregs[REG_RIP] = (greg_t) p;
}

void install_fpe_handler() {
    struct sigaction sa = {};
    sa.sa_sigaction = fpe_handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGFPE, &sa, &g_old_fpe);
}

pool & get_pool() {
    static pool * p = [] { pool * q = new pool(); q->init(); install_fpe_handler(); return q; }();
    return *p;
}


// ---- persistent dispatches (PERSISTENT.md) ------------------------------------------------------
// All threadgroups of the dispatch are fibers of the calling thread, at most the residency limit of
// them at once (the others start when a resident one exits, as on a GPU). Device atomics and
// device-scope fences are scheduling points. Plain stores to registered device memory go to a
// per-threadgroup store buffer (page protection + twin pages) that a device-scope seq_cst fence
// publishes; a threadgroup's unpublished stores become visible to the others at the end of the
// dispatch. A round in which no threadgroup moves is a deadlock, reported with the kernel's name.

size_t page_size() {
    static const size_t ps = (size_t) sysconf(_SC_PAGE_SIZE);
    return ps;
}

struct mem_range { uint8_t * lo; uint8_t * hi; };

std::mutex & ranges_mtx() { static std::mutex m; return m; }
std::vector<mem_range> & ranges() { static std::vector<mem_range> v; return v; }

// the bytes of one page that one device-scope fence published (old = the content before)
struct publication {
    uint64_t              seq;
    uint8_t *             page;
    std::vector<uint16_t> pos;
    std::vector<uint8_t>  old_b;
    std::vector<uint8_t>  new_b;
};

struct persistent_state {
    std::atomic<bool>        active{false};   // a persistent dispatch runs (on one thread)
    std::atomic<const emu_dispatch *> d{nullptr};
    std::vector<mem_range>   tracked;         // registered device memory, during the dispatch
    uint64_t                 epoch = 0;       // bumped whenever memory another threadgroup sees changes
    std::atomic<uint64_t>    rounds{0};       // scheduler rounds (watchdog)
    std::atomic<uint64_t>    serial{0};       // persistent dispatches started (watchdog)
    std::vector<store_buffer> retired;        // store buffers of exited threadgroups
    std::vector<publication> log;             // publications not yet acquired by every resident threadgroup
    uint64_t                 seq = 0;         // publications so far
};

persistent_state g_ps;

bool is_tracked(const void * p) {
    const uint8_t * a = (const uint8_t *) p;
    for (const mem_range & r : g_ps.tracked) {
        if (a >= r.lo && a < r.hi) return true;
    }
    return false;
}

bool in_tgmem(const worker * w, const void * p) {
    const uint8_t * a = (const uint8_t *) p;
    return a >= w->tgmem.data() && a < w->tgmem.data() + w->tgmem.size();
}

void protect(void * p, size_t n, int prot) {
    if (mprotect(p, n, prot) != 0) emu_fatal("mprotect failed on registered device memory");
}

// the running threadgroup's first plain store to a page since it last published
void sb_track(worker * w, uint8_t * page) {
    const size_t ps = page_size();
    if (w->sb.index.find((uintptr_t) page) == w->sb.index.end()) {
        dirty_page dp = { page, new uint8_t[ps], new uint8_t[ps] };
        memcpy(dp.twin, page, ps);
        w->sb.index[(uintptr_t) page] = w->sb.pages.size();
        w->sb.pages.push_back(dp);
    }
    protect(page, ps, PROT_READ | PROT_WRITE);
}

// A threadgroup's view of device memory: the publications up to its last acquire (acq_seq) plus its
// own unpublished stores. Memory holds the running threadgroup's view; between turns it holds the
// latest published content. Publications newer than the threadgroup's acquire are undone while it
// runs (a load without an acquire fence sees stale data), and redone when it stops.
// the pages of the publications newer than the threadgroup's acquire, writable (pages_rw) and back
// to read-only (pages_ro): one mprotect per page and switch
std::vector<uint8_t *> & log_pages() { static std::vector<uint8_t *> v; return v; }

size_t log_first_unacquired(const worker * w) {
    size_t k = g_ps.log.size();
    while (k > 0 && g_ps.log[k - 1].seq > w->acq_seq) k--;
    return k;
}

void log_pages_rw(size_t first) {
    std::vector<uint8_t *> & v = log_pages();
    v.clear();
    for (size_t k = first; k < g_ps.log.size(); ++k) v.push_back(g_ps.log[k].page);
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    for (uint8_t * p : v) protect(p, page_size(), PROT_READ | PROT_WRITE);
}

void log_pages_ro() {
    for (uint8_t * p : log_pages()) protect(p, page_size(), PROT_READ);
}

void log_undo(worker * w) {
    const size_t first = log_first_unacquired(w);
    if (first == g_ps.log.size()) return;
    log_pages_rw(first);
    for (size_t k = g_ps.log.size(); k-- > first;) {
        const publication & e = g_ps.log[k];
        for (size_t i = 0; i < e.pos.size(); ++i) e.page[e.pos[i]] = e.old_b[i];
    }
    log_pages_ro();
}

void log_redo(worker * w) {
    const size_t first = log_first_unacquired(w);
    if (first == g_ps.log.size()) return;
    log_pages_rw(first);
    for (size_t k = first; k < g_ps.log.size(); ++k) {
        const publication & e = g_ps.log[k];
        for (size_t i = 0; i < e.pos.size(); ++i) e.page[e.pos[i]] = e.new_b[i];
    }
    log_pages_ro();
}

// the threadgroup stops running: its stores wait in 'mine', memory goes back to the latest
// published content
void sb_switch_out(worker * w) {
    const size_t ps = page_size();
    for (dirty_page & p : w->sb.pages) {
        memcpy(p.mine, p.page, ps);
        memcpy(p.page, p.twin, ps);
    }
    log_redo(w);
    for (dirty_page & p : w->sb.pages) {
        protect(p.page, ps, PROT_READ);
    }
}

// the threadgroup runs again: memory shows what it has acquired, its stores (bytes where mine !=
// twin) go over that
void sb_switch_in(worker * w) {
    const size_t ps = page_size();
    log_undo(w);
    for (dirty_page & p : w->sb.pages) {
        protect(p.page, ps, PROT_READ | PROT_WRITE);
        for (size_t i = 0; i < ps; ++i) {
            const uint8_t pub = p.page[i];
            if (p.mine[i] != p.twin[i]) p.page[i] = p.mine[i];
            p.twin[i] = pub;
        }
    }
}

void sb_free(store_buffer & sb) {
    for (dirty_page & p : sb.pages) {
        delete[] p.twin;
        delete[] p.mine;
    }
    sb.pages.clear();
    sb.index.clear();
}

// device-scope seq_cst fence of the running threadgroup: its stores are published (release) and it
// sees every publication so far (acquire); returns whether its view of memory changed
bool sb_fence(worker * w) {
    const size_t ps = page_size();
    const uint64_t acq0 = w->acq_seq;
    const uint64_t seq0 = g_ps.seq;
    sb_switch_out(w); // memory: the latest published content
    for (dirty_page & p : w->sb.pages) {
        publication e = { 0, p.page, {}, {}, {} };
        for (size_t i = 0; i < ps; ++i) {
            if (p.mine[i] != p.twin[i]) {
                e.pos.push_back((uint16_t) i);
                e.old_b.push_back(p.page[i]);
                e.new_b.push_back(p.mine[i]);
            }
        }
        if (e.pos.empty()) continue;
        protect(p.page, ps, PROT_READ | PROT_WRITE);
        for (size_t i = 0; i < e.pos.size(); ++i) p.page[e.pos[i]] = e.new_b[i];
        protect(p.page, ps, PROT_READ);
        e.seq = ++g_ps.seq;
        g_ps.log.push_back(std::move(e));
    }
    sb_free(w->sb);
    w->acq_seq = g_ps.seq;
    return g_ps.seq != seq0 || acq0 != seq0;
}

// drop the publications every resident threadgroup has acquired
void log_trim(const std::vector<worker *> & res) {
    uint64_t lo = g_ps.seq;
    for (const worker * w : res) {
        if (w) lo = std::min(lo, w->acq_seq);
    }
    size_t k = 0;
    while (k < g_ps.log.size() && g_ps.log[k].seq <= lo) k++;
    g_ps.log.erase(g_ps.log.begin(), g_ps.log.begin() + k);
}

struct sigaction g_old_segv;

void segv_handler(int sig, siginfo_t * info, void * uctx) {
    (void) sig; (void) uctx;
    worker * w = W;
    if (g_ps.active && w != nullptr && w->cur != nullptr && is_tracked(info->si_addr)) {
        sb_track(w, (uint8_t *) ((uintptr_t) info->si_addr & ~(uintptr_t) (page_size() - 1)));
        return;
    }
    // not a store to tracked device memory: the previous handler sees the fault again
    sigaction(SIGSEGV, &g_old_segv, nullptr);
}

void install_segv_handler() {
    static bool done = false;
    if (done) return;
    done = true;
    struct sigaction sa = {};
    sa.sa_sigaction = segv_handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
}

// a thread that spins without reaching a scheduling point (a loop on plain device memory) never
// returns to the scheduler: report it after GGML_METAL_EMU_WATCHDOG_S seconds (default 60) instead
// of hanging
void start_watchdog() {
    static bool done = false;
    if (done) return;
    done = true;
    int limit = 60;
    if (const char * s = getenv("GGML_METAL_EMU_WATCHDOG_S")) limit = std::max(1, atoi(s));
    std::thread([limit] {
        uint64_t last_serial = 0, last_rounds = 0;
        int still = 0;
        for (;;) {
            std::this_thread::sleep_for(std::chrono::seconds(1));
            const uint64_t se = g_ps.serial.load(), ro = g_ps.rounds.load();
            const emu_dispatch * d = g_ps.d;
            if (!g_ps.active || d == nullptr || se != last_serial || ro != last_rounds) {
                last_serial = se; last_rounds = ro; still = 0;
                continue;
            }
            if (++still >= limit) {
                fprintf(stderr, "metal-emu: kernel %s (file %s): no thread reached a scheduling point for %d s: a thread "
                        "spins on plain (non-atomic) device memory or loops forever (GGML_METAL_EMU_WATCHDOG_S)\n",
                        d->kernel->name, d->kernel->file, limit);
                fflush(stderr);
                abort();
            }
        }
    }).detach();
}

// how long a resident threadgroup runs before the next one gets its turn (env GGML_METAL_EMU_TG_SCHED):
//   greedy (default): until it exits or blocks (spins without news, waits): maximal skew between
//                     threadgroups, so a missing grid barrier reads data that was never written
//   rr:               one pass (every thread to its next scheduling point): fine interleaving
//   random:           1..8 passes, from the same xorshift state as GGML_METAL_EMU_ORDER=shuffle
int tg_sched() {
    static int v = -1;
    if (v < 0) {
        const char * s = getenv("GGML_METAL_EMU_TG_SCHED");
        v = 1;
        if (s && strcmp(s, "rr") == 0) v = 0;
        if (s && strcmp(s, "random") == 0) v = 2;
    }
    return v;
}

std::vector<worker *> & resident_pool() { static std::vector<worker *> v; return v; }

void report_deadlock(const emu_dispatch * d, const std::vector<worker *> & res, int resident, int64_t n_total,
                     int64_t started, int64_t finished, const char * what) {
    fprintf(stderr, "metal-emu: deadlock in kernel %s (file %s): %s\n", d->kernel->name, d->kernel->file, what);
    fprintf(stderr, "metal-emu:   %lld threadgroups launched, %d co-resident, %lld started, %lld finished\n",
            (long long) n_total, resident, (long long) started, (long long) finished);
    for (const worker * w : res) {
        if (!w) continue;
        int spin = 0, wait = 0;
        const void * addr = nullptr;
        for (int i = 0; i < w->n_threads; ++i) {
            const fiber & f = w->fibers[i];
            if (f.done) continue;
            if (f.waiting) wait++;
            else { spin++; addr = f.last_addr; }
        }
        int bi = -1;
        size_t off = 0;
        for (int b = 0; b < EMU_MAX_BUFFERS && addr; ++b) {
            const uint8_t * base = (const uint8_t *) d->bufs[b];
            if (base && (const uint8_t *) addr >= base && (bi < 0 || (size_t) ((const uint8_t *) addr - base) < off)) {
                bi = b;
                off = (size_t) ((const uint8_t *) addr - base);
            }
        }
        if (bi >= 0) {
            fprintf(stderr, "metal-emu:   threadgroup (%u,%u,%u): %d threads spin on device atomics (last at buffer %d + %zu bytes), %d wait at a barrier\n",
                    w->tgpig[0], w->tgpig[1], w->tgpig[2], spin, bi, off, wait);
        } else {
            fprintf(stderr, "metal-emu:   threadgroup (%u,%u,%u): %d threads spin on device atomics, %d wait at a barrier\n",
                    w->tgpig[0], w->tgpig[1], w->tgpig[2], spin, wait);
        }
    }
    if (n_total > resident) {
        fprintf(stderr, "metal-emu:   the launch oversubscribes the GPU: %lld threadgroups > %d co-resident ones; threadgroups "
                "beyond the resident ones start only when one exits, so a persistent kernel that waits for all of them can "
                "never finish (size the grid from emu_max_resident_threadgroups() / the device's limits)\n",
                (long long) n_total, resident);
    }
    fflush(stderr);
}

bool run_persistent(const emu_dispatch * d) {
    const int nt = d->ntg[0]*d->ntg[1]*d->ntg[2];
    const int64_t n_total = (int64_t) d->ntgpg[0]*d->ntgpg[1]*d->ntgpg[2];
    if (n_total <= 0) return true;
    size_t tgmem = 0;
    for (int i = 0; i < EMU_MAX_TGMEM; ++i) tgmem += d->tgmem[i];
    const int limit = emu_max_resident_threadgroups(nt, tgmem);
    const int resident = (int) std::min<int64_t>(limit, n_total);

    std::vector<worker *> & ctxs = resident_pool();
    while ((int) ctxs.size() < resident) ctxs.push_back(new worker());
    for (int i = 0; i < resident; ++i) prepare(ctxs[i], d);

    install_segv_handler();
    start_watchdog();
    {
        std::lock_guard<std::mutex> lk(ranges_mtx());
        g_ps.tracked = ranges();
    }
    for (const mem_range & r : g_ps.tracked) protect(r.lo, (size_t) (r.hi - r.lo), PROT_READ);
    g_ps.d = d;
    g_ps.epoch = 0;
    g_ps.retired.clear();
    g_ps.log.clear();
    g_ps.seq = 0;
    g_ps.serial++;
    g_ps.active = true;

    const int64_t gx = d->ntgpg[0], gy = d->ntgpg[1];
    int64_t next = 0, finished = 0;
    auto start = [&](worker * w) {
        const int64_t i = next++;
        w->tg_linear = i;
        w->acq_seq = g_ps.seq; // a threadgroup starts with everything published so far
        tg_begin(w, d, (uint32_t) (i % gx), (uint32_t) ((i / gx) % gy), (uint32_t) (i / (gx*gy)));
    };
    std::vector<worker *> res;
    for (int i = 0; i < resident; ++i) {
        start(ctxs[i]);
        res.push_back(ctxs[i]);
    }
    bool ok = true;
    int idle = 0;
    std::vector<int> order;
    while (ok && !res.empty()) {
        const uint64_t e0 = g_ps.epoch;
        bool progressed = false;
        const int n = (int) res.size();
        order.resize(n);
        for (int i = 0; i < n; ++i) order[i] = lane_order() == 1 ? n - 1 - i : i;
        if (lane_order() == 2) {
            for (int i = n - 1; i > 0; --i) std::swap(order[i], order[rnd(ctxs[0]) % (i + 1)]);
        }
        for (int k = 0; k < n && ok; ++k) {
            worker * w = res[order[k]];
            W = w;
            sb_switch_in(w);
            // a turn: up to 'budget' passes, ending early when the threadgroup exits or is blocked
            const int budget = tg_sched() == 0 ? 1 : tg_sched() == 2 ? 1 + (int) (rnd(ctxs[0]) % 8) : INT32_MAX;
            pass_result r = {};
            for (int t = 0; t < budget; ++t) {
                g_ps.rounds++;
                r = tg_pass(w);
                if (r.live == 0 || (!r.progressed && !r.soft)) break;
                progressed = progressed || r.progressed;
            }
            sb_switch_out(w);
            if (r.live == 0) {
                g_ps.retired.push_back(std::move(w->sb));
                w->sb = store_buffer();
                finished++;
                progressed = true;
                if (next < n_total) {
                    start(w);
                } else {
                    res[order[k]] = nullptr;
                }
            } else if (r.progressed) {
                progressed = true;
            } else if (r.blocked && !r.stalled) {
                if (tg_release_lockstep(w)) {
                    progressed = true;
                } else {
                    report_deadlock(d, { w }, resident, n_total, next, finished,
                                    "every live thread of a threadgroup waits at a barrier or SIMD-group operation that the others never reach");
                    ok = false;
                }
            }
            W = nullptr;
        }
        res.erase(std::remove(res.begin(), res.end(), nullptr), res.end());
        log_trim(res);
        if (!ok) break;
        if (progressed || g_ps.epoch != e0) {
            idle = 0;
            continue;
        }
        // two rounds in a row in which no thread did anything new (a fence right after a load can
        // look stalled once)
        if (++idle < 2) continue;
        report_deadlock(d, res, resident, n_total, next, finished,
                        "every resident threadgroup spins on device atomics whose values no running thread can change any more");
        ok = false;
    }

    // end of the dispatch: every store becomes visible
    g_ps.active = false;
    for (const mem_range & r : g_ps.tracked) protect(r.lo, (size_t) (r.hi - r.lo), PROT_READ | PROT_WRITE);
    const size_t ps = page_size();
    for (store_buffer & sb : g_ps.retired) {
        for (dirty_page & p : sb.pages) {
            for (size_t i = 0; i < ps; ++i) {
                if (p.mine[i] != p.twin[i]) p.page[i] = p.mine[i];
            }
        }
        sb_free(sb);
    }
    g_ps.retired.clear();
    for (worker * w : res) {
        // threadgroups left behind by a deadlock: their stores are dropped
        sb_free(w->sb);
        w->disp = nullptr;
    }
    g_ps.tracked.clear();
    g_ps.d = nullptr;
    return ok;
}

} // namespace

// ---- kernel-side API ----------------------------------------------------------------------------
void emu_tg_barrier(void) {
    worker * w = W;
    fiber * f = w->cur;
    w->tg_arrived++;
    if (w->tg_arrived >= w->tg_active) {
        tg_release(w);
        return;
    }
    const uint64_t g = w->tg_gen;
    f->waiting = true;
    while (w->tg_gen == g) yield_to_sched(w);
    f->waiting = false;
}

// Apple GPUs run the lanes of a SIMD group in lockstep, and upstream kernels rely on it: e.g.
// kernel_flash_attn_ext_vec lets lane 0 overwrite ss[0..1] with S and M right after the other lanes
// read ss[] in the V loop, with no simdgroup_barrier in between (NE = 1 variants, and the
// cross-simdgroup reduction). Fibers run one lane at a time between synchronisation points, so the
// translator brackets every lane-dependent `if` of a kernel body with this call: all active lanes
// of the SIMD group reach the branch together and leave it together, as in lockstep execution.
// GGML_METAL_EMU_LOCKSTEP=0 turns it off (to find kernels that depend on it).
static int g_lockstep = -1;

void emu_simd_lockstep(void) {
    if (__builtin_expect(g_lockstep < 0, 0)) {
        const char * e = getenv("GGML_METAL_EMU_LOCKSTEP");
        g_lockstep = (e && strcmp(e, "0") == 0) ? 0 : 1;
    }
    if (!g_lockstep) return;
    worker * w = W;
    fiber * f = w->cur;
    sg_state & s = w->sgs[f->sg];
    if (s.active <= 1) return;
    s.ls_arrived++;
    if (s.ls_arrived >= s.active) {
        ls_release(s, w);
        return;
    }
    const uint64_t g = s.ls_gen;
    f->waiting = true;
    while (s.ls_gen == g) yield_to_sched(w);
    f->waiting = false;
}

void emu_simd_sync(void) {
    worker * w = W;
    fiber * f = w->cur;
    sg_state & s = w->sgs[f->sg];
    s.arrived++;
    if (s.arrived >= s.active) {
        sg_release(s, w);
        return;
    }
    const uint64_t g = s.gen;
    f->waiting = true;
    while (s.gen == g) yield_to_sched(w);
    f->waiting = false;
}

void * emu_simd_exchange_raw(const void * v, size_t n) {
    worker * w = W;
    fiber * f = w->cur;
    sg_state & s = w->sgs[f->sg];
    f->parity ^= 1;
    uint8_t * base = s.slots[f->parity];
    memcpy(base + f->lane*EMU_SIMD_SLOT_BYTES, v, n);
    emu_simd_sync();
    return base;
}

uint32_t emu_simd_active_mask(void) {
    worker * w = W;
    return w->sgs[w->cur->sg].mask;
}

int emu_lane(void) {
    return W->cur->lane;
}

bool emu_simd_leader(void) {
    worker * w = W;
    return w->cur->lane == __builtin_ctz(w->sgs[w->cur->sg].mask);
}

void * emu_simd_collective_begin(void) {
    worker * w = W;
    fiber * f = w->cur;
    emu_simd_sync();
    f->coll_n++;
    sg_state & s = w->sgs[f->sg];
    return s.coll_done == f->coll_n ? s.coll_result : nullptr;
}

void * emu_simd_collective_slot(void) {
    worker * w = W;
    return w->sgs[w->cur->sg].coll_result;
}

void emu_simd_collective_done(void) {
    worker * w = W;
    w->sgs[w->cur->sg].coll_done = w->cur->coll_n;
}

void * emu_tg_alloc(const void * key, size_t size, size_t align) {
    worker * w = W;
    for (const tg_key & k : w->keys) {
        if (k.key == key) return k.ptr;
    }
    size_t off = (w->arena_off + align - 1) & ~(align - 1);
    if (off + size > w->arena_end) emu_fatal("threadgroup arrays declared in the kernel exceed the 64 KiB emulator arena");
    void * p = w->tgmem.data() + off;
    w->arena_off = off + size;
    w->keys.push_back({ key, p });
    return p;
}


void emu_atomic_begin(const void * p) {
    if (!g_ps.active) return;
    worker * w = W;
    fiber * f = w->cur;
    if (in_tgmem(w, p)) return; // threadgroup atomics: threads of one threadgroup, no scheduling point
    f->stalled = f->last_addr == p && f->last_epoch == g_ps.epoch;
    yield_to_sched(w);
    f->stalled = false;
}

void emu_atomic_end(const void * p, size_t n, bool changed) {
    if (!g_ps.active) return;
    worker * w = W;
    fiber * f = w->cur;
    if (in_tgmem(w, p)) return;
    if (!changed) {
        f->last_addr = p;
        f->last_epoch = g_ps.epoch;
        return;
    }
    g_ps.epoch++;
    f->last_addr = nullptr;
    // atomics are coherent: keep the published content of a page this threadgroup has dirty in step
    const size_t ps = page_size();
    const uintptr_t page = (uintptr_t) p & ~(uintptr_t) (ps - 1);
    auto it = w->sb.index.find(page);
    if (it != w->sb.index.end()) {
        memcpy(w->sb.pages[it->second].twin + ((uintptr_t) p - page), p, n);
    }
}

void emu_device_fence(bool publish) {
    if (!g_ps.active) return;
    worker * w = W;
    fiber * f = w->cur;
    f->soft = f->last_addr != nullptr && f->last_epoch == g_ps.epoch;
    yield_to_sched(w);
    f->soft = false;
    if (publish && sb_fence(w)) {
        g_ps.epoch++;
    }
}

int emu_max_resident_threadgroups(int threads_per_threadgroup, size_t threadgroup_memory_bytes) {
    if (const char * s = getenv("GGML_METAL_EMU_RESIDENCY")) {
        if (atoi(s) > 0) return atoi(s);
    }
    int cores = 8;
    if (const char * s = getenv("GGML_METAL_EMU_GPU_CORES")) {
        if (atoi(s) > 0) cores = atoi(s);
    }
    // per core: 1024 threads and 32 KiB of threadgroup memory (conservative, see PERSISTENT.md)
    const int threads = std::max(32, (threads_per_threadgroup + 31)/32*32);
    int per_core = std::max(1, 1024/threads);
    if (threadgroup_memory_bytes > 0) {
        per_core = std::min(per_core, std::max(1, (int) (32768/threadgroup_memory_bytes)));
    }
    return cores*per_core;
}

void emu_device_memory_register(void * p, size_t size) {
    const uintptr_t ps = page_size();
    const uintptr_t lo = ((uintptr_t) p + ps - 1) & ~(ps - 1);
    const uintptr_t hi = ((uintptr_t) p + size) & ~(ps - 1);
    if (hi <= lo) return;
    std::lock_guard<std::mutex> lk(ranges_mtx());
    ranges().push_back({ (uint8_t *) lo, (uint8_t *) hi });
}

void emu_device_memory_unregister(void * p) {
    const uintptr_t ps = page_size();
    const uint8_t * lo = (const uint8_t *) (((uintptr_t) p + ps - 1) & ~(ps - 1));
    std::lock_guard<std::mutex> lk(ranges_mtx());
    auto & v = ranges();
    v.erase(std::remove_if(v.begin(), v.end(), [&](const mem_range & r) { return r.lo == lo; }), v.end());
}

// Misaligned typed pointers (a uint32_t * at 2 mod 4, ...): fatal by default, naming the kernel.
// Upstream kernels that do this on purpose (q5_0/q5_1 read their 2-mod-4 'qh' as one uint32, which
// Apple GPUs tolerate) are allowed by kernel-name substring and noted once.
//   GGML_METAL_EMU_MISALIGNED=fatal|warn|off   (default fatal)
//   GGML_METAL_EMU_MISALIGNED_ALLOW=a,b,...    (default "q5_0,q5_1"; empty string: allow none)
static int g_misalign_mode = -1; // 0 off, 1 warn, 2 fatal
static std::vector<std::string> g_misalign_allow;
static std::mutex g_misalign_mtx;
static std::vector<std::string> g_misalign_noted;

void emu_report_misaligned(const void * p, size_t align, const char * where) {
    std::lock_guard<std::mutex> lk(g_misalign_mtx);
    if (g_misalign_mode < 0) {
        const char * s = getenv("GGML_METAL_EMU_MISALIGNED");
        g_misalign_mode = 2;
        if (s && strcmp(s, "warn") == 0) g_misalign_mode = 1;
        if (s && strcmp(s, "off") == 0) g_misalign_mode = 0;
        const char * a = getenv("GGML_METAL_EMU_MISALIGNED_ALLOW");
        std::string list = a ? a : "q5_0,q5_1";
        size_t pos = 0;
        while (pos <= list.size()) {
            size_t e = list.find(',', pos);
            if (e == std::string::npos) e = list.size();
            if (e > pos) g_misalign_allow.push_back(list.substr(pos, e - pos));
            pos = e + 1;
        }
    }
    if (g_misalign_mode == 0) return;
    const char * kname = (W && W->disp) ? W->disp->kernel->name : "?";
    bool allowed = false;
    for (const auto & a : g_misalign_allow) allowed |= strstr(kname, a.c_str()) != nullptr;
    char msg[512];
    snprintf(msg, sizeof(msg), "misaligned typed pointer %p (needs %zu-byte alignment) in %s", p, align, where);
    if (allowed || g_misalign_mode == 1) {
        for (const auto & n : g_misalign_noted) if (n == kname) return;
        g_misalign_noted.push_back(kname);
        fprintf(stderr, "metal-emu: note: %s (kernel %s%s; reported once per kernel)\n", msg, kname,
                allowed ? ", allowed by GGML_METAL_EMU_MISALIGNED_ALLOW" : "");
        return;
    }
    emu_fatal(msg);
}

void * emu_arg_ptr(emu_arg_kind kind, int idx) {
    worker * w = W;
    if (kind == EMU_ARG_TGMEM) {
        // a kernel may declare threadgroup memory that the host leaves at length 0 (unused variant)
        return w->tgmem.data() + w->tgmem_off[idx];
    }
    void * p = w->disp->bufs[idx];
    return p;
}

void emu_arg_u3(emu_arg_kind kind, uint32_t out[3]) {
    worker * w = W;
    const fiber * f = w->cur;
    const emu_dispatch * d = w->disp;
    out[0] = out[1] = out[2] = 0;
    switch (kind) {
        case EMU_ARG_TGPIG: out[0] = w->tgpig[0]; out[1] = w->tgpig[1]; out[2] = w->tgpig[2]; break;
        case EMU_ARG_TPITG: out[0] = f->tpitg[0]; out[1] = f->tpitg[1]; out[2] = f->tpitg[2]; break;
        case EMU_ARG_TIITG: out[0] = f->tid; break;
        case EMU_ARG_TIISG: out[0] = f->lane; break;
        case EMU_ARG_SGITG: out[0] = f->sg; break;
        case EMU_ARG_NSG:   out[0] = w->n_sg; break;
        case EMU_ARG_NTG:   out[0] = d->ntg[0]; out[1] = d->ntg[1]; out[2] = d->ntg[2]; break;
        case EMU_ARG_NTGPG: out[0] = d->ntgpg[0]; out[1] = d->ntgpg[1]; out[2] = d->ntgpg[2]; break;
        case EMU_ARG_TPIG:
            for (int i = 0; i < 3; ++i) out[i] = w->tgpig[i]*d->ntg[i] + f->tpitg[i];
            break;
        case EMU_ARG_NTPSG: out[0] = 32; break;
        default: emu_fatal("bad builtin argument kind");
    }
}

// d = a*b + c for 8x8 matrices in row-major order; element types 0 = f32, 1 = f16, 2 = bf16
static void load8x8(float * dst, const void * src, int t) {
    for (int i = 0; i < 64; ++i) {
        if (t == 0)      dst[i] = ((const float *) src)[i];
        else if (t == 1) dst[i] = (float) ((const _Float16 *) src)[i];
        else             dst[i] = (float) ((const __bf16 *) src)[i];
    }
}

void emu_mma_f32(float * d, const void * a, int ta, const void * b, int tb, const void * c, int tc) {
    float fa[64], fb[64], fc[64];
    load8x8(fa, a, ta);
    load8x8(fb, b, tb);
    load8x8(fc, c, tc);
    for (int r = 0; r < 8; ++r) {
        float acc[8];
        for (int j = 0; j < 8; ++j) acc[j] = fc[r*8 + j];
        for (int k = 0; k < 8; ++k) {
            const float x = fa[r*8 + k];
            for (int j = 0; j < 8; ++j) acc[j] = __builtin_fmaf(x, fb[k*8 + j], acc[j]);
        }
        for (int j = 0; j < 8; ++j) d[r*8 + j] = acc[j];
    }
}

// ---- dispatch --------------------------------------------------------------------------------
bool emu_run_dispatch(const emu_dispatch * d) {
    static std::mutex run_mtx;
    std::lock_guard<std::mutex> run_lk(run_mtx);
    const int nt = d->ntg[0]*d->ntg[1]*d->ntg[2];
    if (nt <= 0 || nt > MAX_THREADS) {
        fprintf(stderr, "metal-emu: kernel %s: bad threadgroup size %d x %d x %d\n", d->kernel->name, d->ntg[0], d->ntg[1], d->ntg[2]);
        return false;
    }
    // function constants: write the pipeline's values into every global that declares them
    for (const fc_slot & s : fc_slots()) {
        bool found = false;
        for (int i = 0; i < d->n_fcs; ++i) {
            if (d->fcs[i].idx == s.idx) {
                memcpy(s.ptr, d->fcs[i].bytes, std::min<size_t>(s.size, (size_t) d->fcs[i].size));
                found = true;
                break;
            }
        }
        if (!found) memset(s.ptr, 0, s.size);
    }
    pool & p = get_pool(); // also installs the SIGFPE handler
    static int force = -1;
    if (force < 0) {
        const char * e = getenv("GGML_METAL_EMU_PERSISTENT");
        force = e && strcmp(e, "all") == 0 ? 1 : 0;
    }
    if (d->kernel->coresident || force) {
        return run_persistent(d);
    }
    return p.run(d);
}
