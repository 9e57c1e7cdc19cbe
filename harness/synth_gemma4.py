"""Synthesize a small Gemma 4 pair for speculative-decoding tests: a `gemma4` target and a
`gemma4-assistant` MTP head (llama.cpp's `--spec-type draft-mtp -md ASSISTANT.gguf`).

Random weights from a fixed seed, the tokenizer metadata of the real Gemma 3 270M GGUF (so
prompts are real text), and the architecture features the pinned loader implements
(src/models/gemma4.cpp, gemma4-assistant.cpp): sliding-window and global layers with different
head sizes, shared-KV layers (the last layers reuse the KV of earlier ones), per-layer token
embeddings, proportional rope on global layers (rope_freqs), final logit softcapping, and an
assistant that cross-attends into the target's KV cache of its last SWA and last global layer.

The weights are random but structured so that drafting is sometimes right and sometimes wrong:
the target's LM head maps token t to perm[t] (a fixed random permutation) and its layers add
context-dependent noise (--noise), so its greedy text mostly walks the permutation and sometimes
departs from it; the assistant predicts perm[t] from the token embedding alone. A speculative run
therefore accepts many drafts and rejects some, which exercises the KV rollback.

Tensor types: Q4_0 for the layer matrices (the CPU repacks them: the 8x8 GEMM/GEMV kernels),
Q8_0 for the token embeddings and LM heads, F16 for the per-layer embeddings, F32 for norms.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

try:
    from . import config
except ImportError:  # run as a script: python harness/synth_gemma4.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from harness import config

# the structured pair (also megakernel/synth_gpu.py --noise): LM head rows unit(...) * HEAD_SCALE, the assistant's weak
# weight of the target's hidden state, its layers' post norms (they add little to its residual stream)
HEAD_SCALE     = 3.0
H_WEAK         = 0.05
ASSISTANT_POST = 0.1

TARGET_NAME = "gemma4-synth-target.gguf"
ASSISTANT_NAME = "gemma4-synth-assistant.gguf"
GENERATOR_VERSION = 1  # bump when the weights or metadata change


@dataclass(frozen=True)
class SynthParams:
    seed: int = 1234
    n_embd: int = 128             # target hidden size
    n_embd_assistant: int = 64    # assistant hidden size (must differ from n_embd: the loader checks)
    n_layer: int = 6
    swa_pattern: str = "SSGSSG"   # S = sliding window layer, G = global layer
    n_kv_shared: int = 3          # the last n_kv_shared layers reuse the KV of earlier layers
    assistant_pattern: str = "SG"
    n_head: int = 2
    n_head_kv: int = 1
    head_dim_swa: int = 64
    head_dim_global: int = 128
    n_ff: int = 256
    n_embd_per_layer: int = 8
    window: int = 128             # sliding window (small, so that short generations cross it)
    softcap: float = 30.0
    noise: float = 6.0            # scale of the layers' contributions to the residual stream (~1/3 of drafts accepted)
    n_ctx_train: int = 8192
    matrix_type: str = "Q4_0"     # type of the layer matrices (F16 for a reference without quantized weights)
    n_vocab: int = 0              # 0: the whole tokenizer; else its first n_vocab tokens (a small LM head for
                                  # emulated backends; the special tokens must lie below n_vocab)
    h_gain: float = 0.0           # 0: the assistant reads the target's hidden state h weakly (0.05) and the target's
                                  # output_norm is all ones; > 0: h reaches the assistant with this weight and
                                  # output_norm is random, so that an h of the wrong scale (not normed) changes the
                                  # drafts (another token's row hardly does: the token path still carries them)

    def key(self) -> str:
        d = asdict(self)
        for f in ("n_vocab", "h_gain"):
            if not d[f]:
                del d[f]  # the keys of models made before the field existed stay the same
        blob = json.dumps({"v": GENERATOR_VERSION, **d}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


def _gguf():
    import gguf  # PyPI gguf (>= 0.19 knows the Gemma 4 keys) or the pinned tree's gguf-py on sys.path
    for attr in ("add_shared_kv_layers", "add_embedding_length_out", "add_key_length_swa"):
        if not hasattr(gguf.GGUFWriter, attr):
            raise RuntimeError(f"synth_gemma4: the gguf package at {gguf.__file__} lacks GGUFWriter.{attr}; "
                               "install gguf>=0.19 or put the pinned llama.cpp's gguf-py first on PYTHONPATH")
    return gguf


def _copy_tokenizer(gguf, reader, writer, limit: int = 0) -> int:
    """Copies the tokenizer.* metadata; limit > 0 keeps the first `limit` tokens (per-token arrays cut)."""
    n_full = len(reader.fields["tokenizer.ggml.tokens"].data)
    n_vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[1]
            val = field.contents()
            if limit and len(val) == n_full:
                val = val[:limit]
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(val)
            writer.add_key_value(name, val, vtype, sub_type=sub)
        else:
            val = field.contents()
            if limit and name.endswith("_token_id") and isinstance(val, int) and val >= limit:
                raise ValueError(f"synth_gemma4: {name} = {val} is not below n_vocab = {limit}")
            writer.add_key_value(name, val, vtype)
    if n_vocab == 0:
        raise RuntimeError("synth_gemma4: the tokenizer GGUF has no tokenizer.ggml.tokens")
    return n_vocab


def _common_attn_kv(gguf, w, p: SynthParams, pattern: str) -> None:
    n = len(pattern)
    w.add_head_count(p.n_head)
    w.add_head_count_kv([p.n_head_kv] * n)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(p.head_dim_global)
    w.add_value_length(p.head_dim_global)
    w.add_key_length_swa(p.head_dim_swa)
    w.add_value_length_swa(p.head_dim_swa)
    w.add_rope_dimension_count(p.head_dim_global)
    w.add_rope_dimension_count_swa(p.head_dim_swa)
    w.add_rope_freq_base(1_000_000.0)
    w.add_rope_freq_base_swa(10_000.0)
    w.add_sliding_window(p.window)
    w.add_sliding_window_pattern([c == "S" for c in pattern])


def assistant_metadata(gguf, w, p: SynthParams, reader, name: str) -> None:
    """A gemma4-assistant's metadata for the target p describes (hidden p.n_embd; the assistant's shapes from p's
    assistant fields) and the tokenizer of reader (its first p.n_vocab tokens when p.n_vocab > 0)."""
    w.add_name(name)
    w.add_context_length(p.n_ctx_train)
    w.add_embedding_length(p.n_embd_assistant)
    w.add_embedding_length_out(p.n_embd)
    w.add_block_count(len(p.assistant_pattern))
    w.add_nextn_predict_layers(len(p.assistant_pattern))
    w.add_feed_forward_length(p.n_ff)
    _common_attn_kv(gguf, w, p, p.assistant_pattern)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    _copy_tokenizer(gguf, reader, w, p.n_vocab)


class _Tensors:
    """Adds tensors in ggml order ({ne0, ne1} = numpy shape (ne1, ne0)) with the chosen type."""

    def __init__(self, gguf, writer):
        self.gguf, self.w = gguf, writer

    def add(self, name: str, data: np.ndarray, qtype: str = "F32") -> None:
        g = self.gguf
        data = np.ascontiguousarray(data, dtype=np.float32)
        if qtype == "F32":
            self.w.add_tensor(name, data)
        elif qtype == "F16":
            self.w.add_tensor(name, data.astype(np.float16))
        else:
            t = getattr(g.GGMLQuantizationType, qtype)
            q = g.quants.quantize(data, t)
            self.w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=t)


def _unit_rows(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _write_atomic(writer_factory, path: Path, fill) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        w = writer_factory(tmp)
        fill(w)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def generate(out_dir: Path, tokenizer_gguf: Path, p: SynthParams = SynthParams()) -> tuple[Path, Path]:
    """Write the target and assistant GGUFs into out_dir (atomically) and return their paths."""
    gguf = _gguf()
    if len(p.swa_pattern) != p.n_layer:
        raise ValueError(f"synth_gemma4: swa_pattern {p.swa_pattern!r} must have n_layer={p.n_layer} letters")
    kv_from = p.n_layer - p.n_kv_shared
    # the loader maps a shared SWA layer to layer kv_from-2 and a shared global layer to kv_from-1;
    # the assistant reads the target's layers n_layer-2 (SWA) and n_layer-1 (global)
    if p.swa_pattern[kv_from - 2] != "S" or p.swa_pattern[kv_from - 1] != "G":
        raise ValueError("synth_gemma4: layers n_layer-n_kv_shared-2/-1 must be SWA/global")
    if p.swa_pattern[-2:] != "SG":
        raise ValueError("synth_gemma4: the last two target layers must be SWA, global")
    if p.n_embd_assistant == p.n_embd:
        raise ValueError("synth_gemma4: the assistant's hidden size must differ from the target's")

    out_dir.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(str(tokenizer_gguf))
    rng = np.random.default_rng(p.seed)

    n_vocab = p.n_vocab or len(reader.fields["tokenizer.ggml.tokens"].data)
    E = rng.standard_normal((n_vocab, p.n_embd), dtype=np.float32)  # token embeddings, rms 1
    perm = rng.permutation(n_vocab)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(n_vocab)
    # LM head: row v = unit(E[inv[v]]) * 3, so that argmax <row, h ~ E[t]> = perm[t] (logits within the softcap)
    O = _unit_rows(E[inv]) * HEAD_SCALE

    def hd(c: str) -> int:
        return p.head_dim_swa if c == "S" else p.head_dim_global

    def mat(n_out: int, n_in: int, scale: float = 1.0) -> np.ndarray:
        return rng.standard_normal((n_out, n_in), dtype=np.float32) * (scale / np.sqrt(n_in))

    def norm_w(n: int, scale: float) -> np.ndarray:
        return (scale * (0.5 + rng.random(n, dtype=np.float32))).astype(np.float32)

    # rope_freqs for proportional rope on global layers: a quarter of the pairs rotate, the rest do not
    n_pairs = p.head_dim_global // 2
    n_rot = n_pairs // 4
    rope_freqs = np.array([1.0] * n_rot + [1e30] * (n_pairs - n_rot), dtype=np.float32)

    target = out_dir / TARGET_NAME
    assistant = out_dir / ASSISTANT_NAME
    arch_t, arch_a = "gemma4", "gemma4-assistant"

    def fill_target(w) -> None:
        w.add_name("gemma4 synthetic target (random weights, stq-metal)")
        w.add_context_length(p.n_ctx_train)
        w.add_embedding_length(p.n_embd)
        w.add_block_count(p.n_layer)
        w.add_feed_forward_length(p.n_ff)
        _common_attn_kv(gguf, w, p, p.swa_pattern)
        w.add_shared_kv_layers(p.n_kv_shared)
        w.add_embedding_length_per_layer_input(p.n_embd_per_layer)
        w.add_final_logit_softcapping(p.softcap)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
        _copy_tokenizer(gguf, reader, w, p.n_vocab)

        t = _Tensors(gguf, w)
        t.add("token_embd.weight", E, "Q8_0")
        t.add("output.weight", O, "Q8_0")
        # (random from a generator of its own: the other weights stay those of h_gain = 0)
        out_norm = np.random.default_rng(p.seed + 1).uniform(0.5, 1.5, p.n_embd).astype(np.float32)
        t.add("output_norm.weight", out_norm if p.h_gain else np.ones(p.n_embd, np.float32))
        t.add("rope_freqs.weight", rope_freqs)
        n_pl = p.n_embd_per_layer * p.n_layer
        t.add("per_layer_token_embd.weight", rng.standard_normal((n_vocab, n_pl), dtype=np.float32), "F16")
        t.add("per_layer_model_proj.weight", mat(n_pl, p.n_embd))
        t.add("per_layer_proj_norm.weight", norm_w(p.n_embd_per_layer, 1.0))
        for il, c in enumerate(p.swa_pattern):
            d = hd(c)
            pre = f"blk.{il}."
            t.add(pre + "attn_norm.weight", norm_w(p.n_embd, 1.0))
            t.add(pre + "attn_q.weight", mat(p.n_head * d, p.n_embd), p.matrix_type)
            t.add(pre + "attn_q_norm.weight", norm_w(d, 1.0))
            if il < kv_from:
                t.add(pre + "attn_k.weight", mat(p.n_head_kv * d, p.n_embd), p.matrix_type)
                t.add(pre + "attn_v.weight", mat(p.n_head_kv * d, p.n_embd), p.matrix_type)
                t.add(pre + "attn_k_norm.weight", norm_w(d, 1.0))
            t.add(pre + "attn_output.weight", mat(p.n_embd, p.n_head * d), p.matrix_type)
            t.add(pre + "post_attention_norm.weight", norm_w(p.n_embd, p.noise))
            t.add(pre + "ffn_norm.weight", norm_w(p.n_embd, 1.0))
            t.add(pre + "ffn_gate.weight", mat(p.n_ff, p.n_embd), p.matrix_type)
            t.add(pre + "ffn_up.weight", mat(p.n_ff, p.n_embd), p.matrix_type)
            t.add(pre + "ffn_down.weight", mat(p.n_embd, p.n_ff), p.matrix_type)
            t.add(pre + "post_ffw_norm.weight", norm_w(p.n_embd, p.noise))
            t.add(pre + "inp_gate.weight", mat(p.n_embd_per_layer, p.n_embd), p.matrix_type)
            t.add(pre + "proj.weight", mat(p.n_embd, p.n_embd_per_layer))
            t.add(pre + "post_norm.weight", norm_w(p.n_embd, p.noise))
            t.add(pre + "layer_output_scale.weight", np.ones(1, np.float32))

    def fill_assistant(w) -> None:
        na = p.n_embd_assistant
        assistant_metadata(gguf, w, p, reader, "gemma4 synthetic MTP assistant (random weights, stq-metal)")

        t = _Tensors(gguf, w)
        # the assistant sees x = E[t] * sqrt(n_embd) concatenated with the target's hidden state h;
        # pre_projection maps x through P (and h weakly), its LM head rows are unit(P E[inv[v]])
        P = mat(na, p.n_embd)
        pre_proj = np.concatenate([P, mat(na, p.n_embd, H_WEAK) * (p.h_gain / H_WEAK if p.h_gain else 1.0)], axis=1)
        A = _unit_rows(E[inv] @ P.T) * HEAD_SCALE
        t.add("token_embd.weight", A, "Q8_0")
        t.add("output_norm.weight", np.ones(na, np.float32))
        t.add("rope_freqs.weight", rope_freqs)
        t.add("nextn.pre_projection.weight", pre_proj)
        t.add("nextn.post_projection.weight", mat(p.n_embd, na))
        for il, c in enumerate(p.assistant_pattern):
            d = hd(c)
            pre = f"blk.{il}."
            t.add(pre + "attn_norm.weight", norm_w(na, 1.0))
            t.add(pre + "attn_q.weight", mat(p.n_head * d, na), p.matrix_type)
            t.add(pre + "attn_q_norm.weight", norm_w(d, 1.0))
            t.add(pre + "attn_output.weight", mat(na, p.n_head * d), p.matrix_type)
            t.add(pre + "post_attention_norm.weight", norm_w(na, ASSISTANT_POST))
            t.add(pre + "ffn_norm.weight", norm_w(na, 1.0))
            t.add(pre + "ffn_gate.weight", mat(p.n_ff, na), p.matrix_type)
            t.add(pre + "ffn_up.weight", mat(p.n_ff, na), p.matrix_type)
            t.add(pre + "ffn_down.weight", mat(na, p.n_ff), p.matrix_type)
            t.add(pre + "post_ffw_norm.weight", norm_w(na, ASSISTANT_POST))
            t.add(pre + "layer_output_scale.weight", np.ones(1, np.float32))

    _write_atomic(lambda path: gguf.GGUFWriter(str(path), arch_t), target, fill_target)
    _write_atomic(lambda path: gguf.GGUFWriter(str(path), arch_a), assistant, fill_assistant)
    return target, assistant


def write_tokenizer_gguf(tokenizer_gguf: Path, out: Path) -> Path:
    """A GGUF holding only the tokenizer.* metadata (6 MB for Gemma's 262k vocabulary): what generate()
    needs from the 253 MB model, small enough to carry to a GPU machine."""
    gguf = _gguf()
    reader = gguf.GGUFReader(str(tokenizer_gguf))
    _write_atomic(lambda path: gguf.GGUFWriter(str(path), "gemma3"), out, lambda w: _copy_tokenizer(gguf, reader, w))
    return out


def cut_vocab(model: Path, n_vocab: int, out_root: Path | None = None) -> Path:
    """A copy of a real Gemma GGUF whose vocabulary is its first n_vocab tokens: the tokenizer arrays and
    token_embd.weight (the tied LM head) cut to those rows, every other tensor and key byte for byte. The
    layer stack stays the real model's (weights, types, shapes); only the LM head shrinks, so that emulated
    backends can run many steps (Gemma's 262144-token head dominates a step). Written once into
    <cache>/models/<stem>-vocab<n_vocab>.gguf; the special tokens must lie below n_vocab."""
    out = (out_root or config.models_dir()) / f"{model.stem}-vocab{n_vocab}.gguf"
    if out.exists():
        return out
    gguf = _gguf()
    reader = gguf.GGUFReader(str(model))
    arch = reader.fields["general.architecture"].contents()
    skip = {"general.architecture", "GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}

    def fill(w) -> None:
        for name, field in reader.fields.items():
            if name in skip or name.startswith("tokenizer."):
                continue
            if field.types[0] == gguf.GGUFValueType.ARRAY:
                w.add_key_value(name, field.contents(), field.types[0], sub_type=field.types[1])
            else:
                w.add_key_value(name, field.contents(), field.types[0])
        if f"{arch}.vocab_size" in reader.fields:
            raise ValueError(f"cut_vocab: {model} has {arch}.vocab_size (not handled)")
        _copy_tokenizer(gguf, reader, w, n_vocab)
        for t in reader.tensors:
            data = t.data
            if t.name == "token_embd.weight":
                if data.shape[0] <= n_vocab:
                    raise ValueError(f"cut_vocab: token_embd.weight has {data.shape[0]} rows, not more than {n_vocab}")
                data = data[:n_vocab]
            w.add_tensor(t.name, np.ascontiguousarray(data), raw_shape=data.shape, raw_dtype=t.tensor_type)

    out.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(lambda path: gguf.GGUFWriter(str(path), arch), out, fill)
    return out


def ensure_pair(tokenizer_gguf: Path, out_root: Path | None = None, p: SynthParams = SynthParams()) -> tuple[Path, Path]:
    """The pair for these parameters, generated once into <cache>/models/gemma4-synth-<key>/."""
    out_dir = (out_root or config.models_dir()) / f"gemma4-synth-{p.key()}"
    target, assistant = out_dir / TARGET_NAME, out_dir / ASSISTANT_NAME
    if not (target.exists() and assistant.exists()):
        generate(out_dir, tokenizer_gguf, p)
    return target, assistant


def main(argv: list[str] | None = None) -> int:
    d = SynthParams()
    ap = argparse.ArgumentParser(prog="synth_gemma4", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer-from", type=Path, required=True,
                    help="GGUF whose tokenizer.* metadata is copied (the Gemma 3 270M GGUF)")
    ap.add_argument("--out-dir", type=Path, help="folder for the two GGUF files (required unless --tokenizer-only)")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--window", type=int, default=d.window, help="sliding window of the SWA layers")
    ap.add_argument("--matrix-type", default=d.matrix_type, choices=["Q4_0", "Q8_0", "F16", "F32"],
                    help="type of the layer matrices (default Q4_0; F16/F32 give a reference without quantized weights)")
    ap.add_argument("--noise", type=float, default=d.noise,
                    help="scale of the layers' residual contributions (higher: the target departs more "
                         "often from the permutation the assistant predicts)")
    ap.add_argument("--n-vocab", type=int, default=d.n_vocab,
                    help="keep only the tokenizer's first N tokens (a small LM head; 0: all)")
    ap.add_argument("--h-gain", type=float, default=d.h_gain,
                    help="weight of the target's hidden state in the assistant (0: weak, 0.05, output_norm all ones; "
                         "> 0: this weight and a random output_norm, so that a wrong hidden state changes the drafts)")
    ap.add_argument("--tokenizer-only", type=Path, metavar="OUT",
                    help="write only a tokenizer GGUF (for carrying to a GPU machine) to OUT and stop")
    args = ap.parse_args(argv)
    if args.tokenizer_only:
        print(write_tokenizer_gguf(args.tokenizer_from, args.tokenizer_only))
        return 0
    if args.out_dir is None:
        ap.error("--out-dir is required")
    p = SynthParams(seed=args.seed, window=args.window, noise=args.noise, matrix_type=args.matrix_type,
                    n_vocab=args.n_vocab, h_gain=args.h_gain)
    target, assistant = generate(args.out_dir, args.tokenizer_from, p)
    print(f"target:    {target}\nassistant: {assistant}\n"
          f"run: llama-server -m {target} --spec-type draft-mtp -md {assistant}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
