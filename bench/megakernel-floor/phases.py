"""The weight bytes of each grid-barrier phase of a Gemma 4 decode step, in the megakernel's order (mk_step in
megakernel/cuda/mk-kernel.cuh), from a GGUF: one line per phase, "BYTES NAME", for floor.cu (the list itself:
harness/bench_megakernel.py's decode_phases).

    PYTHONPATH=$SRC/gguf-py python3 bench/megakernel-floor/phases.py MODEL.gguf > phases.txt
"""
import sys
from pathlib import Path

from gguf import GGUFReader

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # the repository root: harness/
from harness.bench_megakernel import decode_phases  # noqa: E402  (the phase list's one source)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    r = GGUFReader(sys.argv[1])
    out = decode_phases({t.name: int(t.n_bytes) for t in r.tensors})
    for n, name in out:
        print(n, name)
    print(f"# {len(out)} phases, {sum(n for n, _ in out)/1e9:.3f} GB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
