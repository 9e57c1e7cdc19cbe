"""Synthesize a small Hy4-shaped STQ1_0 MoE (`hy_v4`) and its AngelSlim-dialect twin (`hyv4`).

The structure is the one the pinned llama.cpp's hy_v4 loader requires (src/models/hy-v4.cpp):
MLA attention with q/kv LoRA, split k_b/v_b, a sigmoid output gate and per-head attention sinks;
iHC hyper-connections (hc parallel residual streams, per-layer pre/post mixing, a global head);
a DSA lightning indexer on the layers marked "full" (the others reuse its top-k); a dense blk.0
and MoE blocks with 256 routed experts, top-8 sigmoid routing with a selection bias, one shared
expert, routed SwiGLU clamp. Widths are reduced; the expert count and top-k are the real ones.

Tensor types follow AngelSlim's Hy4-preview-STQ1_0.gguf: STQ1_0 routed gate/up expert stacks,
IQ2_XXS routed down stacks, IQ3_XXS / IQ4_XS for the other matrices, Q8_0 k_b/v_b, Q4_K token
embedding, F32 output head, router, indexer projection, iHC and norms. The generator writes an
F32/F16 file with the harness's GGUF writer and lets the series' llama-quantize make the mix
(per-tensor `--tensor-type` overrides; a flat importance matrix, because IQ2_XXS and IQ3_XXS
refuse to quantize without one).

The weights are random but structured like synth_gemma4's: the LM head maps token t to perm[t]
(a fixed random permutation) and the layers add context-dependent contributions of scale
`noise`, so greedy text mostly walks the permutation and sometimes departs from it. A backend
that computes a layer wrongly departs differently; near-ties are rare, so two correct backends
agree on greedy tokens while their log-probabilities differ in the last digits.

The tokenizer (and its chat template, for `--jinja`) is the Gemma 3 270M GGUF's, cut to the
first `n_vocab` tokens (every special token id must fall below the cut).

The `hyv4` twin holds the same tensors under the metadata naming of AngelSlim's converter
(general.architecture = "hyv4", keys `hyv4.*`, the indexer schedule as the integer array
`hyv4.attention.indexer.is_full`); harness/hyv4.py rewrites such files for the hy_v4 loader.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

try:
    from . import config
    from .gguf_layout import RawTensor, read_layout, write_gguf
    from .util import HarnessError, say
except ImportError:  # run as a script: python harness/synth_hy4.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from harness import config
    from harness.gguf_layout import RawTensor, read_layout, write_gguf
    from harness.util import HarnessError, say

MODEL_NAME = "hy4-synth.gguf"          # hy_v4, quantized: what llama-server loads
TWIN_NAME = "hy4-synth-hyv4.gguf"      # the same tensors under AngelSlim's hyv4 metadata
GENERATOR_VERSION = 2                  # bump when the weights or metadata change

# ggml type ids of the F32/F16 intermediate
F32, F16 = 0, 1
# GGUF value types used explicitly below
T_UINT32, T_FLOAT32, T_BOOL = 4, 6, 7
# expert gating function ids (llama-hparams.h: LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID)
GATING_SIGMOID = 2


@dataclass(frozen=True)
class Hy4Params:
    seed: int = 4321
    n_vocab: int = 32768          # Gemma tokenizer cut to this many tokens
    n_embd: int = 256             # real: 6144
    n_layer: int = 4              # blk.0 dense, the rest MoE (real: 78)
    n_ff: int = 512               # dense FFN of blk.0 (real: 18432)
    n_head: int = 4               # real: 64
    q_lora: int = 256             # real: 2048
    kv_lora: int = 256            # real: 512
    qk_nope: int = 64             # real: 192
    qk_rope: int = 64             # as real (cache row kv_lora + rope = 320: a Metal flash-attention size)
    v_head: int = 64              # real: 256
    n_expert: int = 256           # as real
    n_expert_used: int = 8        # as real
    n_ff_exp: int = 256           # real: 2048
    n_expert_shared: int = 1      # as real
    expert_weights_scale: float = 2.827
    swiglu_clamp: float = 10.0
    hc: int = 4                   # iHC streams, as real
    hc_eps: float = 1e-6
    hc_magnitude: float = 2.0
    indexer_heads: int = 4        # real: 32
    indexer_dim: int = 128        # as real
    indexer_top_k: int = 32       # real: 2048 (small here, so that short prompts are sparse)
    indexer_full: str = "FSFS"    # F = layer owns an indexer, S = reuses the previous F's top-k
    noise: float = 0.6            # scale of the layers' contributions to the residual streams
    n_ctx_train: int = 8192

    def key(self) -> str:
        blob = json.dumps({"v": GENERATOR_VERSION, **asdict(self)}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def check(self) -> None:
        if len(self.indexer_full) != self.n_layer or self.indexer_full[0] != "F" or \
                set(self.indexer_full) - {"F", "S"}:
            raise ValueError(f"synth_hy4: indexer_full {self.indexer_full!r} needs n_layer={self.n_layer} "
                             "letters F/S starting with F")
        if self.indexer_dim <= self.qk_rope:
            raise ValueError("synth_hy4: the indexer key length must exceed the rope dimension")
        for what in ("n_embd", "q_lora", "kv_lora", "n_ff", "n_ff_exp"):
            if getattr(self, what) % 256:
                raise ValueError(f"synth_hy4: {what} must be a multiple of 256 (STQ1_0 / IQ rows)")


# tensor name regex -> llama-quantize type, first match wins (the order matters)
TENSOR_TYPES: list[tuple[str, str]] = [
    (r"ffn_(gate|up)_exps", "stq1_0"),
    (r"ffn_down_exps", "iq2_xxs"),
    (r"attn_[kv]_b", "q8_0"),
    (r"hc_|output_hc_|indexer\.proj", "f32"),
    (r"ffn_(gate|up)(_shexp)?\.", "iq3_xxs"),
    (r"ffn_down(_shexp)?\.", "iq4_xs"),
    (r"attn_|indexer\.", "iq4_xs"),
]


def arch_kv(p: Hy4Params, dialect: str = "hy_v4") -> tuple[dict, dict]:
    """The model's metadata in one naming dialect: "hy_v4" (the pinned loader's) or "hyv4"
    (AngelSlim's converter). Returns (values, explicit GGUF value types)."""
    if dialect not in ("hy_v4", "hyv4"):
        raise ValueError(f"unknown dialect {dialect!r}")
    a = dialect
    kv: dict = {
        "general.architecture": a,
        "general.name": "Hy4-shaped synthetic STQ1_0 MoE (random weights, stq-metal)",
        f"{a}.vocab_size": p.n_vocab,
        f"{a}.context_length": p.n_ctx_train,
        f"{a}.embedding_length": p.n_embd,
        f"{a}.block_count": p.n_layer,
        f"{a}.feed_forward_length": p.n_ff,
        f"{a}.leading_dense_block_count": 1,
        f"{a}.attention.head_count": p.n_head,
        f"{a}.attention.head_count_kv": 1,                       # MLA as MQA
        f"{a}.attention.key_length": p.kv_lora + p.qk_rope,      # the absorbed (cache) widths
        f"{a}.attention.value_length": p.kv_lora,
        f"{a}.attention.key_length_mla": p.qk_nope + p.qk_rope,
        f"{a}.attention.value_length_mla": p.v_head,
        f"{a}.attention.q_lora_rank": p.q_lora,
        f"{a}.attention.kv_lora_rank": p.kv_lora,
        f"{a}.attention.layer_norm_rms_epsilon": 1e-5,
        f"{a}.rope.dimension_count": p.qk_rope,
        f"{a}.rope.freq_base": 10000.0,
        f"{a}.expert_count": p.n_expert,
        f"{a}.expert_used_count": p.n_expert_used,
        f"{a}.expert_feed_forward_length": p.n_ff_exp,
        f"{a}.expert_shared_count": p.n_expert_shared,
        f"{a}.expert_weights_scale": p.expert_weights_scale,
        f"{a}.expert_weights_norm": True,
        f"{a}.expert_gating_func": GATING_SIGMOID,
        f"{a}.swiglu_clamp_exp": np.full(p.n_layer, p.swiglu_clamp, np.float32),
        f"{a}.hyper_connection.count": p.hc,
        f"{a}.hyper_connection.epsilon": p.hc_eps,
        f"{a}.hyper_connection.magnitude": p.hc_magnitude,
        f"{a}.attention.indexer.head_count": p.indexer_heads,
        f"{a}.attention.indexer.key_length": p.indexer_dim,
        f"{a}.attention.indexer.top_k": p.indexer_top_k,
    }
    full = [c == "F" for c in p.indexer_full]
    if dialect == "hy_v4":
        kv[f"{a}.attention.indexer.types"] = np.array(full, dtype=bool)
    else:
        kv[f"{a}.attention.indexer.is_full"] = np.array(full, dtype=np.uint32)
    types = {k: T_FLOAT32 for k, v in kv.items() if isinstance(v, float)}
    return kv, types


def tokenizer_kv(tokenizer_gguf: Path, n_vocab: int) -> tuple[dict, dict]:
    """The tokenizer.* metadata of a GGUF, arrays cut to the first n_vocab tokens."""
    lay = read_layout(tokenizer_gguf)
    tokens = lay.kv.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise HarnessError(f"{tokenizer_gguf}: no tokenizer.ggml.tokens")
    if len(tokens) < n_vocab:
        raise HarnessError(f"{tokenizer_gguf}: {len(tokens)} tokens, fewer than n_vocab={n_vocab}")
    kv, types = {}, {}
    for k, v in lay.kv.items():
        if not k.startswith("tokenizer."):
            continue
        if k in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            v = v[:n_vocab]
        elif k.startswith("tokenizer.ggml.merges"):
            raise HarnessError(f"{tokenizer_gguf}: a BPE tokenizer (merges) cannot be cut; use an SPM one")
        elif k.endswith("_token_id") and int(v) >= n_vocab:
            raise HarnessError(f"{tokenizer_gguf}: {k} = {v} does not fit a vocabulary cut to {n_vocab}")
        kv[k] = v
        types[k] = lay.kv_types[k]
    kv.setdefault("tokenizer.chat_template", CHAT_TEMPLATE)
    return kv, types


# the chat template for `--jinja`: the turn format of the Gemma tokenizer the model borrows (its
# <start_of_turn> / <end_of_turn> tokens), not Hy4's own template; system text joins the user turn
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' -%}{{ '<start_of_turn>model\n' }}"
    "{%- else -%}{{ '<start_of_turn>user\n' }}{%- endif -%}"
    "{{ m['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


class _Weights:
    def __init__(self, p: Hy4Params):
        self.p = p
        self.rng = np.random.default_rng(p.seed)
        self.tensors: list[RawTensor] = []

    def add(self, name: str, a: np.ndarray, dtype: int = F32) -> None:
        """Numpy shape (ne[n-1], ..., ne[0]) -> a ggml tensor {ne[0], ne[1], ...}."""
        a = np.ascontiguousarray(a, dtype=np.float16 if dtype == F16 else np.float32)
        self.tensors.append(RawTensor(name, tuple(reversed(a.shape)), dtype, a.tobytes()))

    def mat(self, *shape: int, scale: float = 1.0) -> np.ndarray:
        n_in = shape[-1]
        return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(scale / np.sqrt(n_in))

    def vec(self, n: int, center: float, spread: float) -> np.ndarray:
        return (center + spread * self.rng.standard_normal(n, dtype=np.float32)).astype(np.float32)


def weights(p: Hy4Params) -> list[RawTensor]:
    """Every tensor of the model in ggml order, F32 (F16 for the routed expert stacks)."""
    w = _Weights(p)
    rng = w.rng
    E = rng.standard_normal((p.n_vocab, p.n_embd), dtype=np.float32)
    perm = rng.permutation(p.n_vocab)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(p.n_vocab)
    head = E[inv] / np.linalg.norm(E[inv], axis=1, keepdims=True) * np.float32(0.6)
    hc, d = p.hc, p.n_embd
    w.add("token_embd.weight", E)
    w.add("output.weight", head)
    w.add("output_norm.weight", w.vec(d, 1.0, 0.1))
    w.add("output_hc_fn.weight", w.mat(hc, hc * d, scale=0.5))
    w.add("output_hc_base.weight", w.vec(hc, 0.0, 0.3))
    w.add("output_hc_scale.weight", np.ones(1, np.float32))
    nh, qk = p.n_head, p.qk_nope + p.qk_rope
    for il in range(p.n_layer):
        b = f"blk.{il}."
        w.add(b + "attn_norm.weight", w.vec(d, 1.0, 0.1))
        w.add(b + "attn_sinks.weight", w.vec(nh, 0.0, 0.5))
        w.add(b + "attn_q_a.weight", w.mat(p.q_lora, d))
        w.add(b + "attn_q_a_norm.weight", w.vec(p.q_lora, 1.0, 0.1))
        w.add(b + "attn_q_b.weight", w.mat(nh * qk, p.q_lora))
        w.add(b + "attn_kv_a_mqa.weight", w.mat(p.kv_lora + p.qk_rope, d))
        w.add(b + "attn_kv_a_norm.weight", w.vec(p.kv_lora, 1.0, 0.1))
        w.add(b + "attn_k_b.weight", w.mat(nh, p.kv_lora, p.qk_nope))      # {nope, kv_lora, n_head}
        w.add(b + "attn_v_b.weight", w.mat(nh, p.v_head, p.kv_lora))       # {kv_lora, v_head, n_head}
        w.add(b + "attn_output.weight", w.mat(d, nh * p.v_head, scale=p.noise))
        w.add(b + "attn_gate.weight", w.mat(nh * p.v_head, d))
        if p.indexer_full[il] == "F":
            w.add(b + "indexer.attn_q_b.weight", w.mat(p.indexer_heads * p.indexer_dim, p.q_lora))
            w.add(b + "indexer.attn_k.weight", w.mat(p.indexer_dim, d))
            w.add(b + "indexer.k_norm.weight", w.vec(p.indexer_dim, 1.0, 0.1))
            w.add(b + "indexer.k_norm.bias", w.vec(p.indexer_dim, 0.0, 0.1))
            w.add(b + "indexer.proj.weight", w.mat(p.indexer_heads, d))
        for part in ("attn", "ffn"):
            w.add(b + f"hc_{part}_fn.weight", w.mat(2 * hc, hc * d, scale=0.5))
            w.add(b + f"hc_{part}_base.weight", w.vec(2 * hc, 0.0, 0.3))
            w.add(b + f"hc_{part}_scale.weight", w.vec(2, 1.0, 0.1))
        w.add(b + "ffn_norm.weight", w.vec(d, 1.0, 0.1))
        if il == 0:
            w.add(b + "ffn_gate.weight", w.mat(p.n_ff, d))
            w.add(b + "ffn_up.weight", w.mat(p.n_ff, d))
            w.add(b + "ffn_down.weight", w.mat(d, p.n_ff, scale=p.noise))
            continue
        ne, ff = p.n_expert, p.n_ff_exp
        w.add(b + "ffn_gate_inp.weight", w.mat(ne, d, scale=2.0))
        w.add(b + "exp_probs_b.bias", w.vec(ne, 0.0, 0.2))
        w.add(b + "ffn_gate_exps.weight", w.mat(ne, ff, d), F16)
        w.add(b + "ffn_up_exps.weight", w.mat(ne, ff, d), F16)
        w.add(b + "ffn_down_exps.weight", w.mat(ne, d, ff, scale=p.noise), F16)
        sff = ff * p.n_expert_shared
        w.add(b + "ffn_gate_shexp.weight", w.mat(sff, d))
        w.add(b + "ffn_up_shexp.weight", w.mat(sff, d))
        w.add(b + "ffn_down_shexp.weight", w.mat(d, sff, scale=p.noise))
    return w.tensors


def write_imatrix(path: Path, tensors: list[RawTensor]) -> None:
    """A flat importance matrix (llama.cpp's legacy .dat format: every weight column equally
    important) for every 2D/3D weight, so that llama-quantize accepts IQ2_XXS / IQ3_XXS."""
    out = bytearray()
    n = 0
    for t in tensors:
        if len(t.dims) < 2 or not t.name.endswith(".weight"):
            continue
        nval = t.dims[0] * (t.dims[2] if len(t.dims) > 2 else 1)
        name = t.name.encode()
        out += struct.pack("<i", len(name)) + name + struct.pack("<ii", 1, nval)
        out += np.ones(nval, np.float32).tobytes()
        n += 1
    path.write_bytes(struct.pack("<i", n) + bytes(out))


def quantize(quantize_exe: Path, src: Path, dst: Path, imatrix: Path, log: Path) -> None:
    args = [str(quantize_exe), "--imatrix", str(imatrix), "--output-tensor-type", "f32",
            "--token-embedding-type", "q4_k"]
    for pat, typ in TENSOR_TYPES:
        args += ["--tensor-type", f"{pat}={typ}"]
    args += [str(src), str(dst), "IQ4_XS", "2"]
    with open(log, "w") as lf:
        lf.write("$ " + " ".join(args) + "\n")
        lf.flush()
        r = subprocess.run(args, stdout=lf, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise HarnessError(f"llama-quantize failed ({r.returncode}) on {src}; log {log}:\n{tail}")


def write_twin(model: Path, twin: Path, p: Hy4Params) -> None:
    """The quantized model's tensors under AngelSlim's hyv4 metadata (same bytes, other keys)."""
    lay = read_layout(model)
    kv = {k: v for k, v in lay.kv.items() if not k.startswith("hy_v4.") and k != "general.architecture"}
    types = {k: lay.kv_types[k] for k in kv}
    akv, atypes = arch_kv(p, "hyv4")
    kv = {**akv, **kv}
    types.update(atypes)
    order = lay.by_offset()
    with open(model, "rb") as f:
        raw = []
        ext = lay.extents()
        for t in order:
            f.seek(lay.data_start + t.offset)
            raw.append(RawTensor(t.name, t.dims, t.type_id, f.read(ext[t.name])))
    write_gguf(twin, kv, raw, alignment=lay.alignment, kv_types=types)


def generate(out_dir: Path, tokenizer_gguf: Path, quantize_exe: Path, p: Hy4Params = Hy4Params(),
             twin: bool = True) -> tuple[Path, Path | None]:
    """Write MODEL_NAME (and TWIN_NAME) into out_dir, atomically; return their paths."""
    p.check()
    out_dir.mkdir(parents=True, exist_ok=True)
    model, twin_path = out_dir / MODEL_NAME, out_dir / TWIN_NAME
    tok_kv, tok_types = tokenizer_kv(tokenizer_gguf, p.n_vocab)
    kv, types = arch_kv(p, "hy_v4")
    with tempfile.TemporaryDirectory(prefix="hy4-synth-", dir=out_dir) as td:
        td = Path(td)
        say(f"synth_hy4: writing the F32/F16 model ({p.n_layer} layers, {p.n_expert} experts)")
        ts = weights(p)
        f32 = td / "hy4-f32.gguf"
        write_gguf(f32, {**kv, **tok_kv}, ts, kv_types={**types, **tok_types})
        imat = td / "flat.imatrix"
        write_imatrix(imat, ts)
        del ts
        say("synth_hy4: llama-quantize (STQ1_0 / IQ2_XXS / IQ3_XXS / IQ4_XS mix)")
        tmp = td / MODEL_NAME
        quantize(Path(quantize_exe), f32, tmp, imat, out_dir / "quantize.log")
        if twin:
            tmp_twin = td / TWIN_NAME
            write_twin(tmp, tmp_twin, p)
            os.replace(tmp_twin, twin_path)
        os.replace(tmp, model)
    return model, (twin_path if twin else None)


def ensure(tokenizer_gguf: Path, quantize_exe: Path, out_root: Path | None = None,
           p: Hy4Params = Hy4Params()) -> tuple[Path, Path]:
    """The model and its twin for these parameters, generated once into <cache>/models/hy4-synth-<key>/."""
    out_dir = (out_root or config.models_dir()) / f"hy4-synth-{p.key()}"
    model, twin = out_dir / MODEL_NAME, out_dir / TWIN_NAME
    if not (model.exists() and twin.exists()):
        generate(out_dir, tokenizer_gguf, quantize_exe, p)
    return model, twin


def main(argv: list[str] | None = None) -> int:
    d = Hy4Params()
    ap = argparse.ArgumentParser(prog="synth_hy4", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer-from", type=Path, required=True,
                    help="SPM GGUF whose tokenizer.* metadata (and chat template) is copied (the Gemma 3 270M GGUF)")
    ap.add_argument("--quantize", type=Path, required=True, help="the series' llama-quantize binary")
    ap.add_argument("--out-dir", type=Path, required=True, help=f"folder for {MODEL_NAME} and {TWIN_NAME}")
    ap.add_argument("--seed", type=int, default=d.seed, help="random seed of the weights")
    ap.add_argument("--layers", type=int, default=d.n_layer, help="blocks (blk.0 dense, the rest MoE)")
    ap.add_argument("--noise", type=float, default=d.noise,
                    help="scale of the layers' contributions (higher: greedy text departs more from the permutation)")
    ap.add_argument("--no-twin", action="store_true", help=f"do not write the hyv4 twin {TWIN_NAME}")
    args = ap.parse_args(argv)
    full = ("FS" * args.layers)[:args.layers]
    p = Hy4Params(seed=args.seed, n_layer=args.layers, noise=args.noise, indexer_full=full)
    model, twin = generate(args.out_dir, args.tokenizer_from, args.quantize, p, twin=not args.no_twin)
    print(f"model: {model}" + (f"\ntwin:  {twin}" if twin else "") +
          f"\nrun:   llama-server -m {model} --jinja")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
