"""Write the i-quant grids as WGSL tables (shaders/iq*_grid.wgsl) from gguf-py's tables.

    python scripts/iq_grids.py          # rewrites the files; tests/test_kernels_matvec.py checks them

The i-quants pick each group of 8 (IQ2) or 4 (IQ3) weights from a fixed grid of points
(ggml's iq2xxs_grid, iq3s_grid, ...). gguf.quants holds the same grids, bit for bit, with
each value as an index into a short list of levels (`grid_map`). The files keep that form,
two 16-bit entries per u32, read by the file's `grid_entry(i)`:
  IQ2: 8 level indices of 2 bits, value j in bits 2j, 2j+1;
  IQ3: 4 level indices of 3 bits, value j in bits 3j .. 3j+2.
quant_units.wgsl turns an index into its level (IQ2: 8 25 43; IQ3_XXS: 4 12 ... 52 62; IQ3_S: 1 3 ... 15).

The tables are `var<private>` with an initializer, never written, rather than `const`: naga
compiles a dynamically indexed `const` array by copying it into a local variable at every
access (an IQ2_S matvec took 15 s to compile on lavapipe, 2.9 s this way).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import quants

SHADERS = Path(__file__).resolve().parents[1] / "shaders"
GRIDS = {  # file -> (WGSL name, gguf-py class holding the grid, bits per level index)
    "iq2xxs_grid.wgsl": ("IQ2XXS_GRID", quants.IQ2_XXS, 2),
    "iq2xs_grid.wgsl": ("IQ2XS_GRID", quants.IQ2_XS, 2),
    "iq2s_grid.wgsl": ("IQ2S_GRID", quants.IQ2_S, 2),
    "iq3xxs_grid.wgsl": ("IQ3XXS_GRID", quants.IQ3_XXS, 3),
    "iq3s_grid.wgsl": ("IQ3S_GRID", quants.IQ3_S, 3),
}


def entries(cls, bits: int) -> np.ndarray:
    """The grid of a gguf-py quant class as (n,) uint32 entries of packed level indices."""
    cls.init_grid()
    points = cls.grid.reshape(cls.grid_shape)                          # (n, 8 or 4) levels
    index = np.searchsorted(np.array(cls.grid_map, np.float32), points).astype(np.uint32)
    assert (np.array(cls.grid_map, np.float32)[index] == points).all()
    return (index << (bits * np.arange(points.shape[1], dtype=np.uint32))).sum(1, dtype=np.uint32)


def wgsl(file: str) -> str:
    """The text of shaders/{file}."""
    name, cls, bits = GRIDS[file]
    e = entries(cls, bits)
    words = e[0::2] | (e[1::2] << 16)
    lines = ["    " + " ".join(f"0x{w:08x}u," for w in words[i:i + 8]) for i in range(0, len(words), 8)]
    return (f"// ggml's {cls.qtype.name} grid: {len(e)} entries of {cls.grid_shape[1]} level indices of {bits} bits,\n"
            f"// two entries per word. Written by scripts/iq_grids.py from gguf-py's table; do not edit.\n"
            f"var<private> {name}: array<u32, {len(words)}> = array<u32, {len(words)}>(\n"
            + "\n".join(lines) + "\n);\n\n"
            f"fn grid_entry(i: u32) -> u32 {{\n"
            f"    return ({name}[i >> 1u] >> (16u * (i & 1u))) & 0xFFFFu;\n"
            f"}}\n")


def main() -> None:
    for file in GRIDS:
        (SHADERS / file).write_text(wgsl(file))
        print(f"wrote shaders/{file}", file=sys.stderr)


if __name__ == "__main__":
    main()
