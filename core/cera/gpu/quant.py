"""What the kernels know of the GGUF weight types (shaders/quant_*.wgsl decode them): the types
they decode and their sets by what those offer each, the defines naming a type, a row's
bytes and units, and the row tiles a matrix too big for one storage binding is split into
(bound at aligned offsets: `row_tiles`, `byte_range`).
"""
from __future__ import annotations

from math import gcd

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from cera.device import Binding
from cera.errors import TooLarge, Unsupported
from cera.kernels import flags

# Every type quant_units.wgsl decodes: the matvec, the prefill matmul (it stages whole units) and the
# embedding lookup take each of them.
WEIGHT_TYPES = frozenset({T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
                          T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S,
                          T.IQ3_XXS, T.IQ3_S, T.IQ4_NL, T.IQ4_XS})
UNIT_ELEMS = 16          # elements per work item (a "unit" in shaders/quant_blocks.wgsl)
QUAD_TYPES = frozenset({T.Q4_K, T.Q5_K})   # blocks of a multiple of 16 bytes: bound as vec4<u32>
# Types whose quant_units.wgsl section splits a unit's loads from its arithmetic (unit_words, unit_decode)
UNIT_WORDS_TYPES = frozenset({T.Q4_0, T.Q4_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K})
# Types quant_units.wgsl also gives as affine maps of exact floats (unit_affine): a staged matvec's
# dot then needs no conversion per element (matvec.wgsl UNIT_AFFINE)
UNIT_AFFINE_TYPES = frozenset({T.Q4_K})
# Types dotted with x in integers per 256 elements (quant_items_int.wgsl's item_dot_int: integer
# products, dot4I8Packed; matvec_int.wgsl; cera.gpu.matvec.x_int_bits)
X_INT_TYPES = frozenset({T.Q4_K, T.Q6_K})
X_INT_ITEM_UNITS = {T.Q4_K: 2, T.Q6_K: 4}   # units an item_dot_int takes (the ITEM_UNITS define)
# Weight types with an integer prefill matmul (shaders/matmul_int.wgsl; quant_subs_int.wgsl): x
# in 8 bits per 256-element block, as llama.cpp's CPU backend quantizes the activations of its
# k-quant dot products (Q8_K). Opt-in (cera.gpu.numerics' int8, with decode's 8-bit x): its
# logits differ from the f32 tiles' by llama.cpp's own activation rounding (a few percent of the
# largest on the synthetic models), beyond the tolerance prefill is held to against decode.
INT_TILE_TYPES = frozenset({T.Q4_K, T.Q6_K})
INT_SUB_SCALES = {T.Q4_K: 1, T.Q6_K: 2}   # scales a 32-element sub-block has (the SUB_SCALES define)


def weight_flags(t: T) -> dict:
    """The defines naming a weight type for shaders/quant_*.wgsl: its flag, and WEIGHT_QUADS where
    its blocks are whole 16-byte words (the weights are then bound as array<vec4<u32>> and a
    block's fields arrive in 16-byte loads: fewer storage accesses, each bounds-checked in a
    browser), UNIT_WORDS where quant_units.wgsl splits its unit_values into unit_words and
    unit_decode, and FLOAT_ROWS for the float types (rows of any length, strided units)."""
    return flags(**{t.name: True, "WEIGHT_QUADS": t in QUAD_TYPES, "UNIT_WORDS": t in UNIT_WORDS_TYPES,
                    "FLOAT_ROWS": GGML_QUANT_SIZES[t][0] == 1})


def weight_type(wtype: int, kernel: str = "matvec") -> T:
    """wtype as a GGML type that quant_units.wgsl decodes (else Unsupported, naming `kernel`)."""
    t = T(wtype)
    if t not in WEIGHT_TYPES:
        raise Unsupported(f"no {kernel} kernel for weight type {t.name}")
    return t


def row_bytes(wtype: int, k: int) -> int:
    """Bytes of one row of k elements of type `wtype` (k a multiple of the block size)."""
    block, size = GGML_QUANT_SIZES[T(wtype)]
    if k % block:
        raise Unsupported(f"row length {k} is not a multiple of {T(wtype).name}'s block of {block}")
    return k // block * size


def units_per_row(wtype: int, k: int) -> int:
    """Work items per row in shaders/quant_blocks.wgsl: 16 elements each (the last one of a
    float row may be partial)."""
    weight_type(wtype)
    return -(-k // UNIT_ELEMS)


def row_tiles(wtype: int, k: int, m: int, limits) -> list[tuple[int, int]]:
    """Split m rows into (row_start, n_rows) tiles whose weight bytes fit one storage
    binding and whose starts are aligned for both the weights (row_start * row_bytes) and
    an f32 output bound at the same row (row_start * 4)."""
    rb = row_bytes(wtype, k)
    most = limits.max_storage_buffer_binding_size
    if m * rb <= most and m * 4 <= most:
        return [(0, m)]
    step = aligned_rows(limits.min_storage_buffer_offset_alignment, rb, 4)   # the weights' and an f32 output's
    per_tile = min(most // rb, most // 4) // step * step
    if per_tile == 0:
        raise TooLarge(f"{T(wtype).name} rows of {rb} bytes: {step} aligned rows exceed the "
                         f"storage binding limit of {most} bytes")
    return [(start, min(per_tile, m - start)) for start in range(0, m, per_tile)]


def byte_range(b, start: int, size: int, limits) -> Binding | None:
    """Bytes [start, start+size) of b (a buffer or Binding; None: None), the size rounded up to 4:
    a tile of a tiled dispatch, which must start at an aligned offset."""
    if b is None:
        return None
    b = b if isinstance(b, Binding) else Binding(b)
    align = limits.min_storage_buffer_offset_alignment
    if (b.offset + start) % align:
        raise TooLarge(f"a tile at byte {b.offset + start}: not a multiple of {align}, so it cannot be tiled")
    return Binding(b.buffer, b.offset + start, (size + 3) // 4 * 4)


def aligned_rows(align: int, *row_sizes: int) -> int:
    """The smallest row count whose multiples keep every row size's offsets aligned."""
    step = 1
    for size in row_sizes:
        need = align // gcd(align, size)
        step = step * need // gcd(step, need)
    return step
