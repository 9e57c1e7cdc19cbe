"""Retag privately numbered STQ1_0 tensors (type id 42) to the upstream id 43.

Some Hy-MT "1.25bit" GGUFs store STQ1_0 tensors with type id 42, which upstream llama.cpp uses
for Q2_0, a different layout.  Only the layout tells them apart: a tensor of ``n`` elements takes
``n/256*42`` bytes as STQ1_0 and ``n/64*18`` bytes as Q2_0.  GGUF does not store byte sizes, so
the size available to a tensor is measured as the distance to the next tensor's data (or to the
end of the file), and a size "fits" when ``size <= available < size + alignment``.

The tool lists every type-42 tensor with its verdict (dry run, the default) and, with ``--write``,
rewrites only the 4-byte type fields of the tensors that fit STQ1_0 and not Q2_0.  A file in which
any type-42 tensor fits Q2_0 (a genuine or ambiguous Q2_0 file) is refused and never touched.

Exit status: 0 done (or nothing to do), 1 refused, 2 unreadable/corrupt/truncated input or
unusable arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import stq1_0
from .gguf_layout import GGUFFormatError, GGUFLayout, read_layout
from .util import HarnessError, fsync_dir

PRIVATE_ID = 42  # the id the private files use; upstream Q2_0 at the pin
STQ1_0_ID = stq1_0.TYPE_ID  # 43
# Q2_0 at the pin (ggml/src/ggml-common.h: QK2_0 = 64, block = fp16 d + 64/4 bytes)
Q2_0_BLOCK = 64
Q2_0_BYTES = 18

EXIT_OK, EXIT_REFUSED, EXIT_BAD_INPUT = 0, 1, 2


class RetagRefused(HarnessError):
    """The file holds (or may hold) genuine Q2_0 tensors: retagging would corrupt it."""


def _size(n: int, blck: int, nbytes: int) -> int | None:
    return n // blck * nbytes if n % blck == 0 else None


def _fits(size: int | None, avail: int, alignment: int) -> bool:
    return size is not None and size <= avail < size + alignment


def _other_type_size(type_id: int, n: int) -> int | None:
    """Byte size of a tensor of another type, where the type is known (for truncation checks)."""
    if type_id == STQ1_0_ID:
        return _size(n, stq1_0.QK, stq1_0.BLOCK_BYTES)
    try:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
        blck, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    except Exception:  # gguf missing, or a type id this gguf does not know
        return None
    return _size(n, blck, nbytes)


@dataclass
class Candidate:
    name: str
    dims: tuple[int, ...]
    n_elements: int
    type_field_offset: int
    data_offset: int
    available: int
    stq1_0_size: int | None
    q2_0_size: int | None
    verdict: str  # "stq1_0" | "q2_0" | "ambiguous" | "neither"

    def as_dict(self) -> dict:
        return dict(self.__dict__, dims=list(self.dims))


@dataclass
class Plan:
    path: Path
    layout: GGUFLayout
    candidates: list[Candidate] = field(default_factory=list)

    @property
    def to_retag(self) -> list[Candidate]:
        return [c for c in self.candidates if c.verdict == "stq1_0"]

    def refusal(self) -> str | None:
        bad = [c for c in self.candidates if c.verdict in ("q2_0", "ambiguous")]
        if not bad:
            return None
        c = bad[0]
        why = "fits Q2_0" if c.verdict == "q2_0" else "fits both Q2_0 and STQ1_0"
        return (f"{self.path}: refusing: tensor '{c.name}' (type 42, {c.n_elements} elements, "
                f"{c.available} bytes available at data offset {c.data_offset}) {why}; "
                f"{len(bad)} such tensor(s): this is (or may be) a genuine Q2_0 file and is left untouched")


def scan(path) -> Plan:
    """Read a GGUF file and classify its type-42 tensors.  Raises GGUFFormatError for unreadable,
    truncated or inconsistent files (including type-42 tensors that fit neither layout)."""
    layout = read_layout(path)
    avail = layout.extents()
    plan = Plan(Path(path), layout)
    for t in layout.by_offset():  # the first problem reported is the earliest in the file
        n = t.n_elements
        a = avail[t.name]
        if a < 0:
            raise GGUFFormatError(
                layout.path,
                f"truncated: tensor '{t.name}' data would start at byte {layout.data_start + t.offset}, past the end "
                f"of the file ({layout.file_size} bytes)", t.type_field_offset)
        if t.type_id != PRIVATE_ID:
            need = _other_type_size(t.type_id, n)
            if need is not None and need > a:
                raise GGUFFormatError(
                    layout.path,
                    f"truncated or corrupt: tensor '{t.name}' (type {t.type_id}, {n} elements) needs {need} bytes, "
                    f"{a} available at data offset {t.offset}", t.type_field_offset)
            continue
        s = _size(n, stq1_0.QK, stq1_0.BLOCK_BYTES)
        q = _size(n, Q2_0_BLOCK, Q2_0_BYTES)
        fs, fq = _fits(s, a, layout.alignment), _fits(q, a, layout.alignment)
        verdict = "ambiguous" if fs and fq else "stq1_0" if fs else "q2_0" if fq else "neither"
        c = Candidate(t.name, t.dims, n, t.type_field_offset, t.offset, a, s, q, verdict)
        if verdict == "neither":
            sizes = " or ".join(f"{v} as {k}" for k, v in (("STQ1_0", s), ("Q2_0", q)) if v is not None) \
                or "whole blocks of either layout"
            short = all(v is None or a < v for v in (s, q))
            what = "truncated" if short and layout.data_start + t.offset + a == layout.file_size else "corrupt"
            raise GGUFFormatError(
                layout.path,
                f"{what}: type-42 tensor '{t.name}' ({n} elements) has {a} bytes at data offset {t.offset}, "
                f"which fits neither layout (needs {sizes})", t.type_field_offset)
        plan.candidates.append(c)
    order = {t.name: i for i, t in enumerate(layout.tensors)}
    plan.candidates.sort(key=lambda c: order[c.name])
    return plan


def _verify_fields(f, plan: Plan, label) -> None:
    for c in plan.to_retag:
        f.seek(c.type_field_offset)
        got = f.read(4)
        if got != struct.pack("<I", PRIVATE_ID):
            raise HarnessError(f"{label}: type field of tensor '{c.name}' at byte {c.type_field_offset} is "
                               f"{got.hex()}, expected 42: the file changed since it was scanned; nothing written there")


def _patch(f, plan: Plan) -> None:
    new = struct.pack("<I", STQ1_0_ID)
    for c in plan.to_retag:
        f.seek(c.type_field_offset)
        f.write(new)
    f.flush()
    os.fsync(f.fileno())


def _atomic_copy(src: Path, dest: Path, edit=None) -> None:
    """Copy ``src`` to ``dest`` through a temp file beside ``dest``: optionally ``edit(f)`` the copy (opened
    r+b), fsync, rename over ``dest``, fsync the folder. On any failure the temp file is removed and
    ``dest`` is untouched."""
    dst_dir = dest.parent if str(dest.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dst_dir)
    os.close(fd)
    tmp = Path(tmp)
    try:
        shutil.copyfile(src, tmp)
        with open(tmp, "r+b") as f:
            if edit is not None:
                edit(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise
    fsync_dir(dst_dir)


def apply(plan: Plan, output=None, backup: bool = True, backup_path=None, force: bool = False) -> Path | None:
    """Rewrite the planned type fields.

    ``output``: write a retagged copy there (temp file in the same folder, fsync, rename; an
    existing file is replaced only with ``force``).  Otherwise patch in place, first writing a
    backup copy (``backup_path`` or ``FILE.bak``; never replaced) unless ``backup`` is False.
    Returns the backup path (in-place mode with backup) or None.
    """
    msg = plan.refusal()
    if msg:
        raise RetagRefused(msg)
    src = plan.path
    if output is not None:
        out = Path(output)
        if out.exists() and out.resolve() == src.resolve():
            raise HarnessError(f"{out}: --output is the input file; leave --output out to patch in place")
        if out.exists() and not force:
            raise HarnessError(f"{out}: exists; pass --force to replace it")

        def edit(f):
            _verify_fields(f, plan, src)
            _patch(f, plan)

        _atomic_copy(src, out, edit)
        return None
    bak = None
    if backup:
        bak = Path(backup_path) if backup_path else src.with_name(src.name + ".bak")
        if bak.exists():
            raise HarnessError(f"{bak}: backup file exists already; move it away or pass --backup-path")
        _atomic_copy(src, bak)
    with open(src, "r+b") as f:
        _verify_fields(f, plan, src)
        _patch(f, plan)
    return bak



def _report(plan: Plan) -> str:
    lines = [f"{plan.path}: GGUF v{plan.layout.version}, {len(plan.layout.tensors)} tensors, "
             f"alignment {plan.layout.alignment}, {len(plan.candidates)} typed 42"]
    ft = plan.layout.kv.get("general.file_type")
    if ft is not None:
        lines.append(f"  general.file_type = {ft} (left unchanged)")
    for c in plan.candidates:
        shape = "x".join(str(d) for d in c.dims)
        lines.append(f"  {c.verdict:9s} {c.name} [{shape}] type field @{c.type_field_offset}, "
                     f"{c.available} bytes available (STQ1_0 {c.stq1_0_size}, Q2_0 {c.q2_0_size})")
    return "\n".join(lines)


def build_parser(prog: str = "stq-metal retag") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Find tensors typed 42 whose byte sizes fit only STQ1_0 (n/256*42 bytes) in a GGUF file and "
                    "retag them to the upstream STQ1_0 id 43, rewriting only their 4-byte type fields. "
                    "Without --write this is a dry run that lists what would change. Files in which any type-42 "
                    "tensor fits Q2_0 (n/64*18 bytes) are refused and left byte-identical.",
        epilog="exit status: 0 done or nothing to do, 1 refused (Q2_0 or ambiguous), 2 bad/truncated input or arguments")
    p.add_argument("gguf", type=Path, help="the GGUF file to inspect (and, with --write, to retag)")
    p.add_argument("--write", action="store_true",
                   help="apply the change (default: dry run, only list what would change)")
    p.add_argument("--output", "-o", type=Path, metavar="FILE",
                   help="write the retagged file to FILE (copy to a temp file beside FILE, fsync, rename) and leave "
                        "the input untouched; without it --write patches the input in place")
    p.add_argument("--force", action="store_true", help="with --output: replace FILE if it exists")
    p.add_argument("--backup", action=argparse.BooleanOptionalAction, default=True,
                   help="in-place mode: first copy the input to the backup path (default on; --no-backup skips "
                        "it, e.g. for files too large to copy)")
    p.add_argument("--backup-path", type=Path, metavar="FILE",
                   help="where the in-place backup goes (default: GGUF.bak beside the input; never overwritten)")
    p.add_argument("--json", action="store_true", help="print the scan result as JSON instead of text")
    return p


def main(argv=None, prog: str = "stq-metal retag") -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        plan = scan(args.gguf)
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    refusal = plan.refusal()
    if args.json:
        print(json.dumps({"file": str(plan.path), "refused": refusal, "write": bool(args.write and not refusal),
                          "tensors": [c.as_dict() for c in plan.candidates]}, indent=1))
    else:
        print(_report(plan))
    if refusal:
        print(f"refused: {refusal}", file=sys.stderr)
        return EXIT_REFUSED
    todo = plan.to_retag
    if not todo:
        print(f"{plan.path}: no type-42 tensors to retag; nothing to do", file=sys.stderr)
        return EXIT_OK
    if not args.write:
        print(f"dry run: {len(todo)} tensor(s) would be retagged 42 -> {STQ1_0_ID}; pass --write to apply",
              file=sys.stderr)
        return EXIT_OK
    try:
        bak = apply(plan, output=args.output, backup=args.backup, backup_path=args.backup_path, force=args.force)
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as e:
        print(f"error: {e.filename or args.gguf}: {e.strerror}", file=sys.stderr)
        return EXIT_BAD_INPUT
    where = args.output if args.output else args.gguf
    extra = f" (backup: {bak})" if bak else ""
    print(f"retagged {len(todo)} tensor(s) 42 -> {STQ1_0_ID} in {where}{extra}", file=sys.stderr)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
