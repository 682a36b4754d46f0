"""cera.device.Device on the browser's WebGPU, from Pyodide: the raw calls, forwarded to
`GpuHost` (web/gpu.js). The policy (limits, pass grouping, staging, upload chunks) is the
core's, in cera.device.

Every call across the Pyodide boundary costs microseconds, so the hot paths are one call
each: `_submit` hands JS a schedule id, the writes queued since the last call and a read
range; `_upload` hands JS a Blob range to move to the GPU by itself.
"""
from __future__ import annotations

import struct
import weakref
from array import array

from cera import errors
from cera.device import Binding, Copy, Device, Flush, Limits
from pyodide.ffi import JsException, can_run_sync, run_sync, to_js

from .sources import BlobSource

_FLUSH_BYTES = 1 << 20        # queued write bytes that trigger a flush without waiting for run()


class Handle:
    """A GPU object living in GpuHost's table; freed there when Python drops it."""
    __slots__ = ("id", "label", "size", "__weakref__")

    def __init__(self, device: "WebDevice", id: int, label: str, size: int = 0):
        self.id, self.label, self.size = id, label, size
        weakref.finalize(self, device._dead.append, id)

    def __repr__(self) -> str:
        return f"<{self.label} #{self.id}>"


class WebDevice(Device):
    """A WebGPU device granted the adapter's maximum limits (see openGpu in gpu.js)."""

    def __init__(self, host, simulate: dict | None = None):
        """simulate: Limits fields to lower below what the device has (a smaller GPU, for testing;
        WebGPU itself never grants less than its defaults)."""
        self._host = host                     # the JS GpuHost
        granted = vars(Limits.read(host.limit))
        for field, value in (simulate or {}).items():
            if field not in granted:
                raise errors.InvalidArgument(f"unknown limit {field!r}: one of {', '.join(granted)}")
            better = max if field == "min_storage_buffer_offset_alignment" else min
            granted[field] = better(granted[field], int(value))
        super().__init__(str(host.adapterName), Limits(**granted), frozenset(host.features.to_py()))
        self._writes: list[bytes] = []        # packed (handle, offset, length) + data, in order
        self._write_bytes = 0
        self._dead: list[int] = []            # handles whose Python objects were collected

    # --- allocation and writes -----------------------------------------------------------
    def _buffer(self, size, label, usage):
        if len(self._dead) > 64:
            self.release_unused()
        return Handle(self, int(self._host.buffer(size, label, usage)), label, size)

    def write(self, buffer: Handle, data, offset: int = 0) -> None:
        """Queued: applied in order by the next run/read/upload (or once 1 MiB is queued)."""
        # a copy (the caller may reuse `data`) unless it is immutable bytes already
        raw = data if isinstance(data, bytes) else memoryview(data).cast("B").tobytes()
        if not raw:
            return
        self._writes.append(struct.pack("<3d", buffer.id, offset, len(raw)))
        self._writes.append(raw + b"\0" * (-len(raw) % 8))
        self._write_bytes += len(raw)
        if self._write_bytes >= _FLUSH_BYTES:
            self._host.write(self._take_writes())

    def _take_writes(self):
        """The queued writes as one Uint8Array for GpuHost, or None."""
        if not self._writes:
            return None
        packed = b"".join(self._writes)
        self._writes.clear()
        self._write_bytes = 0
        return to_js(packed)

    def release_unused(self) -> None:
        """Free the GPU objects whose Python handles were collected (batched: one JS call)."""
        if self._dead:
            dead, self._dead[:] = self._dead[:], []
            self._host.release(to_js(array("d", dead)))

    async def _upload(self, buffer, source, src_offset, size, dst_offset):
        """A Blob-backed source moves in JS (Blob slice -> writeBuffer); others pass through here."""
        if isinstance(source, BlobSource):
            await settle(self._host.uploadBlob(buffer.id, source.blob, src_offset, size, dst_offset,
                                               self._take_writes()))
        else:
            self.write(buffer, source.read(src_offset, size), dst_offset)

    async def _drain(self):
        await settle(self._host.drain())

    # --- kernels and schedules -----------------------------------------------------------
    def _kernel(self, name, code):
        """Errors raise at once where Pyodide can block on a promise (JSPI), else at the next
        await (`check()` or any run)."""
        handle = Handle(self, int(self._host.kernel(name, code)), name)
        if can_run_sync():
            self._raise_compile_error(run_sync(self._host.checkCompiles()))
        return handle

    async def check(self) -> None:
        """Raise the first compile error of the kernels made so far (run() also does)."""
        self._raise_compile_error(await self._host.checkCompiles())

    def _raise_compile_error(self, failure) -> None:
        if failure:
            name, detail = failure.to_py()
            raise self.compile_error(name, detail)

    def _bind(self, kernel, bindings):
        entries = array("d")
        for b in bindings:
            entries.extend((b.buffer.id, b.offset, b.nbytes))
        handle = Handle(self, int(self._host.bind(kernel.id, to_js(entries))), f"bind group of {kernel.label}")
        weakref.finalize(handle, lambda keep: None, [b.buffer for b in bindings])   # buffers outlive it
        return handle

    def _schedule(self, segments):
        # keep the objects the segments name alive as long as the schedule is
        handle = Handle(self, int(self._host.schedule(_pack(segments))), f"schedule of {len(segments)} segments")
        weakref.finalize(handle, lambda keep: None, list(segments))
        return handle

    # --- submission and readback ---------------------------------------------------------
    def _submit(self, schedule, read: Binding | None, staging):
        """One JS call that applies the queued writes, encodes and submits now."""
        schedule_id = schedule.id if schedule is not None else 0
        if read is None:
            return settle(self._host.run(schedule_id, self._take_writes(), 0, 0, 0, 0))
        return settle(self._host.run(schedule_id, self._take_writes(), read.buffer.id, read.offset, read.size,
                                     staging.id), lambda js: js.to_bytes())

    async def _time_passes(self, passes):
        spans = await settle(self._host.timePasses(_pack(passes), self._take_writes()), lambda js: js.to_py())
        return [int(ns) for ns in spans]

    # --- bookkeeping ---------------------------------------------------------------------
    def calls(self) -> dict:
        """Calls from Python into GpuHost, by entry point, since the device was opened."""
        return self._host.calls.to_py()

    def close(self) -> None:
        self._writes.clear()
        self._host.destroy()


_BY_NAME = {cls.__name__: cls for cls in errors.ERRORS}


def _pack(segments) -> object:
    """Segments as GpuHost.segments() reads them: a pass is (0, n) then n times (kernel, bind
    group, x, y, z); a copy is (1, src, src offset, dst, dst offset, size); a flush is (2)."""
    packed = array("d")
    for s in segments:
        if isinstance(s, Flush):
            packed.append(2)
        elif isinstance(s, Copy):
            packed.extend((1, s.src.id, s.src_offset, s.dst.id, s.dst_offset, s.size))
        else:
            packed.extend((0, len(s.dispatches)))
            for d in s.dispatches:
                packed.extend((d.kernel.id, d.bind_group.id, *d.groups))
    return to_js(packed)


async def settle(promise, convert=None):
    """Await a GpuHost promise and `convert` its value (None: drop it); a JS error becomes the
    cera.errors type its name says."""
    try:
        data = await promise
    except JsException as err:
        message = str(getattr(err, "message", None) or err).removeprefix("Error: ")
        raise _BY_NAME.get(getattr(err, "name", ""), errors.GpuError)(message) from None
    return convert(data) if convert else None
