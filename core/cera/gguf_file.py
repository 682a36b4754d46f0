"""GGUF header reader over any byte source.

Parses magic, version (2, 3), metadata of every value type and the tensor infos,
reading only the header: tensor bytes are fetched later, by name, and only when
asked for. A source is anything with `size` and `read(offset, n) -> bytes`: a file
natively, a Blob prefix in the browser. Bad input raises ValueError naming what is
wrong and where.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from cera.errors import BadFile, TruncatedFile

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_ARRAY_DEPTH = 8   # arrays of arrays: a guard against recursion bombs
_SCALARS = {  # value type -> struct format
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?", GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
}


class NeedMoreBytes(Exception):
    """The header extends past the bytes a PrefixSource holds: retry with at least `needed`."""

    def __init__(self, needed: int):
        super().__init__(f"GGUF header needs the first {needed} bytes")
        self.needed = needed


class FileSource:
    """A GGUF file on disk."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.size = os.path.getsize(self.path)
        self._file = open(self.path, "rb")

    def read(self, offset: int, n: int) -> bytes:
        self._file.seek(offset)
        return self._file.read(n)

    def close(self) -> None:
        self._file.close()


class PrefixSource:
    """The first bytes of a larger file (e.g. a Blob slice in the browser)."""

    def __init__(self, prefix: bytes, size: int):
        self.prefix, self.size = prefix, size
        self.available = len(prefix)

    def read(self, offset: int, n: int) -> bytes:
        end = min(offset + n, self.size)
        if end > len(self.prefix):
            raise NeedMoreBytes(max(end, 2 * len(self.prefix)))
        return self.prefix[offset:end]


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    ne: tuple[int, ...]   # GGUF order: ne[0] is the contiguous (innermost) dimension
    offset: int           # absolute byte offset in the file
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy order: (rows, cols) for a matrix."""
        return tuple(reversed(self.ne))

    @property
    def type_name(self) -> str:
        return GGMLQuantizationType(self.ggml_type).name


class _Cursor:
    """Sequential reads over a source, buffered in chunks."""
    CHUNK = 1 << 20

    def __init__(self, source):
        self.source, self.pos = source, 0
        self._buf, self._buf_start = b"", 0

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > self.source.size:
            raise TruncatedFile(f"GGUF header truncated: {what} at byte {self.pos} needs {n} bytes, "
                             f"file has {self.source.size} (the file is truncated: download it again)")
        start = self.pos - self._buf_start
        if start + n > len(self._buf):
            # read ahead a chunk, but not past what a PrefixSource holds unless this read needs it
            limit = getattr(self.source, "available", self.source.size) - self.pos
            self._buf = self.source.read(self.pos, n if limit < n else min(max(n, self.CHUNK), limit))
            self._buf_start, start = self.pos, 0
        self.pos += n
        return self._buf[start:start + n]

    def unpack(self, fmt: str, what: str):
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.unpack("Q", what + " length")
        return self.take(n, what).decode("utf-8", errors="surrogateescape")

    def remaining(self) -> int:
        return self.source.size - self.pos


class GGUFFile:
    """The parsed header of a GGUF file: `metadata`, `tensors` (by name), `data_offset`."""

    def __init__(self, source):
        self.source = source
        cur = _Cursor(source)
        if source.size < 4 or cur.take(4, "magic") != GGUF_MAGIC:
            raise BadFile("GGUF magic invalid: not a GGUF file")
        self.version = cur.unpack("I", "version")
        if self.version not in (2, 3):
            raise BadFile(f"GGUF version {self.version} unsupported (cera reads versions 2 and 3)")
        n_tensors = cur.unpack("Q", "tensor count")
        n_kv = cur.unpack("Q", "metadata count")
        # every metadata entry takes >= 13 bytes and every tensor info >= 24: reject absurd counts
        if n_kv * 13 + n_tensors * 24 > cur.remaining():
            raise BadFile(f"GGUF counts absurd for a {source.size}-byte file: "
                             f"{n_kv} metadata entries, {n_tensors} tensors")
        self.metadata: dict = {}
        for _ in range(n_kv):
            key = cur.string("metadata key")
            if key in self.metadata:
                raise BadFile(f"duplicate metadata key {key!r}")
            self.metadata[key] = self._value(cur, cur.unpack("I", f"type of {key}"), key)
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise BadFile(f"general.alignment {alignment!r} is not a power of two")
        infos = [self._tensor_info(cur) for _ in range(n_tensors)]
        self.data_offset = -(-cur.pos // alignment) * alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, ggml_type, ne, rel_offset, nbytes in infos:
            if name in self.tensors:
                raise BadFile(f"duplicate tensor name {name!r}")
            if rel_offset % alignment:
                raise BadFile(f"tensor {name} offset {rel_offset} is not aligned to {alignment}")
            offset = self.data_offset + rel_offset
            if offset + nbytes > source.size:
                raise TruncatedFile(f"tensor {name} ends past end of file "
                                 f"({offset + nbytes} > {source.size} bytes: the file is truncated, download it again)")
            self.tensors[name] = TensorInfo(name, ggml_type, ne, offset, nbytes)

    @classmethod
    def open(cls, path: str | os.PathLike) -> "GGUFFile":
        return cls(FileSource(path))

    @property
    def arch(self) -> str:
        return self.metadata.get("general.architecture", "")

    def read(self, name: str) -> bytes:
        """The raw bytes of one tensor (as stored: quantized blocks stay quantized)."""
        info = self.tensors[name]
        return self.source.read(info.offset, info.nbytes)

    def _value(self, cur: _Cursor, vtype: int, key: str, depth: int = 0):
        if vtype == GGUFValueType.STRING:
            return cur.string(key)
        if vtype in _SCALARS:
            return cur.unpack(_SCALARS[vtype], key)
        if vtype == GGUFValueType.ARRAY:
            etype = cur.unpack("I", f"element type of {key}")
            n = cur.unpack("Q", f"length of {key}")
            if n > cur.remaining():
                raise BadFile(f"array {key} claims {n} elements, more than the file holds")
            if etype in _SCALARS:
                fmt = _SCALARS[etype]
                return list(struct.unpack(f"<{n}{fmt}", cur.take(n * struct.calcsize(fmt), key)))
            if etype == GGUFValueType.ARRAY and depth >= MAX_ARRAY_DEPTH:
                raise BadFile(f"metadata {key}: arrays nested deeper than {MAX_ARRAY_DEPTH}")
            return [self._value(cur, etype, key, depth + 1) for _ in range(n)]
        raise BadFile(f"metadata {key}: unknown value type {vtype}")

    @staticmethod
    def _tensor_info(cur: _Cursor):
        name = cur.string("tensor name")
        n_dims = cur.unpack("I", f"dims of {name}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise BadFile(f"tensor {name} has {n_dims} dimensions (1..{MAX_DIMS} allowed)")
        ne = tuple(cur.unpack("Q", f"shape of {name}") for _ in range(n_dims))
        ggml_type = cur.unpack("I", f"type of {name}")
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        except (ValueError, KeyError):
            raise BadFile(f"tensor {name} has unknown ggml type id {ggml_type}") from None
        if ne[0] % block:
            raise BadFile(f"tensor {name}: row length {ne[0]} is not a multiple of "
                             f"{GGMLQuantizationType(ggml_type).name}'s block size {block}")
        n_elements = 1
        for d in ne:
            n_elements *= d
        if n_elements > 1 << 40:
            raise BadFile(f"tensor {name} claims {n_elements} elements")
        rel_offset = cur.unpack("Q", f"offset of {name}")
        return name, ggml_type, ne, rel_offset, n_elements // block * type_size
