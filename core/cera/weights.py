"""Tensors out of a GGUF file as float32 numpy arrays (numpy order: (rows, cols) for a matrix).

Dequantizing goes through `gguf.quants.dequantize`, which matches ggml bit for bit for the
types cera runs (Q4_0 .. Q8_0, the K-quants, F16, BF16, F32). This is the CPU path: the
numpy reference and the tests use it; the GPU keeps quantized weights quantized.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from .gguf_file import GGUFFile, TensorInfo
from cera.errors import BadFile, InvalidArgument, Unsupported


def _decode(raw: bytes, info: TensorInfo, n_rows: int) -> np.ndarray:
    """Raw bytes of `n_rows` whole rows of `info` -> float32 (n_rows, row_len)."""
    row_len = info.ne[0]
    data = np.frombuffer(raw, dtype=np.uint8).reshape(n_rows, -1)   # (n_rows, row_bytes)
    try:
        out = dequantize(data, GGMLQuantizationType(info.ggml_type))
    except NotImplementedError:
        raise Unsupported(f"tensor {info.name}: type {info.type_name} cannot be dequantized") from None
    return np.ascontiguousarray(out, dtype=np.float32).reshape(n_rows, row_len)


def tensor(gguf_file: GGUFFile, name: str) -> np.ndarray:
    """The whole tensor `name`, dequantized to float32, in numpy shape (`TensorInfo.shape`)."""
    if name not in gguf_file.tensors:
        raise BadFile(f"tensor {name} missing")
    info = gguf_file.tensors[name]
    n_rows = int(np.prod(info.shape[:-1], dtype=np.int64)) if len(info.shape) > 1 else 1
    return _decode(gguf_file.read(name), info, n_rows).reshape(info.shape)


def rows(gguf_file: GGUFFile, name: str, ids) -> np.ndarray:
    """Selected rows of a matrix (an embedding lookup), reading only those rows' bytes.

    ids (T,) -> float32 (T, row_len)."""
    if name not in gguf_file.tensors:
        raise BadFile(f"tensor {name} missing")
    info = gguf_file.tensors[name]
    n_rows = info.shape[0]
    row_bytes = info.nbytes // n_rows
    out = np.empty((len(ids), info.ne[0]), dtype=np.float32)
    for i, r in enumerate(ids):
        r = int(r)
        if not 0 <= r < n_rows:
            raise InvalidArgument(f"row {r} out of range for {name} ({n_rows} rows)")
        raw = gguf_file.source.read(info.offset + r * row_bytes, row_bytes)
        out[i] = _decode(raw, info, 1)[0]
    return out
