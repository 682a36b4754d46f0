"""Shape clones of GGUF files, for timing where the real files cannot be reached.

A clone keeps a model's whole header (metadata, vocabulary, tensor names, types and shapes)
and replaces the tensor bytes with a fill, so every kernel sees the real shapes and weight
types (the generated text is meaningless). The default fill is one constant byte; `--fill
random` writes seeded random bytes instead, for checking that the constant does not flatter
the timing (a GPU may compress memory that repeats one value, which random bytes defeat; some
random f16 scales are NaN or Inf, which costs the kernels nothing).

    python scripts/shape_clone.py header MODEL.gguf OUT.hdr                  # the header alone (a few MB)
    python scripts/shape_clone.py expand OUT.hdr CLONE.gguf [--fill random]  # header + filled tensor data
"""
import argparse
import sys

import numpy as np

from cera.gguf_file import GGUFFile, PrefixSource

FILL = 0x11   # as f16 a small normal number, as f32 a tiny one: no NaN or Inf anywhere
CHUNK = 64 << 20


def header(model: str, out: str) -> None:
    g = GGUFFile.open(model)
    with open(model, "rb") as f, open(out, "wb") as o:
        o.write(f.read(g.data_offset))
    print(f"{out}: {g.data_offset} header bytes of {g.source.size}")


def expand(hdr: str, out: str, fill: str = "constant") -> None:
    prefix = open(hdr, "rb").read()
    g = GGUFFile(PrefixSource(prefix, 1 << 62))
    size = max(t.offset + t.nbytes for t in g.tensors.values())
    rng = np.random.default_rng(0)
    constant = bytes([FILL]) * CHUNK
    with open(out, "wb") as o:
        o.write(prefix)
        while o.tell() < size:
            chunk = rng.bytes(CHUNK) if fill == "random" else constant
            o.write(chunk[: size - o.tell()])
    print(f"{out}: {size} bytes, {len(g.tensors)} tensors, {fill} fill")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["header", "expand"])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--fill", choices=["constant", "random"], default="constant",
                    help="expand: the tensor bytes, one constant byte or seeded random bytes (default: constant)")
    a = ap.parse_args()
    if a.action == "header":
        header(a.src, a.dst)
    else:
        expand(a.src, a.dst, a.fill)


if __name__ == "__main__":
    sys.exit(main())
