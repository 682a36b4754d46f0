"""GGUF header reader over any byte source.

Parses magic, version (2, 3), metadata of every value type and the tensor infos,
reading only the header: tensor bytes are fetched later, by name, and only when
asked for. A source is anything with `size` and `read(offset, n) -> bytes`: a file
natively, a Blob prefix in the browser. Bad input raises a BadFile (TruncatedFile where
the file ends too soon) naming what is wrong and where.

A model split by llama.cpp's gguf-split (PREFIX-00001-of-0000N.gguf, ...: metadata in the first
part, `split.no`, `split.count` and `split.tensors.count` in each, every part's tensors in its
own data section) opens from its first part's path as one GGUFFile over the parts joined end to
end, each tensor's offset counted from the start of the first part.

Phi-3's fused projections (attn_qkv, ffn_up of gate and up) are listed as the separate tensors
other archs store, row ranges of the same bytes (cera.config.unfused); `fused` says which.

A header costs time and memory in proportion to its own bytes, whatever they say: every
count and length is checked against the bytes left in the file before the reader loops or
allocates, and a value of BIG bytes or more (a long string, a long array of numbers) is
skipped and read only once the whole header, tensor infos included, has parsed. A corrupt
length that points into the tensor data then costs a skip, not a read of what is there.
"""
from __future__ import annotations

import bisect
import os
import re
import struct
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from cera.config import unfused
from cera.errors import BadFile, ModelNotFound, TruncatedFile

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_ARRAY_DEPTH = 8   # arrays of arrays: a guard against recursion bombs
MAX_NAME = 64         # ggml's GGML_MAX_NAME: tensor names are shorter (llama.cpp refuses longer ones)
BIG = 1 << 16         # bytes: a value this long is read after the header has parsed
BLOCK = 1 << 20       # bytes read ahead
WINDOW = 1 << 16      # bytes of a string array cut apart at once (_Reader.short_strings)

STRING, ARRAY = GGUFValueType.STRING, GGUFValueType.ARRAY
_FORMATS = {  # number type -> struct format
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?", GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
}
_NUMBERS = {vtype: struct.Struct("<" + fmt) for vtype, fmt in _FORMATS.items()}
# the fewest bytes one value of each type takes: a string its 8-byte length, an array its
# element type and length
_LEAST = {**{vtype: s.size for vtype, s in _NUMBERS.items()}, STRING: 8, ARRAY: 12}
_U32, _U64 = _NUMBERS[GGUFValueType.UINT32], _NUMBERS[GGUFValueType.UINT64]
_HIGH_ZEROS = bytes(7)                                   # the high bytes of a length below 256
_MINUS_ONE = bytes((b - 1) % 256 for b in range(256))    # a bytes.translate table
_LAST = itemgetter(-1)
SPLIT_NAME = re.compile(r"(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf", re.IGNORECASE)


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


class JoinedSource:
    """Sources read as one, end to end: the parts of a split model. A read stays within the
    part it starts in, as every tensor does."""

    def __init__(self, sources):
        self.sources = list(sources)
        self.starts = [0]   # where each source begins
        for source in self.sources:
            self.starts.append(self.starts[-1] + source.size)
        self.size = self.starts.pop()

    def read(self, offset: int, n: int) -> bytes:
        i = bisect.bisect_right(self.starts, offset) - 1
        return self.sources[i].read(offset - self.starts[i], n)


def split_parts(path: str | os.PathLike, count: int) -> list[str]:
    """The paths of a split model's `count` parts, from its first part's: llama.cpp's names,
    PREFIX-00001-of-0000N.gguf and on."""
    folder, name = os.path.split(os.fspath(path))
    m = SPLIT_NAME.fullmatch(name)
    if not m or int(m["no"]) != 1 or int(m["count"]) != count:
        raise BadFile(f"{name} is the first of {count} parts of a split model, but is not named "
                      f"PREFIX-00001-of-{count:05d}.gguf, so the other parts cannot be found")
    return [os.path.join(folder, f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


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


class _Later(NamedTuple):
    """A value skipped while parsing: a string (count: its bytes) or an array of numbers."""
    pos: int
    vtype: int
    count: int
    nbytes: int
    what: str


class _Reader:
    """A header read front to back, the source a block at a time. Values of BIG bytes or more
    are skipped and noted in `later` with the slot they fill (`read_later` reads them)."""

    def __init__(self, source):
        self.source, self.size, self.pos = source, source.size, 0
        self.available = getattr(source, "available", source.size)   # what reads ahead may reach
        self.buf, self.base = b"", 0          # source bytes from offset `base` on
        self.later: list[tuple] = []          # (container, slot, _Later)

    def need(self, n: int, what: str) -> int:
        """The offset in `buf` of the next n bytes, read ahead if they are not there yet."""
        pos = self.pos
        self.check_end(n, what)
        off = pos - self.base
        if off + n > len(self.buf):
            # a block, but not past what a PrefixSource holds unless this read needs it
            limit = self.available - pos
            self.buf, self.base, off = self.source.read(pos, n if limit < n else min(max(n, BLOCK), limit)), pos, 0
            if len(self.buf) < n:
                raise TruncatedFile(f"GGUF header truncated: {what} at byte {pos}: the source gave "
                                    f"{len(self.buf)} of {n} bytes")
        return off

    def check_end(self, n: int, what: str) -> None:
        if self.pos + n > self.size:
            raise TruncatedFile(f"GGUF header truncated: {what} at byte {self.pos} needs {n} bytes, file has "
                                f"{self.size} (the file is truncated: download it again)")

    def take(self, n: int, what: str) -> bytes:
        off = self.need(n, what)
        self.pos += n
        return self.buf[off:off + n]

    def number(self, st: struct.Struct, what: str):
        off = self.need(st.size, what)
        self.pos += st.size
        return st.unpack_from(self.buf, off)[0]

    def check_count(self, n: int, least: int, what: str) -> None:
        """Refuse n values of at least `least` bytes each where the rest of the file is smaller."""
        left = self.size - self.pos
        if n * least > left:
            raise BadFile(f"{what} at byte {self.pos} claims {n} values of >= {least} bytes; "
                          f"the file has {left} bytes left")

    def string(self, what: str, limit: int | None = None):
        n = self.number(_U64, f"{what} length")
        if limit is not None and n >= limit:
            raise BadFile(f"{what} at byte {self.pos - 8} is {n} bytes long (at most {limit - 1})")
        self.check_end(n, what)
        if n >= BIG:
            return self.skip(STRING, n, n, what)
        return self.take(n, what).decode("utf-8", "surrogateescape")

    def skip(self, vtype: int, count: int, nbytes: int, what: str) -> _Later:
        later = _Later(self.pos, vtype, count, nbytes, what)
        self.pos += nbytes
        return later

    def store(self, container, slot, value) -> None:
        container[slot] = value
        if type(value) is _Later:
            self.later.append((container, slot, value))

    def value(self, vtype: int, key: str, depth: int = 0):
        if vtype == STRING:
            return self.string(key)
        if vtype in _NUMBERS:
            return self.number(_NUMBERS[vtype], key)
        if vtype != ARRAY:
            raise BadFile(f"metadata {key}: unknown value type {vtype} at byte {self.pos - 4}")
        etype = self.number(_U32, f"element type of {key}")
        n = self.number(_U64, f"length of {key}")
        if etype not in _LEAST:
            raise BadFile(f"metadata {key}: unknown array element type {etype} at byte {self.pos - 12}")
        self.check_count(n, _LEAST[etype], f"array {key}")
        if etype in _FORMATS:
            nbytes = n * _LEAST[etype]
            if nbytes >= BIG:
                return self.skip(etype, n, nbytes, key)
            off = self.need(nbytes, key)
            self.pos += nbytes
            return list(struct.unpack_from(f"<{n}{_FORMATS[etype]}", self.buf, off))
        if etype == STRING:
            return self.strings(n, key)
        if depth >= MAX_ARRAY_DEPTH:
            raise BadFile(f"metadata {key}: arrays nested deeper than {MAX_ARRAY_DEPTH}")
        out = [None] * n
        for i in range(n):
            self.store(out, i, self.value(ARRAY, key, depth + 1))
        return out

    def strings(self, n: int, key: str) -> list:
        """An array of n strings: short ones a window at a time, the rest one by one (after a
        window that takes none, a run of them that doubles while windows keep failing)."""
        out: list = []
        run = 16
        while len(out) < n:
            if self.short_strings(n - len(out), out):
                run = 16
                continue
            for _ in range(min(run, n - len(out))):
                out.append(self.string(key))
                if type(out[-1]) is _Later:
                    self.later.append((out, len(out) - 1, out[-1]))
            run *= 2
        return out

    def short_strings(self, n: int, out: list) -> int:
        """Append up to n - 1 of the next n strings, those shorter than 255 bytes, cut apart a
        window at a time in C: a length below 256 is its low byte and seven zeros, so splitting
        on seven zeros leaves, after the first length's low byte, pieces that are a string and
        the next length's low byte. Each piece's size is checked against the length before it,
        so the strings taken are exactly those a read one by one would give. Returns how many."""
        size = min(WINDOW, self.available - self.pos)
        if n < 2 or size < 16:
            return 0
        off = self.need(size, "string array")
        pieces = self.buf[off:off + size].split(_HIGH_ZEROS, n)
        m = min(len(pieces) - 2, n - 1)          # the last piece may be cut by the window
        if m <= 0 or len(pieces[0]) != 1:
            return 0
        body = pieces[1:m + 1]                   # string k + low byte of length k + 1
        try:
            sizes = bytes(map(len, body))
        except ValueError:                       # a piece of 256 bytes or more: stop before it
            m = next(k for k, p in enumerate(body) if len(p) > 255)
            sizes = bytes(map(len, body[:m]))
        if 0 in sizes:
            m = sizes.index(0)
        heads = bytes(map(_LAST, pieces[:m]))    # the low bytes of lengths 0 .. m - 1
        m = _common_prefix(heads, sizes[:m].translate(_MINUS_ONE))
        try:
            out += [p[:-1].decode() for p in body[:m]]
        except UnicodeDecodeError:               # not UTF-8: its bytes kept as surrogates
            out += [p[:-1].decode("utf-8", "surrogateescape") for p in body[:m]]
        self.pos += 8 * m + sum(heads[:m])
        return m

    def read_later(self) -> None:
        """Read the skipped values into their slots."""
        for container, slot, later in self.later:
            data = self.source.read(later.pos, later.nbytes)
            if len(data) < later.nbytes:
                raise TruncatedFile(f"GGUF header truncated: {later.what} at byte {later.pos}: the source gave "
                                    f"{len(data)} of {later.nbytes} bytes")
            container[slot] = (data.decode("utf-8", "surrogateescape") if later.vtype == STRING else
                               list(struct.unpack(f"<{later.count}{_FORMATS[later.vtype]}", data)))


def _common_prefix(a: bytes, b: bytes) -> int:
    """The length of the longest common prefix of a and b (a binary search of C comparisons)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class GGUFFile:
    """The parsed header of a GGUF file: `metadata`, `tensors` (by name), `data_offset`."""

    def __init__(self, source):
        self.source = source
        r = _Reader(source)
        if source.size < 4 or r.take(4, "magic") != GGUF_MAGIC:
            raise BadFile("GGUF magic invalid: not a GGUF file")
        self.version = r.number(_U32, "version")
        if self.version not in (2, 3):
            raise BadFile(f"GGUF version {self.version} unsupported (cera reads versions 2 and 3)")
        n_tensors = r.number(_U64, "tensor count")
        n_kv = r.number(_U64, "metadata count")
        # every metadata entry takes >= 13 bytes and every tensor info >= 32: reject absurd counts
        if n_kv * 13 + n_tensors * 32 > r.size - r.pos:
            raise BadFile(f"GGUF counts absurd for a {source.size}-byte file: "
                          f"{n_kv} metadata entries, {n_tensors} tensors")
        self.metadata: dict = {}
        for _ in range(n_kv):
            key = r.string("metadata key", BIG)
            if key in self.metadata:
                raise BadFile(f"duplicate metadata key {key!r} at byte {r.pos}")
            r.store(self.metadata, key, r.value(r.number(_U32, f"type of {key}"), key))
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
            shown = alignment if type(alignment) is int else f"(a {type(alignment).__name__})"
            raise BadFile(f"general.alignment {shown} is not a power of two")
        infos = [self._tensor_info(r, i) for i in range(n_tensors)]
        self.data_offset = -(-r.pos // alignment) * alignment
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
        r.read_later()
        self.fused: dict[str, tuple[str, ...]] = {}   # a fused tensor's name -> its parts' (cera.config.unfused)
        if self.metadata.get("split.count", 1) == 1:   # a split model's, once its parts are joined
            self.tensors, self.fused = unfused(self.metadata, self.tensors)

    @classmethod
    def open(cls, path: str | os.PathLike) -> "GGUFFile":
        """The GGUF at `path`; the first part of a split model opens the whole model."""
        g = cls(FileSource(path))
        count = g.metadata.get("split.count", 1)
        if count == 1:
            return g
        name = os.path.basename(path)
        if type(count) is not int or not 1 < count < 100_000:
            raise BadFile(f"{name}: split.count {count!r} is not a number of parts")
        if g.metadata.get("split.no") != 0:
            raise BadFile(f"{name} is not the first of the {count} parts of a split model: open "
                          "PREFIX-00001-of-...gguf")
        parts = split_parts(path, count)
        if missing := [p for p in parts if not os.path.isfile(p)]:
            raise ModelNotFound(f"{name} is split into {count} parts; missing: {', '.join(missing)}")
        g._join([cls(FileSource(p)) for p in parts[1:]])
        return g

    def _join(self, parts: list["GGUFFile"]) -> None:
        """Take in the other parts of the split model this is the first of: their tensors, at
        offsets past the parts before them, and their bytes, joined after this one's."""
        count, base = self.metadata["split.count"], self.source.size
        for no, part in enumerate(parts, 1):
            said = part.metadata.get("split.no"), part.metadata.get("split.count")
            if said != (no, count):
                raise BadFile(f"{part.source.path}: split.no and split.count are {said[0]!r} and {said[1]!r}; "
                              f"part {no + 1} of {count} says {no} and {count}")
            for name, info in part.tensors.items():
                if name in self.tensors:
                    raise BadFile(f"tensor {name} is in two parts of a split model ({part.source.path})")
                self.tensors[name] = TensorInfo(name, info.ggml_type, info.ne, base + info.offset, info.nbytes)
            base += part.source.size
        self.source = JoinedSource([self.source, *(part.source for part in parts)])
        if len(self.tensors) != self.metadata.get("split.tensors.count"):
            raise BadFile(f"the {count} parts of a split model hold {len(self.tensors)} tensors; its "
                          f"split.tensors.count says {self.metadata.get('split.tensors.count')!r}")
        self.tensors, self.fused = unfused(self.metadata, self.tensors)

    @property
    def arch(self) -> str:
        return self.metadata.get("general.architecture", "")

    def read(self, name: str) -> bytes:
        """The raw bytes of one tensor (as stored: quantized blocks stay quantized)."""
        info = self.tensors[name]
        return self.source.read(info.offset, info.nbytes)

    @staticmethod
    def _tensor_info(r: _Reader, index: int):
        name = r.string(f"name of tensor {index}", MAX_NAME)
        n_dims = r.number(_U32, f"dims of {name}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise BadFile(f"tensor {name} has {n_dims} dimensions (1..{MAX_DIMS} allowed)")
        ne = tuple(r.number(_U64, f"shape of {name}") for _ in range(n_dims))
        ggml_type = r.number(_U32, f"type of {name}")
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
        rel_offset = r.number(_U64, f"offset of {name}")
        return name, ggml_type, ne, rel_offset, n_elements // block * type_size
