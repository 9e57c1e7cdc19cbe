// emu-kernel.h - glue between translated kernels and the runtime: argument binding + registration
#pragma once

#include "emu-runtime.h"

#include <type_traits>
#include <utility>

template<typename A>
__attribute__((always_inline)) inline A emu_get_arg(const emu_arg_desc & k) {
    typedef std::remove_cvref_t<A> T;
    if constexpr (std::is_reference_v<A>) {
        return *(std::remove_reference_t<A> *) emu_arg_ptr(k.kind, k.idx);
    } else if constexpr (std::is_pointer_v<T>) {
        return (T) emu_arg_ptr(k.kind, k.idx);
    } else {
        uint32_t v[3];
        emu_arg_u3(k.kind, v);
        if constexpr (metal::is_vector_v<T>) {
            T r;
            for (int i = 0; i < metal::vsize<T>; ++i) r[i] = (metal::velem_t<T>) v[i];
            return r;
        } else {
            return (T) v[0];
        }
    }
}

template<typename R, typename... A, size_t... I>
__attribute__((always_inline)) inline void emu_call_impl(R (*f)(A...), const emu_arg_desc * k, std::index_sequence<I...>) {
    f(emu_get_arg<A>(k[I])...);
}

template<typename R, typename... A>
inline void emu_call(R (*f)(A...), const emu_arg_desc * k) {
    emu_call_impl(f, k, std::index_sequence_for<A...>{});
}

struct emu_registrar {
    emu_registrar(const char * name, emu_kernel_fn fn, const char * file, bool coresident) { emu_register_kernel(name, fn, file, coresident); }
};
