"""`stq-metal model pull NAME | REPO FILE`: download model files from the Hugging Face hub.

Through the huggingface-hub client (HF_ENDPOINT and HF_TOKEN are honoured as the client reads
them): the repository's file list with sizes and sha256 (`model_info(files_metadata=True)`)
selects the files (a preset's glob pattern, or FILE: an exact name or a glob, so split GGUF parts
come as a set); a disk-space preflight compares what is still to download with the free space;
`hf_hub_download(local_dir=...)` downloads with a progress bar and resumes an interrupted
transfer from its `.incomplete` file on the next run; every finished file is checked against the
hub's size and LFS sha256 and moved aside (never left under the real name) when it differs.
A GGUF that arrives with private type-42 STQ1_0 tensors gets the `stq-metal retag` command
printed (applied with --retag); one with the `hyv4` architecture gets `stq-metal hyv4`'s.

Exit status: 0 done, 1 download / verification / space error, 2 bad arguments or unknown preset.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from . import config
from .util import HarnessError, say, sha256_file

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
SPACE_MARGIN = 64 << 20  # bytes kept free beyond the files themselves


@dataclass(frozen=True)
class Preset:
    repo: str
    pattern: str
    note: str


# repository names from public pages; patterns are resolved against the repository's file list at pull
# time. "unverified": the name was not checked against the hub from this project (no network here).
PRESETS = {
    "hy4-stq1_0": Preset("AngelSlim/Hy4-preview-GGUF", "*STQ1_0*.gguf",
                         "Hy4-preview STQ1_0 (229.4 GB, split parts; arch hyv4: run stq-metal hyv4 after)"),
    "gemma4-e2b": Preset("ggml-org/gemma-4-E2B-it-GGUF", "*Q4_K_M*.gguf", "Gemma 4 E2B it, Q4_K_M (unverified)"),
    "gemma4-e4b": Preset("ggml-org/gemma-4-E4B-it-GGUF", "*Q4_K_M*.gguf", "Gemma 4 E4B it, Q4_K_M (unverified)"),
    "gemma4-e2b-mtp": Preset("amaranus/Gemma-4-E2B-it-qat-assistant-MTP-Q8_0-GGUF", "*.gguf",
                             "Gemma 4 E2B MTP assistant for --spec-type draft-mtp -md (third-party, unverified)"),
    "gemma4-e4b-mtp": Preset("amaranus/Gemma-4-E4B-it-qat-assistant-MTP-Q8_0-GGUF", "*.gguf",
                             "Gemma 4 E4B MTP assistant for --spec-type draft-mtp -md (third-party, unverified)"),
}


@dataclass
class RemoteFile:
    name: str
    size: int | None
    sha256: str | None      # LFS files only


def _hub():
    try:
        import huggingface_hub
    except ImportError:
        raise HarnessError("the huggingface-hub package is missing; ./RUNBOOK.sh setup installs it "
                           "(or: pip install huggingface-hub)") from None
    return huggingface_hub


def list_files(repo: str, revision: str | None) -> list[RemoteFile]:
    hub = _hub()
    from huggingface_hub.utils import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
    try:
        info = hub.HfApi().model_info(repo, revision=revision, files_metadata=True)
    except RepositoryNotFoundError:
        raise HarnessError(f"{repo}: repository not found at {hub.constants.ENDPOINT} "
                           "(private or gated: set HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise HarnessError(f"{repo}: revision {revision!r} not found") from None
    except HfHubHTTPError as e:
        raise HarnessError(f"{repo}: listing the files failed: {e}") from None
    out = []
    for s in info.siblings or []:
        out.append(RemoteFile(s.rfilename, s.lfs.size if s.lfs else s.size, s.lfs.sha256 if s.lfs else None))
    return out


def select(files: list[RemoteFile], pattern: str, repo: str) -> list[RemoteFile]:
    exact = [f for f in files if f.name == pattern]
    got = exact or sorted((f for f in files if fnmatch.fnmatchcase(f.name, pattern)), key=lambda f: f.name)
    if not got:
        some = ", ".join(f.name for f in files[:12])
        raise HarnessError(f"{repo}: no file matches {pattern!r} (files: {some}{', ...' if len(files) > 12 else ''})")
    return got


def _partial(dest: Path, f: RemoteFile) -> int:
    """Bytes of `f` already on disk: the finished file, or the client's <hash>.<sha256>.incomplete
    file under <dest>/.cache/huggingface/download/ (what a resumed download continues from)."""
    p = dest / f.name
    if p.exists():
        return p.stat().st_size
    if not f.sha256:
        return 0
    inc = (dest / ".cache" / "huggingface" / "download" / f.name).parent
    return max((q.stat().st_size for q in inc.glob(f"*.{f.sha256}.incomplete")), default=0)


def free_bytes(path: Path) -> int:
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def preflight(dest: Path, todo: list[RemoteFile]) -> None:
    need = 0
    for f in todo:
        if f.size is None:
            continue
        need += max(0, f.size - _partial(dest, f))
    free = free_bytes(dest)
    if need + SPACE_MARGIN > free:
        raise HarnessError(f"not enough disk space in {dest}: {need / 2**30:.2f} GiB still to download "
                           f"(+{SPACE_MARGIN >> 20} MiB margin), {free / 2**30:.2f} GiB free; "
                           f"free space or choose another folder with --dir")


def verify(path: Path, f: RemoteFile) -> None:
    size = path.stat().st_size
    bad = None
    if f.size is not None and size != f.size:
        bad = f"size {size} bytes, the hub says {f.size}"
    elif f.sha256:
        got = sha256_file(path)
        if got != f.sha256:
            bad = f"sha256 {got}, the hub says {f.sha256}"
    if bad:
        aside = path.with_name(path.name + ".bad")
        os.replace(path, aside)
        raise HarnessError(f"{path.name}: {bad}; moved to {aside} (delete it and pull again)")


def download(repo: str, f: RemoteFile, dest: Path, revision: str | None) -> Path:
    hub = _hub()
    from huggingface_hub.utils import EntryNotFoundError, HfHubHTTPError
    try:
        got = hub.hf_hub_download(repo, f.name, revision=revision, local_dir=str(dest))
    except EntryNotFoundError:
        raise HarnessError(f"{repo}: {f.name} not found (404)") from None
    except HfHubHTTPError as e:
        raise HarnessError(f"{repo}: downloading {f.name} failed: {e}") from None
    except OSError as e:
        raise HarnessError(f"{repo}: downloading {f.name} into {dest} failed: {e.strerror or e}"
                           f" (partial data kept; run the same pull again to resume)") from None
    return Path(got)


def after_gguf(path: Path, do_retag: bool) -> list[str]:
    """Notes (and the optional retag) for a downloaded GGUF."""
    from . import retag
    from .gguf_layout import GGUFFormatError, read_layout
    notes = []
    try:
        lay = read_layout(path)
    except GGUFFormatError:
        return notes  # a split part without a header of its own, or not a GGUF: nothing to offer
    if lay.kv.get("general.architecture") == "hyv4":
        notes.append(f"{path.name}: architecture hyv4 (AngelSlim naming): run `stq-metal hyv4 {path} --write` "
                     "before serving it with the hy_v4 loader")
    if any(t.type_id == retag.PRIVATE_ID for t in lay.tensors):
        if do_retag:
            plan = retag.scan(path)
            msg = plan.refusal()
            if msg:
                notes.append(f"{path.name}: not retagged: {msg}")
            elif plan.to_retag:
                retag.apply(plan, backup=False)
                notes.append(f"{path.name}: retagged {len(plan.to_retag)} tensor(s) 42 -> 43")
        else:
            notes.append(f"{path.name}: holds type-42 tensors (private STQ1_0 numbering?): "
                         f"`stq-metal retag {path}` lists them, `--write` fixes them (or pull with --retag)")
    return notes


def pull(repo: str, pattern: str, dest: Path, revision: str | None = None, do_retag: bool = False) -> list[Path]:
    files = select(list_files(repo, revision), pattern, repo)
    dest.mkdir(parents=True, exist_ok=True)
    todo = [f for f in files if not ((dest / f.name).exists() and (dest / f.name).stat().st_size == f.size)]
    done = [dest / f.name for f in files if f not in todo]
    for p in done:
        say(f"{p.name}: already here ({p.stat().st_size} bytes); checking")
        verify(p, next(f for f in files if dest / f.name == p))
    preflight(dest, todo)
    for f in todo:
        size = f"{f.size / 2**20:.1f} MiB" if f.size is not None else "size unknown"
        say(f"{repo}: {f.name} ({size})")
        p = download(repo, f, dest, revision)
        verify(p, f)
        done.append(p)
    notes = []
    for p in sorted(done):
        if p.suffix == ".gguf":
            notes += after_gguf(p, do_retag)
    for n in notes:
        say(n)
    return sorted(done)


def build_parser(prog: str = "stq-metal model pull") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog, description=__doc__.split("\n\n")[1].replace("\n", " "),
        epilog="presets:\n" + "\n".join(f"  {k:16s} {v.repo} {v.pattern}: {v.note}" for k, v in PRESETS.items()) +
               "\n\nexit status: 0 done, 1 failed (download, verification, disk space), 2 bad arguments",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", help="a preset name (below) or a repository id owner/name")
    ap.add_argument("file", nargs="?", help="with a repository id: a file name or a glob (split parts: '*-of-*.gguf')")
    ap.add_argument("--dir", type=Path, help="destination folder (default: <cache>/models/<owner>--<name>)")
    ap.add_argument("--revision", help="branch, tag or commit (default: the repository's main)")
    ap.add_argument("--retag", action="store_true",
                    help="retag private type-42 STQ1_0 tensors of downloaded GGUFs in place (no backup)")
    ap.add_argument("--list", action="store_true", help="list the matching files with sizes and exit")
    return ap


def main(argv=None, prog: str = "stq-metal model pull") -> int:
    args = build_parser(prog).parse_args(argv)
    if "/" in args.what:
        if not args.file:
            print(f"error: {args.what}: a repository id needs FILE (a name or a glob)", file=sys.stderr)
            return EXIT_USAGE
        repo, pattern = args.what, args.file
    elif args.what in PRESETS:
        if args.file:
            print(f"error: preset {args.what} takes no FILE", file=sys.stderr)
            return EXIT_USAGE
        repo, pattern = PRESETS[args.what].repo, PRESETS[args.what].pattern
    else:
        print(f"error: {args.what!r} is neither a preset ({', '.join(PRESETS)}) nor a repository id owner/name",
              file=sys.stderr)
        return EXIT_USAGE
    dest = args.dir or config.models_dir() / repo.replace("/", "--")
    try:
        if args.list:
            for f in select(list_files(repo, args.revision), pattern, repo):
                print(f"{f.name}\t{f.size}\t{f.sha256 or '-'}")
            return EXIT_OK
        paths = pull(repo, pattern, dest, args.revision, args.retag)
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    for p in paths:
        print(p)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
