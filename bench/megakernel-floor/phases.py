"""The weight bytes of each grid-barrier phase of a Gemma 4 decode step, in the megakernel's order (mk_step in
megakernel/cuda/mk-kernel.cuh), from a GGUF: one line per phase, "BYTES NAME", for floor.cu.

    PYTHONPATH=$SRC/gguf-py python3 bench/megakernel-floor/phases.py MODEL.gguf > phases.txt
"""
import sys

from gguf import GGUFReader


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    r = GGUFReader(sys.argv[1])
    size = {t.name: int(t.n_bytes) for t in r.tensors}
    n_layer = 1 + max(int(n.split(".")[1]) for n in size if n.startswith("blk."))
    ple = "per_layer_model_proj.weight" in size
    b = lambda *names: sum(size.get(n, 0) for n in names)  # noqa: E731
    out = []
    if ple:
        out += [(b("per_layer_model_proj.weight"), "per-layer proj"), (0, "per-layer inputs")]
    for il in range(n_layer):
        p = f"blk.{il}."
        out += [(b(p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"), f"{il} q/k/v"),
                (0, f"{il} heads"), (0, f"{il} attention"),
                (b(p + "attn_output.weight"), f"{il} o proj"),
                (b(p + "ffn_gate.weight", p + "ffn_up.weight"), f"{il} gate/up"),
                (b(p + "ffn_down.weight"), f"{il} down")]
        if ple:
            out += [(b(p + "inp_gate.weight"), f"{il} per-layer gate"), (b(p + "proj.weight"), f"{il} per-layer proj+")]
    out.append((b("output.weight") or b("token_embd.weight"), "lm head"))
    for n, name in out:
        print(n, name)
    print(f"# {len(out)} phases, {sum(n for n, _ in out)/1e9:.3f} GB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
