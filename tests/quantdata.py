"""Random valid GGUF weight rows of every matvec type, with their dequantized values.

    raw, ref = random_rows(GGMLQuantizationType.Q4_K, rows=7, k=512, rng=np.random.default_rng(0))
    # raw: uint8 (rows, row_bytes), ggml block layout; ref: float32 (rows, k), gguf.quants.dequantize(raw)

Types gguf.quants can quantize are quantized from normal values; the K-quants and
i-quants (which gguf.quants cannot write) are random bytes with finite, moderate f16 scales.
"""
from __future__ import annotations

import numpy as np
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T


RANDOM_BLOCK_TYPES = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS,
                      T.IQ3_S, T.IQ4_NL, T.IQ4_XS)   # gguf.quants cannot write these


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    """(n,) values -> (n, 2) uint8, little-endian f16."""
    return values.astype("<f2").view(np.uint8).reshape(-1, 2)


def _random_blocks(qtype: T, n: int, rng: np.random.Generator) -> np.ndarray:
    """n random blocks of a K-quant or i-quant: random quants, small positive f16 super-scales."""
    def scale(lo, hi):
        return _f16_bytes(rng.uniform(lo, hi, n))

    def noise(size):
        return rng.integers(0, 256, (n, size), dtype=np.uint8)

    if qtype == T.Q2_K:       # scales[16] | qs[64] | d | dmin; |x| <~ 15 * 3 * d
        parts = [noise(16), noise(64), scale(0.02, 0.06), scale(0.02, 0.06)]
    elif qtype == T.Q3_K:     # hmask[32] | qs[64] | scales[12] | d; |x| <~ 32 * 4 * d
        parts = [noise(32), noise(64), noise(12), scale(5e-3, 1.5e-2)]
    elif qtype == T.Q4_K:     # d | dmin | scales[12] | qs[128]; |x| <~ 63 * 15 * d
        parts = [scale(1e-3, 3e-3), scale(1e-3, 3e-3), noise(12), noise(128)]
    elif qtype == T.Q5_K:     # d | dmin | scales[12] | qh[32] | qs[128]
        parts = [scale(5e-4, 1.5e-3), scale(5e-4, 1.5e-3), noise(12), noise(32), noise(128)]
    elif qtype == T.Q6_K:     # ql[128] | qh[64] | scales[16] (i8) | d
        parts = [noise(128), noise(64), noise(16), scale(5e-4, 1.5e-3)]
    elif qtype in (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S):   # d | grid indices, signs, scales; |x| <= 15.5 / 4 * 43 * d
        parts = [scale(5e-3, 1.5e-2), noise(GGML_QUANT_SIZES[qtype][1] - 2)]
    elif qtype in (T.IQ3_XXS, T.IQ3_S):   # d | grid indices, signs, scales; |x| <= 31 * 15 * d
        parts = [scale(1e-3, 3e-3), noise(GGML_QUANT_SIZES[qtype][1] - 2)]
    elif qtype == T.IQ4_NL:   # d | qs[16]; |x| <= 127 * d
        parts = [scale(5e-3, 1.5e-2), noise(16)]
    elif qtype == T.IQ4_XS:   # d | scales_h (u16) | scales_l[4] | qs[128]; |x| <= 32 * 127 * d
        parts = [scale(2e-4, 6e-4), noise(2), noise(4), noise(128)]
    else:
        raise ValueError(f"{qtype.name} is not a type with random blocks here")
    blocks = np.concatenate(parts, axis=1)
    assert blocks.shape[1] == GGML_QUANT_SIZES[qtype][1]
    return blocks


def random_rows(qtype: int, rows: int, k: int, rng: np.random.Generator, std: float = 1.0):
    """(raw uint8 (rows, row_bytes), dequantized float32 (rows, k)) for a weight type."""
    qtype = T(qtype)
    block, size = GGML_QUANT_SIZES[qtype]
    assert k % block == 0, (qtype.name, k)
    if qtype in RANDOM_BLOCK_TYPES:
        raw = _random_blocks(qtype, rows * k // block, rng).reshape(rows, k // block * size)
    else:
        values = (rng.standard_normal((rows, k)) * std).astype(np.float32)
        raw = np.ascontiguousarray(quants.quantize(values, qtype)).view(np.uint8).reshape(rows, -1)
    ref = quants.dequantize(raw, qtype).reshape(rows, k).astype(np.float32)
    assert np.isfinite(ref).all()
    return raw, ref


def padded(data: np.ndarray | bytes) -> bytes:
    """Bytes padded with zeros to a multiple of 4 (queue writes need it)."""
    data = bytes(data) if not isinstance(data, np.ndarray) else data.tobytes()
    return data + bytes(-len(data) % 4)
