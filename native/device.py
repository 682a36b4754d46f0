"""cera.device.Device on wgpu-py: the raw calls only (the policy is the core's)."""
from __future__ import annotations

import os
import tempfile
import time

os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())  # quiets Mesa's WSI probe on headless machines
import wgpu  # noqa: E402

from cera.device import (KERNEL_FEATURES, WANTED_FEATURES, WANTED_LANGUAGE_FEATURES, Binding, Copy, Device,  # noqa: E402
                         Flush, Limits, Pass)
from cera.errors import GpuError, NoGpu  # noqa: E402

_USAGE = {"storage": wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST,
          "uniform": wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST,
          "readback": wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST}
_WGPU_FEATURE = {"subgroups": "subgroup"}   # the WebGPU spec's feature names -> wgpu-py's


def _kebab(camel: str) -> str:
    """maxBufferSize -> max-buffer-size (wgpu-py spells WebGPU limits this way)."""
    return "".join("-" + c.lower() if c.isupper() else c for c in camel)


def _raw_calls():
    """Functions over wgpu-native's C API directly, for the hot paths; this is the one place
    cera reaches into wgpu-py's internals (`_ffi`, `_api.libf`, `._internal`, as of wgpu-py 0.32).

    encode: a Pass's dispatches into a compute pass. wgpu-py's per-call wrappers (error scopes,
    offset arrays) cost more than the call itself and a token is a few hundred dispatches;
    errors still surface at the encoder's finish().
    submit, read: a command buffer submitted for its submission index, then a staging buffer
    mapped once exactly that submission is done. wgpu-py's map waits for the device to go
    idle (a blocking poll of every submission), so a decode step submitted ahead of the one
    being read back would be waited for too, and the pipelined loop would lose its overlap.
    shader: a WGSL module compiled with the runtime checks asked for. wgpu-py compiles with
    naga's defaults, which bound every loop with a counter (a guard against untrusted shaders
    that never end) and clamp every array index."""
    from wgpu.backends.wgpu_native._api import GPUShaderModule, libf
    from wgpu.backends.wgpu_native._ffi import ffi, lib

    set_pipeline, set_bind_group = lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup
    dispatch, no_offsets = lib.wgpuComputePassEncoderDispatchWorkgroups, ffi.NULL

    def handles(segment: Pass) -> list:
        return [(d.kernel._internal, d.bind_group._internal, *d.groups) for d in segment.dispatches]

    def encode(compute_pass, raw) -> None:
        compute = compute_pass._internal
        for pipeline, bind_group, x, y, z in raw:
            set_pipeline(compute, pipeline)
            set_bind_group(compute, 0, bind_group, 0, no_offsets)
            dispatch(compute, x, y, z)

    def submit(queue, command_buffer) -> int:
        return libf.wgpuQueueSubmitForIndex(queue._internal, 1, ffi.new("WGPUCommandBuffer[1]", [command_buffer._internal]))

    @ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)")
    def on_mapped(status, _message, status_out, _unused):
        ffi.cast("int *", status_out)[0] = status

    def read(device, staging, size: int, index: int) -> bytes:
        status = ffi.new("int *", -1)
        info = ffi.new("WGPUBufferMapCallbackInfo *", {"mode": lib.WGPUCallbackMode_AllowProcessEvents,
                                                       "callback": on_mapped, "userdata1": status})
        libf.wgpuBufferMapAsync(staging._internal, lib.WGPUMapMode_Read, 0, size, info[0])
        libf.wgpuDevicePoll(device._internal, True, ffi.new("WGPUSubmissionIndex *", index))
        if status[0] != lib.WGPUMapAsyncStatus_Success:
            raise GpuError(f"reading back {staging.label} failed (map status {status[0]})")
        data = bytes(ffi.buffer(lib.wgpuBufferGetConstMappedRange(staging._internal, 0, size), size))
        lib.wgpuBufferUnmap(staging._internal)
        return data

    def shader(device, code: str, label: str, bounds_checks: bool):
        text, name = ffi.new("char[]", code.encode()), ffi.new("char[]", label.encode())   # alive until compiled
        source = ffi.new("WGPUShaderSourceWGSL *", {"code": {"data": text, "length": len(text) - 1}})
        source.chain.sType = lib.WGPUSType_ShaderSourceWGSL
        descriptor = ffi.new("WGPUShaderModuleDescriptor *", {"nextInChain": ffi.cast("WGPUChainedStruct *", source),
                                                              "label": {"data": name, "length": len(name) - 1}})
        checks = lib.WGPUShaderRuntimeChecks_BoundsChecks if bounds_checks else lib.WGPUShaderRuntimeChecks_None
        module = libf.wgpuDeviceCreateShaderModuleTrusted(device._internal, descriptor, checks)
        if module == ffi.NULL:
            raise RuntimeError("shader module creation failed")
        return GPUShaderModule(label, module, device)

    return handles, encode, submit, read, shader


_handles, _encode_pass, _submit_for_index, _read_after, _shader = _raw_calls()


class NativeDevice(Device):
    """A wgpu-py device with every adapter limit requested at its maximum. Kernels compile
    without naga's loop counters (cera's loops are bounded by construction); `bounds_checks`
    keeps its clamped array indices (off: what the WGSL says, unchecked). `baseline` asks for
    what every WebGPU device grants instead: the spec's default limits and none of the features
    kernels may use (each keeps a fallback), so a run on it shows a kernel that needs more."""

    def __init__(self, power_preference: str = "high-performance", bounds_checks: bool = True,
                 baseline: bool = False):
        self.bounds_checks = bounds_checks
        adapter = wgpu.gpu.request_adapter_sync(power_preference=power_preference)
        if adapter is None:
            raise NoGpu("no WebGPU adapter found (natively: install a Vulkan driver, e.g. Debian's "
                        "mesa-vulkan-drivers)")
        features = [f for f in WANTED_FEATURES if _WGPU_FEATURE.get(f, f) in adapter.features
                    and not (baseline and f in KERNEL_FEATURES)]
        limits = {_kebab(Limits.webgpu_name(name)): value
                  for name, value in vars(Limits.webgpu_defaults()).items()} if baseline else dict(adapter.limits)
        self._device = adapter.request_device_sync(required_features=[_WGPU_FEATURE.get(f, f) for f in features],
                                                   required_limits=limits)
        info = adapter.info
        language = list(WANTED_LANGUAGE_FEATURES)   # naga has each
        super().__init__(f"{info['device']} via {info['backend_type']}",
                         Limits.read(lambda name: self._device.limits[_kebab(name)]), frozenset(features + language))

    def _buffer(self, size, label, usage):
        return self._device.create_buffer(size=size, usage=_USAGE[usage], label=label)

    def write(self, buffer, data, offset=0):
        self._device.queue.write_buffer(buffer, offset, memoryview(data).cast("B"))

    async def _upload(self, buffer, source, src_offset, size, dst_offset):
        data = source.read(src_offset, size)
        self.write(buffer, data + bytes(-len(data) % 4), dst_offset)

    async def _drain(self):
        pass   # queue.write_buffer copies the bytes at once: nothing is held for us

    def _kernel(self, name, code):
        # The shaders enable the subgroups extension as WGSL asks; wgpu's compiler (naga) takes
        # subgroup operations where the device has the feature, but not yet that directive.
        code = code.replace("enable subgroups;\n", "")
        try:
            module = _shader(self._device, code, name, self.bounds_checks)
            return self._device.create_compute_pipeline(
                layout="auto", compute={"module": module, "entry_point": "main"}, label=name)
        except Exception as err:   # wgpu raises GPUValidationError et al. with the compiler's message
            raise self.compile_error(name, str(err)) from err

    def _bind(self, kernel, bindings):
        entries = [{"binding": i, "resource": {"buffer": b.buffer, "offset": b.offset, "size": b.nbytes}}
                   for i, b in enumerate(bindings)]
        return self._device.create_bind_group(layout=kernel.get_bind_group_layout(0), entries=entries)

    def _schedule(self, segments):
        # each Pass kept beside its raw handles: its Dispatch objects keep those handles alive
        return tuple(s if isinstance(s, (Copy, Flush)) else (s, _handles(s)) for s in segments)

    def _submit(self, schedule, read: Binding | None, staging):
        encoder = self._device.create_command_encoder()
        for segment in schedule or ():
            if isinstance(segment, Flush):
                self._device.queue.submit([encoder.finish()])
                encoder = self._device.create_command_encoder()
                continue
            if isinstance(segment, Copy):
                encoder.copy_buffer_to_buffer(segment.src, segment.src_offset, segment.dst, segment.dst_offset,
                                              segment.size)
                continue
            compute = encoder.begin_compute_pass()
            _encode_pass(compute, segment[1])
            compute.end()
        if read is not None:
            encoder.copy_buffer_to_buffer(read.buffer, read.offset, staging, 0, read.size)
        index = _submit_for_index(self._device.queue, encoder.finish())
        return self._map(staging, None if read is None else read.size, index)

    def encode_cost(self, schedule) -> tuple[float, float]:
        """What a schedule of passes costs the host before its submit, in seconds: recording
        them (cera's calls into wgpu-native), then the encoder's finish() (wgpu-native validates
        and tracks the commands and has the driver record them). Nothing is submitted."""
        encoder = self._device.create_command_encoder()
        t = time.perf_counter()
        for segment in schedule:
            compute = encoder.begin_compute_pass()
            _encode_pass(compute, segment[1])
            compute.end()
        recorded = time.perf_counter()
        encoder.finish()
        return recorded - t, time.perf_counter() - recorded

    async def _time_passes(self, passes):
        n = 2 * len(passes)
        queries = self._device.create_query_set(type="timestamp", count=n)
        resolved = self._device.create_buffer(size=8 * n, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        staging = self._buffer(8 * n, "timestamps", "readback")
        encoder = self._device.create_command_encoder()
        for i, segment in enumerate(passes):
            compute = encoder.begin_compute_pass(timestamp_writes={
                "query_set": queries, "beginning_of_pass_write_index": 2 * i, "end_of_pass_write_index": 2 * i + 1})
            _encode_pass(compute, _handles(segment))
            compute.end()
        encoder.resolve_query_set(queries, 0, n, resolved, 0)
        encoder.copy_buffer_to_buffer(resolved, 0, staging, 0, 8 * n)
        stamps = memoryview(await self._map(staging, 8 * n, _submit_for_index(self._device.queue, encoder.finish())))
        stamps = stamps.cast("Q")
        return [stamps[i + 1] - stamps[i] for i in range(0, n, 2)]

    async def _map(self, staging, size, index):
        if staging is None:
            return None
        return _read_after(self._device, staging, size, index)
