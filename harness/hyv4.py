"""Rewrite the metadata of an AngelSlim `hyv4` GGUF for the pinned llama.cpp's `hy_v4` loader.

AngelSlim's converter (Hy4-preview-GGUF) names the architecture `hyv4`; upstream llama.cpp
implements the same model family as `hy_v4` (src/models/hy-v4.cpp). The two dialects differ only
in metadata; every tensor name (output_hc_*, blk.N.hc_*, attn_gate, attn_sinks,
exp_probs_b.bias, indexer.*, the split attn_k_b / attn_v_b, the expert stacks) is the same:

| hyv4 (AngelSlim)                                  | hy_v4 (pinned loader)                          |
|---------------------------------------------------|------------------------------------------------|
| general.architecture = "hyv4"                     | "hy_v4"                                        |
| hyv4.<key>                                        | hy_v4.<key>                                    |
| hyv4.attention.indexer.is_full (u32/i32 0/1 array) | hy_v4.attention.indexer.types (bool array)    |

Why a rewrite tool and not a loader patch: the difference is a naming dialect, not a model
difference, and the loader resolves every key through the architecture's own name (LLM_KV), so
an alias would have to thread a second key prefix through the generic loader for one converter;
rewritten files also work with every other tool of the pin (llama-quantize, gguf-py) and
upstream llama.cpp without our series. The rewrite is cheap even for the 229 GB file: the data
section stays where it is, because the tool keeps the header exactly as long as before (a
`stq_metal.hyv4_padding` string key absorbs the difference) and rewrites only the header bytes,
after saving them to a backup file. A header that cannot be kept in place (it would grow past
the data section) is refused in place; `--output FILE` then writes a full copy through a temp file.

Every `hyv4.*` key must be one the hy_v4 loader reads (KNOWN); an unknown key, a required key
that is missing, or a malformed indexer schedule is an error naming the key and the file, and
nothing is written. Exit status: 0 done (or nothing to do), 1 refused, 2 unreadable input or bad
arguments.
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .gguf_layout import (GGUF_MAGIC, T_ARRAY, T_STRING, GGUFFormatError,
                          GGUFLayout, _align, pack_kv, read_layout)
from .util import HarnessError, atomic_write_bytes, fsync_dir

SRC_ARCH, DST_ARCH = "hyv4", "hy_v4"
SRC_INDEXER, DST_INDEXER = "attention.indexer.is_full", "attention.indexer.types"
PAD_KEY = "stq_metal.hyv4_padding"
# the smallest padding record: key, type, string length, empty string
PAD_MIN = 8 + len(PAD_KEY) + 4 + 8

# keys (after the architecture prefix) that the pinned hy_v4 loader reads: llama_model_base::load_hparams,
# llama_model_hy_v4::load_arch_hparams, the rope / expert-group options, plus vocab_size (written by the
# DeepSeek-V2 converter family, unread); REQUIRED ones are read without a default
REQUIRED = (
    "context_length", "embedding_length", "block_count", "attention.layer_norm_rms_epsilon",
    "attention.q_lora_rank", "attention.kv_lora_rank", "attention.key_length_mla", "attention.value_length_mla",
    "expert_feed_forward_length", "expert_shared_count", "hyper_connection.count", "hyper_connection.epsilon",
    "hyper_connection.magnitude",
)
KNOWN = frozenset(REQUIRED + (
    "vocab_size", "feed_forward_length", "leading_dense_block_count", "nextn_predict_layers",
    "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.value_length",
    "attention.key_length_swa", "attention.value_length_swa", "attention.causal",
    "attention.indexer.head_count", "attention.indexer.key_length", "attention.indexer.top_k", SRC_INDEXER,
    "rope.dimension_count", "rope.dimension_count_swa", "rope.freq_base", "rope.scaling.type",
    "rope.scaling.factor", "rope.scale_linear", "rope.scaling.original_context_length", "rope.scaling.finetuned",
    "rope.scaling.attn_factor", "rope.scaling.alpha", "rope.scaling.yarn_log_multiplier",
    "expert_count", "expert_used_count", "expert_group_count", "expert_group_used_count",
    "expert_weights_scale", "expert_weights_norm", "expert_gating_func", "swiglu_clamp_exp",
    "embedding_length_out", "pooling_type",
))
# tokenizer.ggml.pre values of the hyv4 dialect -> the pin's name (upstream's converter writes "hy_v4";
# "hyv4" is assumed for AngelSlim's, unverified)
PRE_ALIASES = {"hyv4": "hy_v4"}

EXIT_OK, EXIT_REFUSED, EXIT_BAD_INPUT = 0, 1, 2


class Hyv4Refused(HarnessError):
    """The file is not a hyv4 GGUF the tool understands; nothing was written."""


@dataclass
class Plan:
    path: Path
    layout: GGUFLayout
    records: list[bytes]                 # the new key/value records, in the file's order
    changes: list[str] = field(default_factory=list)
    header_end: int = 0                  # end of the tensor infos in the input
    in_place: bool = False
    new_header: bytes = b""              # the complete new header up to the data section (in place)


def _tensor_infos_end(lay: GGUFLayout) -> int:
    last = max(lay.tensors, key=lambda t: t.info_offset)
    return last.info_offset + 8 + len(last.name.encode()) + 4 + 8 * len(last.dims) + 4 + 8


def _indexer_types(path: Path, key: str, t: int, v) -> np.ndarray:
    if t != T_ARRAY or not isinstance(v, np.ndarray) or v.dtype.kind not in "iub":
        raise Hyv4Refused(f"{path}: {key} must be an integer array of 0/1 flags (one per layer)")
    if v.size and not np.isin(v, (0, 1)).all():
        raise Hyv4Refused(f"{path}: {key} holds values other than 0 and 1: {sorted(set(v.tolist()))[:8]}")
    return v.astype(bool)


def plan(path) -> Plan:
    """Check the file and compute the rewritten key/value records; raises Hyv4Refused / GGUFFormatError."""
    path = Path(path)
    lay = read_layout(path)
    arch = lay.kv.get("general.architecture")
    if arch != SRC_ARCH:
        raise Hyv4Refused(f"{path}: general.architecture is {arch!r}, not {SRC_ARCH!r}: nothing to rewrite")
    if not lay.tensors:
        raise Hyv4Refused(f"{path}: no tensors (a split part without tensors is not supported)")
    pre = SRC_ARCH + "."
    unknown = [k for k in lay.kv if k.startswith(pre) and k[len(pre):] not in KNOWN]
    if unknown:
        raise Hyv4Refused(f"{path}: key(s) the hy_v4 loader does not know: {', '.join(unknown)} "
                          "(unknown hyv4 dialect; nothing written)")
    missing = [pre + k for k in REQUIRED if pre + k not in lay.kv]
    if lay.kv.get(pre + "attention.indexer.top_k", 0):
        missing += [pre + k for k in ("attention.indexer.head_count", "attention.indexer.key_length", SRC_INDEXER)
                    if pre + k not in lay.kv]
    if missing:
        raise Hyv4Refused(f"{path}: required key(s) missing: {', '.join(missing)}")
    n_layer = int(lay.kv[pre + "block_count"])
    records, changes = [], []
    for k, v in lay.kv.items():
        t = lay.kv_types[k]
        if k == PAD_KEY:
            continue
        if k == "general.architecture":
            records.append(pack_kv(k, DST_ARCH, T_STRING))
            changes.append(f"general.architecture: {SRC_ARCH!r} -> {DST_ARCH!r}")
        elif k == pre + SRC_INDEXER:
            flags = _indexer_types(path, k, t, v)
            if flags.size != n_layer:
                raise Hyv4Refused(f"{path}: {k} has {flags.size} entries, block_count is {n_layer}")
            nk = f"{DST_ARCH}.{DST_INDEXER}"
            records.append(pack_kv(nk, flags, T_ARRAY))
            changes.append(f"{k} ({flags.size} x int) -> {nk} (bool array, {int(flags.sum())} full)")
        elif k.startswith(pre):
            nk = DST_ARCH + "." + k[len(pre):]
            records.append(pack_kv(nk, v, t))
            changes.append(f"{k} -> {nk}")
        elif k == "tokenizer.ggml.pre" and v in PRE_ALIASES:
            records.append(pack_kv(k, PRE_ALIASES[v], T_STRING))
            changes.append(f"tokenizer.ggml.pre: {v!r} -> {PRE_ALIASES[v]!r}")
        else:
            records.append(pack_kv(k, v, t))
    p = Plan(path, lay, records, changes, header_end=_tensor_infos_end(lay))
    _fit(p)
    return p


def _head(n_tensors: int, records: list[bytes]) -> bytes:
    return GGUF_MAGIC + struct.pack("<IQQ", 3, n_tensors, len(records)) + b"".join(records)


def _fit(p: Plan) -> None:
    """Decide in place (the new header ends exactly where the old data section starts) or copy."""
    lay = p.layout
    with open(p.path, "rb") as f:
        first_info = min(t.info_offset for t in lay.tensors)
        f.seek(first_info)
        infos = f.read(p.header_end - first_info)
    body = _head(len(lay.tensors), p.records)
    need = len(body) + len(infos)
    if need <= lay.data_start and _align(need, lay.alignment) == lay.data_start:
        p.in_place, p.new_header = True, body + infos + b"\0" * (lay.data_start - need)
        return
    if need + PAD_MIN <= lay.data_start:
        pad = lay.data_start - need - PAD_MIN
        body = _head(len(lay.tensors), p.records + [pack_kv(PAD_KEY, " " * pad, T_STRING)])
        p.in_place, p.new_header = True, body + infos
        assert len(p.new_header) == lay.data_start
        return
    p.in_place = False
    p.new_header = body + infos
    p.new_header += b"\0" * (_align(len(p.new_header), lay.alignment) - len(p.new_header))



def _copy_rewritten(p: Plan, dest: Path, chunk: int = 64 << 20) -> None:
    """New header + the input's data section into a temp file beside dest, fsync, rename."""
    lay = p.layout
    need = len(p.new_header) + lay.file_size - lay.data_start
    free = shutil.disk_usage(dest.parent).free
    if free < need:
        raise HarnessError(f"{dest.parent}: {free / 2**30:.1f} GiB free, the rewritten copy needs "
                           f"{need / 2**30:.1f} GiB; free space or pass --output on another disk")
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out, open(p.path, "rb") as src:
            out.write(p.new_header)
            src.seek(lay.data_start)
            while True:
                b = src.read(chunk)
                if not b:
                    break
                out.write(b)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(dest.parent)


def backup_path_for(path: Path) -> Path:
    return path.with_name(path.name + ".hyv4-header.bak")


def apply(p: Plan, output=None, backup_path=None, force: bool = False) -> tuple[Path, Path | None]:
    """Write the rewrite. Returns (the rewritten file, the header backup or None)."""
    src = p.path
    if output is None and not p.in_place:
        raise HarnessError(f"{src}: the rewritten header is longer than the old one ({len(p.new_header)} > "
                           f"{p.layout.data_start} bytes), so it cannot be rewritten in place; pass --output FILE "
                           "for a rewritten copy")
    if output is not None:
        out = Path(output)
        if out.exists():
            if out.resolve() == src.resolve():
                raise HarnessError(f"{out}: --output is the input file; leave --output out to rewrite in place")
            if not force:
                raise HarnessError(f"{out}: exists; pass --force to replace it")
        _copy_rewritten(p, out)
        return out, None
    bak = Path(backup_path) if backup_path else backup_path_for(src)
    if bak.exists():
        raise HarnessError(f"{bak}: a header backup exists already (an earlier rewrite?); move it away")
    with open(src, "rb") as f:
        old = f.read(p.layout.data_start)
    atomic_write_bytes(bak, old)
    with open(src, "r+b") as f:
        if f.read(len(old)) != old:
            raise HarnessError(f"{src}: the file changed since it was read; nothing written (backup {bak})")
        f.seek(0)
        f.write(p.new_header)
        f.flush()
        os.fsync(f.fileno())
    return src, bak


def restore(path, backup_path=None) -> Path:
    """Put the saved header back (undo an in-place rewrite)."""
    path = Path(path)
    bak = Path(backup_path) if backup_path else backup_path_for(path)
    old = bak.read_bytes()
    if not old.startswith(GGUF_MAGIC):
        raise HarnessError(f"{bak}: not a saved GGUF header")
    lay = read_layout(path)
    if lay.data_start != len(old):
        raise HarnessError(f"{path}: data section starts at {lay.data_start}, the backup {bak} holds "
                           f"{len(old)} header bytes: not this file's backup")
    with open(path, "r+b") as f:
        f.write(old)
        f.flush()
        os.fsync(f.fileno())
    return bak


def verify(p: Plan, path: Path) -> None:
    """The rewritten file: hy_v4, same tensors (names, shapes, types, data offsets), same data bytes start."""
    new = read_layout(path)
    if new.kv.get("general.architecture") != DST_ARCH:
        raise HarnessError(f"{path}: rewrite check failed: architecture is {new.kv.get('general.architecture')!r}")
    a = [(t.name, t.dims, t.type_id, t.offset) for t in p.layout.tensors]
    b = [(t.name, t.dims, t.type_id, t.offset) for t in new.tensors]
    if a != b:
        raise HarnessError(f"{path}: rewrite check failed: the tensor table differs from {p.path}'s")
    if new.file_size - new.data_start != p.layout.file_size - p.layout.data_start:
        raise HarnessError(f"{path}: rewrite check failed: the data section changed size")


def split_no(path) -> int:
    """gguf-split's 0-based part number of the file (0 for an unsplit file or a broken one)."""
    try:
        return int(read_layout(path).kv.get("split.no", 0))
    except GGUFFormatError:
        return 0


def build_parser(prog: str = "stq-metal hyv4") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog,
        description="Rewrite an AngelSlim hyv4 GGUF's metadata (architecture, hyv4.* keys, the indexer schedule) "
                    "for the pinned llama.cpp's hy_v4 loader. Tensor data is never touched. Without --write this "
                    "is a dry run listing the changes.",
        epilog="exit status: 0 done or nothing to do, 1 refused (not hyv4, unknown or missing keys), "
               "2 bad input or arguments")
    ap.add_argument("gguf", type=Path, help="the hyv4 GGUF file (split models: the first part, the only one "
                                            "with model metadata; later parts are left alone)")
    ap.add_argument("--write", action="store_true", help="apply the rewrite (default: dry run)")
    ap.add_argument("--output", "-o", type=Path, metavar="FILE",
                    help="write a rewritten copy to FILE (temp file beside it, fsync, rename) and leave the input "
                         "untouched; without it --write rewrites the header in place, after saving the old header "
                         "to GGUF.hyv4-header.bak")
    ap.add_argument("--force", action="store_true", help="with --output: replace FILE if it exists")
    ap.add_argument("--backup-path", type=Path, metavar="FILE",
                    help="where the in-place header backup goes (default GGUF.hyv4-header.bak; never overwritten)")
    ap.add_argument("--restore", action="store_true",
                    help="undo an in-place rewrite: write the saved header back (from --backup-path or the default)")
    return ap


def main(argv=None, prog: str = "stq-metal hyv4") -> int:
    args = build_parser(prog).parse_args(argv)
    if args.restore:
        try:
            bak = restore(args.gguf, args.backup_path)
        except (HarnessError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(f"{args.gguf}: header restored from {bak}", file=sys.stderr)
        return EXIT_OK
    try:
        p = plan(args.gguf)
    except Hyv4Refused as e:
        arch = None
        try:
            arch = read_layout(args.gguf).kv.get("general.architecture")
        except GGUFFormatError:
            pass
        if arch == DST_ARCH:
            print(f"{args.gguf}: already {DST_ARCH}; nothing to do", file=sys.stderr)
            return EXIT_OK
        if arch is None and split_no(args.gguf):
            print(f"{args.gguf}: split part {split_no(args.gguf) + 1} holds no model metadata (only the first "
                  "part does); nothing to do", file=sys.stderr)
            return EXIT_OK
        print(f"refused: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except (HarnessError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"{p.path}: {len(p.layout.tensors)} tensors, {len(p.changes)} metadata change(s); "
          f"{'header rewritten in place' if p.in_place and not args.output else 'full copy'}")
    for c in p.changes:
        print("  " + c)
    if not args.write:
        print("dry run: pass --write to apply", file=sys.stderr)
        return EXIT_OK
    try:
        out, bak = apply(p, args.output, args.backup_path, args.force)
        verify(p, out)
    except (HarnessError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"rewrote {out} for {DST_ARCH}" + (f" (old header saved to {bak}; undo: {prog} --restore {out})"
                                             if bak else ""), file=sys.stderr)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
