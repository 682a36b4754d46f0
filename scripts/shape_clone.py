"""Shape clones of GGUF files, for timing where the real files cannot be reached.

A clone keeps a model's whole header (metadata, vocabulary, tensor names, types and shapes)
and replaces the tensor bytes with a constant fill, so every kernel sees the real shapes and
weight types; timing does not depend on weight values (the generated text is meaningless).

    python scripts/shape_clone.py header MODEL.gguf OUT.hdr      # the header alone (a few MB)
    python scripts/shape_clone.py expand OUT.hdr CLONE.gguf      # header + filled tensor data
"""
import argparse
import sys

from cera.gguf_file import GGUFFile, PrefixSource

FILL = 0x11   # as f16 a small normal number, as f32 a tiny one: no NaN or Inf anywhere


def header(model: str, out: str) -> None:
    g = GGUFFile.open(model)
    with open(model, "rb") as f, open(out, "wb") as o:
        o.write(f.read(g.data_offset))
    print(f"{out}: {g.data_offset} header bytes of {g.source.size}")


def expand(hdr: str, out: str) -> None:
    prefix = open(hdr, "rb").read()
    g = GGUFFile(PrefixSource(prefix, 1 << 62))
    size = max(t.offset + t.nbytes for t in g.tensors.values())
    chunk = bytes([FILL]) * (64 << 20)
    with open(out, "wb") as o:
        o.write(prefix)
        while o.tell() < size:
            o.write(chunk[: size - o.tell()])
    print(f"{out}: {size} bytes, {len(g.tensors)} tensors")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["header", "expand"])
    ap.add_argument("src")
    ap.add_argument("dst")
    a = ap.parse_args()
    (header if a.action == "header" else expand)(a.src, a.dst)


if __name__ == "__main__":
    sys.exit(main())
