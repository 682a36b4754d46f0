"""cera.device.Device on wgpu-py."""
from __future__ import annotations

import os
import tempfile

os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())  # quiets Mesa's WSI probe on headless machines
import wgpu  # noqa: E402
from wgpu.backends.wgpu_native._ffi import ffi as _ffi, lib as _lib  # noqa: E402  (the raw C calls)

from cera.device import Binding, Copy, Dispatch, Limits  # noqa: E402

_LIMIT_NAMES = {   # cera.device.Limits field -> WebGPU limit name
    "max_storage_buffer_binding_size": "max-storage-buffer-binding-size",
    "max_buffer_size": "max-buffer-size",
    "min_storage_buffer_offset_alignment": "min-storage-buffer-offset-alignment",
    "max_compute_invocations_per_workgroup": "max-compute-invocations-per-workgroup",
    "max_compute_workgroup_storage_size": "max-compute-workgroup-storage-size",
    "max_storage_buffers_per_shader_stage": "max-storage-buffers-per-shader-stage",
    "max_compute_workgroups_per_dimension": "max-compute-workgroups-per-dimension",
}
_WANTED_FEATURES = ("shader-f16", "subgroup", "timestamp-query")   # timestamps: profiling only
_WEBGPU_NAMES = {"subgroup": "subgroups"}   # wgpu-py's feature names -> the WebGPU spec's
_STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
_UNIFORM = wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST


class NativeDevice:
    """A wgpu-py device with the adapter's limits requested at their maximum."""

    def __init__(self, power_preference: str = "high-performance"):
        adapter = wgpu.gpu.request_adapter_sync(power_preference=power_preference)
        if adapter is None:
            raise RuntimeError("no WebGPU adapter found (natively: install a Vulkan driver, "
                               "e.g. Debian's mesa-vulkan-drivers)")
        info = adapter.info
        self.adapter_name = f"{info['device']} via {info['backend_type']}"
        features = [f for f in _WANTED_FEATURES if f in adapter.features]
        required = {name: adapter.limits[name] for name in _LIMIT_NAMES.values()}
        self._device = adapter.request_device_sync(required_features=features, required_limits=required)
        self.features = frozenset(_WEBGPU_NAMES.get(f, f) for f in features)
        self.limits = Limits(**{field: self._device.limits[name] for field, name in _LIMIT_NAMES.items()})
        self._staging = {}   # size -> free MAP_READ buffers

    def buffer(self, size: int, label: str, uniform: bool = False):
        size = max(4, (size + 3) // 4 * 4)
        return self._device.create_buffer(size=size, usage=_UNIFORM if uniform else _STORAGE, label=label)

    def write(self, buffer, data, offset: int = 0) -> None:
        self._device.queue.write_buffer(buffer, offset, memoryview(data).cast("B"))

    async def upload(self, buffer, source, src_offset: int, size: int, dst_offset: int = 0) -> None:
        chunk = 64 << 20
        for start in range(0, size, chunk):
            data = source.read(src_offset + start, min(chunk, size - start))
            self.write(buffer, data + bytes(-len(data) % 4), dst_offset + start)   # writes are whole words

    def kernel(self, name: str, code: str):
        try:
            module = self._device.create_shader_module(code=code, label=name)
            return self._device.create_compute_pipeline(
                layout="auto", compute={"module": module, "entry_point": "main"}, label=name)
        except Exception as err:   # wgpu raises GPUValidationError et al. with the compiler's message
            raise RuntimeError(f"shader {name} failed to compile: {err}") from err

    def bind(self, kernel, bindings):
        entries = [{"binding": i, "resource": {"buffer": b.buffer, "offset": b.offset,
                                               "size": b.buffer.size - b.offset if b.size is None else b.size}}
                   for i, b in enumerate(bindings)]
        return self._device.create_bind_group(layout=kernel.get_bind_group_layout(0), entries=entries)

    def schedule(self, steps):
        """Group consecutive dispatches into compute passes (copies go between passes), each
        dispatch kept as the raw wgpu-native handles the per-token loop calls with."""
        segments = []
        for step in steps:
            if isinstance(step, Dispatch):
                if not segments or not isinstance(segments[-1], _Pass):
                    segments.append(_Pass())
                segments[-1].add(step)
            elif isinstance(step, Copy):
                segments.append(step)
            else:
                raise TypeError(f"not a schedule step: {step!r}")
        return segments

    def _encode(self, schedule, read: Binding | None):
        encoder = self._device.create_command_encoder()
        for segment in schedule:
            if isinstance(segment, Copy):
                encoder.copy_buffer_to_buffer(segment.src, segment.src_offset, segment.dst,
                                              segment.dst_offset, segment.size)
                continue
            compute = encoder.begin_compute_pass()
            segment.encode(compute._internal)
            compute.end()
        staging = None
        if read is not None:
            staging = self._staging_buffer(read.size)
            encoder.copy_buffer_to_buffer(read.buffer, read.offset, staging, 0, read.size)
        self._device.queue.submit([encoder.finish()])
        return staging

    def _staging_buffer(self, size: int):
        """A MAP_READ buffer of `size` bytes that no pending read holds."""
        free = self._staging.setdefault(size, [])
        if free:
            return free.pop()
        return self._device.create_buffer(size=size, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST,
                                          label=f"staging {size}")

    def _readback(self, staging, size: int) -> bytes:
        staging.map_sync(wgpu.MapMode.READ, 0, size)
        data = bytes(staging.read_mapped(0, size))
        staging.unmap()
        self._staging[size].append(staging)
        return data

    def submit(self, schedule, read: Binding | None = None) -> bytes | None:
        """Synchronous run(): the native loop needs no event loop."""
        staging = self._encode(schedule, read)
        return None if staging is None else self._readback(staging, read.size)

    def run(self, schedule, read: Binding | None = None):
        """Submit now; the returned awaitable waits for the work and yields the read bytes."""
        staging = self._encode(schedule, read)
        return self._finish(staging, None if read is None else read.size)

    async def _finish(self, staging, size):
        return None if staging is None else self._readback(staging, size)

    def read_sync(self, buffer, offset: int, size: int) -> bytes:
        return self.submit([], Binding(buffer, offset, size))

    async def read(self, buffer, offset: int, size: int) -> bytes:
        return self.read_sync(buffer, offset, size)


class _Pass:
    """Consecutive dispatches of a schedule. Encoding calls wgpu-native directly with handles
    taken once: wgpu-py's per-call wrappers (error scopes, offset arrays) cost more than the
    call itself, and a token is a few hundred dispatches. Errors still surface at finish()."""

    def __init__(self):
        self.dispatches = []   # the Dispatch objects, which keep the handles alive
        self._raw = []         # (pipeline, bind group, x, y, z) handles

    def add(self, d: Dispatch) -> None:
        self.dispatches.append(d)
        self._raw.append((d.kernel._internal, d.bind_group._internal, *d.groups))

    def encode(self, compute) -> None:
        set_pipeline, set_bind_group = _lib.wgpuComputePassEncoderSetPipeline, _lib.wgpuComputePassEncoderSetBindGroup
        dispatch, no_offsets = _lib.wgpuComputePassEncoderDispatchWorkgroups, _ffi.NULL
        for pipeline, bind_group, x, y, z in self._raw:
            set_pipeline(compute, pipeline)
            set_bind_group(compute, 0, bind_group, 0, no_offsets)
            dispatch(compute, x, y, z)
