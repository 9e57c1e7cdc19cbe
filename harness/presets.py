"""`stq-metal serve start --preset NAME`: named llama-server set-ups for the models `stq-metal model pull`
downloads.

A preset names the model file(s) (a `model pull` preset and the glob it downloads; the files are looked
up where `model pull` stores them: <cache>/models/<owner>--<name>/<file name in the repository>) and the
llama-server flags for them. Nothing is downloaded here: a missing file is an error naming the glob and
the `stq-metal model pull NAME` command that fetches it.

Flag order: llama-server gets `-m MODEL --host H --port P --jinja`, the chat template (only for a Gemma
GGUF without one), the preset's flags, then the user's arguments after `--`. A preset flag whose option
the user also passes (under any of its spellings, e.g. `-c`/`--ctx-size`) is left out, so the user's
value wins even for options that llama.cpp accumulates (`--spec-type`); everything else the user passes
is appended.
"""

from __future__ import annotations

import fnmatch
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from . import config
from .pull import PRESETS as PULL_PRESETS
from .util import HarnessError

# spellings of the options a preset sets (llama.cpp common/arg.cpp at the pin)
OPT_CTX = ("-c", "--ctx-size")
OPT_NGL = ("-ngl", "--gpu-layers", "--n-gpu-layers")
OPT_NGLD = ("-ngld", "--spec-draft-ngl", "--gpu-layers-draft", "--n-gpu-layers-draft")
OPT_SPEC_TYPE = ("--spec-type",)
OPT_DRAFT = ("-md", "--spec-draft-model", "--model-draft")

GPU_LAYERS = "99"           # every layer on the GPU backend (metal, cuda, metal-emu); left out on cpu
SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


@dataclass(frozen=True)
class ServePreset:
    name: str
    help: str
    model: str              # a `model pull` preset name
    ctx: int
    draft: str | None = None  # the MTP assistant's `model pull` preset (--spec-type draft-mtp -md FILE)
    hyv4_check: bool = False  # refuse an AngelSlim `hyv4` GGUF (the pin loads `hy_v4`) with the fix
    no_repack_on_amx: bool = False  # cpu backend on an AMX CPU: --no-repack (see cpu_has_amx)


SERVE_PRESETS = {p.name: p for p in (
    ServePreset("hy4", "Hy4-preview STQ1_0 (229.4 GB, split parts; first part served), -c 32768",
                "hy4-stq1_0", 32768, hyv4_check=True, no_repack_on_amx=True),
    ServePreset("gemma4-e2b", "Gemma 4 E2B it Q4_K_M, -c 32768", "gemma4-e2b", 32768),
    ServePreset("gemma4-e4b", "Gemma 4 E4B it Q4_K_M, -c 32768", "gemma4-e4b", 32768),
    ServePreset("gemma4-e2b-spec", "Gemma 4 E2B + its MTP assistant: --spec-type draft-mtp -md ASSISTANT, -c 32768",
                "gemma4-e2b", 32768, draft="gemma4-e2b-mtp"),
    ServePreset("gemma4-e4b-spec", "Gemma 4 E4B + its MTP assistant: --spec-type draft-mtp -md ASSISTANT, -c 32768",
                "gemma4-e4b", 32768, draft="gemma4-e4b-mtp"),
)}


def help_lines() -> str:
    return "\n".join(f"  {p.name:16s} {p.help} (pull: {' + '.join(x for x in (p.model, p.draft) if x)})"
                     for p in SERVE_PRESETS.values())


def pull_dir(pull_name: str) -> Path:
    """Where `stq-metal model pull NAME` puts the files (pull.main's default --dir)."""
    return config.models_dir() / PULL_PRESETS[pull_name].repo.replace("/", "--")


def _local_matches(d: Path, pattern: str) -> list[Path]:
    """Finished files under `d` whose path relative to `d` matches `pattern` as pull.select matches
    repository file names (fnmatchcase; the client's .cache/ and set-aside *.bad files excluded)."""
    if not d.is_dir():
        return []
    out = []
    for p in d.rglob("*"):
        rel = p.relative_to(d).as_posix()
        if rel.startswith(".cache/") or not p.is_file():
            continue
        if rel == pattern or fnmatch.fnmatchcase(rel, pattern):
            out.append(p)
    return sorted(out)


def _missing(pull_name: str, what: str, detail: str = "") -> HarnessError:
    pp = PULL_PRESETS[pull_name]
    return HarnessError(f"{what}: no file matching {pp.pattern!r} in {pull_dir(pull_name)}{detail}; "
                        f"download it first: stq-metal model pull {pull_name}")


def resolve_file(pull_name: str, what: str) -> Path:
    """The GGUF to pass to llama-server for a `model pull` preset: the one match, or the first part of
    a split set (every part must be there)."""
    pp = PULL_PRESETS[pull_name]
    found = _local_matches(pull_dir(pull_name), pp.pattern)
    if not found:
        raise _missing(pull_name, what)
    splits: dict[str, list[tuple[int, int, Path]]] = {}
    singles = []
    for p in found:
        m = SPLIT_RE.search(p.name)
        if m:
            splits.setdefault(p.name[:m.start()], []).append((int(m.group(1)), int(m.group(2)), p))
        else:
            singles.append(p)
    if len(singles) + len(splits) > 1:
        names = [str(p) for p in singles] + [f"{k}-*-of-*.gguf" for k in splits]
        raise HarnessError(f"{what}: {len(names)} models match {pp.pattern!r} in {pull_dir(pull_name)}: "
                           f"{', '.join(names)}; serve one with --model FILE instead of --preset")
    if singles:
        return singles[0]
    (stem, parts), = splits.items()
    count = parts[0][1]
    have = {n for n, _, _ in parts}
    lost = [f"{stem}-{n:05d}-of-{count:05d}.gguf" for n in range(1, count + 1) if n not in have]
    if lost:
        raise _missing(pull_name, what, f" for split part(s) {', '.join(lost)} (the set is incomplete)")
    return next(p for n, _, p in parts if n == 1)


def _arch(path: Path) -> str | None:
    from .gguf_layout import GGUFFormatError, read_layout
    try:
        return read_layout(path).kv.get("general.architecture")
    except GGUFFormatError:
        return None  # the server start reports a broken file with its own check


OPT_REPACK = ("-nr", "--no-repack", "--repack")


def cpu_has_amx() -> bool:
    """True on a CPU with Intel AMX (the `amx_int8` flag; STQ_CPUINFO names another cpuinfo file). There the
    CPU backend of a native build puts Q8_0 and K-quant weights in its AMX buffer type, which refuses matrix
    products with a non-contiguous input. Hy4's MLA multiplies attn_k_b by a permuted q_nope: llama.cpp then
    finds no backend for that node and aborts at load (ggml-backend.cpp: GGML_ASSERT(*cur_backend_id != -1);
    seen on the H200 machine's Xeon, NOTES.md). --no-repack keeps the weights in plain CPU buffers."""
    path = Path(os.environ.get("STQ_CPUINFO", "/proc/cpuinfo"))
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return False
    return re.search(r"^flags\s*:.*\bamx_int8\b", text, re.M) is not None


def _given(user_args: list[str], opts: tuple[str, ...]) -> bool:
    return any(a in opts or a.startswith(tuple(o + "=" for o in opts)) for a in user_args)


def resolve(name: str, backend: str, user_args: list[str] | None = None) -> tuple[Path, list[str]]:
    """(model file, llama-server arguments: the preset's flags the user did not override, then the
    user's). Raises HarnessError when a file is missing or the model needs `stq-metal hyv4` first."""
    if name not in SERVE_PRESETS:
        raise HarnessError(f"unknown preset {name!r} (presets: {', '.join(SERVE_PRESETS)})")
    ps = SERVE_PRESETS[name]
    user_args = list(user_args or [])
    files, errors = [], []
    for pull_name, what in [(ps.model, f"preset {name}"), (ps.draft, f"preset {name} (MTP assistant)")]:
        if pull_name is None:
            files.append(None)
            continue
        try:
            files.append(resolve_file(pull_name, what))
        except HarnessError as e:
            errors.append(str(e))
    if errors:
        raise HarnessError("\n".join(errors))
    model, draft = files
    if ps.hyv4_check and _arch(model) == "hyv4":
        raise HarnessError(f"preset {name}: {model} has the architecture 'hyv4' (AngelSlim's naming), which the "
                           f"pinned llama.cpp does not load (it names the family 'hy_v4'); rewrite its metadata "
                           f"first (in place, tensor data untouched, header backup kept): "
                           f"stq-metal hyv4 {model} --write")
    flags: list[tuple[tuple[str, ...], list[str]]] = [(OPT_CTX, ["-c", str(ps.ctx)])]
    gpu = backend != "cpu"
    if gpu:
        flags.append((OPT_NGL, ["-ngl", GPU_LAYERS]))
    if draft:
        flags.append((OPT_SPEC_TYPE, ["--spec-type", "draft-mtp"]))
        flags.append((OPT_DRAFT, ["-md", str(draft)]))
        if gpu:
            flags.append((OPT_NGLD, ["-ngld", GPU_LAYERS]))
    if ps.no_repack_on_amx and not gpu and cpu_has_amx():
        flags.append((OPT_REPACK, ["--no-repack"]))
        print(f"[stq-metal] preset {name}: --no-repack (this CPU has AMX, whose weight buffers cannot run Hy4's "
              f"MLA product with a permuted input; llama.cpp would abort at load)", file=sys.stderr)
    out = [x for opts, f in flags if not _given(user_args, opts) for x in f]
    return model, out + user_args
