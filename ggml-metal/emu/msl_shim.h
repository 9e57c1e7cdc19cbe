// msl_shim.h - Metal Shading Language subset as C++ for the metal-emu kernel translation.
//
// Kernel sources are rewritten by msl2cpp.py and compiled by clang (>= 19: _Float16 and __bf16 on
// x86-64). Every GPU thread runs as a fiber (emu-runtime.cpp); SIMD-group operations and barriers
// are synchronisation points between the fibers of one SIMD group / threadgroup.
//
// Deliberately no <cmath>/<math.h>: their global float overloads would make the Metal math
// functions below ambiguous. Math goes through the __builtin_* functions.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>

#include "emu-runtime.h"

#define __METAL_VERSION__ 310
#define __METAL__ 1

// address spaces and qualifiers
#define device
#define thread
#define threadgroup
#define constant const
#define kernel
// MSL 3.2 coherent(device): device memory coherent across threadgroups (the emulator treats all
// device memory alike, PERSISTENT.md)
#define coherent(scope)

#define EMU_INL __attribute__((always_inline)) inline

#define FLT_MAX  3.40282347e+38f
#define FLT_MIN  1.17549435e-38f
#define INFINITY __builtin_inff()
#define NAN      __builtin_nanf("")
#define MAXHALF  65504.0f
#define HALF_MAX ((metal::half) 65504.0f)
#define M_PI_F   3.14159265358979323846f
#define M_LN2_F  0.693147180559945309417f

namespace metal {

typedef _Float16      half;
typedef __bf16        bfloat;
typedef unsigned char  uchar;
typedef unsigned short ushort;
typedef unsigned int   uint;
typedef unsigned long  ulong;

// vectors: element alignment unless EMU_STRICT_ALIGN (then natural alignment as on the GPU)
#if defined(EMU_STRICT_ALIGN)
#define EMU_VALIGN(T, N) aligned(sizeof(T) * ((N) == 3 ? 4 : (N)))
#else
#define EMU_VALIGN(T, N) aligned(sizeof(T))
#endif

#define EMU_VEC_TYPES(T, name) \
    typedef T name##2 __attribute__((ext_vector_type(2), EMU_VALIGN(T, 2))); \
    typedef T name##3 __attribute__((ext_vector_type(3), EMU_VALIGN(T, 3))); \
    typedef T name##4 __attribute__((ext_vector_type(4), EMU_VALIGN(T, 4))); \
    typedef T name##8 __attribute__((ext_vector_type(8), EMU_VALIGN(T, 8))); \
    typedef T name##16 __attribute__((ext_vector_type(16), EMU_VALIGN(T, 16)));

EMU_VEC_TYPES(float,   float)
EMU_VEC_TYPES(half,    half)
EMU_VEC_TYPES(bfloat,  bfloat)
EMU_VEC_TYPES(int,     int)
EMU_VEC_TYPES(uint,    uint)
EMU_VEC_TYPES(short,   short)
EMU_VEC_TYPES(ushort,  ushort)
EMU_VEC_TYPES(char,    char)
EMU_VEC_TYPES(uchar,   uchar)
EMU_VEC_TYPES(long,    long)
EMU_VEC_TYPES(ulong,   ulong)
EMU_VEC_TYPES(bool,    bool)

typedef float  packed_float2 __attribute__((ext_vector_type(2), aligned(4)));
typedef float  packed_float3 __attribute__((ext_vector_type(3), aligned(4)));
typedef float  packed_float4 __attribute__((ext_vector_type(4), aligned(4)));
typedef half   packed_half2  __attribute__((ext_vector_type(2), aligned(2)));
typedef half   packed_half4  __attribute__((ext_vector_type(4), aligned(2)));
typedef char   packed_char4  __attribute__((ext_vector_type(4), aligned(1)));
typedef uchar  packed_uchar4 __attribute__((ext_vector_type(4), aligned(1)));

template<typename T, int N> struct emu_vec_t { typedef T type __attribute__((ext_vector_type(N), aligned(sizeof(T)))); };
template<typename T, int N> using vec = typename emu_vec_t<T, N>::type;

// vector traits
template<typename T> concept is_vector_v = requires (T v) { __builtin_vectorelements(v); };

template<typename T> struct velem { typedef T type; static constexpr int n = 1; };
template<typename T> requires is_vector_v<T> struct velem<T> { typedef std::remove_cvref_t<decltype(T{}[0])> type; static constexpr int n = __builtin_vectorelements(T{}); };
template<typename T> using velem_t = typename velem<std::remove_cvref_t<T>>::type;
template<typename T> constexpr int vsize = velem<std::remove_cvref_t<T>>::n;

// matrices: C columns of R-vectors, m[c][r]
template<typename T, int C, int R = C>
struct matrix {
    typedef vec<T, R> col_t;
    col_t c[C];

    matrix() = default;
    EMU_INL explicit matrix(T v) { for (int i = 0; i < C; ++i) { c[i] = col_t(0); if (i < R) c[i][i] = v; } }
    template<typename... A> requires (sizeof...(A) == C && C > 1)
    EMU_INL matrix(const A &... cols) { int i = 0; ((c[i++] = __builtin_convertvector(cols, col_t)), ...); }
    template<typename U>
    EMU_INL matrix(const matrix<U, C, R> & m) {
        typedef float fcol_t __attribute__((ext_vector_type(R)));
        for (int i = 0; i < C; ++i) {
            if constexpr (std::is_same_v<U, __bf16> != std::is_same_v<T, __bf16>) {
                c[i] = __builtin_convertvector(__builtin_convertvector(m.c[i], fcol_t), col_t); // bf16: via f32 (clang 19 x86)
            } else {
                c[i] = __builtin_convertvector(m.c[i], col_t);
            }
        }
    }

    EMU_INL col_t & operator[](int i) { return c[i]; }
    EMU_INL const col_t & operator[](int i) const { return c[i]; }
};

template<typename T, int C, int R>
EMU_INL matrix<T, C, R> operator*(const matrix<T, C, R> & m, T s) { matrix<T, C, R> r; for (int i = 0; i < C; ++i) r.c[i] = m.c[i]*s; return r; }
template<typename T, int C, int R>
EMU_INL matrix<T, C, R> operator*(T s, const matrix<T, C, R> & m) { return m*s; }
template<typename T, int C, int R>
EMU_INL matrix<T, C, R> operator+(const matrix<T, C, R> & a, const matrix<T, C, R> & b) { matrix<T, C, R> r; for (int i = 0; i < C; ++i) r.c[i] = a.c[i] + b.c[i]; return r; }
// matrix * column vector
template<typename T, int C, int R>
EMU_INL vec<T, R> operator*(const matrix<T, C, R> & m, const vec<T, C> & v) { vec<T, R> r = 0; for (int i = 0; i < C; ++i) r += m.c[i]*v[i]; return r; }

#define EMU_MAT_TYPES(T, name) \
    typedef matrix<T, 2, 2> name##2x2; typedef matrix<T, 2, 3> name##2x3; typedef matrix<T, 2, 4> name##2x4; \
    typedef matrix<T, 3, 2> name##3x2; typedef matrix<T, 3, 3> name##3x3; typedef matrix<T, 3, 4> name##3x4; \
    typedef matrix<T, 4, 2> name##4x2; typedef matrix<T, 4, 3> name##4x3; typedef matrix<T, 4, 4> name##4x4;

EMU_MAT_TYPES(float,  float)
EMU_MAT_TYPES(half,   half)
EMU_MAT_TYPES(bfloat, bfloat)

template<typename T> struct is_matrix : std::false_type {};
template<typename T, int C, int R> struct is_matrix<matrix<T, C, R>> : std::true_type {};

// ---- conversions --------------------------------------------------------------------------
// emu_cvt<T>(x): what a C-style or functional cast to T means in MSL (element-wise for vectors
// and matrices, never a bit cast)
template<typename To, typename From>
EMU_INL To emu_cvt(const From & x) {
    typedef std::remove_cvref_t<From> F;
    if constexpr (is_matrix<To>::value) {
        return To(x);
    } else if constexpr (is_vector_v<To>) {
        if constexpr (is_vector_v<F>) {
            static_assert(vsize<To> == vsize<F>, "vector conversion between different sizes");
            if constexpr ((std::is_same_v<velem_t<F>, bfloat> && !std::is_same_v<velem_t<To>, float>) ||
                          (std::is_same_v<velem_t<To>, bfloat> && !std::is_same_v<velem_t<F>, float>)) {
                // clang 19's x86 backend cannot lower bf16 <-> f16/int vector conversions: go via f32
                typedef float emu_fv __attribute__((ext_vector_type(vsize<To>)));
                return __builtin_convertvector(__builtin_convertvector(x, emu_fv), To);
            } else {
                return __builtin_convertvector(x, To);
            }
        } else {
            return To((velem_t<To>) x);
        }
    } else if constexpr (std::is_enum_v<To> || std::is_arithmetic_v<To> || std::is_same_v<To, half> || std::is_same_v<To, bfloat>) {
        return (To) x;
    } else {
        return To(x);
    }
}

template<typename V, int I, typename A>
EMU_INL void emu_fill(V & v, int & i, const A & a) {
    typedef std::remove_cvref_t<A> F;
    if constexpr (is_vector_v<F>) {
        for (int k = 0; k < vsize<F>; ++k) v[i++] = (velem_t<V>) a[k];
    } else {
        v[i++] = (velem_t<V>) a;
    }
}

// emu_make<V>(a, b, ...): MSL vector/matrix constructor
template<typename V, typename... A>
EMU_INL V emu_make(const A &... a) {
    if constexpr (sizeof...(A) == 0) {
        return V{};
    } else if constexpr (sizeof...(A) == 1 && !is_matrix<V>::value) {
        return emu_cvt<V>(a...);
    } else if constexpr (is_matrix<V>::value || !is_vector_v<V>) {
        return V(a...);
    } else {
        V v; int i = 0;
        (emu_fill<V, 0>(v, i, a), ...);
        return v;
    }
}

template<typename To, typename From>
EMU_INL To as_type(const From & x) {
    static_assert(sizeof(To) == sizeof(From), "as_type: size mismatch");
    To r; __builtin_memcpy(&r, &x, sizeof(To)); return r;
}

// ---- math -------------------------------------------------------------------------------------
#define EMU_M1(name, fexpr) \
    EMU_INL float name(float x) { return fexpr; } \
    EMU_INL half  name(half x)  { float xf = (float) x; return (half) name(xf); } \
    template<typename V> requires is_vector_v<V> \
    EMU_INL V name(V v) { V r; for (int i = 0; i < vsize<V>; ++i) r[i] = name(v[i]); return r; }

#define EMU_M2(name, fexpr) \
    EMU_INL float name(float x, float y) { return fexpr; } \
    EMU_INL half  name(half x, half y) { return (half) name((float) x, (float) y); } \
    template<typename V> requires is_vector_v<V> \
    EMU_INL V name(V a, V b) { V r; for (int i = 0; i < vsize<V>; ++i) r[i] = name(a[i], b[i]); return r; } \
    template<typename V> requires is_vector_v<V> \
    EMU_INL V name(V a, velem_t<V> b) { V r; for (int i = 0; i < vsize<V>; ++i) r[i] = name(a[i], b); return r; }

EMU_M1(exp,   __builtin_expf(x))
EMU_M1(exp2,  __builtin_exp2f(x))
EMU_M1(log,   __builtin_logf(x))
EMU_M1(log2,  __builtin_log2f(x))
EMU_M1(log1p, __builtin_log1pf(x))
EMU_M1(sqrt,  __builtin_sqrtf(x))
EMU_M1(rsqrt, 1.0f/__builtin_sqrtf(x))
EMU_M1(tanh,  __builtin_tanhf(x))
EMU_M1(tan,   __builtin_tanf(x))
EMU_M1(sin,   __builtin_sinf(x))
EMU_M1(cos,   __builtin_cosf(x))
EMU_M1(sinh,  __builtin_sinhf(x))
EMU_M1(cosh,  __builtin_coshf(x))
EMU_M1(atan,  __builtin_atanf(x))
EMU_M1(asin,  __builtin_asinf(x))
EMU_M1(acos,  __builtin_acosf(x))
EMU_M1(erf,   __builtin_erff(x))
EMU_M1(fabs,  __builtin_fabsf(x))
EMU_M1(floor, __builtin_floorf(x))
EMU_M1(ceil,  __builtin_ceilf(x))
EMU_M1(round, __builtin_roundf(x))
EMU_M1(rint,  __builtin_rintf(x))
EMU_M1(trunc, __builtin_truncf(x))
EMU_M1(fract, x - __builtin_floorf(x))
EMU_M1(sign,  x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : (x == 0.0f ? 0.0f : x)))
EMU_M1(saturate, __builtin_fminf(__builtin_fmaxf(x, 0.0f), 1.0f))
EMU_M2(pow,   __builtin_powf(x, y))
EMU_M2(powr,  __builtin_powf(x, y))
EMU_M2(atan2, __builtin_atan2f(x, y))
EMU_M2(fmax,  __builtin_fmaxf(x, y))
EMU_M2(fmin,  __builtin_fminf(x, y))
EMU_M2(copysign, __builtin_copysignf(x, y))
EMU_M2(fmod,  __builtin_fmodf(x, y))
EMU_M2(step,  y < x ? 0.0f : 1.0f)
EMU_M2(ldexp_f, x * __builtin_exp2f(y))

EMU_INL float ldexp(float x, int e) { return __builtin_ldexpf(x, e); }
EMU_INL float sincos(float x, thread float & c) { c = __builtin_cosf(x); return __builtin_sinf(x); }
EMU_INL float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
EMU_INL half  fma(half a, half b, half c) { return (half) __builtin_fmaf(a, b, c); }
template<typename V> requires is_vector_v<V>
EMU_INL V fma(V a, V b, V c) { V r; for (int i = 0; i < vsize<V>; ++i) r[i] = fma(a[i], b[i], c[i]); return r; }

// mixed scalar/vector arguments: the scalar is converted to the vector's element type
#define EMU_MIXED2(name) \
    template<typename V, typename S> requires (is_vector_v<V> && !is_vector_v<S>) \
    EMU_INL V name(S a, V b) { return name(V((velem_t<V>) a), b); } \
    template<typename V, typename S> requires (is_vector_v<V> && !is_vector_v<S> && !std::is_same_v<S, velem_t<V>>) \
    EMU_INL V name(V a, S b) { return name(a, V((velem_t<V>) b)); } \
    template<typename A, typename B> requires (!is_vector_v<A> && !is_vector_v<B> && !std::is_same_v<A, B>) \
    EMU_INL float name(A a, B b) { return name((float) a, (float) b); }
EMU_MIXED2(fmax)
EMU_MIXED2(fmin)
EMU_MIXED2(pow)
EMU_MIXED2(step)

EMU_INL bool isnan(float x)    { return __builtin_isnan(x); }
EMU_INL bool isinf(float x)    { return __builtin_isinf(x); }
EMU_INL bool isfinite(float x) { return __builtin_isfinite(x); }
EMU_INL bool isnan(half x)     { return __builtin_isnan((float) x); }
EMU_INL bool isinf(half x)     { return __builtin_isinf((float) x); }
EMU_INL bool isfinite(half x)  { return __builtin_isfinite((float) x); }

namespace precise { using metal::tanh; using metal::exp; using metal::log; using metal::sqrt; using metal::rsqrt; using metal::sin; using metal::cos; using metal::pow; using metal::erf; using metal::exp2; }
namespace fast    { using metal::tanh; using metal::exp; using metal::log; using metal::sqrt; using metal::rsqrt; using metal::sin; using metal::cos; using metal::pow; using metal::erf; using metal::exp2; }

// min/max/clamp for scalars of mixed types and vectors
template<typename A, typename B> requires (!is_vector_v<A> && !is_vector_v<B>)
EMU_INL auto min(A a, B b) { typedef std::common_type_t<A, B> C; return (C) a < (C) b ? (C) a : (C) b; }
template<typename A, typename B> requires (!is_vector_v<A> && !is_vector_v<B>)
EMU_INL auto max(A a, B b) { typedef std::common_type_t<A, B> C; return (C) a > (C) b ? (C) a : (C) b; }
EMU_INL float min(float a, float b) { return __builtin_fminf(a, b); }
EMU_INL float max(float a, float b) { return __builtin_fmaxf(a, b); }
template<typename V> requires is_vector_v<V>
EMU_INL V min(V a, V b) { V r; for (int i = 0; i < vsize<V>; ++i) r[i] = min(a[i], b[i]); return r; }
template<typename V> requires is_vector_v<V>
EMU_INL V max(V a, V b) { V r; for (int i = 0; i < vsize<V>; ++i) r[i] = max(a[i], b[i]); return r; }
template<typename V> requires is_vector_v<V>
EMU_INL V min(V a, velem_t<V> b) { V r; for (int i = 0; i < vsize<V>; ++i) r[i] = min(a[i], b); return r; }
template<typename V> requires is_vector_v<V>
EMU_INL V max(V a, velem_t<V> b) { V r; for (int i = 0; i < vsize<V>; ++i) r[i] = max(a[i], b); return r; }
template<typename T, typename L, typename H>
EMU_INL T clamp(T x, L lo, H hi) { return min(max(x, lo), hi); }

template<typename T> requires (!is_vector_v<T>)
EMU_INL T abs(T x) { return x < (T) 0 ? (T) -x : x; }
template<typename V> requires is_vector_v<V>
EMU_INL V abs(V v) { V r; for (int i = 0; i < vsize<V>; ++i) r[i] = abs(v[i]); return r; }

template<typename V> requires is_vector_v<V>
EMU_INL velem_t<V> dot(V a, V b) { velem_t<V> s = 0; for (int i = 0; i < vsize<V>; ++i) s += a[i]*b[i]; return s; }
template<typename V> requires is_vector_v<V>
EMU_INL velem_t<V> length(V a) { return sqrt(dot(a, a)); }
template<typename V> requires is_vector_v<V>
EMU_INL V normalize(V a) { return a / length(a); }

template<typename T, typename M> requires (!is_vector_v<T>)
EMU_INL T select(T a, T b, M c) { return c ? b : a; }
template<typename V, typename M> requires is_vector_v<V>
EMU_INL V select(V a, V b, M c) {
    V r;
    for (int i = 0; i < vsize<V>; ++i) {
        bool ci;
        if constexpr (is_vector_v<M>) ci = c[i] != 0; else ci = c;
        r[i] = ci ? b[i] : a[i];
    }
    return r;
}
template<typename V> requires is_vector_v<V>
EMU_INL V mix(V a, V b, V t) { return a + (b - a)*t; }
EMU_INL float mix(float a, float b, float t) { return a + (b - a)*t; }

template<typename V> requires is_vector_v<V>
EMU_INL bool all(V v) { for (int i = 0; i < vsize<V>; ++i) if (!v[i]) return false; return true; }
template<typename V> requires is_vector_v<V>
EMU_INL bool any(V v) { for (int i = 0; i < vsize<V>; ++i) if (v[i]) return true; return false; }
EMU_INL bool all(bool b) { return b; }
EMU_INL bool any(bool b) { return b; }

template<typename T> EMU_INL T popcount(T x) { return (T) __builtin_popcountll((unsigned long long) (std::make_unsigned_t<T>) x); }
EMU_INL uint clz(uint x) { return x ? __builtin_clz(x) : 32; }
EMU_INL uint ctz(uint x) { return x ? __builtin_ctz(x) : 32; }

// ---- numeric limits ---------------------------------------------------------------------------
template<typename T> struct numeric_limits;
template<> struct numeric_limits<float> {
    static constexpr float max() { return 3.40282347e+38f; }
    static constexpr float lowest() { return -3.40282347e+38f; }
    static constexpr float min() { return 1.17549435e-38f; }
    static constexpr float infinity() { return __builtin_inff(); }
};
template<> struct numeric_limits<half> {
    static constexpr half max() { return (half) 65504.0f; }
    static constexpr half lowest() { return (half) -65504.0f; }
    static constexpr half infinity() { return (half) __builtin_inff(); }
};
template<> struct numeric_limits<int>  { static constexpr int max() { return 2147483647; } static constexpr int min() { return -2147483647 - 1; } static constexpr int lowest() { return -2147483647 - 1; } };
template<> struct numeric_limits<uint> { static constexpr uint max() { return 0xffffffffu; } static constexpr uint min() { return 0; } static constexpr uint lowest() { return 0; } };

using std::is_same;
using std::is_same_v;
using std::enable_if_t;
using std::conditional_t;

// ---- synchronisation --------------------------------------------------------------------------
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
EMU_INL mem_flags operator|(mem_flags a, mem_flags b) { return (mem_flags) ((int) a | (int) b); }

// threadgroup scope (the default, and what the two-argument form with thread_scope_threadgroup
// says); a device-scope fence is atomic_thread_fence's job
EMU_INL void threadgroup_barrier(mem_flags) { emu_tg_barrier(); }
enum thread_scope { thread_scope_thread = 0, thread_scope_simdgroup = 1, thread_scope_threadgroup = 2, thread_scope_device = 3 };
EMU_INL void threadgroup_barrier(mem_flags, thread_scope) { emu_tg_barrier(); }
EMU_INL void simdgroup_barrier(mem_flags)   { emu_simd_sync(); }

// ---- SIMD-group functions -----------------------------------------------------------------------
// every lane deposits its value; after the sync each lane reads the deposits of the active lanes.
template<typename T>
EMU_INL T * emu_simd_exchange(const T & v) {
    static_assert(sizeof(T) <= EMU_SIMD_SLOT_BYTES, "simd value too large");
    return (T *) emu_simd_exchange_raw(&v, sizeof(T));
}

template<typename T> EMU_INL T emu_zero() { return (T) 0; }

// value deposited by lane i (slots are EMU_SIMD_SLOT_BYTES apart)
template<typename T> EMU_INL T emu_slot(const T * s, int i) { T v; __builtin_memcpy(&v, (const char *) s + i*EMU_SIMD_SLOT_BYTES, sizeof(T)); return v; }

template<typename T>
EMU_INL T simd_sum(T v) {
    T * s = emu_simd_exchange(v);
    const uint32_t m = emu_simd_active_mask();
    T r = emu_zero<T>();
    for (int i = 0; i < 32; ++i) if (m & (1u << i)) r += emu_slot(s, i);
    return r;
}
#define EMU_SIMD_REDUCE(name, op) \
template<typename T> \
EMU_INL T name(T v) { \
    T * s = emu_simd_exchange(v); \
    const uint32_t m = emu_simd_active_mask(); \
    bool first = true; T r = v; \
    for (int i = 0; i < 32; ++i) if (m & (1u << i)) { T x = emu_slot(s, i); if (first) { r = x; first = false; } else { r = op; } } \
    return r; \
}
EMU_SIMD_REDUCE(simd_max, max(r, x))
EMU_SIMD_REDUCE(simd_min, min(r, x))
EMU_SIMD_REDUCE(simd_product, r*x)
EMU_SIMD_REDUCE(simd_and, r & x)
EMU_SIMD_REDUCE(simd_or, r | x)
EMU_SIMD_REDUCE(simd_xor, r ^ x)

template<typename T>
EMU_INL T emu_simd_read(T * s, int lane, const T & self) {
    if (lane < 0 || lane >= 32 || !(emu_simd_active_mask() & (1u << lane))) {
        return self; // reading an inactive lane is undefined on the GPU
    }
    return emu_slot(s, lane);
}

template<typename T> EMU_INL T simd_shuffle(T v, ushort lane)         { T * s = emu_simd_exchange(v); return emu_simd_read(s, lane, v); }
template<typename T> EMU_INL T simd_broadcast(T v, ushort lane)       { T * s = emu_simd_exchange(v); return emu_simd_read(s, lane, v); }
template<typename T> EMU_INL T simd_broadcast_first(T v)              { T * s = emu_simd_exchange(v); return emu_simd_read(s, __builtin_ctz(emu_simd_active_mask()), v); }
template<typename T> EMU_INL T simd_shuffle_down(T v, ushort d)       { T * s = emu_simd_exchange(v); int l = emu_lane() + d; return l < 32 ? emu_simd_read(s, l, v) : v; }
template<typename T> EMU_INL T simd_shuffle_up(T v, ushort d)         { T * s = emu_simd_exchange(v); int l = emu_lane() - d; return l >= 0 ? emu_simd_read(s, l, v) : v; }
template<typename T> EMU_INL T simd_shuffle_xor(T v, ushort m)        { T * s = emu_simd_exchange(v); return emu_simd_read(s, emu_lane() ^ m, v); }
template<typename T> EMU_INL T simd_shuffle_rotate_down(T v, ushort d){ T * s = emu_simd_exchange(v); return emu_simd_read(s, (emu_lane() + d) & 31, v); }

template<typename T>
EMU_INL T simd_prefix_exclusive_sum(T v) {
    T * s = emu_simd_exchange(v);
    const uint32_t m = emu_simd_active_mask();
    T r = emu_zero<T>();
    for (int i = 0; i < emu_lane(); ++i) if (m & (1u << i)) r += emu_slot(s, i);
    return r;
}
template<typename T>
EMU_INL T simd_prefix_inclusive_sum(T v) { return simd_prefix_exclusive_sum(v) + v; }

EMU_INL bool simd_all(bool b) { bool * s = emu_simd_exchange(b); const uint32_t m = emu_simd_active_mask(); for (int i = 0; i < 32; ++i) if ((m & (1u << i)) && !emu_slot(s, i)) return false; return true; }
EMU_INL bool simd_any(bool b) { bool * s = emu_simd_exchange(b); const uint32_t m = emu_simd_active_mask(); for (int i = 0; i < 32; ++i) if ((m & (1u << i)) &&  emu_slot(s, i)) return true;  return false; }
EMU_INL bool simd_is_first() { return emu_lane() == __builtin_ctz(emu_simd_active_mask()); }

// ---- simdgroup matrices -----------------------------------------------------------------------
// Every lane holds the whole 8x8 matrix; loads, stores and multiplies are SIMD-group collective
// operations: they synchronise the SIMD group, the multiply is computed once per SIMD group.
template<typename T, int R, int C>
struct simdgroup_matrix {
    T e[R*C]; // row-major: e[r*C + c]

    simdgroup_matrix() = default;
    EMU_INL explicit simdgroup_matrix(T v) { for (int i = 0; i < R*C; ++i) e[i] = (i/C == i%C) ? v : (T) 0; }
};

typedef simdgroup_matrix<float,  8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half,   8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

template<typename T, int R, int C = R>
EMU_INL simdgroup_matrix<T, R, C> make_filled_simdgroup_matrix(T v) {
    simdgroup_matrix<T, R, C> m; for (int i = 0; i < R*C; ++i) m.e[i] = v; return m;
}

template<typename T, typename P>
EMU_INL void simdgroup_load(thread simdgroup_matrix<T, 8, 8> & m, const P * src, ulong elements_per_row = 8, ulong2 origin = 0, bool transpose = false) {
    emu_simd_sync();
    src += origin.x + origin.y*elements_per_row;
    for (int r = 0; r < 8; ++r) {
        for (int c = 0; c < 8; ++c) {
            m.e[r*8 + c] = (T) (transpose ? src[c*elements_per_row + r] : src[r*elements_per_row + c]);
        }
    }
}

template<typename T, typename P>
EMU_INL void simdgroup_store(const thread simdgroup_matrix<T, 8, 8> & m, P * dst, ulong elements_per_row = 8, ulong2 origin = 0, bool transpose = false) {
    emu_simd_sync();
    if (emu_simd_leader()) {
        dst += origin.x + origin.y*elements_per_row;
        for (int r = 0; r < 8; ++r) {
            for (int c = 0; c < 8; ++c) {
                (transpose ? dst[c*elements_per_row + r] : dst[r*elements_per_row + c]) = (P) m.e[r*8 + c];
            }
        }
    }
}

// d = a*b + c, once per SIMD group (computed by the first lane to arrive, copied by the others)

template<typename T> constexpr int emu_mtype() { if constexpr (std::is_same_v<T, float>) return 0; else if constexpr (std::is_same_v<T, half>) return 1; else return 2; }

template<typename TD, typename TA, typename TB, typename TC>
EMU_INL void simdgroup_multiply_accumulate(thread simdgroup_matrix<TD, 8, 8> & d, const thread simdgroup_matrix<TA, 8, 8> & a,
                                           const thread simdgroup_matrix<TB, 8, 8> & b, const thread simdgroup_matrix<TC, 8, 8> & c) {
    float * res = (float *) emu_simd_collective_begin();
    if (res == nullptr) {
        res = (float *) emu_simd_collective_slot();
        emu_mma_f32(res, a.e, emu_mtype<TA>(), b.e, emu_mtype<TB>(), c.e, emu_mtype<TC>());
        emu_simd_collective_done();
    }
    for (int i = 0; i < 64; ++i) d.e[i] = (TD) res[i];
}

template<typename TD, typename TA, typename TB>
EMU_INL void simdgroup_multiply(thread simdgroup_matrix<TD, 8, 8> & d, const thread simdgroup_matrix<TA, 8, 8> & a, const thread simdgroup_matrix<TB, 8, 8> & b) {
    simdgroup_matrix<float, 8, 8> z = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    simdgroup_multiply_accumulate(d, a, b, z);
}

// ---- atomics ----------------------------------------------------------------------------------
// MSL atomic operations take memory_order_relaxed; fences take relaxed or seq_cst. On device memory
// every operation is a scheduling point of a persistent dispatch (emu_atomic_begin/end, PERSISTENT.md);
// the operations themselves are real atomics (pool dispatches run threadgroups on several threads).
enum memory_order { memory_order_relaxed = __ATOMIC_RELAXED, memory_order_seq_cst = __ATOMIC_SEQ_CST };

template<typename T> struct emu_atomic { T v; };
typedef emu_atomic<int>   atomic_int;
typedef emu_atomic<uint>  atomic_uint;
typedef emu_atomic<float> atomic_float;
typedef emu_atomic<bool>  atomic_bool;
template<typename T> using atomic = emu_atomic<T>;

template<typename A> struct emu_atomic_value;
template<typename T> struct emu_atomic_value<emu_atomic<T>> { typedef T type; };
template<typename A> using emu_av_t = typename emu_atomic_value<std::remove_cv_t<A>>::type;

// bit-level comparison (float atomics: -0.0f != 0.0f, a stored NaN is a change)
template<typename T> EMU_INL bool emu_same(T a, T b) { return __builtin_memcmp(&a, &b, sizeof(T)) == 0; }

template<typename A> EMU_INL emu_av_t<A> * emu_aptr(A * a) { return (emu_av_t<A> *) &((std::remove_cv_t<A> *) a)->v; }

// the __atomic_*_n builtins take integers only: floats go through the generic forms
template<typename T> EMU_INL T emu_aload(T * p) {
    if constexpr (std::is_integral_v<T>) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
    else { T r; __atomic_load(p, &r, __ATOMIC_RELAXED); return r; }
}
template<typename T> EMU_INL T emu_axchg(T * p, T v) {
    if constexpr (std::is_integral_v<T>) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
    else { T r; __atomic_exchange(p, &v, &r, __ATOMIC_RELAXED); return r; }
}
template<typename T> EMU_INL bool emu_acas(T * p, T * expected, T desired, bool weak) {
    if constexpr (std::is_integral_v<T>) { return __atomic_compare_exchange_n(p, expected, desired, weak, __ATOMIC_RELAXED, __ATOMIC_RELAXED); }
    else { return __atomic_compare_exchange(p, expected, &desired, weak, __ATOMIC_RELAXED, __ATOMIC_RELAXED); }
}

template<typename A> EMU_INL emu_av_t<A> atomic_load_explicit(A * a, memory_order) {
    typedef emu_av_t<A> T;
    T * p = emu_aptr(a);
    emu_atomic_begin(p);
    const T r = emu_aload(p);
    emu_atomic_end(p, sizeof(T), false);
    return r;
}
template<typename A, typename U> EMU_INL void atomic_store_explicit(A * a, U v, memory_order) {
    typedef emu_av_t<A> T;
    T * p = emu_aptr(a);
    emu_atomic_begin(p);
    const T old = emu_axchg(p, (T) v);
    emu_atomic_end(p, sizeof(T), !emu_same(old, (T) v));
}
template<typename A, typename U> EMU_INL emu_av_t<A> atomic_exchange_explicit(A * a, U v, memory_order) {
    typedef emu_av_t<A> T;
    T * p = emu_aptr(a);
    emu_atomic_begin(p);
    const T old = emu_axchg(p, (T) v);
    emu_atomic_end(p, sizeof(T), !emu_same(old, (T) v));
    return old;
}
template<typename A, typename U> EMU_INL bool atomic_compare_exchange_weak_explicit(A * a, thread emu_av_t<A> * expected, U desired, memory_order, memory_order) {
    typedef emu_av_t<A> T;
    T * p = emu_aptr(a);
    emu_atomic_begin(p);
    const T want = *expected;
    const bool ok = emu_acas(p, expected, (T) desired, false);
    emu_atomic_end(p, sizeof(T), ok && !emu_same(want, (T) desired));
    return ok;
}

// read-modify-write through a compare-exchange loop (works for float too)
template<typename A, typename F> EMU_INL emu_av_t<A> emu_atomic_rmw(A * a, F f) {
    typedef emu_av_t<A> T;
    T * p = emu_aptr(a);
    emu_atomic_begin(p);
    T old = emu_aload(p);
    T nv;
    do {
        nv = f(old);
    } while (!emu_acas(p, &old, nv, true));
    emu_atomic_end(p, sizeof(T), !emu_same(old, nv));
    return old;
}
template<typename A, typename U> EMU_INL emu_av_t<A> atomic_fetch_add_explicit(A * a, U v, memory_order) { return emu_atomic_rmw(a, [v](emu_av_t<A> x) { return (emu_av_t<A>) (x + (emu_av_t<A>) v); }); }
template<typename A, typename U> EMU_INL emu_av_t<A> atomic_fetch_sub_explicit(A * a, U v, memory_order) { return emu_atomic_rmw(a, [v](emu_av_t<A> x) { return (emu_av_t<A>) (x - (emu_av_t<A>) v); }); }
template<typename A, typename U> EMU_INL emu_av_t<A> atomic_fetch_and_explicit(A * a, U v, memory_order) { return emu_atomic_rmw(a, [v](emu_av_t<A> x) { return (emu_av_t<A>) (x & (emu_av_t<A>) v); }); }
template<typename A, typename U> EMU_INL emu_av_t<A> atomic_fetch_or_explicit (A * a, U v, memory_order) { return emu_atomic_rmw(a, [v](emu_av_t<A> x) { return (emu_av_t<A>) (x | (emu_av_t<A>) v); }); }
template<typename A, typename U> EMU_INL emu_av_t<A> atomic_fetch_xor_explicit(A * a, U v, memory_order) { return emu_atomic_rmw(a, [v](emu_av_t<A> x) { return (emu_av_t<A>) (x ^ (emu_av_t<A>) v); }); }
template<typename A, typename U> EMU_INL emu_av_t<A> atomic_fetch_max_explicit(A * a, U v, memory_order) { return emu_atomic_rmw(a, [v](emu_av_t<A> x) { return x < (emu_av_t<A>) v ? (emu_av_t<A>) v : x; }); }
template<typename A, typename U> EMU_INL emu_av_t<A> atomic_fetch_min_explicit(A * a, U v, memory_order) { return emu_atomic_rmw(a, [v](emu_av_t<A> x) { return (emu_av_t<A>) v < x ? (emu_av_t<A>) v : x; }); }

// atomic_thread_fence(mem_flags::mem_device, memory_order_seq_cst, thread_scope_device) publishes the
// threadgroup's plain device stores (MSL 3.2). A relaxed fence orders nothing, a threadgroup-scope
// fence nothing beyond the threadgroup: both are scheduling points only.
EMU_INL void atomic_thread_fence(mem_flags flags, memory_order order, thread_scope scope = thread_scope_device) {
    emu_device_fence(((int) flags & (int) mem_flags::mem_device) != 0 && order == memory_order_seq_cst && scope == thread_scope_device);
}

} // namespace metal

// half literals: 1.0h -> emu_h(1.0)
constexpr metal::half operator""_emu_h(long double v) { return (metal::half) v; }
constexpr metal::half operator""_emu_h(unsigned long long v) { return (metal::half) v; }

using namespace metal;

// ---- checked pointer casts ----------------------------------------------------------------------
// (device const uint32_t *) p  ->  emu_pcast<const uint32_t *>(p): reports a misaligned typed pointer
template<typename To, typename From>
EMU_INL To emu_pcast(From p) {
    if constexpr (std::is_pointer_v<To> && std::is_pointer_v<From>) {
        typedef std::remove_cv_t<std::remove_pointer_t<To>> E;
        if constexpr (!std::is_void_v<E>) {
#if defined(EMU_STRICT_ALIGN)
            constexpr size_t al = alignof(E) > 16 ? 16 : alignof(E);
#else
            // scalars and structs: natural alignment (a 2-mod-4 uint32 load is a real GPU bug);
            // vectors: element alignment (upstream kernels load char4 from 2-byte aligned q8_0 blocks)
            constexpr size_t al = alignof(metal::velem_t<E>) > 16 ? 16 : alignof(metal::velem_t<E>);
#endif
            if (__builtin_expect(((uintptr_t) p) % al != 0, 0)) {
                emu_report_misaligned((const void *) p, al, __PRETTY_FUNCTION__);
            }
        }
        return (To) p;
    } else {
        return (To) p;
    }
}

// threadgroup variables declared in a kernel body are shared by the whole threadgroup
template<typename T>
EMU_INL T * emu_tg_var(const void * key) {
    return (T *) emu_tg_alloc(key, sizeof(T), alignof(T) < 16 ? 16 : alignof(T));
}
