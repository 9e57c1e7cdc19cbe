"""Minimal GGUF layout reader (and a writer for synthetic test files).

The PyPI ``gguf`` reader refuses tensor type ids it does not know (0.19.0 knows neither 42 nor
43), and the retag tool must look at files whose type ids are *wrong*, so this module parses the
container itself: the header, the key/value section (values are decoded, arrays of numbers kept
as numpy arrays), the tensor infos with the *file offset of each 4-byte type field*, the
alignment and the start of the data section.  It never interprets tensor data.

GGUF v2/v3, little endian only.  Every error names the file and the byte offset.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Mapping, Sequence

import numpy as np

from .util import HarnessError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
ALIGNMENT_KEY = "general.alignment"

# GGUF value types (gguf spec)
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY, \
    T_UINT64, T_INT64, T_FLOAT64 = range(13)

_SCALAR = {
    T_UINT8: "<B", T_INT8: "<b", T_UINT16: "<H", T_INT16: "<h", T_UINT32: "<I", T_INT32: "<i",
    T_FLOAT32: "<f", T_BOOL: "<?", T_UINT64: "<Q", T_INT64: "<q", T_FLOAT64: "<d",
}
_NP = {
    T_UINT8: "<u1", T_INT8: "<i1", T_UINT16: "<u2", T_INT16: "<i2", T_UINT32: "<u4", T_INT32: "<i4",
    T_FLOAT32: "<f4", T_BOOL: "<u1", T_UINT64: "<u8", T_INT64: "<i8", T_FLOAT64: "<f8",
}

# sanity limits against corrupt counts (a real file is far below these)
_MAX_STRING = 1 << 30
_MAX_DIMS = 8  # GGML_MAX_DIMS is 4; allow some slack, reject garbage


class GGUFFormatError(HarnessError):
    """The file is not a well-formed GGUF (truncated, corrupt, unsupported)."""

    def __init__(self, path, msg: str, offset: int | None = None):
        where = f" at byte {offset}" if offset is not None else ""
        super().__init__(f"{path}: {msg}{where}")
        self.path = path
        self.offset = offset


@dataclass
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # ne[0], ne[1], ... (ggml order, fastest first)
    type_id: int
    offset: int  # relative to the data section
    type_field_offset: int  # absolute file offset of the uint32 type field
    info_offset: int  # absolute file offset where this tensor info starts

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n


@dataclass
class GGUFLayout:
    path: Path
    version: int
    kv: dict[str, Any]
    tensors: list[TensorInfo]
    alignment: int
    data_start: int  # absolute offset of the data section
    file_size: int
    kv_types: dict[str, int] = field(default_factory=dict)

    def extents(self) -> dict[str, int]:
        """Bytes available to each tensor: distance to the next tensor's data (by offset), or to
        the end of the file for the last one; negative when the data would start past the end."""
        order = self.by_offset()
        data_len = self.file_size - self.data_start
        out: dict[str, int] = {}
        for i, t in enumerate(order):
            end = order[i + 1].offset if i + 1 < len(order) else data_len
            out[t.name] = min(end, data_len) - t.offset
        return out

    def by_offset(self) -> list[TensorInfo]:
        return sorted(self.tensors, key=lambda t: (t.offset, t.name))


class _Reader:
    """Sequential reader over a memory map of the file (never reads past its end)."""

    def __init__(self, buf, path, size: int):
        self.buf = buf
        self.path = path
        self.size = size
        self.pos = 0

    def read(self, n: int, what: str) -> bytes:
        at = self.pos
        if n < 0 or at + n > self.size:
            raise GGUFFormatError(self.path, f"truncated: {what} needs {n} bytes, file has {self.size - at} left", at)
        self.pos = at + n
        return self.buf[at:at + n]

    def scalar(self, t: int, what: str):
        fmt = _SCALAR[t]
        return struct.unpack(fmt, self.read(struct.calcsize(fmt), what))[0]

    def u32(self, what: str) -> int:
        return self.scalar(T_UINT32, what)

    def u64(self, what: str) -> int:
        return self.scalar(T_UINT64, what)

    def string(self, what: str) -> str:
        at = self.pos
        n = self.u64(f"length of {what}")
        if n > _MAX_STRING:
            raise GGUFFormatError(self.path, f"corrupt: {what} claims a length of {n} bytes", at)
        raw = self.read(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFFormatError(self.path, f"corrupt: {what} is not UTF-8 ({e})", at) from None

    def strings(self, n: int, what: str) -> list[str]:
        out = []
        buf, size, unpack = self.buf, self.size, struct.Struct("<Q").unpack_from
        pos = self.pos
        for i in range(n):
            if pos + 8 > size:
                self.pos = pos
                raise GGUFFormatError(self.path, f"truncated: length of {what}[{i}]", pos)
            ln = unpack(buf, pos)[0]
            if ln > _MAX_STRING or pos + 8 + ln > size:
                self.pos = pos
                raise GGUFFormatError(self.path, f"truncated or corrupt: {what}[{i}] of {ln} bytes", pos)
            raw = buf[pos + 8:pos + 8 + ln]
            try:
                out.append(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                raise GGUFFormatError(self.path, f"corrupt: {what}[{i}] is not UTF-8 ({e})", pos) from None
            pos += 8 + ln
        self.pos = pos
        return out

    def value(self, t: int, what: str):
        at = self.pos
        if t in _SCALAR:
            return self.scalar(t, what)
        if t == T_STRING:
            return self.string(what)
        if t == T_ARRAY:
            et = self.u32(f"element type of {what}")
            n = self.u64(f"element count of {what}")
            if et in _NP:
                itemsize = np.dtype(_NP[et]).itemsize
                if n * itemsize > self.size - self.pos:
                    raise GGUFFormatError(self.path, f"truncated: array {what} of {n} elements", at)
                a = np.frombuffer(self.read(n * itemsize, what), dtype=_NP[et])
                return a.astype(bool) if et == T_BOOL else a
            if et in (T_STRING, T_ARRAY):
                if n > self.size - self.pos:  # every element takes at least one byte
                    raise GGUFFormatError(self.path, f"corrupt: array {what} claims {n} elements", at)
                if et == T_STRING:
                    return self.strings(n, what)
                return [self.value(et, f"{what}[{i}]") for i in range(n)]
            raise GGUFFormatError(self.path, f"corrupt: array {what} has unknown element type {et}", at)
        raise GGUFFormatError(self.path, f"corrupt: {what} has unknown value type {t}", at)


def read_layout(path) -> GGUFLayout:
    """Parse the header, key/values and tensor infos of a GGUF file."""
    path = Path(path)
    try:
        size = path.stat().st_size
        f = open(path, "rb")
    except OSError as e:
        raise GGUFFormatError(path, f"cannot open: {e.strerror}") from None
    with f:
        if size == 0:
            raise GGUFFormatError(path, "not a GGUF file (empty)", 0)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _parse(_Reader(mm, path, size), path, size)


def _parse(r: _Reader, path: Path, size: int) -> GGUFLayout:
    magic = r.read(4, "magic")
    if magic != GGUF_MAGIC:
        raise GGUFFormatError(path, f"not a GGUF file (magic {magic!r})", 0)
    vraw = r.read(4, "version")
    version = struct.unpack("<I", vraw)[0]
    if version not in (2, 3):
        if struct.unpack(">I", vraw)[0] in (2, 3):
            raise GGUFFormatError(path, "big-endian GGUF files are not supported", 4)
        raise GGUFFormatError(path, f"unsupported GGUF version {version}", 4)
    n_tensors = r.u64("tensor count")
    n_kv = r.u64("key/value count")
    if n_tensors > size or n_kv > size:
        raise GGUFFormatError(path, f"corrupt: {n_tensors} tensors / {n_kv} key/values in a {size}-byte file", 8)
    kv: dict[str, Any] = {}
    kv_types: dict[str, int] = {}
    for i in range(n_kv):
        key = r.string(f"key #{i}")
        t = r.u32(f"value type of '{key}'")
        kv[key] = r.value(t, f"value of '{key}'")
        kv_types[key] = t
    tensors: list[TensorInfo] = []
    seen = set()
    for i in range(n_tensors):
        start = r.pos
        name = r.string(f"name of tensor #{i}")
        nd_at = r.pos
        nd = r.u32(f"dimension count of tensor '{name}'")
        if nd == 0 or nd > _MAX_DIMS:
            raise GGUFFormatError(path, f"corrupt: tensor '{name}' has {nd} dimensions", nd_at)
        dims = tuple(r.u64(f"dimension {j} of tensor '{name}'") for j in range(nd))
        tpos = r.pos
        type_id = r.u32(f"type of tensor '{name}'")
        off = r.u64(f"data offset of tensor '{name}'")
        if name in seen:
            raise GGUFFormatError(path, f"corrupt: duplicate tensor name '{name}'", start)
        seen.add(name)
        tensors.append(TensorInfo(name, dims, type_id, off, tpos, start))
    alignment = kv.get(ALIGNMENT_KEY, DEFAULT_ALIGNMENT)
    if isinstance(alignment, np.ndarray) or not isinstance(alignment, (int, np.integer)) \
            or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFFormatError(path, f"corrupt: {ALIGNMENT_KEY} = {alignment!r} is not a power of two")
    alignment = int(alignment)
    data_start = _align(r.pos, alignment)
    if data_start > size:
        raise GGUFFormatError(path, f"truncated: data section would start at {data_start}", r.pos)
    for t in tensors:
        if t.offset % alignment:
            raise GGUFFormatError(
                path, f"corrupt: tensor '{t.name}' data offset {t.offset} is not a multiple of the alignment {alignment}",
                t.type_field_offset + 4)
    return GGUFLayout(path, version, kv, tensors, alignment, data_start, size, kv_types)


def _align(x: int, a: int) -> int:
    return (x + a - 1) // a * a


# ---------------------------------------------------------------------------------------------
# writer (for synthetic files in tests and tools; raw type ids, no knowledge of the types)


def _pack_string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


# numpy dtype (without byte order) -> GGUF array element type, for arrays read by this module
_NP_ARRAY = {"u1": T_UINT8, "i1": T_INT8, "u2": T_UINT16, "i2": T_INT16, "u4": T_UINT32, "i4": T_INT32,
             "f4": T_FLOAT32, "b1": T_BOOL, "u8": T_UINT64, "i8": T_INT64, "f8": T_FLOAT64}


def pack_typed(t: int, v) -> bytes:
    """The bytes of value `v` stored with GGUF value type `t` (as read: kv_types[key], kv[key])."""
    if t in _SCALAR:
        return struct.pack(_SCALAR[t], v)
    got, b = _pack_value(v)
    if got != t:
        raise TypeError(f"value {v!r} packs as GGUF type {got}, not {t}")
    return b


def pack_kv(key: str, v, t: int | None = None) -> bytes:
    """One key/value record: key, value type, value (type inferred from `v` unless given)."""
    if t is None:
        t, b = _pack_value(v)
    else:
        b = pack_typed(t, v)
    return _pack_string(key) + struct.pack("<I", t) + b


def _pack_value(v) -> tuple[int, bytes]:
    if isinstance(v, bool):
        return T_BOOL, struct.pack("<?", v)
    if isinstance(v, int):
        if 0 <= v < 1 << 32:
            return T_UINT32, struct.pack("<I", v)
        if -(1 << 31) <= v < 0:
            return T_INT32, struct.pack("<i", v)
        return (T_UINT64, struct.pack("<Q", v)) if v >= 0 else (T_INT64, struct.pack("<q", v))
    if isinstance(v, float):
        return T_FLOAT32, struct.pack("<f", v)
    if isinstance(v, str):
        return T_STRING, _pack_string(v)
    if isinstance(v, np.ndarray):
        if v.ndim != 1 or v.dtype.str.lstrip("<|=") not in _NP_ARRAY:
            raise TypeError(f"cannot store a numpy array of shape {v.shape} and dtype {v.dtype} in GGUF")
        et = _NP_ARRAY[v.dtype.str.lstrip("<|=")]
        return T_ARRAY, struct.pack("<IQ", et, len(v)) + np.ascontiguousarray(v, dtype=_NP[et]).tobytes()
    if isinstance(v, (list, tuple)):
        if v and all(isinstance(e, bool) for e in v):
            return T_ARRAY, struct.pack("<IQ", T_BOOL, len(v)) + bytes(int(e) for e in v)
        if all(isinstance(e, str) for e in v):
            return T_ARRAY, struct.pack("<IQ", T_STRING, len(v)) + b"".join(_pack_string(e) for e in v)
        if all(isinstance(e, int) and not isinstance(e, bool) for e in v):
            return T_ARRAY, struct.pack("<IQ", T_INT32, len(v)) + struct.pack(f"<{len(v)}i", *v)
        if all(isinstance(e, float) for e in v):
            return T_ARRAY, struct.pack("<IQ", T_FLOAT32, len(v)) + struct.pack(f"<{len(v)}f", *v)
    raise TypeError(f"cannot store {type(v).__name__} value {v!r} in GGUF")


@dataclass
class RawTensor:
    name: str
    dims: Sequence[int]  # ggml order
    type_id: int
    data: bytes


def write_gguf(path, kv: Mapping[str, Any], tensors: Iterable[RawTensor], alignment: int = DEFAULT_ALIGNMENT,
               pad_last: bool = True, kv_types: Mapping[str, int] | None = None) -> None:
    """Write a GGUF v3 file with raw tensor bytes and raw type ids (the caller is responsible for
    the data sizes matching the types).  Value types are inferred from the values unless
    `kv_types` names them.  Writes through a temp file + rename."""
    tensors = list(tensors)
    kv = dict(kv)
    kv_types = kv_types or {}
    if alignment != DEFAULT_ALIGNMENT:
        kv[ALIGNMENT_KEY] = alignment
    head = bytearray(GGUF_MAGIC + struct.pack("<IQQ", 3, len(tensors), len(kv)))
    for k, v in kv.items():
        head += pack_kv(k, v, kv_types.get(k))
    off = 0
    offsets = []
    for t in tensors:
        offsets.append(off)
        off = _align(off + len(t.data), alignment)
    for t, o in zip(tensors, offsets):
        head += _pack_string(t.name) + struct.pack("<I", len(t.dims))
        head += struct.pack(f"<{len(t.dims)}Q", *t.dims) + struct.pack("<IQ", t.type_id, o)
    head += b"\0" * (_align(len(head), alignment) - len(head))
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(head)
        for i, t in enumerate(tensors):
            f.write(t.data)
            if pad_last or i + 1 < len(tensors):
                f.write(b"\0" * (_align(len(t.data), alignment) - len(t.data)))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
