"""cera.device.Device on the browser's WebGPU, from Pyodide.

The GPU objects live in JavaScript (web/gpu.js, `GpuHost`); Python holds small handles.
Every call across the Pyodide boundary costs microseconds, so the hot paths are one
call each: `run` hands JS a schedule id, the writes queued since the last call and a
read range; `upload` hands JS a Blob range to move to the GPU by itself.
"""
from __future__ import annotations

import re
import struct
import weakref
from array import array

from cera.device import Binding, Copy, Dispatch, Limits
from pyodide.ffi import can_run_sync, run_sync, to_js

from .sources import BlobSource

_FLUSH_BYTES = 1 << 20        # queued write bytes that trigger a flush without waiting for run()
_ZERO_CHECK_BYTES = 1 << 16   # writes this large are checked for being all zeros
_SUBGROUP_USE = re.compile(r"\bsubgroup[A-Z]\w*\s*\(|@builtin\(\s*subgroup_")


class Handle:
    """A GPU object living in GpuHost's table; freed there when Python drops it."""
    __slots__ = ("id", "label", "size", "__weakref__")

    def __init__(self, device: "WebDevice", id: int, label: str, size: int = 0):
        self.id, self.label, self.size = id, label, size
        weakref.finalize(self, device._dead.append, id)

    def __repr__(self) -> str:
        return f"<{self.label} #{self.id}>"


class WebDevice:
    """A WebGPU device granted the adapter's maximum limits (see GpuHost in gpu.js)."""

    def __init__(self, host, simulate: dict | None = None):
        """simulate: Limits fields to lower below what the device has (a smaller GPU, for testing;
        WebGPU itself never grants less than its defaults)."""
        self._host = host                     # the JS GpuHost
        self.adapter_name = str(host.adapterName)
        self.features = frozenset(host.features.to_py())
        granted = {field: int(getattr(host.limits, field)) for field in Limits.__dataclass_fields__}
        for field, value in (simulate or {}).items():
            if field not in granted:
                raise ValueError(f"unknown limit {field!r}: one of {', '.join(granted)}")
            if field == "min_storage_buffer_offset_alignment":
                granted[field] = max(granted[field], int(value))
            else:
                granted[field] = min(granted[field], int(value))
        self.limits = Limits(**granted)
        self._writes: list[bytes] = []        # packed (handle, offset, length) + data, in order
        self._write_bytes = 0
        self._dead: list[int] = []            # handles whose Python objects were collected

    # --- allocation and writes -----------------------------------------------------------
    def buffer(self, size: int, label: str, uniform: bool = False) -> Handle:
        size = max(4, (size + 3) // 4 * 4)
        if size > self.limits.max_buffer_size:
            raise ValueError(f"buffer {label} needs {size} bytes; this GPU's maxBufferSize is "
                             f"{self.limits.max_buffer_size} (model too large for this GPU)")
        self._release()
        return Handle(self, int(self._host.buffer(size, label, uniform)), label, size)

    def write(self, buffer: Handle, data, offset: int = 0) -> None:
        """Queued: applied in order by the next run/read/upload (or once 1 MiB is queued)."""
        # a copy (the caller may reuse `data`) unless it is immutable bytes already
        raw = data if isinstance(data, bytes) else memoryview(data).cast("B").tobytes()
        n = len(raw)
        if n == 0:
            return
        if n >= _ZERO_CHECK_BYTES and raw.count(0) == n:
            # clearing a KV cache: JS writes zeros of its own, nothing crosses from wasm
            self._writes.append(struct.pack("<3d", buffer.id, offset, -n))
            return
        self._writes.append(struct.pack("<3d", buffer.id, offset, n))
        self._writes.append(raw + b"\0" * (-n % 8) if n % 8 else raw)
        self._write_bytes += n
        if self._write_bytes >= _FLUSH_BYTES:
            self._host.write(self._take_writes())

    def _take_writes(self):
        """The queued writes as one Uint8Array for GpuHost.write, or None."""
        if not self._writes:
            return None
        packed = b"".join(self._writes)
        self._writes.clear()
        self._write_bytes = 0
        return to_js(packed)

    def _release(self) -> None:
        if len(self._dead) > 64:
            self.release_unused()

    def release_unused(self) -> None:
        """Free the GPU objects whose Python handles were collected (batched: one JS call)."""
        if self._dead:
            dead, self._dead[:] = self._dead[:], []
            self._host.release(to_js(array("d", dead)))

    # --- kernels and schedules -----------------------------------------------------------
    def kernel(self, name: str, code: str) -> Handle:
        """Compile WGSL (entry point `main`, auto layout). Errors raise RuntimeError naming the
        kernel: at once where Pyodide can block on a promise (JSPI), else at the next await."""
        if "subgroups" in self.features and "enable subgroups;" not in code and _SUBGROUP_USE.search(code):
            code = "enable subgroups;\n" + code      # browsers want the extension enabled in WGSL
        handle = Handle(self, int(self._host.kernel(name, code)), name)
        if can_run_sync():
            self._raise_compile_error(run_sync(self._host.checkCompiles()))
        return handle

    async def check(self) -> None:
        """Raise the first compile error of the kernels made so far (run() also does)."""
        self._raise_compile_error(await self._host.checkCompiles())

    @staticmethod
    def _raise_compile_error(message) -> None:
        if message:
            raise RuntimeError(str(message))

    def bind(self, kernel: Handle, bindings) -> Handle:
        entries = array("d")
        align = self.limits.min_storage_buffer_offset_alignment
        for i, b in enumerate(bindings):
            if b.offset % align:   # WebGPU would only say so at the next submission
                raise ValueError(f"{kernel.label}: binding {i} starts at byte {b.offset} of buffer "
                                 f"{b.buffer.label}, not a multiple of this GPU's "
                                 f"minStorageBufferOffsetAlignment {align}")
            entries.extend((b.buffer.id, b.offset, -1 if b.size is None else b.size))
        handle = Handle(self, int(self._host.bind(kernel.id, to_js(entries))), f"bind group of {kernel.label}")
        weakref.finalize(handle, lambda keep: None, [b.buffer for b in bindings])   # buffers outlive it
        return handle

    def schedule(self, steps) -> Handle:
        """Hand the whole step list to JS once; run() then replays it by id."""
        packed = array("d")
        for step in steps:
            if isinstance(step, Dispatch):
                packed.extend((0, step.kernel.id, step.bind_group.id, *step.groups))
            elif isinstance(step, Copy):
                packed.extend((1, step.src.id, step.src_offset, step.dst.id, step.dst_offset, step.size))
            else:
                raise TypeError(f"not a schedule step: {step!r}")
        # keep the objects the steps name alive as long as the schedule is
        handle = Handle(self, int(self._host.schedule(to_js(packed))), f"schedule of {len(steps)} steps")
        weakref.finalize(handle, lambda keep: None, list(steps))
        return handle

    # --- submission and readback ---------------------------------------------------------
    def run(self, schedule: Handle, read: Binding | None = None):
        """One JS call that applies the queued writes, encodes and submits the schedule now, and
        (if asked) copies `read` to a staging buffer; the returned awaitable yields those bytes
        once mapped, so the caller may submit the next step before awaiting this one."""
        if read is None:
            return self._settle(self._host.run(schedule.id, self._take_writes(), 0, 0, 0), False)
        size = read.buffer.size - read.offset if read.size is None else read.size
        return self._settle(self._host.run(schedule.id, self._take_writes(), read.buffer.id, read.offset, size), True)

    @staticmethod
    async def _settle(promise, want_bytes: bool) -> bytes | None:
        try:
            data = await promise
        except Exception as err:   # a JsException: a compile error or a WebGPU validation error
            raise RuntimeError(_js_message(err)) from None
        return data.to_bytes() if want_bytes else None

    async def read(self, buffer: Handle, offset: int, size: int) -> bytes:
        return await self._settle(self._host.run(0, self._take_writes(), buffer.id, offset, size), True)

    async def upload(self, buffer: Handle, source, src_offset: int, size: int, dst_offset: int = 0) -> None:
        """A Blob-backed source moves in JS (Blob slice -> writeBuffer); others pass through here."""
        if isinstance(source, BlobSource):
            await self._host.uploadBlob(buffer.id, source.blob, src_offset, size, dst_offset, self._take_writes())
            return
        chunk = 16 << 20
        for start in range(0, size, chunk):
            self.write(buffer, source.read(src_offset + start, min(chunk, size - start)), dst_offset + start)

    # --- bookkeeping ---------------------------------------------------------------------
    def calls(self) -> dict:
        """Calls from Python into GpuHost, by entry point, since the device was opened."""
        return self._host.calls.to_py()

    def close(self) -> None:
        self._writes.clear()
        self._host.destroy()


def _js_message(err) -> str:
    message = getattr(err, "message", None) or str(err)
    return str(message).removeprefix("Error: ")
