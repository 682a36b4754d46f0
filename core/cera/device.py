"""The interface between the core and a host, and the policy every host shares.

A host is the native wgpu-py device (`cera.native`) or the browser's WebGPU reached from
Pyodide (`web/cera_web/host.py` + `web/gpu.js`). The core never imports either. A host
subclasses `Device` and implements the raw calls at the bottom (create a buffer, write
bytes, compile, bind, record a schedule, submit); everything that is a decision lives here,
once: buffer size rounding and limits, offset alignment, how dispatches group into compute
passes, the staging buffers readbacks go through, upload chunking, error types.
Handles a host returns (buffers, kernels, bind groups, schedules) are opaque to the core,
except that a buffer has `.label` and `.size`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Sequence

from cera.errors import GpuError, ShaderError, TooLarge, Unsupported

UPLOAD_CHUNK = 32 << 20   # bytes per upload call (a Blob slice in the browser, a file read natively)
UPLOAD_DRAIN = 256 << 20  # wait for the queue after this many uploaded bytes: bounds the host's staging memory
KERNEL_FEATURES = ("shader-f16", "subgroups")   # optional features kernels use, each beside a fallback
WANTED_FEATURES = KERNEL_FEATURES + ("timestamp-query",)   # requested where the adapter has them
# The WGSL language feature of dot4I8Packed and pack4xI8, named in Device.features where the
# host's shader compiler has it (Chromium: navigator.gpu.wgslLanguageFeatures; naga: always)
PACKED_DOT = "packed_4x8_integer_dot_product"
WANTED_LANGUAGE_FEATURES = (PACKED_DOT,)   # the page's gpu.js names those its compiler has (openGpu)
DEFAULT_WORKGROUP_STORAGE = 16384   # bytes of workgroup memory every WebGPU device grants (Apple, SwiftShader: no more)
MAX_QUERIES = 4096   # timestamps one query set may hold (WebGPU's limit): two per timed pass


def buffer_size(size: int) -> int:
    """The bytes `Device.buffer` allocates for `size`: whole words, at least one."""
    return max(4, (size + 3) // 4 * 4)
CPU_ADAPTERS = ("llvmpipe", "lavapipe", "swiftshader")   # WebGPU adapters that emulate a GPU on the CPU


@dataclass(frozen=True)
class Limits:
    """The adapter limits the core plans around (every limit is requested at its maximum)."""
    max_storage_buffer_binding_size: int
    max_buffer_size: int
    min_storage_buffer_offset_alignment: int
    max_compute_invocations_per_workgroup: int
    max_compute_workgroup_storage_size: int
    max_storage_buffers_per_shader_stage: int
    max_compute_workgroups_per_dimension: int

    @staticmethod
    def webgpu_name(field_name: str) -> str:
        """The WebGPU spelling of a field: max_buffer_size -> maxBufferSize."""
        head, *rest = field_name.split("_")
        return head + "".join(word.title() for word in rest)

    @classmethod
    def webgpu_defaults(cls) -> "Limits":
        """The limits every WebGPU device grants (the spec's defaults): what a kernel must fit
        to run on any adapter."""
        return cls(max_storage_buffer_binding_size=128 << 20, max_buffer_size=256 << 20,
                   min_storage_buffer_offset_alignment=256, max_compute_invocations_per_workgroup=256,
                   max_compute_workgroup_storage_size=DEFAULT_WORKGROUP_STORAGE,
                   max_storage_buffers_per_shader_stage=8, max_compute_workgroups_per_dimension=65535)

    @classmethod
    def read(cls, get) -> "Limits":
        """Limits from get(WebGPU limit name) -> value."""
        return cls(**{f: int(get(cls.webgpu_name(f))) for f in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Binding:
    """A byte range of a buffer bound at one @binding index (size None: to the end)."""
    buffer: Any
    offset: int = 0
    size: int | None = None

    @property
    def nbytes(self) -> int:
        return self.buffer.size - self.offset if self.size is None else self.size


@dataclass(frozen=True)
class Dispatch:
    """One compute dispatch: a kernel, its bind group, workgroup counts (x, y, z), and what it
    moves: bytes read and written, plus bytes read per cached position (attention reads the
    KV cache up to the live position), for `cera.gpu.plan`'s accounting."""
    kernel: Any
    bind_group: Any
    groups: tuple[int, int, int]
    label: str = ""
    bindings: tuple[Binding, ...] = ()
    reads: int = 0
    writes: int = 0
    reads_per_position: int = 0


@dataclass(frozen=True)
class Copy:
    """A buffer-to-buffer copy inside a schedule."""
    src: Any
    src_offset: int
    dst: Any
    dst_offset: int
    size: int


@dataclass(frozen=True)
class Flush:
    """A submission boundary inside a schedule: what is encoded before it is submitted at once,
    so that the GPU starts on it while the host encodes the rest (cera.gpu.plan.FLUSH_LAYERS)."""


Step = Dispatch | Copy | Flush


@dataclass(frozen=True)
class Pass:
    """Consecutive dispatches encoded in one compute pass."""
    dispatches: tuple[Dispatch, ...]


def passes(steps: Sequence[Step]) -> list[Pass | Copy | Flush]:
    """Group a schedule's steps: consecutive dispatches share a compute pass, copies and flushes
    go between (a flush only after something to submit)."""
    segments: list[Pass | Copy | Flush] = []
    run: list[Dispatch] = []
    for step in steps:
        if isinstance(step, Dispatch):
            run.append(step)
            continue
        if not isinstance(step, (Copy, Flush)):
            raise TypeError(f"not a schedule step: {step!r}")
        if run:
            segments.append(Pass(tuple(run)))
            run = []
        if isinstance(step, Copy) or (segments and not isinstance(segments[-1], Flush)):
            segments.append(step)
    if run:
        segments.append(Pass(tuple(run)))
    return segments


@dataclass(eq=False)
class Device(ABC):
    """A WebGPU device: what the model and the tests are written against."""
    adapter_name: str                     # e.g. "llvmpipe (LLVM 15.0.6, 256 bits) via Vulkan"
    limits: Limits
    features: frozenset[str]              # WebGPU feature names granted, e.g. "shader-f16", "subgroups"
    _staging: dict = field(default_factory=lambda: defaultdict(list), init=False, repr=False)

    @property
    def cpu_emulated(self) -> bool:
        """Whether the adapter is a CPU emulation of a GPU (Mesa's llvmpipe/lavapipe, SwiftShader):
        the kernels run, at a few GB/s."""
        name = self.adapter_name.lower()
        return any(cpu in name for cpu in CPU_ADAPTERS)

    # --- what the core calls -------------------------------------------------------------
    def buffer(self, size: int, label: str, uniform: bool = False) -> Any:
        """A zero-filled GPU buffer of `buffer_size(size)` bytes: storage + copy src/dst, or
        uniform + storage + copy dst."""
        size = buffer_size(size)
        if size > self.limits.max_buffer_size:
            raise TooLarge(f"buffer {label} needs {size} bytes; this GPU's largest buffer is "
                           f"{self.limits.max_buffer_size} bytes")
        return self._buffer(size, label, "uniform" if uniform else "storage")

    async def upload(self, buffer, source, src_offset: int, size: int, dst_offset: int = 0) -> None:
        """Copy `size` bytes of a byte source (cera.gguf_file's `size` + `read(offset, n)`) into
        `buffer`, in chunks, waiting for the queue every UPLOAD_DRAIN bytes."""
        for start in range(0, size, UPLOAD_CHUNK):
            n = min(UPLOAD_CHUNK, size - start)
            await self._upload(buffer, source, src_offset + start, n, dst_offset + start)
            if (start + n) % UPLOAD_DRAIN < n:
                await self._drain()

    def kernel(self, name: str, code: str) -> Any:
        """Compile WGSL `code` (entry point `main`, auto layout) into a compute pipeline.
        Raises ShaderError("shader {name} failed to compile: ...")."""
        return self._kernel(name, code)

    def bind(self, kernel, bindings: Sequence[Binding], label: str = "") -> Any:
        """A bind group for group 0 of `kernel`: bindings[i] at @binding(i)."""
        align = self.limits.min_storage_buffer_offset_alignment
        for i, b in enumerate(bindings):
            if b.offset % align:
                raise GpuError(f"{label}: binding {i} starts at byte {b.offset} of buffer {b.buffer.label}, "
                               f"not a multiple of this GPU's minStorageBufferOffsetAlignment {align}")
        return self._bind(kernel, bindings)

    def schedule(self, steps: Sequence[Step]) -> Any:
        """Prepare a fixed list of dispatches and copies for repeated submission."""
        return self._schedule(passes(steps))

    def run(self, schedule, read: Binding | None = None) -> Awaitable[bytes | None]:
        """Submit `schedule` now; with `read`, copy that range to a staging buffer in the same
        submission. The returned awaitable yields those bytes once mapped, so the caller can
        submit the next step before waiting for this one (schedule None: only the read)."""
        if read is None:
            return self._submit(schedule, None, None)
        size = (read.nbytes + 3) // 4 * 4
        idle = self._staging[size]   # staging buffers no pending read holds
        staging = idle.pop() if idle else self._buffer(size, f"staging {size}", "readback")
        return self._readback(self._submit(schedule, Binding(read.buffer, read.offset, size), staging),
                              idle, staging, read.nbytes)

    async def read(self, buffer, offset: int, size: int) -> bytes:
        """Read bytes back from a buffer, after the work queued so far."""
        return await self.run(None, Binding(buffer, offset, size))

    async def time_passes(self, groups: Sequence[Sequence[Dispatch]]) -> list[int]:
        """GPU nanoseconds of each group of dispatches, each group encoded as one compute pass
        with timestamps written at its beginning and end, after the queued writes; up to
        MAX_QUERIES / 2 passes a submission. Needs "timestamp-query" in `features`."""
        if "timestamp-query" not in self.features:
            raise Unsupported(f"{self.adapter_name} has no timestamp-query: GPU times cannot be measured here")
        per_submission = MAX_QUERIES // 2
        spans: list[int] = []
        for start in range(0, len(groups), per_submission):
            spans += await self._time_passes([Pass(tuple(g)) for g in groups[start:start + per_submission]])
        return spans

    @staticmethod
    async def _readback(pending, idle: list, staging, n: int) -> bytes:
        try:
            data = await pending
        finally:
            idle.append(staging)
        return data[:n]

    @staticmethod
    def compile_error(name: str, detail: str) -> ShaderError:
        return ShaderError(f"shader {name} failed to compile: {detail}")

    # --- what a host implements ----------------------------------------------------------
    @abstractmethod
    def _buffer(self, size: int, label: str, usage: str) -> Any:
        """A buffer of `size` bytes (a multiple of 4); usage "storage" (storage, copy src and
        dst), "uniform" (uniform, storage, copy dst: a kernel may advance it, greedy_advance.wgsl) or
        "readback" (map read, copy dst)."""

    @abstractmethod
    def write(self, buffer, data: bytes | memoryview, offset: int = 0) -> None:
        """Queue a write of host bytes (a multiple of 4) into `buffer` at `offset`."""

    @abstractmethod
    async def _upload(self, buffer, source, src_offset: int, size: int, dst_offset: int) -> None:
        """One chunk of `upload` (at most UPLOAD_CHUNK bytes, padded to whole words)."""

    @abstractmethod
    async def _drain(self) -> None:
        """Wait until the queued writes are done."""

    @abstractmethod
    def _kernel(self, name: str, code: str) -> Any:
        """Compile; raise `Device.compile_error(name, detail)` on failure."""

    @abstractmethod
    def _bind(self, kernel, bindings: Sequence[Binding]) -> Any:
        """A bind group of `kernel`'s group 0."""

    @abstractmethod
    def _schedule(self, segments: Sequence[Pass | Copy | Flush]) -> Any:
        """Record compute passes and copies for repeated submission; at a Flush, what is encoded
        so far is submitted."""

    @abstractmethod
    def _submit(self, schedule, read: Binding | None, staging) -> Awaitable[bytes | None]:
        """Encode `schedule` (None: nothing), copy `read` into `staging`, submit now; the
        awaitable maps `staging` and yields its bytes."""

    @abstractmethod
    async def _time_passes(self, passes: Sequence[Pass]) -> list[int]:
        """Encode each pass with beginning and end timestamps (2 x len(passes) <= MAX_QUERIES),
        submit, read the timestamps back: each pass's end minus its beginning, in ns."""
