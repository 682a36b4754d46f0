"""The narrow interface between the core and a host.

A host is the native wgpu-py device (`cera.native`) or the browser's WebGPU
reached from Pyodide (`web/`). The core never imports either: it builds buffers,
kernels and a fixed per-token schedule through this interface, and hosts do the
rest. Handles returned by a host (buffers, kernels, bind groups, schedules) are
opaque to the core.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Protocol, Sequence


@dataclass(frozen=True)
class Limits:
    """The adapter limits the core plans around (requested at their maximum)."""
    max_storage_buffer_binding_size: int
    max_buffer_size: int
    min_storage_buffer_offset_alignment: int
    max_compute_invocations_per_workgroup: int
    max_compute_workgroup_storage_size: int
    max_storage_buffers_per_shader_stage: int
    max_compute_workgroups_per_dimension: int


@dataclass(frozen=True)
class Binding:
    """A byte range of a buffer bound at one @binding index (size None: to the end)."""
    buffer: Any
    offset: int = 0
    size: int | None = None


@dataclass(frozen=True)
class Dispatch:
    """One compute dispatch: a kernel, its bind group, workgroup counts (x, y, z)."""
    kernel: Any
    bind_group: Any
    groups: tuple[int, int, int]
    label: str = ""


@dataclass(frozen=True)
class Copy:
    """A buffer-to-buffer copy inside a schedule."""
    src: Any
    src_offset: int
    dst: Any
    dst_offset: int
    size: int


Step = Dispatch | Copy


class Device(Protocol):
    adapter_name: str            # e.g. "llvmpipe (LLVM 15.0.6, 256 bits) via Vulkan"
    limits: Limits
    features: frozenset[str]     # WebGPU feature names granted, e.g. "shader-f16", "subgroups"

    def buffer(self, size: int, label: str, uniform: bool = False) -> Any:
        """A zero-filled GPU buffer (storage + copy src/dst, or uniform + copy dst)."""

    def write(self, buffer: Any, data: bytes | memoryview, offset: int = 0) -> None:
        """Queue a write of host bytes into `buffer` at `offset` (a multiple of 4)."""

    async def upload(self, buffer: Any, source: Any, src_offset: int, size: int, dst_offset: int = 0) -> None:
        """Copy `size` bytes of a byte source (cera.gguf.ByteSource) into `buffer`.

        Hosts that can move bytes without passing them through Python (the browser,
        from a Blob) do so; the others read the source and write."""

    def kernel(self, name: str, code: str) -> Any:
        """Compile WGSL `code` (entry point `main`, auto layout) into a compute pipeline.

        Raises RuntimeError("shader {name} failed to compile: ...") on error."""

    def bind(self, kernel: Any, bindings: Sequence[Binding]) -> Any:
        """A bind group for group 0 of `kernel`: bindings[i] at @binding(i)."""

    def schedule(self, steps: Sequence[Step]) -> Any:
        """Prepare a fixed list of dispatches and copies for repeated submission."""

    def run(self, schedule: Any, read: Binding | None = None) -> Awaitable[bytes | None]:
        """Encode and submit `schedule` now; if `read` is given, copy that range to a staging
        buffer in the same submission. The returned awaitable yields those bytes once mapped,
        so the caller can submit the next step before waiting for this one."""

    async def read(self, buffer: Any, offset: int, size: int) -> bytes:
        """Read bytes back from a buffer (waits for queued work)."""
