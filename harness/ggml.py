"""ctypes bindings to a built ggml (libggml-base, libggml-cpu, libggml) for tests and tools.

Nothing is loaded at import time: ``GGML(build_dir)`` opens the shared libraries of one build
(llama.cpp builds them by default, BUILD_SHARED_LIBS=ON, into ``<build>/bin``) and gives

* type traits: ``type_size``, ``blck_size``, ``type_name``, ``row_size``, ``type_id(name)``,
  ``traits(type)`` (the ``struct ggml_type_traits`` of the pin, checked against the accessor
  functions by ``self_check()``), ``validate_row_data``;
* ``quantize(type, x, imatrix)`` through ``ggml_quantize_chunk`` and ``dequantize(type, data)``
  through the traits' ``to_float``;
* CPU-only ``vec_dot`` through ``ggml_get_type_traits_cpu`` (the kernel the CPU build selected);
* a small graph runner on any registered backend (``"CPU"``, and whatever else the build has, e.g.
  ``"MTL0"`` from the metal emulator or ``"CUDA0"``): ``mul_mat``, ``mul_mat_id``, ``get_rows``,
  ``cpy``, returning numpy arrays;
* ``gguf_load(path)``: the build's own GGUF loader, to check that a file loads.

Struct layouts follow the pinned headers (ggml/include/ggml.h, ggml-cpu.h, gguf.h).  Shapes are
given in ggml order (``ne0`` = contiguous dimension first); numpy arrays are the reverse
(C order), e.g. a weight matrix with ``ne = (K, M)`` is a numpy ``(M, K)`` array.
"""

from __future__ import annotations

import ctypes as C
import os
import sys
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .util import HarnessError

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_MAX_OP_PARAMS = 64
GGML_MAX_NAME = 64

# at the pin there are 43 types (FACTS.md); the STQ1_0 series adds one
PIN_TYPE_COUNT = 43


class GGMLError(HarnessError):
    """A ggml library, symbol or call failed."""


# ---------------------------------------------------------------------------------------------
# struct layouts (pinned headers)


class ggml_init_params(C.Structure):
    _fields_ = [("mem_size", C.c_size_t), ("mem_buffer", C.c_void_p), ("no_alloc", C.c_bool)]


class ggml_tensor(C.Structure):
    _fields_ = [
        ("type", C.c_int),
        ("buffer", C.c_void_p),
        ("ne", C.c_int64 * GGML_MAX_DIMS),
        ("nb", C.c_size_t * GGML_MAX_DIMS),
        ("op", C.c_int),
        ("op_params", C.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", C.c_int32),
        ("src", C.c_void_p * GGML_MAX_SRC),
        ("view_src", C.c_void_p),
        ("view_offs", C.c_size_t),
        ("data", C.c_void_p),
        ("name", C.c_char * GGML_MAX_NAME),
        ("extra", C.c_void_p),
        ("padding", C.c_char * 8),
    ]


_to_float_t = C.CFUNCTYPE(None, C.c_void_p, C.POINTER(C.c_float), C.c_int64)
_from_float_t = C.CFUNCTYPE(None, C.POINTER(C.c_float), C.c_void_p, C.c_int64)
# void (*)(int n, float * s, size_t bs, const void * x, size_t bx, const void * y, size_t by, int nrc)
_vec_dot_t = C.CFUNCTYPE(None, C.c_int, C.POINTER(C.c_float), C.c_size_t, C.c_void_p, C.c_size_t,
                         C.c_void_p, C.c_size_t, C.c_int)


class ggml_type_traits(C.Structure):
    _fields_ = [
        ("type_name", C.c_void_p),
        ("blck_size", C.c_int64),
        ("blck_size_interleave", C.c_int64),
        ("type_size", C.c_size_t),
        ("is_quantized", C.c_bool),
        ("to_float", C.c_void_p),
        ("from_float_ref", C.c_void_p),
    ]


class ggml_type_traits_cpu(C.Structure):
    _fields_ = [
        ("from_float", C.c_void_p),
        ("vec_dot", C.c_void_p),
        ("vec_dot_type", C.c_int),
        ("nrows", C.c_int64),
    ]


class gguf_init_params(C.Structure):
    _fields_ = [("no_alloc", C.c_bool), ("ctx", C.POINTER(C.c_void_p))]


P = C.c_void_p
_SIGS = {
    # ggml-base
    "ggml_type_size": (C.c_size_t, [C.c_int]),
    "ggml_blck_size": (C.c_int64, [C.c_int]),
    "ggml_type_name": (C.c_char_p, [C.c_int]),
    "ggml_row_size": (C.c_size_t, [C.c_int, C.c_int64]),
    "ggml_is_quantized": (C.c_bool, [C.c_int]),
    "ggml_get_type_traits": (C.POINTER(ggml_type_traits), [C.c_int]),
    "ggml_quantize_chunk": (C.c_size_t, [C.c_int, P, P, C.c_int64, C.c_int64, C.c_int64, P]),
    "ggml_quantize_requires_imatrix": (C.c_bool, [C.c_int]),
    "ggml_validate_row_data": (C.c_bool, [C.c_int, P, C.c_size_t]),
    "ggml_tensor_overhead": (C.c_size_t, []),
    "ggml_graph_overhead": (C.c_size_t, []),
    "ggml_init": (P, [ggml_init_params]),
    "ggml_free": (None, [P]),
    "ggml_new_tensor": (C.POINTER(ggml_tensor), [P, C.c_int, C.c_int, C.POINTER(C.c_int64)]),
    "ggml_set_name": (C.POINTER(ggml_tensor), [C.POINTER(ggml_tensor), C.c_char_p]),
    "ggml_get_name": (C.c_void_p, [C.POINTER(ggml_tensor)]),
    "ggml_get_data": (C.c_void_p, [C.POINTER(ggml_tensor)]),
    "ggml_get_tensor": (C.POINTER(ggml_tensor), [P, C.c_char_p]),
    "ggml_nbytes": (C.c_size_t, [C.POINTER(ggml_tensor)]),
    "ggml_mul_mat": (C.POINTER(ggml_tensor), [P, C.POINTER(ggml_tensor), C.POINTER(ggml_tensor)]),
    "ggml_mul_mat_id": (C.POINTER(ggml_tensor),
                        [P, C.POINTER(ggml_tensor), C.POINTER(ggml_tensor), C.POINTER(ggml_tensor)]),
    "ggml_get_rows": (C.POINTER(ggml_tensor), [P, C.POINTER(ggml_tensor), C.POINTER(ggml_tensor)]),
    "ggml_cpy": (C.POINTER(ggml_tensor), [P, C.POINTER(ggml_tensor), C.POINTER(ggml_tensor)]),
    "ggml_new_graph": (P, [P]),
    "ggml_build_forward_expand": (None, [P, C.POINTER(ggml_tensor)]),
    "gguf_init_from_file": (P, [C.c_char_p, gguf_init_params]),
    "gguf_free": (None, [P]),
    "gguf_get_n_tensors": (C.c_int64, [P]),
    "gguf_get_tensor_name": (C.c_char_p, [P, C.c_int64]),
    "gguf_get_tensor_type": (C.c_int, [P, C.c_int64]),
    "gguf_get_tensor_size": (C.c_size_t, [P, C.c_int64]),
    "gguf_get_tensor_offset": (C.c_size_t, [P, C.c_int64]),
    "gguf_get_data_offset": (C.c_size_t, [P]),
    "gguf_get_alignment": (C.c_size_t, [P]),
    # ggml (backend registry, alloc)
    "ggml_backend_load_all_from_path": (None, [C.c_char_p]),
    "ggml_backend_reg_by_name": (P, [C.c_char_p]),
    "ggml_backend_dev_count": (C.c_size_t, []),
    "ggml_backend_dev_get": (P, [C.c_size_t]),
    "ggml_backend_dev_name": (C.c_char_p, [P]),
    "ggml_backend_dev_description": (C.c_char_p, [P]),
    "ggml_backend_dev_by_name": (P, [C.c_char_p]),
    "ggml_backend_dev_init": (P, [P, C.c_char_p]),
    "ggml_backend_dev_backend_reg": (P, [P]),
    "ggml_backend_reg_get_proc_address": (P, [P, C.c_char_p]),
    "ggml_backend_free": (None, [P]),
    "ggml_backend_name": (C.c_char_p, [P]),
    "ggml_backend_supports_op": (C.c_bool, [P, C.POINTER(ggml_tensor)]),
    "ggml_backend_alloc_ctx_tensors": (P, [P, P]),
    "ggml_backend_buffer_free": (None, [P]),
    "ggml_backend_tensor_set": (None, [C.POINTER(ggml_tensor), P, C.c_size_t, C.c_size_t]),
    "ggml_backend_tensor_get": (None, [C.POINTER(ggml_tensor), P, C.c_size_t, C.c_size_t]),
    "ggml_backend_graph_compute": (C.c_int, [P, P]),
    "ggml_backend_synchronize": (None, [P]),
    # ggml-cpu
    "ggml_get_type_traits_cpu": (C.POINTER(ggml_type_traits_cpu), [C.c_int]),
    "ggml_cpu_init": (None, []),
    "ggml_cpu_has_avx2": (C.c_int, []),
    "ggml_backend_cpu_set_n_threads": (None, [P, C.c_int]),
}

_LIBS = ("ggml-base", "ggml", "ggml-cpu")


def _lib_filename(stem: str) -> str:
    if sys.platform == "darwin":
        return f"lib{stem}.dylib"
    if os.name == "nt":
        return f"{stem}.dll"
    return f"lib{stem}.so"


def find_libs(build_dir) -> dict[str, Path]:
    """Paths of libggml-base / libggml / libggml-cpu in a build dir (``bin/`` first, then
    ``lib/``, ``ggml/src/``).  Raises GGMLError naming what is missing and where it looked."""
    build = Path(build_dir)
    if not build.is_dir():
        raise GGMLError(f"{build}: build directory does not exist")
    dirs = [build / "bin", build / "lib", build / "ggml" / "src", build]
    out: dict[str, Path] = {}
    for stem in _LIBS:
        name = _lib_filename(stem)
        for d in dirs:
            if (d / name).exists():
                out[stem] = d / name
                break
        else:
            raise GGMLError(
                f"{build}: {name} not found in {', '.join(str(d) for d in dirs)}; build with "
                f"BUILD_SHARED_LIBS=ON (llama.cpp's default) and the ggml targets")
    return out


_GLOBAL_BUILD: list[Path] = []  # the build loaded into the default namespace (at most one)


class _DL:
    """dlmopen/dlsym from the C library, for loading a second build into its own link-map
    namespace (glibc only)."""

    LM_ID_NEWLM = -1
    RTLD_NOW = 2
    RTLD_DI_LMID = 1

    def __init__(self):
        libc = C.CDLL(None)
        self.dlmopen = libc.dlmopen
        self.dlmopen.restype, self.dlmopen.argtypes = C.c_void_p, [C.c_long, C.c_char_p, C.c_int]
        self.dlinfo = libc.dlinfo
        self.dlinfo.argtypes = [C.c_void_p, C.c_int, C.c_void_p]
        self.dlsym = libc.dlsym
        self.dlsym.restype, self.dlsym.argtypes = C.c_void_p, [C.c_void_p, C.c_char_p]
        self.dlerror = libc.dlerror
        self.dlerror.restype = C.c_char_p

    def load(self, paths: dict[str, Path]) -> dict[str, int]:
        handles, lmid = {}, self.LM_ID_NEWLM
        for stem in _LIBS:
            h = self.dlmopen(lmid, str(paths[stem]).encode(), self.RTLD_NOW)
            if not h:
                err = self.dlerror()
                raise GGMLError(f"{paths[stem]}: dlmopen failed: {err.decode() if err else 'unknown error'}")
            if lmid == self.LM_ID_NEWLM:
                ns = C.c_long()
                self.dlinfo(h, self.RTLD_DI_LMID, C.byref(ns))
                lmid = ns.value
            handles[stem] = h
        return handles


class GGML:
    """The ggml libraries of one build directory.

    Every build's libraries have the same sonames, so a second build in the same process cannot
    share the default namespace with the first (the loader would resolve its dependencies to the
    first build's libraries): the first build is loaded normally, any other one into a link-map
    namespace of its own with glibc's dlmopen (elsewhere: GGMLError, use a subprocess).  Several
    backends of one build (e.g. MTL0 and CPU of a metal-emu build) work side by side.
    """

    def __init__(self, build_dir, n_threads: int = 2):
        self.build_dir = Path(build_dir)
        self.paths = find_libs(self.build_dir)
        here = self.paths["ggml-base"].resolve()
        self.n_threads = n_threads
        self._cdll: dict[str, C.CDLL] = {}
        self._dl: _DL | None = None
        self._handles: dict[str, int] = {}
        if not _GLOBAL_BUILD or _GLOBAL_BUILD[0] == here:
            mode = getattr(C, "RTLD_GLOBAL", 0)
            for stem in _LIBS:  # base first: the others link against it
                try:
                    self._cdll[stem] = C.CDLL(str(self.paths[stem]), mode=mode)
                except OSError as e:
                    raise GGMLError(f"{self.paths[stem]}: cannot load: {e}") from None
            if not _GLOBAL_BUILD:
                _GLOBAL_BUILD.append(here)
        else:
            try:
                self._dl = _DL()
            except AttributeError:
                raise GGMLError(f"{self.build_dir}: this process already uses the ggml libraries of "
                                f"{_GLOBAL_BUILD[0].parent} and this platform has no dlmopen: "
                                f"use a subprocess for a second build") from None
            self._handles = self._dl.load(self.paths)
        self._fn = {}
        self._backends: dict[str, int] = {}
        self.cpu("ggml_cpu_init")()
        if not self.fn("ggml_backend_reg_by_name")(b"CPU"):
            # a build with GGML_BACKEND_DL: backends are modules beside the libraries
            self.fn("ggml_backend_load_all_from_path")(str(self.paths["ggml"].parent).encode())
        self._type_ids = None

    # -- symbols --------------------------------------------------------------------------

    def _lookup(self, name: str):
        """A ctypes function for ``name`` (default signature: returns int, untyped args)."""
        for stem in ("ggml-base", "ggml", "ggml-cpu"):
            if self._dl is None:
                try:
                    return getattr(self._cdll[stem], name)
                except AttributeError:
                    continue
            addr = self._dl.dlsym(self._handles[stem], name.encode())
            if addr:
                return C.CFUNCTYPE(C.c_int)(addr)
        return None

    def has_symbol(self, name: str) -> bool:
        return name in self._fn or self._lookup(name) is not None

    def fn(self, name: str):
        """The function ``name`` from this build, typed from the pinned headers where known."""
        f = self._fn.get(name)
        if f is not None:
            return f
        f = self._lookup(name)
        if f is None:
            raise GGMLError(f"symbol {name} not found in {', '.join(str(p) for p in self.paths.values())} "
                            f"(wrong build, or a patch missing?)")
        if name in _SIGS:
            f.restype, f.argtypes = _SIGS[name][0], _SIGS[name][1]
        self._fn[name] = f
        return f

    cpu = fn  # CPU-backend functions live in libggml-cpu; same lookup

    # -- types ------------------------------------------------------------------------------

    def type_count(self) -> int:
        """Number of ggml types in this build (the pin's 43, plus one with STQ1_0)."""
        return PIN_TYPE_COUNT + (1 if self.has_symbol("dequantize_row_stq1_0") else 0)

    def has_stq1_0(self) -> bool:
        return self.type_count() > 43

    def _check_type(self, t: int) -> int:
        t = int(t)
        if not 0 <= t < self.type_count():
            raise GGMLError(f"type id {t} is not a ggml type in {self.build_dir} (types 0..{self.type_count() - 1})")
        return t

    def type_name(self, t: int) -> str:
        return self.fn("ggml_type_name")(self._check_type(t)).decode()

    def type_id(self, name: str) -> int:
        if self._type_ids is None:
            self._type_ids = {self.type_name(i).lower(): i for i in range(self.type_count())}
        try:
            return self._type_ids[name.lower()]
        except KeyError:
            raise GGMLError(f"no ggml type named {name!r} in {self.build_dir}") from None

    def type_size(self, t: int) -> int:
        return int(self.fn("ggml_type_size")(self._check_type(t)))

    def blck_size(self, t: int) -> int:
        return int(self.fn("ggml_blck_size")(self._check_type(t)))

    def row_size(self, t: int, n: int) -> int:
        t = self._check_type(t)
        if n % self.blck_size(t):
            raise GGMLError(f"{n} elements are not whole {self.type_name(t)} blocks of {self.blck_size(t)}")
        return int(self.fn("ggml_row_size")(t, n))

    def is_quantized(self, t: int) -> bool:
        return bool(self.fn("ggml_is_quantized")(self._check_type(t)))

    def traits(self, t: int) -> ggml_type_traits:
        return self.fn("ggml_get_type_traits")(self._check_type(t)).contents

    def traits_cpu(self, t: int) -> ggml_type_traits_cpu:
        return self.fn("ggml_get_type_traits_cpu")(self._check_type(t)).contents

    def self_check(self) -> None:
        """Check the struct layouts against accessor functions; raises GGMLError on mismatch."""
        for t in range(self.type_count()):
            tr = self.traits(t)
            got = (C.string_at(tr.type_name).decode() if tr.type_name else None, tr.blck_size, tr.type_size)
            want = (self.type_name(t), self.blck_size(t), self.type_size(t))
            if got != want:
                raise GGMLError(f"struct ggml_type_traits layout mismatch for type {t}: struct {got}, accessors {want}")
            if bool(tr.is_quantized) != self.is_quantized(t):
                raise GGMLError(f"struct ggml_type_traits.is_quantized mismatch for type {t}")
        ctx = self._ctx(1 << 16, no_alloc=False)
        try:
            ne = (C.c_int64 * 4)(5, 3, 2, 1)
            tp = self.fn("ggml_new_tensor")(ctx, self.type_id("f32"), 4, ne)
            self.fn("ggml_set_name")(tp, b"self-check")
            t = tp.contents
            addr = C.addressof(t)
            if self.fn("ggml_get_name")(tp) != addr + ggml_tensor.name.offset or t.name != b"self-check":
                raise GGMLError("struct ggml_tensor layout mismatch (name)")
            if self.fn("ggml_get_data")(tp) != t.data or not t.data:
                raise GGMLError("struct ggml_tensor layout mismatch (data)")
            if list(t.ne) != [5, 3, 2, 1] or list(t.nb) != [4, 20, 60, 120] or self.fn("ggml_nbytes")(tp) != 120:
                raise GGMLError(f"struct ggml_tensor layout mismatch (ne {list(t.ne)}, nb {list(t.nb)})")
        finally:
            self.fn("ggml_free")(ctx)

    def validate_row_data(self, t: int, data) -> bool:
        buf = _as_bytes(data)
        return bool(self.fn("ggml_validate_row_data")(self._check_type(t), _ptr(buf), len(buf)))

    # -- quantize / dequantize ------------------------------------------------------------

    def quantize(self, t: int, x, imatrix=None) -> np.ndarray:
        """``ggml_quantize_chunk`` over all rows of ``x`` (..., n_per_row).  Returns uint8 of shape
        (..., row_size)."""
        t = self._check_type(t)
        x = np.ascontiguousarray(x, dtype=np.float32)
        n_per_row = x.shape[-1]
        nrows = x.size // n_per_row if n_per_row else 0
        rs = self.row_size(t, n_per_row)
        out = np.empty(x.shape[:-1] + (rs,), dtype=np.uint8)
        im = None
        if imatrix is not None:
            im = np.ascontiguousarray(imatrix, dtype=np.float32).reshape(-1)
            if im.size != n_per_row:
                raise GGMLError(f"imatrix has {im.size} values, rows have {n_per_row}")
        elif self.fn("ggml_quantize_requires_imatrix")(t):
            raise GGMLError(f"type {self.type_name(t)} requires an imatrix")
        n = self.fn("ggml_quantize_chunk")(t, _ptr(x), _ptr(out), 0, nrows, n_per_row,
                                             _ptr(im) if im is not None else None)
        if n != out.size:
            raise GGMLError(f"ggml_quantize_chunk({self.type_name(t)}) wrote {n} bytes, expected {out.size}")
        return out

    def dequantize(self, t: int, data, n: int | None = None) -> np.ndarray:
        """The type's ``to_float`` over ``data``: a flat float32 array of all its elements."""
        t = self._check_type(t)
        buf = _as_bytes(data)
        bs, ts = self.blck_size(t), self.type_size(t)
        if len(buf) % ts:
            raise GGMLError(f"{len(buf)} bytes are not whole {self.type_name(t)} blocks of {ts} bytes")
        k = len(buf) // ts * bs
        if n is not None and n != k:
            raise GGMLError(f"{len(buf)} bytes of {self.type_name(t)} hold {k} elements, not {n}")
        tr = self.traits(t)
        if not tr.to_float:
            raise GGMLError(f"type {self.type_name(t)} has no to_float")
        out = np.empty(k, dtype=np.float32)
        _to_float_t(tr.to_float)(_ptr(buf), out.ctypes.data_as(C.POINTER(C.c_float)), k)
        return out

    def from_float_cpu(self, t: int, x) -> np.ndarray:
        """The CPU backend's ``from_float`` of a type (e.g. Q8_K activations for vec_dot)."""
        t = self._check_type(t)
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        tr = self.traits_cpu(t)
        if not tr.from_float:
            raise GGMLError(f"type {self.type_name(t)} has no CPU from_float")
        out = np.empty(self.row_size(t, x.size), dtype=np.uint8)
        _from_float_t(tr.from_float)(x.ctypes.data_as(C.POINTER(C.c_float)), _ptr(out), x.size)
        return out

    def vec_dot(self, t: int, n: int, x_blocks, y_blocks) -> float:
        """The CPU backend's ``vec_dot`` for type ``t`` (one row of ``n`` elements of ``t``
        against one row of its ``vec_dot_type``)."""
        t = self._check_type(t)
        tr = self.traits_cpu(t)
        if not tr.vec_dot:
            raise GGMLError(f"type {self.type_name(t)} has no CPU vec_dot")
        xb, yb = _as_bytes(x_blocks), _as_bytes(y_blocks)
        if len(xb) != self.row_size(t, n) or len(yb) != self.row_size(tr.vec_dot_type, n):
            raise GGMLError(f"vec_dot({self.type_name(t)}, n={n}): wrong buffer sizes {len(xb)}, {len(yb)}")
        s = C.c_float(0)
        _vec_dot_t(tr.vec_dot)(n, C.byref(s), 0, _ptr(xb), 0, _ptr(yb), 0, 1)
        return s.value

    # -- gguf ---------------------------------------------------------------------------------

    def gguf_info(self, path) -> dict:
        """The build's GGUF loader on a file's header only (no data read): ``{"data_offset",
        "alignment", "tensors": [(name, type, offset, size), ...]}``."""
        params = gguf_init_params(True, None)
        g = self.fn("gguf_init_from_file")(str(path).encode(), params)
        if not g:
            raise GGMLError(f"{path}: gguf_init_from_file of {self.build_dir} refused the file")
        try:
            ts = []
            for i in range(self.fn("gguf_get_n_tensors")(g)):
                ts.append((self.fn("gguf_get_tensor_name")(g, i).decode(), self.fn("gguf_get_tensor_type")(g, i),
                           self.fn("gguf_get_tensor_offset")(g, i), self.fn("gguf_get_tensor_size")(g, i)))
            return {"data_offset": self.fn("gguf_get_data_offset")(g), "alignment": self.fn("gguf_get_alignment")(g),
                    "tensors": ts}
        finally:
            self.fn("gguf_free")(g)

    def gguf_load(self, path) -> dict[str, dict]:
        """Load a GGUF file with the build's loader (data read into a ggml context).  Returns
        ``{name: {"type", "ne", "data"}}``; raises GGMLError when the loader refuses the file."""
        ctxp = C.c_void_p(None)
        params = gguf_init_params(False, C.pointer(ctxp))
        g = self.fn("gguf_init_from_file")(str(path).encode(), params)
        if not g:
            raise GGMLError(f"{path}: gguf_init_from_file of {self.build_dir} refused the file "
                            f"(its log above says why)")
        try:
            out = {}
            for i in range(self.fn("gguf_get_n_tensors")(g)):
                name = self.fn("gguf_get_tensor_name")(g, i)
                tp = self.fn("ggml_get_tensor")(ctxp, name)
                t = tp.contents
                nbytes = self.fn("ggml_nbytes")(tp)
                out[name.decode()] = {"type": t.type, "ne": tuple(t.ne), "data": C.string_at(t.data, nbytes)}
            return out
        finally:
            self.fn("gguf_free")(g)
            if ctxp.value:
                self.fn("ggml_free")(ctxp)

    # -- backends and graphs -------------------------------------------------------------------

    def devices(self) -> list[tuple[str, str]]:
        """(name, description) of every registered backend device."""
        out = []
        for i in range(self.fn("ggml_backend_dev_count")()):
            d = self.fn("ggml_backend_dev_get")(i)
            out.append((self.fn("ggml_backend_dev_name")(d).decode(),
                        self.fn("ggml_backend_dev_description")(d).decode()))
        return out

    def backend(self, name: str = "CPU") -> int:
        """A backend for device ``name`` (kept and reused; freed by ``close()``)."""
        be = self._backends.get(name)
        if be:
            return be
        dev = self.fn("ggml_backend_dev_by_name")(name.encode())
        if not dev:
            have = ", ".join(n for n, _ in self.devices()) or "none"
            raise GGMLError(f"no backend device {name!r} in {self.build_dir} (devices: {have})")
        be = self.fn("ggml_backend_dev_init")(dev, None)
        if not be:
            raise GGMLError(f"backend device {name!r} failed to initialize")
        reg = self.fn("ggml_backend_dev_backend_reg")(dev)
        set_threads = self.fn("ggml_backend_reg_get_proc_address")(reg, b"ggml_backend_set_n_threads")
        if set_threads:
            C.CFUNCTYPE(None, C.c_void_p, C.c_int)(set_threads)(be, self.n_threads)
        self._backends[name] = be
        return be

    def is_cpu_backend(self, name: str) -> bool:
        return name.upper() == "CPU"

    def cpu_guard(self, op: str, *args) -> None:
        """The CPU backend reports support for every type and aborts (or crashes) on a quantized
        type it has no kernels for, e.g. in a build with only the type core of a new type.  A
        type the CPU backend knows has a CPU vec_dot; refuse the others here, with a message."""
        for a in args:
            if not a:
                continue
            t = a.contents.type
            if self.is_quantized(t) and not self.traits_cpu(t).vec_dot:
                raise GGMLError(f"the CPU backend of {self.build_dir} has no kernels for {self.type_name(t)} "
                                f"({op} would abort)")

    def close(self) -> None:
        for be in self._backends.values():
            self.fn("ggml_backend_free")(be)
        self._backends.clear()

    def _ctx(self, mem: int, no_alloc: bool):
        ctx = self.fn("ggml_init")(ggml_init_params(mem, None, no_alloc))
        if not ctx:
            raise GGMLError("ggml_init failed")
        return ctx

    def graph(self, backend: str = "CPU") -> "Graph":
        return Graph(self, backend)

    # convenience ops --------------------------------------------------------------------

    def mul_mat(self, wtype: int, w, k: int, m: int, x, backend: str = "CPU") -> np.ndarray:
        """``ggml_mul_mat`` of weights (``m`` rows of ``k`` elements of ``wtype``, raw bytes, or
        float32 when ``wtype`` is F32) with activations ``x`` (..., k) float32.  Returns (..., m)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, k)
        with self.graph(backend) as g:
            a = g.tensor(wtype, (k, m), w)
            b = g.tensor(self.type_id("f32"), (k, x2.shape[0]), x2)
            out = g.op("ggml_mul_mat", a, b)
            return g.compute(out).reshape(lead + (m,))

    def mul_mat_id(self, wtype: int, w, k: int, m: int, n_expert: int, x, ids, backend: str = "CPU") -> np.ndarray:
        """``ggml_mul_mat_id``: ``w`` holds ``n_expert`` matrices of ``m`` x ``k`` (raw bytes in
        expert-major order), ``x`` (n_tokens, n_x, k) with n_x 1 (shared) or n_used, ``ids``
        (n_tokens, n_used) expert indices.  Returns (n_tokens, n_used, m)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        n_tokens, n_used = ids.shape
        if x.ndim != 3 or x.shape[0] != n_tokens or x.shape[2] != k or x.shape[1] not in (1, n_used):
            raise GGMLError(f"mul_mat_id: x must be (n_tokens, 1 or n_used, k), got {x.shape}")
        if ids.size and (ids.min() < 0 or ids.max() >= n_expert):
            raise GGMLError("mul_mat_id: expert id out of range")
        with self.graph(backend) as g:
            a = g.tensor(wtype, (k, m, n_expert), w)
            b = g.tensor(self.type_id("f32"), (k, x.shape[1], n_tokens), x)
            i = g.tensor(self.type_id("i32"), (n_used, n_tokens), ids)
            out = g.op("ggml_mul_mat_id", a, b, i)
            return g.compute(out).reshape(n_tokens, n_used, m)

    def get_rows(self, wtype: int, w, k: int, n_rows: int, rows, backend: str = "CPU") -> np.ndarray:
        """``ggml_get_rows``: rows ``rows`` (int indices) of an ``n_rows`` x ``k`` matrix, as float32."""
        rows = np.ascontiguousarray(rows, dtype=np.int32).reshape(-1)
        with self.graph(backend) as g:
            a = g.tensor(wtype, (k, n_rows), w)
            i = g.tensor(self.type_id("i32"), (rows.size,), rows)
            out = g.op("ggml_get_rows", a, i)
            return g.compute(out).reshape(rows.size, k)

    def cpy(self, src_type: int, src, dst_type: int, k: int, n_rows: int, backend: str = "CPU") -> np.ndarray:
        """``ggml_cpy`` of an ``n_rows`` x ``k`` tensor from ``src_type`` to ``dst_type``.
        Returns float32 (n_rows, k) for F32 destinations, else the raw uint8 rows."""
        with self.graph(backend) as g:
            a = g.tensor(src_type, (k, n_rows), src)
            d = g.tensor(dst_type, (k, n_rows), None)
            out = g.op("ggml_cpy", a, d)
            r = g.compute(out)
            return r.reshape(n_rows, -1)


class ContextBuffer:
    """Owns a ggml context (``ctx``) and the backend buffer of its tensors (``buf``); frees both on
    close() or at the end of a ``with`` block."""

    lib: GGML
    ctx = None
    buf = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self.buf:
            self.lib.fn("ggml_backend_buffer_free")(self.buf)
            self.buf = None
        if self.ctx:
            self.lib.fn("ggml_free")(self.ctx)
            self.ctx = None


class Graph(ContextBuffer):
    """One ggml context + graph on one backend.  Use as a context manager::

        with lib.graph("CPU") as g:
            a = g.tensor(t, (k, m), data); b = g.tensor(f32, (k, n), x)
            y = g.compute(g.op("ggml_mul_mat", a, b))
    """

    def __init__(self, lib: GGML, backend: str):
        self.lib = lib
        self.backend_name = backend
        self.be = lib.backend(backend)
        self.ctx = lib._ctx(64 * lib.fn("ggml_tensor_overhead")() + lib.fn("ggml_graph_overhead")(), no_alloc=True)
        self.inputs: list[tuple] = []
        self.buf = None

    def tensor(self, t: int, ne: Sequence[int], data=None):
        """New tensor of type ``t`` and shape ``ne`` (ggml order); ``data`` (raw bytes or a numpy
        array of matching size) is uploaded before compute."""
        lib = self.lib
        ne = tuple(int(v) for v in ne)
        if not 1 <= len(ne) <= GGML_MAX_DIMS:
            raise GGMLError(f"tensor rank {len(ne)} not in 1..4")
        arr = (C.c_int64 * len(ne))(*ne)
        tp = lib.fn("ggml_new_tensor")(self.ctx, lib._check_type(t), len(ne), arr)
        if not tp:
            raise GGMLError("ggml_new_tensor failed")
        if data is not None:
            buf = _as_bytes(data)
            nbytes = lib.fn("ggml_nbytes")(tp)
            if len(buf) != nbytes:
                raise GGMLError(f"tensor {lib.type_name(t)} {ne} needs {nbytes} bytes, got {len(buf)}")
            self.inputs.append((tp, buf))
        return tp

    def op(self, name: str, *args):
        if self.lib.is_cpu_backend(self.backend_name):
            self.lib.cpu_guard(name, *args)
        tp = self.lib.fn(name)(self.ctx, *args)
        if not tp:
            raise GGMLError(f"{name} failed")
        return tp

    def supports(self, tp) -> bool:
        return bool(self.lib.fn("ggml_backend_supports_op")(self.be, tp))

    def compute(self, out) -> np.ndarray:
        lib = self.lib
        if not self.supports(out):
            srcs = [C.cast(p, C.POINTER(ggml_tensor)).contents for p in out.contents.src if p]
            kinds = ", ".join(f"{lib.type_name(s.type)} {list(s.ne)}" for s in srcs)
            raise GGMLError(f"backend {self.backend_name} does not support op {out.contents.op} on {kinds}")
        gf = lib.fn("ggml_new_graph")(self.ctx)
        lib.fn("ggml_build_forward_expand")(gf, out)
        self.buf = lib.fn("ggml_backend_alloc_ctx_tensors")(self.ctx, self.be)
        if not self.buf:
            raise GGMLError(f"backend {self.backend_name}: buffer allocation failed")
        for tp, buf in self.inputs:
            lib.fn("ggml_backend_tensor_set")(tp, _ptr(buf), 0, len(buf))
        st = lib.fn("ggml_backend_graph_compute")(self.be, gf)
        if st != 0:
            raise GGMLError(f"backend {self.backend_name}: graph compute failed with status {st}")
        lib.fn("ggml_backend_synchronize")(self.be)
        t = out.contents
        nbytes = lib.fn("ggml_nbytes")(out)
        dtype = {lib.type_id("f32"): np.float32, lib.type_id("i32"): np.int32}.get(t.type, np.uint8)
        res = np.empty(nbytes // np.dtype(dtype).itemsize, dtype=dtype)
        lib.fn("ggml_backend_tensor_get")(out, _ptr(res), 0, nbytes)
        return res


def _as_bytes(data):
    """A C-contiguous numpy view (or copy) of ``data`` for passing its pointer."""
    if data is None:
        raise GGMLError("no data")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return np.frombuffer(data, dtype=np.uint8)
    a = np.ascontiguousarray(data)
    return a.view(np.uint8).reshape(-1) if a.size else a.reshape(-1).view(np.uint8)


def _ptr(a):
    return None if a is None else C.c_void_p(a.ctypes.data)
