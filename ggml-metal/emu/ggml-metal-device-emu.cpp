// ggml-metal-device-emu.cpp - the C API that ggml-metal-device.m and ggml-metal-context.m implement
// on Apple platforms, implemented on top of the metal-emu runtime so that the unchanged host code
// (ggml-metal.cpp, ggml-metal-ops.cpp, ggml-metal-device.cpp, ggml-metal-common.cpp, fusion, tuning)
// runs on Linux:
//   library  = registry of translated kernels + function-constant values per pipeline
//   buffers  = host memory (unified memory, shared buffers)
//   encoder  = each dispatch runs to completion when it is encoded (a valid serial order)
//   events, residency sets, capture = no-ops
//   device   = an Apple7-class GPU with SIMD-group reduction and matrix multiply

#include "ggml-metal-device.h"
#include "ggml-metal-context.h"
#include "ggml-metal-fusion.h"
#include "ggml-metal-ops.h"
#include "ggml-metal-common.h"
#include "ggml-metal-impl.h"

#include "ggml-impl.h"
#include "ggml-backend-impl.h"

#include "emu-runtime.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <unistd.h>

//
// function constants
//

struct ggml_metal_cv {
    std::vector<emu_fc_value> vals;

    void set(int idx, const void * p, int size) {
        for (auto & v : vals) {
            if (v.idx == idx) {
                v.size = size;
                memcpy(v.bytes, p, size);
                return;
            }
        }
        emu_fc_value v = {};
        v.idx  = idx;
        v.size = size;
        memcpy(v.bytes, p, size);
        vals.push_back(v);
    }
};

ggml_metal_cv_t ggml_metal_cv_init(void) {
    return new ggml_metal_cv();
}

void ggml_metal_cv_free(ggml_metal_cv_t cv) {
    delete cv;
}

void ggml_metal_cv_set_int16(ggml_metal_cv_t cv, int16_t value, int32_t idx) { cv->set(idx, &value, sizeof(value)); }
void ggml_metal_cv_set_int32(ggml_metal_cv_t cv, int32_t value, int32_t idx) { cv->set(idx, &value, sizeof(value)); }
void ggml_metal_cv_set_bool (ggml_metal_cv_t cv, bool    value, int32_t idx) { cv->set(idx, &value, sizeof(value)); }

//
// pipelines
//

struct ggml_metal_pipeline {
    const emu_kernel_info *   kernel = nullptr;
    std::vector<emu_fc_value> fcs;
    std::string               name;
};

ggml_metal_pipeline_t ggml_metal_pipeline_init(void) {
    return new ggml_metal_pipeline();
}

void ggml_metal_pipeline_free(ggml_metal_pipeline_t pipeline) {
    delete pipeline;
}

int ggml_metal_pipeline_max_theads_per_threadgroup(struct ggml_metal_pipeline_with_params pipeline) {
    GGML_UNUSED(pipeline);
    return 1024;
}

//
// library
//

struct ggml_metal_library {
    ggml_metal_device_t    dev;
    ggml_metal_pipelines_t pipelines;
    std::mutex             lock;
};

ggml_metal_library_t ggml_metal_library_init(ggml_metal_device_t dev) {
    ggml_metal_library_t lib = new ggml_metal_library();
    lib->dev       = dev;
    lib->pipelines = ggml_metal_pipelines_init();
    // force the registration of all translated kernels
    (void) emu_find_kernel("");
    GGML_LOG_INFO("%s: metal-emu: %d translated kernels\n", __func__, emu_n_kernels());
    return lib;
}

ggml_metal_library_t ggml_metal_library_init_from_source(ggml_metal_device_t dev, const char * source, bool verbose) {
    GGML_UNUSED(dev);
    GGML_UNUSED(source);
    if (verbose) {
        GGML_LOG_ERROR("%s: metal-emu cannot compile Metal source at run time\n", __func__);
    }
    return nullptr;
}

void ggml_metal_library_free(ggml_metal_library_t lib) {
    if (!lib) {
        return;
    }
    ggml_metal_pipelines_free(lib->pipelines);
    delete lib;
}

ggml_metal_device_t ggml_metal_library_get_device(ggml_metal_library_t lib) {
    return lib->dev;
}

static ggml_metal_pipeline_with_params emu_empty_pwp() {
    ggml_metal_pipeline_with_params res = {};
    res.pipeline = nullptr;
    return res;
}

struct ggml_metal_pipeline_with_params ggml_metal_library_get_pipeline(ggml_metal_library_t lib, const char * name) {
    std::lock_guard<std::mutex> lk(lib->lock);
    ggml_metal_pipeline_with_params res = emu_empty_pwp();
    res.pipeline = ggml_metal_pipelines_get(lib->pipelines, name);
    return res;
}

struct ggml_metal_pipeline_with_params ggml_metal_library_compile_pipeline(ggml_metal_library_t lib, const char * base, const char * name, ggml_metal_cv_t cv) {
    std::lock_guard<std::mutex> lk(lib->lock);
    ggml_metal_pipeline_with_params res = emu_empty_pwp();

    res.pipeline = ggml_metal_pipelines_get(lib->pipelines, name);
    if (res.pipeline) {
        return res;
    }

    const emu_kernel_info * k = emu_find_kernel(base);
    if (!k) {
        GGML_LOG_ERROR("%s: metal-emu: kernel '%s' (pipeline '%s') is not in the translated kernel set\n", __func__, base, name);
        return res;
    }

    ggml_metal_pipeline_t ppl = ggml_metal_pipeline_init();
    ppl->kernel = k;
    ppl->name   = name;
    if (cv) {
        ppl->fcs = cv->vals;
    }

    ggml_metal_pipelines_add(lib->pipelines, name, ppl);
    res.pipeline = ppl;
    return res;
}

//
// command buffers / encoders
//

struct emu_cmd_buf {
    ggml_metal_device_t dev;
    bool                error;
};

struct ggml_metal_encoder {
    emu_cmd_buf *             cb;
    const ggml_metal_pipeline * ppl;
    emu_dispatch              d;
    std::vector<uint8_t>      bytes[EMU_MAX_BUFFERS];
};

ggml_metal_encoder_t ggml_metal_encoder_init(ggml_metal_cmd_buf_t cmd_buf_raw, bool concurrent) {
    GGML_UNUSED(concurrent);
    ggml_metal_encoder_t enc = new ggml_metal_encoder();
    enc->cb  = (emu_cmd_buf *) cmd_buf_raw;
    enc->ppl = nullptr;
    memset(&enc->d, 0, sizeof(enc->d));
    return enc;
}

void ggml_metal_encoder_free(ggml_metal_encoder_t encoder) {
    delete encoder;
}

void ggml_metal_encoder_debug_group_push(ggml_metal_encoder_t encoder, const char * name) { GGML_UNUSED(encoder); GGML_UNUSED(name); }
void ggml_metal_encoder_debug_group_pop (ggml_metal_encoder_t encoder) { GGML_UNUSED(encoder); }

void ggml_metal_encoder_set_pipeline(ggml_metal_encoder_t encoder, struct ggml_metal_pipeline_with_params pipeline) {
    if (!pipeline.pipeline) {
        GGML_ABORT("%s: nil Metal pipeline (missing kernel; see compile_pipeline log above)\n", __func__);
    }
    encoder->ppl = pipeline.pipeline;
    for (int i = 0; i < EMU_MAX_TGMEM; ++i) {
        encoder->d.tgmem[i] = 0;
    }
}

void ggml_metal_encoder_set_bytes(ggml_metal_encoder_t encoder, void * data, size_t size, int idx) {
    GGML_ASSERT(idx >= 0 && idx < EMU_MAX_BUFFERS);
    auto & b = encoder->bytes[idx];
    b.assign((const uint8_t *) data, (const uint8_t *) data + size);
    b.resize(std::max<size_t>(size, 16) + 64, 0);
    encoder->d.bufs[idx]     = b.data();
    encoder->d.buf_size[idx] = size;
}

void ggml_metal_encoder_set_buffer(ggml_metal_encoder_t encoder, struct ggml_metal_buffer_id buffer, int idx) {
    GGML_ASSERT(idx >= 0 && idx < EMU_MAX_BUFFERS);
    encoder->d.bufs[idx]     = buffer.metal ? (uint8_t *) buffer.metal + buffer.offs : nullptr;
    encoder->d.buf_size[idx] = 0;
}

void ggml_metal_encoder_set_threadgroup_memory_size(ggml_metal_encoder_t encoder, size_t size, int idx) {
    GGML_ASSERT(size % 16 == 0);
    GGML_ASSERT(idx >= 0 && idx < EMU_MAX_TGMEM - 1);
    encoder->d.tgmem[idx] = size;
}

void ggml_metal_encoder_dispatch_threadgroups(ggml_metal_encoder_t encoder, int tg0, int tg1, int tg2, int tptg0, int tptg1, int tptg2) {
    const ggml_metal_pipeline * ppl = encoder->ppl;
    GGML_ASSERT(ppl != nullptr);
    emu_dispatch & d = encoder->d;
    d.kernel   = ppl->kernel;
    d.ntgpg[0] = tg0;   d.ntgpg[1] = tg1;   d.ntgpg[2] = tg2;
    d.ntg[0]   = tptg0; d.ntg[1]   = tptg1; d.ntg[2]   = tptg2;
    d.fcs      = ppl->fcs.data();
    d.n_fcs    = (int) ppl->fcs.size();
    size_t tgmem_total = 0;
    for (int i = 0; i < EMU_MAX_TGMEM; ++i) {
        tgmem_total += d.tgmem[i];
    }
    if (tgmem_total > 32768) {
        GGML_LOG_ERROR("%s: metal-emu: pipeline %s requests %zu bytes of threadgroup memory (> 32 KiB)\n", __func__, ppl->name.c_str(), tgmem_total);
        encoder->cb->error = true;
        return;
    }
    static const bool trace = getenv("GGML_METAL_EMU_TRACE") != nullptr;
    if (trace) {
        fprintf(stderr, "metal-emu: dispatch %s grid (%d,%d,%d) tg (%d,%d,%d) tgmem %zu\n", ppl->name.c_str(),
                tg0, tg1, tg2, tptg0, tptg1, tptg2, tgmem_total);
    }
    if (!emu_run_dispatch(&d)) {
        GGML_LOG_ERROR("%s: metal-emu: dispatch of %s failed\n", __func__, ppl->name.c_str());
        encoder->cb->error = true;
    }
}

void ggml_metal_encoder_memory_barrier(ggml_metal_encoder_t encoder) { GGML_UNUSED(encoder); }
void ggml_metal_encoder_end_encoding (ggml_metal_encoder_t encoder) { GGML_UNUSED(encoder); }

// a command buffer outside a graph (the megakernel's one dispatch per step, ggml-metal/mk): dispatches
// run when encoded, so committing only reports whether one of them failed
ggml_metal_cmd_buf_t ggml_metal_device_cmd_buf_init(ggml_metal_device_t dev) {
    return new emu_cmd_buf{ dev, false };
}

bool ggml_metal_device_cmd_buf_commit_and_wait(ggml_metal_cmd_buf_t cmd_buf) {
    emu_cmd_buf * cb = (emu_cmd_buf *) cmd_buf;
    const bool ok = !cb->error;
    delete cb;
    return ok;
}

//
// residency sets (no-op)
//

ggml_metal_rsets_t ggml_metal_rsets_init(ggml_metal_device_t dev) { GGML_UNUSED(dev); return nullptr; }
void ggml_metal_rsets_free(ggml_metal_rsets_t rsets) { GGML_UNUSED(rsets); }

//
// device
//

struct ggml_metal_device {
    struct ggml_metal_device_props props;
    ggml_metal_library_t           library;
    struct ggml_metal_fusion_info * finfo;
};

struct ggml_metal_event {
    int unused;
};

const char * ggml_metal_device_id_token(enum ggml_metal_device_id id) {
    switch (id) {
        case GGML_METAL_DEVICE_M1: return "m1";
        case GGML_METAL_DEVICE_M2: return "m2";
        case GGML_METAL_DEVICE_M3: return "m3";
        case GGML_METAL_DEVICE_M4: return "m4";
        default: return "generic";
    }
}

ggml_metal_device_t ggml_metal_device_init(int device, int n_devices) {
    ggml_metal_device_t dev = new ggml_metal_device();
    memset(&dev->props, 0, sizeof(dev->props));

    auto & p = dev->props;
    p.device      = device;
    p.device_phys = 0;
    p.device_virt = device;
    snprintf(p.name, sizeof(p.name), "%s%d", "MTL", device);
    if (n_devices > 1) {
        snprintf(p.desc, sizeof(p.desc), "metal-emu Apple7 (dev p0/v%d)", device);
    } else {
        snprintf(p.desc, sizeof(p.desc), "metal-emu Apple7");
    }

    const long pages = sysconf(_SC_PHYS_PAGES);
    const long psize = sysconf(_SC_PAGE_SIZE);
    const size_t mem = (pages > 0 && psize > 0) ? (size_t) pages*(size_t) psize : (size_t) 8 << 30;

    p.max_buffer_size            = mem/2;
    p.max_working_set_size       = mem/2;
    p.max_theadgroup_memory_size = 32768;

    p.has_simdgroup_reduction = true;
    p.has_simdgroup_mm        = true;
    p.has_unified_memory      = true;
#ifdef GGML_METAL_EMU_HAS_BF16
    p.has_bfloat              = true;  // -DGGML_METAL_EMU_BF16=ON: the bfloat kernels are translated
#else
    p.has_bfloat              = false; // bfloat kernels not translated (GGML_METAL_EMU_BF16=OFF)
#endif
    p.has_tensor              = false;
    p.use_residency_sets      = false;
    p.use_shared_buffers      = true;

    p.supports_gpu_family_apple7 = true;
    p.device_id  = GGML_METAL_DEVICE_GENERIC;
    p.gpu_family = 7;

    p.op_offload_min_batch_size = getenv("GGML_OP_OFFLOAD_MIN_BATCH") ? atoi(getenv("GGML_OP_OFFLOAD_MIN_BATCH")) : 32;

    {
        const char * val = getenv("GGML_METAL_FUSION_DEBUG");
        dev->finfo = ggml_metal_fusion_info_init(getenv("GGML_METAL_FUSION_DISABLE") == nullptr, val ? atoi(val) : 0);
    }

    dev->library = ggml_metal_library_init(dev);

    GGML_LOG_INFO("%s: GPU name:   %s (%s)\n", __func__, p.name, p.desc);

    return dev;
}

void ggml_metal_device_free(ggml_metal_device_t dev) {
    ggml_metal_fusion_info_free(dev->finfo);
    ggml_metal_library_free(dev->library);
    delete dev;
}

void * ggml_metal_device_get_obj  (ggml_metal_device_t dev) { return dev; }
void * ggml_metal_device_get_queue(ggml_metal_device_t dev) { return dev; }

ggml_metal_library_t ggml_metal_device_get_library(ggml_metal_device_t dev) {
    return dev->library;
}

void ggml_metal_device_rsets_add(ggml_metal_device_t dev, ggml_metal_rset_t rset) { GGML_UNUSED(dev); GGML_UNUSED(rset); }
void ggml_metal_device_rsets_rm (ggml_metal_device_t dev, ggml_metal_rset_t rset) { GGML_UNUSED(dev); GGML_UNUSED(rset); }
void ggml_metal_device_rsets_keep_alive(ggml_metal_device_t dev) { GGML_UNUSED(dev); }

void ggml_metal_event_encode_signal(ggml_metal_event_t ev, ggml_metal_cmd_buf_t cmd_buf) { GGML_UNUSED(ev); GGML_UNUSED(cmd_buf); }
void ggml_metal_event_encode_wait  (ggml_metal_event_t ev, ggml_metal_cmd_buf_t cmd_buf) { GGML_UNUSED(ev); GGML_UNUSED(cmd_buf); }

ggml_metal_event_t ggml_metal_device_event_init(ggml_metal_device_t dev) { GGML_UNUSED(dev); return new ggml_metal_event(); }
void ggml_metal_device_event_free(ggml_metal_device_t dev, ggml_metal_event_t ev) { GGML_UNUSED(dev); delete ev; }
void ggml_metal_device_event_synchronize(ggml_metal_device_t dev, ggml_metal_event_t ev) { GGML_UNUSED(dev); GGML_UNUSED(ev); }

void ggml_metal_device_get_memory(ggml_metal_device_t dev, size_t * free, size_t * total) {
    *total = dev->props.max_working_set_size;
    const long pages = sysconf(_SC_AVPHYS_PAGES);
    const long psize = sysconf(_SC_PAGE_SIZE);
    const size_t avail = (pages > 0 && psize > 0) ? (size_t) pages*(size_t) psize : *total;
    *free = std::min(*total, avail);
}

// the upstream ggml_metal_device_supports_op(), extracted from ggml-metal-device.m at build time
// (one source of truth for what the Metal backend claims), renamed to ..._upstream
#include "emu-supports-op.inc"

// FLASH_ATTN_EXT (K, V head sizes) that passed test-backend-ops on the emulator with f16 K/V (NOTES.md,
// "metal-emu: FLASH_ATTN_EXT (issue 4, session 2)")
static bool emu_fa_head_size_verified(int64_t dk, int64_t dv) {
    static const int64_t verified[][2] = {
        {  40,  40 }, {  64,  64 }, {  72,  72 }, {  80,  80 }, {  96,  64 }, {  96,  96 }, { 128, 128 },
        { 192, 128 }, { 192, 192 }, { 256, 256 }, { 320, 256 }, { 512, 512 }, { 576, 512 },
    };
    for (const auto & v : verified) {
        if (v[0] == dk && v[1] == dv) {
            return true;
        }
    }
    return false;
}

// ops verified on the emulator with test-backend-ops, and the kernel files they need; everything
// else is reported as unsupported (GGML_METAL_EMU_ALL_OPS=1 lifts the op list, not the file check)
static bool emu_op_files(const struct ggml_tensor * op, bool all_ops, const char ** files, int * n) {
    *n = 0;
    auto need = [&](const char * f) { files[(*n)++] = f; };
    switch (op->op) {
        case GGML_OP_NONE:
        case GGML_OP_RESHAPE:
        case GGML_OP_VIEW:
        case GGML_OP_TRANSPOSE:
        case GGML_OP_PERMUTE:
            return true;
        case GGML_OP_MUL_MAT:
        case GGML_OP_MUL_MAT_ID:
            need("mul_mv"); need("mul_mm");
            return true;
        case GGML_OP_GET_ROWS:
        case GGML_OP_SET_ROWS:
        case GGML_OP_CPY:
        case GGML_OP_DUP:
        case GGML_OP_CONT:
            need("quantize");
            return true;
        case GGML_OP_RMS_NORM:
        case GGML_OP_NORM:
            need("norm");
            return true;
        case GGML_OP_ROPE:
            need("rope");
            return true;
        case GGML_OP_SOFT_MAX:
            need("softmax");
            return true;
        case GGML_OP_ADD:
        case GGML_OP_SUB:
        case GGML_OP_MUL:
        case GGML_OP_DIV:
            need("binbcast");
            return true;
        case GGML_OP_SCALE:
        case GGML_OP_GLU:
            need("unary");
            return true;
        case GGML_OP_UNARY:
            need("unary");
            return all_ops || ggml_get_unary_op(op) == GGML_UNARY_OP_GELU || ggml_get_unary_op(op) == GGML_UNARY_OP_SILU;
        case GGML_OP_FLASH_ATTN_EXT:
            // verified with test-backend-ops (tests/test_metal_emu_ops.py): f16 K and V, the head sizes
            // of emu_fa_head_size_verified(); other K/V types (fa_<type> files) are not verified yet.
            // GGML_METAL_EMU_FA=0 reports FA unsupported (llama.cpp then runs attention unfused)
            if (!all_ops) {
                static const bool fa_off = getenv("GGML_METAL_EMU_FA") && strcmp(getenv("GGML_METAL_EMU_FA"), "0") == 0;
                if (fa_off || op->src[1]->type != GGML_TYPE_F16 || op->src[2]->type != GGML_TYPE_F16 ||
                    !emu_fa_head_size_verified(op->src[1]->ne[0], op->src[2]->ne[0])) {
                    return false;
                }
            }
            {
                static char fa[32][64];
                static char fa_vec[32][64];
                const int t = (int) op->src[1]->type % 32;
                snprintf(fa[t],     sizeof(fa[t]),     "fa_%s",     ggml_type_name(op->src[1]->type));
                snprintf(fa_vec[t], sizeof(fa_vec[t]), "fa_vec_%s", ggml_type_name(op->src[1]->type));
                need("fa_aux"); need(fa[t]); need(fa_vec[t]);
            }
            return true;
        default:
            return all_ops;
    }
}

bool ggml_metal_device_supports_op(ggml_metal_device_t dev, const struct ggml_tensor * op) {
    if (!ggml_metal_device_supports_op_upstream(dev, op)) {
        return false;
    }
    static const bool all_ops = getenv("GGML_METAL_EMU_ALL_OPS") != nullptr;
    const char * files[8];
    int n = 0;
    if (!emu_op_files(op, all_ops, files, &n)) {
        return false;
    }
    for (int i = 0; i < n; ++i) {
        if (!emu_have_file(files[i])) {
            return false;
        }
    }
    return true;
}

const struct ggml_metal_device_props * ggml_metal_device_get_props(ggml_metal_device_t dev) {
    return &dev->props;
}

struct ggml_metal_fusion_info * ggml_metal_device_get_fusion_info(ggml_metal_device_t dev) {
    return dev->finfo;
}

//
// buffers: host memory
//

struct ggml_metal_buffer {
    void * data;
    size_t size;
    bool   owned;
    ggml_metal_device_t dev;
};

ggml_metal_buffer_t ggml_metal_buffer_init(ggml_metal_device_t dev, size_t size, bool shared) {
    GGML_UNUSED(shared);
    const size_t page = (size_t) sysconf(_SC_PAGE_SIZE);
    size_t size_aligned = size;
    if (size_aligned % page != 0) {
        size_aligned += page - (size_aligned % page);
    }
    if (size_aligned == 0) {
        size_aligned = page;
    }
    void * data = nullptr;
    if (posix_memalign(&data, page, size_aligned) != 0) {
        GGML_LOG_ERROR("%s: metal-emu: failed to allocate buffer of %.2f MiB\n", __func__, size_aligned/1024.0/1024.0);
        return nullptr;
    }
    ggml_metal_buffer_t buf = new ggml_metal_buffer();
    buf->data  = data;
    buf->size  = size_aligned;
    buf->owned = true;
    buf->dev   = dev;
    // persistent dispatches buffer the plain stores to it per threadgroup (emu/PERSISTENT.md); mapped
    // host memory (model files) is not tracked
    emu_device_memory_register(data, size_aligned);
    return buf;
}

ggml_metal_buffer_t ggml_metal_buffer_map(ggml_metal_device_t dev, void * ptr, size_t size, size_t max_tensor_size) {
    GGML_UNUSED(max_tensor_size);
    ggml_metal_buffer_t buf = new ggml_metal_buffer();
    buf->data  = ptr;
    buf->size  = size;
    buf->owned = false;
    buf->dev   = dev;
    return buf;
}

void ggml_metal_buffer_free(ggml_metal_buffer_t buf) {
    if (buf->owned) {
        emu_device_memory_unregister(buf->data);
        free(buf->data);
    }
    delete buf;
}

void * ggml_metal_buffer_get_base(ggml_metal_buffer_t buf) { return buf->data; }
bool   ggml_metal_buffer_is_shared(ggml_metal_buffer_t buf) { GGML_UNUSED(buf); return true; }

void ggml_metal_buffer_memset_tensor(ggml_metal_buffer_t buf, struct ggml_tensor * tensor, uint8_t value, size_t offset, size_t size) {
    GGML_UNUSED(buf);
    memset((uint8_t *) tensor->data + offset, value, size);
}

void ggml_metal_buffer_set_tensor(ggml_metal_buffer_t buf, struct ggml_tensor * tensor, const void * data, size_t offset, size_t size) {
    GGML_UNUSED(buf);
    memcpy((uint8_t *) tensor->data + offset, data, size);
}

void ggml_metal_buffer_get_tensor(ggml_metal_buffer_t buf, const struct ggml_tensor * tensor, void * data, size_t offset, size_t size) {
    GGML_UNUSED(buf);
    memcpy(data, (const uint8_t *) tensor->data + offset, size);
}

bool ggml_metal_buffer_cpy_tensor(ggml_metal_buffer_t buf, const struct ggml_tensor * src, struct ggml_tensor * dst) {
    GGML_UNUSED(buf);
    memcpy(dst->data, src->data, ggml_nbytes(src));
    return true;
}

void ggml_metal_buffer_clear(ggml_metal_buffer_t buf, uint8_t value) {
    memset(buf->data, value, buf->size);
}

struct ggml_metal_buffer_id ggml_metal_buffer_get_id(ggml_metal_buffer_t buf, const struct ggml_tensor * t) {
    struct ggml_metal_buffer_id res = { nullptr, 0 };
    const int64_t tsize = ggml_nbytes(t);
    const uint8_t * base = (const uint8_t *) buf->data;
    const uint8_t * p    = (const uint8_t *) t->data;
    if (p >= base && p + tsize <= base + buf->size) {
        res.metal = buf->data;
        res.offs  = (size_t) (p - base);
        return res;
    }
    GGML_LOG_ERROR("%s: metal-emu: tensor '%s' is not inside its buffer\n", __func__, t->name);
    return res;
}

//
// backend context (ggml-metal-context.m)
//

struct ggml_metal {
    char name[128];

    ggml_metal_device_t  dev;
    ggml_metal_library_t lib;

    ggml_metal_event_t ev_cpy;

    bool use_concurrency;
    bool use_graph_optimize;
    int  debug_graph;

    struct ggml_metal_fusion_info * finfo;

    int n_cb;

    ggml_abort_callback abort_callback;
    void *              abort_callback_data;

    bool has_error;
};

ggml_metal_t ggml_metal_init(ggml_metal_device_t dev) {
    ggml_metal_t res = new ggml_metal();
    res->dev = dev;
    res->lib = ggml_metal_device_get_library(dev);
    if (res->lib == nullptr) {
        GGML_LOG_ERROR("%s: error: the metal-emu device has no kernel library\n", __func__);
        delete res;
        return nullptr;
    }
    res->ev_cpy = ggml_metal_device_event_init(dev);
    snprintf(res->name, sizeof(res->name), "%s", ggml_metal_device_get_props(dev)->name);
    res->use_concurrency    = getenv("GGML_METAL_CONCURRENCY_DISABLE") == nullptr;
    res->use_graph_optimize = getenv("GGML_METAL_GRAPH_OPTIMIZE_DISABLE") == nullptr;
    {
        const char * val = getenv("GGML_METAL_GRAPH_DEBUG");
        res->debug_graph = val ? atoi(val) : 0;
    }
    res->finfo = ggml_metal_device_get_fusion_info(dev);
    res->n_cb = 1;
    res->abort_callback = nullptr;
    res->abort_callback_data = nullptr;
    res->has_error = false;
    return res;
}

void ggml_metal_free(ggml_metal_t ctx) {
    ggml_metal_device_event_free(ctx->dev, ctx->ev_cpy);
    delete ctx;
}

const char * ggml_metal_get_name(ggml_metal_t ctx) {
    return ctx->name;
}

void ggml_metal_synchronize(ggml_metal_t ctx) {
    GGML_UNUSED(ctx); // every dispatch completes when it is encoded
}

static struct ggml_metal_buffer_id emu_get_buffer_id(const struct ggml_tensor * t) {
    ggml_backend_buffer_t buffer = t->view_src ? t->view_src->buffer : t->buffer;
    return ggml_metal_buffer_get_id((ggml_metal_buffer_t) buffer->context, t);
}

void ggml_metal_set_tensor_async(ggml_metal_t ctx, struct ggml_tensor * tensor, const void * data, size_t offset, size_t size) {
    GGML_UNUSED(ctx);
    struct ggml_metal_buffer_id bid = emu_get_buffer_id(tensor);
    if (bid.metal == nullptr) {
        GGML_ABORT("%s: failed to find buffer for tensor '%s'\n", __func__, tensor->name);
    }
    memcpy((uint8_t *) bid.metal + bid.offs + offset, data, size);
}

void ggml_metal_get_tensor_async(ggml_metal_t ctx, const struct ggml_tensor * tensor, void * data, size_t offset, size_t size) {
    GGML_UNUSED(ctx);
    struct ggml_metal_buffer_id bid = emu_get_buffer_id(tensor);
    if (bid.metal == nullptr) {
        GGML_ABORT("%s: failed to find buffer for tensor '%s'\n", __func__, tensor->name);
    }
    memcpy(data, (const uint8_t *) bid.metal + bid.offs + offset, size);
}

bool ggml_metal_cpy_tensor_async(ggml_metal_t ctx_src, ggml_metal_t ctx_dst, const struct ggml_tensor * src, struct ggml_tensor * dst) {
    GGML_UNUSED(ctx_src);
    GGML_UNUSED(ctx_dst);
    struct ggml_metal_buffer_id bs = emu_get_buffer_id(src);
    struct ggml_metal_buffer_id bd = emu_get_buffer_id(dst);
    if (bs.metal == nullptr || bd.metal == nullptr) {
        return false;
    }
    memcpy((uint8_t *) bd.metal + bd.offs, (const uint8_t *) bs.metal + bs.offs, ggml_nbytes(src));
    return true;
}

enum ggml_status ggml_metal_graph_compute(ggml_metal_t ctx, struct ggml_cgraph * gf) {
    if (ctx->has_error) {
        GGML_LOG_ERROR("%s: backend is in error state from a previous failure - recreate the backend to recover\n", __func__);
        return GGML_STATUS_FAILED;
    }
    if (gf->n_nodes == 0) {
        return GGML_STATUS_SUCCESS;
    }

    emu_cmd_buf cb = { ctx->dev, false };

    ggml_metal_op_t ctx_op = ggml_metal_op_init(
        ctx->dev,
        &cb,
        gf,
        ctx->finfo,
        0,
        gf->n_nodes,
        ctx->use_concurrency,
        false,
        ctx->debug_graph);

    for (int idx = 0; idx < ggml_metal_op_n_nodes(ctx_op); ++idx) {
        const int res = ggml_metal_op_encode(ctx_op, idx);
        if (res == 0) {
            break;
        }
        idx += res - 1;
        if (cb.error) {
            break;
        }
        if (ctx->abort_callback && ctx->abort_callback(ctx->abort_callback_data)) {
            ggml_metal_op_free(ctx_op);
            return GGML_STATUS_ABORTED;
        }
    }

    ggml_metal_op_free(ctx_op);

    if (cb.error) {
        ctx->has_error = true;
        return GGML_STATUS_FAILED;
    }
    return GGML_STATUS_SUCCESS;
}

void ggml_metal_graph_optimize(ggml_metal_t ctx, struct ggml_cgraph * gf) {
    if (ctx->use_graph_optimize) {
        ggml_graph_optimize(gf);
    }
}

void ggml_metal_event_record(ggml_metal_t ctx, ggml_metal_event_t ev) { GGML_UNUSED(ctx); GGML_UNUSED(ev); }
void ggml_metal_event_wait  (ggml_metal_t ctx, ggml_metal_event_t ev) { GGML_UNUSED(ctx); GGML_UNUSED(ev); }

ggml_metal_event_t ggml_metal_get_ev_cpy(ggml_metal_t ctx) {
    return ctx->ev_cpy;
}

void ggml_metal_set_n_cb(ggml_metal_t ctx, int n_cb) {
    ctx->n_cb = n_cb;
}

void ggml_metal_set_abort_callback(ggml_metal_t ctx, ggml_abort_callback abort_callback, void * user_data) {
    ctx->abort_callback      = abort_callback;
    ctx->abort_callback_data = user_data;
}

bool ggml_metal_supports_family(ggml_metal_t ctx, int family) {
    GGML_UNUSED(ctx);
    return family <= 7;
}

void ggml_metal_capture_next_compute(ggml_metal_t ctx) {
    GGML_UNUSED(ctx);
}
