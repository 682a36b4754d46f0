"""Which weights live on the GPU, where, in which type, and how they get there.

A tensor is placed the first time a plan builder asks for it, then uploaded with the others
by `upload()`. Matrices keep their GGUF bytes (quantized blocks stay quantized, decoded in
the shaders); a type without a kernel is dequantized once, on the CPU, to F16, and says so.
Small tensors (norms, biases, conv taps, frequency factors) become f32. A layer's q, k, v
projections of one type can share one buffer (a "stacked" matrix), so one matvec makes them.
`resident_type` and `qkv_runs` are the rules; `cera.gpu.footprint` sizes a model by them
before anything is allocated.
"""
from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass

import numpy as np
from gguf.constants import GGMLQuantizationType

from cera import weights
from cera.config import ModelConfig
from cera.device import Binding, Device
from cera.errors import TooLarge
from cera.gpu.quant import WEIGHT_TYPES
from cera.gpu.spec import Projection

F16, F32 = GGMLQuantizationType.F16, GGMLQuantizationType.F32
VECTOR_SUFFIXES = ("norm.weight", ".bias", "shortconv.conv.weight", "rope_freqs.weight", "rope_factors_long.weight",
                   "rope_factors_short.weight")   # the small tensors


def is_vector(name: str) -> bool:
    """Whether the plan reads tensor `name` as a small f32 vector (`Weights.vector`)."""
    return name.endswith(VECTOR_SUFFIXES)


def resident_type(info, vector: bool) -> int:
    """The type tensor `info` sits on the GPU as: a vector as F32; a matrix as stored where a
    kernel decodes its type, else F16 (dequantized at load)."""
    if vector:
        return F32
    return info.ggml_type if info.ggml_type in WEIGHT_TYPES else F16


def resident_bytes(info, vector: bool) -> int:
    """Bytes tensor `info` takes on the GPU (before rounding to whole words)."""
    t = resident_type(info, vector)
    if t == info.ggml_type:
        return info.nbytes
    return math.prod(info.shape) * (2 if t == F16 else 4)


def qkv_runs(cfg: ModelConfig, tensors: dict, i: int, align: int) -> list[str] | None:
    """blk.i's q, k, v projections grouped into runs of consecutive same-type matrices ("qkv",
    or "qk" + "v" when v is quantized differently), each run one matvec writing its part of
    a stacked q | k | v output. None when those parts cannot be bound at `align`ed offsets."""
    if (4 * cfg.q_dim) % align or (4 * cfg.kv_dim(i)) % align:
        return None
    infos = [tensors[f"blk.{i}.attn_{p}.weight"] for p in "qkv"]
    runs = ["q"]
    for p, prev, info in zip("kv", infos, infos[1:]):
        same = (info.ggml_type == prev.ggml_type and info.ggml_type in WEIGHT_TYPES
                and info.nbytes % 4 == 0 and prev.nbytes % 4 == 0)
        runs[-1:] = [runs[-1] + p] if same else [runs[-1], p]
    return runs


def stacked_parts(cfg: ModelConfig, tensors: dict, i: int, align: int) -> dict[str, tuple[str, int]]:
    """blk.i's projection weights and biases that live inside a stacked buffer and are read there
    one by one too (a prefill chunk's projections): name -> (the stacked tensor's name, byte
    offset). A weight whose offset is not `align`ed has a buffer of its own besides; a bias's
    offset always is (qkv_runs asks that of the outputs, which the biases match row for row)."""
    parts = {}
    for run in qkv_runs(cfg, tensors, i, align) or []:
        if len(run) == 1:
            continue
        offset, rows = 0, 0
        for p in run:
            name = f"blk.{i}.attn_{p}.weight"
            if offset % align == 0:
                parts[name] = (f"blk.{i}.attn_{run}.weight", offset)
            if cfg.qkv_bias:
                parts[f"blk.{i}.attn_{p}.bias"] = (f"blk.{i}.attn_{run}.bias", 4 * rows)
            offset, rows = offset + tensors[name].nbytes, rows + tensors[name].shape[0]
    return parts


_QKV = re.compile(r"blk\.(\d+)\.attn_[qkv]\.(weight|bias)")


def warn(message: str) -> None:
    print(f"cera: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Matrix:
    """A weight matrix on the GPU: (rows, cols) of `wtype`, row-major, raw GGUF rows."""
    name: str
    binding: Binding
    wtype: int
    rows: int
    cols: int

    def projection(self, **kw) -> Projection:
        """out = this matrix times x, with kw the rest of the Projection (w_up, bias, scale, ...)."""
        return Projection(self.binding, self.wtype, k=self.cols, m=self.rows, **kw)


@dataclass(frozen=True)
class Upload:
    """GGUF bytes [src_offset, src_offset + size) to go into `buffer` at dst_offset."""
    buffer: object
    src_offset: int
    size: int
    dst_offset: int = 0


class Weights:
    """The model's tensors on one device."""

    def __init__(self, cfg: ModelConfig, gguf_file, device: Device):
        self.cfg, self.gguf, self.device = cfg, gguf_file, device
        self._matrices: dict[str, Matrix] = {}
        self._vectors: dict[str, Binding] = {}
        self.pending: list[Upload] = []          # uploads that load() still has to make
        self.fallbacks: list[str] = []           # tensors dequantized to F16 (no kernel for their type)

    @property
    def nbytes(self) -> int:
        """Bytes of every weight buffer placed so far (an F32 vector is its matrix's buffer)."""
        buffers = {id(b.buffer): b.buffer for b in [m.binding for m in self._matrices.values()]
                   + list(self._vectors.values())}
        return sum(b.size for b in buffers.values())

    def matrix(self, name: str) -> Matrix:
        """Tensor `name` as stored, or as F16 if its type has no kernel; a q/k/v projection that
        sits in a stacked buffer, read there (stacked_parts)."""
        if name not in self._matrices and (view := self._view(name)):
            stacked, offset = view
            info = self.gguf.tensors[name]
            self._matrices[name] = Matrix(name, Binding(stacked.binding.buffer, offset, info.nbytes), stacked.wtype,
                                          info.shape[0], info.shape[-1])
        if name not in self._matrices:
            info = self.gguf.tensors[name]
            rows = self.cfg.vocab_size if name == self.cfg.lm_head else info.shape[0]   # head rows past the vocabulary: unused
            wtype = resident_type(info, vector=False)
            if wtype == info.ggml_type:
                buffer = self._buffer(name, info.nbytes)
                self.pending.append(Upload(buffer, info.offset, info.nbytes))
            else:
                warn(f"{name} is {info.type_name}, which has no GPU kernel: dequantized to F16 at load")
                data = weights.tensor(self.gguf, name).astype(np.float16)
                buffer = self._buffer(name, data.nbytes)
                self.device.write(buffer, data.tobytes() + bytes(-data.nbytes % 4))
                self.fallbacks.append(name)
            self._matrices[name] = Matrix(name, Binding(buffer), wtype, rows, info.shape[-1])
        return self._matrices[name]

    def vector(self, name: str) -> Binding:
        """A small tensor as f32 (a q/k/v bias read inside its stacked buffer, stacked_parts)."""
        if name not in self._vectors and (view := self._view(name)):
            stacked, offset = view
            self._vectors[name] = Binding(stacked.buffer, offset, 4 * self.gguf.tensors[name].shape[0])
        if name not in self._vectors:
            if self.gguf.tensors[name].ggml_type == F32:
                self._vectors[name] = self.matrix(name).binding
            else:
                self._vectors[name] = self._f32(name, weights.tensor(self.gguf, name))
        return self._vectors[name]

    def vectors(self, *names: str) -> Binding:
        """Small tensors as f32, one after another in one buffer: a kernel binds them as one."""
        key = " | ".join(names)
        if key not in self._vectors:
            self._vectors[key] = self._f32(key, np.concatenate([weights.tensor(self.gguf, n).ravel() for n in names]))
        return self._vectors[key]

    def _view(self, name: str) -> tuple[Binding | Matrix, int] | None:
        """(the stacked matrix or bias holding `name`, its byte offset there), if one does."""
        part = _QKV.fullmatch(name)
        if part is None:
            return None
        i = int(part[1])
        align = self.device.limits.min_storage_buffer_offset_alignment
        where = stacked_parts(self.cfg, self.gguf.tensors, i, align).get(name)
        if where is None:
            return None
        holder, offset = where
        run = holder.split(".")[2].removeprefix("attn_")
        matrix, bias = self.stacked(i, run)
        return (bias if name.endswith(".bias") else matrix), offset

    def qkv_runs(self, i: int) -> list[str] | None:
        """`qkv_runs` of blk.i on this device."""
        return qkv_runs(self.cfg, self.gguf.tensors, i, self.device.limits.min_storage_buffer_offset_alignment)

    def stacked(self, i: int, run: str) -> tuple[Matrix, Binding | None]:
        """The matrix of blk.i's projections `run` ("qkv", "qk", "q", "v", ...) stacked by rows in
        one buffer, and their biases stacked likewise (None without biases)."""
        cfg, b = self.cfg, f"blk.{i}."
        if len(run) == 1:
            bias = self.vector(f"{b}attn_{run}.bias") if cfg.qkv_bias else None
            return self.matrix(f"{b}attn_{run}.weight"), bias
        name = f"{b}attn_{run}.weight"
        if name not in self._matrices:
            infos = [self.gguf.tensors[f"{b}attn_{p}.weight"] for p in run]
            offsets = np.cumsum([0] + [t.nbytes for t in infos])
            buffer = self._buffer(name, int(offsets[-1]))
            self.pending += [Upload(buffer, t.offset, t.nbytes, int(o)) for t, o in zip(infos, offsets)]
            self._matrices[name] = Matrix(name, Binding(buffer), infos[0].ggml_type,
                                          sum(t.shape[0] for t in infos), cfg.hidden)
            if cfg.qkv_bias:
                self._vectors[f"{b}attn_{run}.bias"] = self._f32(f"{b}attn_{run}.bias", np.concatenate(
                    [weights.tensor(self.gguf, f"{b}attn_{p}.bias") for p in run]))
        return self._matrices[name], self._vectors.get(f"{b}attn_{run}.bias")

    async def upload(self, progress=None) -> None:
        """Make the pending uploads; progress(done, total) in bytes after each."""
        total, done = sum(u.size for u in self.pending), 0
        for u in self.pending:
            await self.device.upload(u.buffer, self.gguf.source, u.src_offset, u.size, u.dst_offset)
            done += u.size
            if progress:
                progress(done, total)
        self.pending.clear()

    def _buffer(self, name: str, nbytes: int):
        try:
            return self.device.buffer(nbytes, name)
        except TooLarge as err:
            raise TooLarge(f"tensor {name}: {err}") from None

    def _f32(self, name: str, data: np.ndarray) -> Binding:
        buffer = self._buffer(name, data.nbytes)
        self.device.write(buffer, data.astype(np.float32).tobytes())
        return Binding(buffer)
