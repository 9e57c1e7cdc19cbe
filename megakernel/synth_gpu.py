"""Gemma-4-E2B/E4B-shaped synthetic targets for the megakernel's speed runs, made on a CUDA GPU.

Random weights (torch on the GPU, fixed seed) quantized on the GPU to Q4_0 (layer matrices) and
Q8_0 (token embedding, untied LM head), F16 per-layer token embeddings, F32 norms and projections;
metadata and tokenizer as harness/synth_gemma4.py writes them. numpy alone needs many minutes for
the 8 B parameters of the E4B shape; this takes about a minute. The GPU quantizers are checked
byte-identical to gguf-py's reference quantizers on a sample before anything is written.
--assistant also writes a gemma4-assistant (MTP head) for it, shaped like Gemma 4's: 4 layers (SSSG) of hidden size
256 reading the target's last sliding-window and global layers' caches, 4 query heads of the target's head sizes,
FFN 2048, Q4_0 matrices, F16 projections, a tied Q8_0 LM head over the whole vocabulary; random, so its drafts are
rarely accepted: it is for the fused draft's speed and its agreement with llama.cpp's assistant graph.
--noise X makes the pair structured instead, as harness/synth_gemma4.py's small pair is: the target's LM head maps token t
to perm[t] (a fixed random permutation; rows unit(E[inv]) * 3 of its token embedding E), the assistant predicts perm[t]
from the token embedding alone (its tied LM head unit(E[inv] P^T) * 3, P its pre-projection's token half), and X scales
the target layers' contributions to the residual stream (the post-attention, post-FFN and per-layer post norms), so the
target's greedy text walks the permutation and departs from it more often as X grows: X sets the drafts' acceptance
(stq-metal bench mtp reports it). The file keeps X under the key stq_metal.synth.noise; --set-noise Y rescales those
norms of such a file in place (seconds, not a new 9 GB file), so one pair serves several acceptance rates.

    python3 megakernel/synth_gpu.py --shape e4b --tokenizer-from TOKENIZER.gguf --out e4b.gguf [--assistant e4b-a.gguf]
        [--noise X]
    python3 megakernel/synth_gpu.py --set-noise Y --out e4b.gguf     # (a file made with --noise)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness import synth_gemma4 as sg  # noqa: E402

SHAPES = {
    # n_layer, pattern, n_embd, n_head, n_head_kv, hd_swa, hd_global, n_ff (per layer), n_kv_shared, n_pl, window
    "e4b": dict(n_layer=42, pattern="SSSSSG" * 7, n_embd=2560, n_head=8, n_head_kv=2, hd_swa=256, hd_global=512,
                n_ff=[10240] * 42, n_kv_shared=18, n_pl=256, window=512),
    "e2b": dict(n_layer=35, pattern="SSSSG" * 7, n_embd=1536, n_head=8, n_head_kv=1, hd_swa=256, hd_global=512,
                n_ff=[6144] * 15 + [12288] * 20, n_kv_shared=20, n_pl=256, window=512),
}


def _roundf(x):
    import torch
    return torch.sign(x) * torch.floor(torch.abs(x) + 0.5)


def q8_0(x):
    """x: [rows, n] float32 CUDA tensor -> uint8 [rows, n/32*34] (ggml's quantize_row_q8_0_ref)."""
    import torch
    b = x.reshape(-1, 32)
    amax = b.abs().amax(dim=1, keepdim=True)
    d = amax / 127.0
    idv = torch.where(d == 0, torch.zeros_like(d), 1.0 / d)
    q = _roundf(b * idv).to(torch.int8)
    dh = d.to(torch.float16).view(torch.uint8).reshape(-1, 2)
    out = torch.cat([dh, q.view(torch.uint8)], dim=1)
    return out.reshape(x.shape[0], -1)


def q4_0(x):
    """x: [rows, n] float32 CUDA tensor -> uint8 [rows, n/32*18] (ggml's quantize_row_q4_0_ref)."""
    import torch
    b = x.reshape(-1, 32)
    idx = b.abs().argmax(dim=1, keepdim=True)
    mx = torch.gather(b, 1, idx)
    d = mx / -8.0
    idv = torch.where(d == 0, torch.zeros_like(d), 1.0 / d)
    q = torch.clamp((b * idv + 8.5).to(torch.int8), max=15).to(torch.uint8)  # trunc toward zero as (int8_t)
    qs = q[:, :16] | (q[:, 16:] << 4)
    dh = d.to(torch.float16).view(torch.uint8).reshape(-1, 2)
    out = torch.cat([dh, qs], dim=1)
    return out.reshape(x.shape[0], -1)


def check_quantizers(gguf) -> None:
    import torch
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(64, 2048, device="cuda", generator=g)
    x[0, :32] = 0.0  # an all-zero block
    xn = x.cpu().numpy()
    for name, fn in (("Q8_0", q8_0), ("Q4_0", q4_0)):
        ref = gguf.quants.quantize(xn, getattr(gguf.GGMLQuantizationType, name))
        got = fn(x).cpu().numpy()
        if ref.shape != got.shape or not np.array_equal(ref, got):
            diff = int((ref != got).sum()) if ref.shape == got.shape else -1
            raise SystemExit(f"synth_gpu: the GPU {name} quantizer differs from gguf-py's on the sample ({diff} bytes)")
    print("synth_gpu: GPU Q8_0/Q4_0 quantizers byte-identical to gguf-py's on a 64x2048 sample")


NOISE_KEY = "stq_metal.synth.noise"
# the target's norms that scale its layers' contributions to the residual stream (--noise, --set-noise)
NOISE_NORMS = ("post_attention_norm", "post_ffw_norm", "post_norm")


def set_noise(path: Path, noise: float | None) -> float:
    """Rescale the NOISE_NORMS of a target made with --noise to `noise`, in place (None: change nothing); returns the
    noise it had."""
    import re
    gguf = sg._gguf()
    try:
        reader = gguf.GGUFReader(str(path), "r" if noise is None else "r+")
    except (OSError, ValueError) as e:
        raise SystemExit(f"synth_gpu: cannot read {path} as GGUF ({e}); nothing changed") from None
    field = reader.fields.get(NOISE_KEY)
    if field is None:
        raise SystemExit(f"synth_gpu: {path} has no {NOISE_KEY} key (not a target made with --noise); nothing changed")
    old = float(field.parts[field.data[0]][0])
    if noise is None or noise == old:
        return old
    pat = re.compile(r"blk\.\d+\.(" + "|".join(NOISE_NORMS) + r")\.weight")
    hits = [t for t in reader.tensors if pat.fullmatch(t.name)]
    if not hits or any(t.tensor_type != gguf.GGMLQuantizationType.F32 for t in hits):
        raise SystemExit(f"synth_gpu: {path}: expected F32 tensors blk.N.{{{','.join(NOISE_NORMS)}}}.weight; nothing changed")
    for t in hits:
        t.data[...] = t.data * np.float32(noise / old)
    field.parts[field.data[0]][0] = noise   # the key last: an interrupted run leaves the old value with mixed norms
    reader.data.flush()
    print(f"synth_gpu: {path}: noise {old:g} -> {noise:g} ({len(hits)} norm vectors rescaled in place)")
    return old


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="synth_gpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), help="Gemma 4 E2B or E4B layout (required unless --set-noise)")
    ap.add_argument("--tokenizer-from", type=Path, help="GGUF whose tokenizer.* metadata is copied (required unless --set-noise)")
    ap.add_argument("--out", type=Path, required=True, help="the GGUF to write (atomically); with --set-noise: the target to rescale")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--assistant", type=Path, help="also write an MTP assistant (gemma4-assistant) for the target here")
    ap.add_argument("--noise", type=float, help="a structured pair (see above): the scale of the target layers' "
                    "contributions to the residual stream (larger: the drafts accepted less often)")
    ap.add_argument("--set-noise", type=float, metavar="Y", help="rescale the noise of --out (made with --noise) to Y in "
                    "place and exit (the file is changed where it is: an interrupted run leaves it mixed)")
    args = ap.parse_args(argv)
    if args.set_noise is not None:
        set_noise(args.out, args.set_noise)
        return 0
    if args.shape is None or args.tokenizer_from is None:
        ap.error("--shape and --tokenizer-from are required to make a model")
    structured = args.noise is not None

    import torch
    gguf = sg._gguf()
    check_quantizers(gguf)
    s = SHAPES[args.shape]
    t0 = time.time()
    torch.manual_seed(args.seed)
    reader = gguf.GGUFReader(str(args.tokenizer_from))
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    n = s["n_embd"]
    pattern = s["pattern"]
    kv_from = s["n_layer"] - s["n_kv_shared"]

    def rnd(rows, cols, scale):
        return torch.randn(rows, cols, device="cuda") * (scale / np.sqrt(cols))

    def norm_w(k, scale=1.0):
        return (scale * (0.5 + torch.rand(k, device="cuda"))).cpu().numpy().astype(np.float32)

    Q8, Q4 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0

    def write(path: Path, arch: str, fill) -> None:
        sg._write_atomic(lambda p: gguf.GGUFWriter(str(p), arch), path, fill)

    def adders(w):
        def add_q(name, x, qt):
            q = (q8_0 if qt == Q8 else q4_0)(x).cpu().numpy()
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)

        def add_f(name, x, dtype=np.float32):
            arr = x if isinstance(x, np.ndarray) else x.cpu().numpy()
            w.add_tensor(name, np.ascontiguousarray(arr.astype(dtype)))
        return add_q, add_f

    def add_out_ffn(add_q, add_f, pre, width, q_width, ff, post=0.5):
        # a layer's tensors after its attention's Q/K/V, in the same order for target and assistant layers
        add_q(pre + "attn_output.weight", rnd(width, q_width, 1.0), Q4)
        add_f(pre + "post_attention_norm.weight", norm_w(width, post))
        add_f(pre + "ffn_norm.weight", norm_w(width))
        add_q(pre + "ffn_gate.weight", rnd(ff, width, 1.0), Q4)
        add_q(pre + "ffn_up.weight", rnd(ff, width, 1.0), Q4)
        add_q(pre + "ffn_down.weight", rnd(width, ff, 1.0), Q4)
        add_f(pre + "post_ffw_norm.weight", norm_w(width, post))

    def unit_rows(x):
        return x / x.norm(dim=1, keepdim=True)

    # structured: E kept for both files, inv = the permutation's inverse (LM head row v = unit(E[inv[v]]) * 3)
    E = inv = None
    if structured:
        gp = torch.Generator(device="cuda").manual_seed(args.seed + 2)
        perm = torch.randperm(n_vocab, device="cuda", generator=gp)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(n_vocab, device="cuda")

    n_pairs = s["hd_global"] // 2
    rope_freqs = np.array([1.0] * (n_pairs // 4) + [1e30] * (n_pairs - n_pairs // 4), np.float32)

    def fill_target(w) -> None:
        nonlocal E
        w.add_name(f"gemma4 {args.shape}-shaped synthetic target (random weights, stq-metal)")
        w.add_context_length(8192)
        w.add_embedding_length(n)
        w.add_block_count(s["n_layer"])
        w.add_feed_forward_length(s["n_ff"])
        p = sg.SynthParams(n_embd=n, n_layer=s["n_layer"], swa_pattern=pattern, n_kv_shared=s["n_kv_shared"],
                           n_head=s["n_head"], n_head_kv=s["n_head_kv"], head_dim_swa=s["hd_swa"],
                           head_dim_global=s["hd_global"], n_ff=s["n_ff"][0], n_embd_per_layer=s["n_pl"],
                           window=s["window"])
        sg._common_attn_kv(gguf, w, p, pattern)
        w.add_shared_kv_layers(s["n_kv_shared"])
        w.add_embedding_length_per_layer_input(s["n_pl"])
        w.add_final_logit_softcapping(30.0)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
        sg._copy_tokenizer(gguf, reader, w)
        if structured:
            w.add_float32(NOISE_KEY, args.noise)

        add_q, add_f = adders(w)

        emb = torch.randn(n_vocab, n, device="cuda")
        add_q("token_embd.weight", emb, Q8)
        if structured:
            E = emb
            add_q("output.weight", unit_rows(E[inv]) * sg.HEAD_SCALE, Q8)
        else:
            add_q("output.weight", rnd(n_vocab, n, 3.0), Q8)
        post = args.noise if structured else 0.5
        add_f("output_norm.weight", np.ones(n, np.float32))
        add_f("rope_freqs.weight", rope_freqs)
        n_pl_all = s["n_pl"] * s["n_layer"]
        pl = np.empty((n_vocab, n_pl_all), np.float16)
        for r0 in range(0, n_vocab, 16384):
            pl[r0:r0 + 16384] = torch.randn(min(16384, n_vocab - r0), n_pl_all, device="cuda").half().cpu().numpy()
        add_f("per_layer_token_embd.weight", pl, np.float16)
        add_f("per_layer_model_proj.weight", rnd(n_pl_all, n, 1.0))
        add_f("per_layer_proj_norm.weight", norm_w(s["n_pl"]))
        for il, c in enumerate(pattern):
            d = s["hd_swa"] if c == "S" else s["hd_global"]
            ff = s["n_ff"][il]
            pre = f"blk.{il}."
            add_f(pre + "attn_norm.weight", norm_w(n))
            add_q(pre + "attn_q.weight", rnd(s["n_head"] * d, n, 1.0), Q4)
            add_f(pre + "attn_q_norm.weight", norm_w(d))
            if il < kv_from:
                add_q(pre + "attn_k.weight", rnd(s["n_head_kv"] * d, n, 1.0), Q4)
                add_q(pre + "attn_v.weight", rnd(s["n_head_kv"] * d, n, 1.0), Q4)
                add_f(pre + "attn_k_norm.weight", norm_w(d))
            add_out_ffn(add_q, add_f, pre, n, s["n_head"] * d, ff, post)
            add_q(pre + "inp_gate.weight", rnd(s["n_pl"], n, 1.0), Q4)
            add_f(pre + "proj.weight", rnd(n, s["n_pl"], 1.0))
            add_f(pre + "post_norm.weight", norm_w(n, post))
            add_f(pre + "layer_output_scale.weight", np.ones(1, np.float32))

    def fill_assistant(w) -> None:
        na, pat, n_head, ff = 256, "SSSG", 4, 2048
        pa = sg.SynthParams(n_embd=n, n_embd_assistant=na, assistant_pattern=pat, n_head=n_head, n_head_kv=s["n_head_kv"],
                            head_dim_swa=s["hd_swa"], head_dim_global=s["hd_global"], n_ff=ff, window=s["window"],
                            n_ctx_train=8192)
        sg.assistant_metadata(gguf, w, pa, reader, f"gemma4 {args.shape}-shaped synthetic MTP assistant (random weights, stq-metal)")
        add_q, add_f = adders(w)
        if structured:
            # x = E[t]*sqrt(n) beside the target's hidden state h: the pre-projection maps x through P (h weakly), so
            # the tied LM head's rows unit(P E[inv[v]]) * 3 put perm[t] first; the layers add little (synth_gemma4's constants)
            P = rnd(na, n, 1.0)
            add_q("token_embd.weight", unit_rows(E[inv] @ P.T) * sg.HEAD_SCALE, Q8)
            add_f("output_norm.weight", np.ones(na, np.float32))
            add_f("rope_freqs.weight", rope_freqs)
            add_f("nextn.pre_projection.weight", torch.cat([P, rnd(na, n, sg.H_WEAK)], dim=1), np.float16)
        else:
            add_q("token_embd.weight", rnd(n_vocab, na, 3.0), Q8)
            add_f("output_norm.weight", norm_w(na))
            add_f("rope_freqs.weight", rope_freqs)
            add_f("nextn.pre_projection.weight", rnd(na, 2*n, 1.0), np.float16)
        add_f("nextn.post_projection.weight", rnd(n, na, 1.0), np.float16)
        for il, c in enumerate(pat):
            d = s["hd_swa"] if c == "S" else s["hd_global"]
            pre = f"blk.{il}."
            add_f(pre + "attn_norm.weight", norm_w(na))
            add_q(pre + "attn_q.weight", rnd(n_head * d, na, 1.0), Q4)
            add_f(pre + "attn_q_norm.weight", norm_w(d))
            add_out_ffn(add_q, add_f, pre, na, n_head * d, ff, sg.ASSISTANT_POST if structured else 0.5)
            add_f(pre + "layer_output_scale.weight", np.ones(1, np.float32))

    write(args.out, "gemma4", fill_target)
    print(f"synth_gpu: wrote {args.out} ({args.out.stat().st_size / 2**30:.2f} GiB) in {time.time() - t0:.0f} s")
    if args.assistant:
        write(args.assistant, "gemma4-assistant", fill_assistant)
        print(f"synth_gpu: wrote {args.assistant} ({args.assistant.stat().st_size / 2**20:.0f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
