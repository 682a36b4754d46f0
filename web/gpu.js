// The JavaScript half of the browser host (cera_web/host.py is the Python half).
//
// Python holds small integer handles; the GPU objects live in the tables here. Hot paths
// are one call from Python each: run() encodes a whole prepared schedule, applies the
// writes queued since the last call, submits, and (when asked) maps a staging copy and
// resolves to its bytes; uploadBlob() moves a tensor from a Blob/File straight to
// queue.writeBuffer without passing through wasm memory.

// cera.device.Limits field -> WebGPU limit, requested at the adapter's maximum.
export const LIMITS = {
  max_storage_buffer_binding_size: "maxStorageBufferBindingSize",
  max_buffer_size: "maxBufferSize",
  min_storage_buffer_offset_alignment: "minStorageBufferOffsetAlignment",
  max_compute_invocations_per_workgroup: "maxComputeInvocationsPerWorkgroup",
  max_compute_workgroup_storage_size: "maxComputeWorkgroupStorageSize",
  max_storage_buffers_per_shader_stage: "maxStorageBuffersPerShaderStage",
  max_compute_workgroups_per_dimension: "maxComputeWorkgroupsPerDimension",
};
const WANTED_FEATURES = ["shader-f16", "subgroups"];
const UPLOAD_CHUNK = 32 << 20;          // bytes per Blob slice read during upload
const UPLOAD_DRAIN = 256 << 20;         // wait for the queue after this many bytes in flight
const ZERO_CHUNK = 16 << 20;            // the largest block of zeros kept for clearing buffers

// An error a user can act on: `name` picks the page's advice.
export class CeraError extends Error {
  constructor(name, message) { super(message); this.name = name; }
}

export async function openGpu() {
  if (!("gpu" in navigator)) {
    throw new CeraError("NoWebGPU", "This browser does not expose WebGPU (navigator.gpu is missing). " +
      "Use a recent Chrome or Edge (113+), or Firefox 141+ / Safari 26+; on Linux Chrome, enable " +
      "chrome://flags/#enable-unsafe-webgpu and chrome://flags/#enable-vulkan. The page must be served " +
      "over https:// or from localhost.");
  }
  const adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
  if (!adapter) {
    throw new CeraError("NoWebGPU", "WebGPU is present but no GPU adapter was granted (blocklisted " +
      "driver or GPU disabled). In Chrome, check chrome://gpu; try enabling chrome://flags/#enable-unsafe-webgpu.");
  }
  const requiredLimits = {};
  for (const name of Object.values(LIMITS)) requiredLimits[name] = adapter.limits[name];
  const requiredFeatures = WANTED_FEATURES.filter((f) => adapter.features.has(f));
  const device = await adapter.requestDevice({ requiredLimits, requiredFeatures });
  const info = adapter.info || {};
  const name = [info.vendor, info.architecture, info.device, info.description].filter(Boolean).join(" ") || "unknown GPU";
  return new GpuHost(device, name, requiredFeatures);
}

export class GpuHost {
  constructor(device, adapterName, features) {
    this.device = device;
    this.queue = device.queue;
    this.adapterName = adapterName;
    this.features = features;
    this.limits = {};
    for (const [field, name] of Object.entries(LIMITS)) this.limits[field] = device.limits[name];
    this.objects = [null];          // handle -> GPUBuffer | GPUComputePipeline | GPUBindGroup | schedule
    this.free = [];                 // reusable handles
    this.staging = new Map();       // size -> [idle MAP_READ buffers]
    this.compiles = [];             // pending compile checks: Promise<string|null>
    this.error = null;              // first uncaptured GPU error since the last run
    this.calls = {};                // entry point -> calls from Python (for the per-token count)
    this.lost = device.lost;
    device.addEventListener("uncapturederror", (e) => { this.error ??= e.error.message; });
  }

  count(name) { this.calls[name] = (this.calls[name] || 0) + 1; }

  put(object) {
    const id = this.free.length ? this.free.pop() : this.objects.length;
    this.objects[id] = object;
    return id;
  }

  release(ids) {               // handles Python no longer references (a Float64Array)
    this.count("release");
    for (const id of ids) {
      const object = this.objects[id];
      if (object instanceof GPUBuffer) object.destroy();
      this.objects[id] = null;
      this.free.push(id);
    }
  }

  buffer(size, label, uniform) {
    this.count("buffer");
    const usage = uniform ? GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST
      : GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
    return this.put(this.device.createBuffer({ size, usage, label }));
  }

  // Queued writes, packed by Python: per write three f64 (handle, offset, length), then the data
  // padded to 8 bytes; a negative length means that many zero bytes, with no data following.
  // Applied in order before the next submission.
  write(packed) {
    this.count("write");
    this.applyWrites(packed);
  }

  applyWrites(packed) {
    const view = new DataView(packed.buffer, packed.byteOffset, packed.byteLength);
    let at = 0;
    while (at < packed.byteLength) {
      const id = view.getFloat64(at, true), offset = view.getFloat64(at + 8, true), n = view.getFloat64(at + 16, true);
      at += 24;
      if (n < 0) {
        this.writeZeros(this.objects[id], offset, -n);
        continue;
      }
      this.queue.writeBuffer(this.objects[id], offset, packed.buffer, packed.byteOffset + at, n);
      at += Math.ceil(n / 8) * 8;
    }
  }

  writeZeros(buffer, offset, size) {
    const chunk = Math.min(size, ZERO_CHUNK);
    if (!this.zeros || this.zeros.length < chunk) this.zeros = new Uint8Array(chunk);
    for (let done = 0; done < size; done += chunk) {
      this.queue.writeBuffer(buffer, offset + done, this.zeros, 0, Math.min(chunk, size - done));
    }
  }

  // A compute pipeline; its compile check is settled at the next checkCompiles() (or run()).
  kernel(name, code) {
    this.count("kernel");
    this.device.pushErrorScope("validation");
    const module = this.device.createShaderModule({ code, label: name });
    const pipeline = this.device.createComputePipeline({ layout: "auto", compute: { module, entryPoint: "main" }, label: name });
    const scope = this.device.popErrorScope();
    this.compiles.push(Promise.all([module.getCompilationInfo(), scope]).then(([info, error]) => {
      const lines = info.messages.filter((m) => m.type === "error")
        .map((m) => `line ${m.lineNum}:${m.linePos}: ${m.message}`);
      if (!lines.length && !error) return null;
      return `shader ${name} failed to compile: ` + (lines.length ? lines.join("; ") : error.message);
    }));
    return this.put(pipeline);
  }

  // Resolves to null, or the first compile error of the kernels made since the last check.
  checkCompiles() {
    this.count("checkCompiles");
    return this.settleCompiles();
  }

  async settleCompiles() {
    const pending = this.compiles;
    this.compiles = [];
    for (const message of await Promise.all(pending)) if (message) return message;
    return null;
  }

  // entries: per binding three f64 (buffer handle, offset, size or -1 for "to the end").
  bind(kernelId, entries) {
    this.count("bind");
    const pipeline = this.objects[kernelId];
    const list = [];
    for (let i = 0; i < entries.length; i += 3) {
      const buffer = this.objects[entries[i]], offset = entries[i + 1];
      const size = entries[i + 2] < 0 ? buffer.size - offset : entries[i + 2];
      list.push({ binding: i / 3, resource: { buffer, offset, size } });
    }
    return this.put(this.device.createBindGroup({ layout: pipeline.getBindGroupLayout(0), entries: list }));
  }

  // steps: six f64 each: (0, kernel, bind group, x, y, z) a dispatch, (1, src, src offset, dst,
  // dst offset, size) a copy. Consecutive dispatches share one compute pass.
  schedule(steps) {
    this.count("schedule");
    const segments = [];
    for (let i = 0; i < steps.length; i += 6) {
      if (steps[i] === 0) {
        let pass = segments[segments.length - 1];
        if (!pass || !pass.dispatches) segments.push(pass = { dispatches: [] });
        pass.dispatches.push(this.objects[steps[i + 1]], this.objects[steps[i + 2]], steps[i + 3], steps[i + 4], steps[i + 5]);
      } else {
        segments.push({ copy: [this.objects[steps[i + 1]], steps[i + 2], this.objects[steps[i + 3]], steps[i + 4], steps[i + 5]] });
      }
    }
    return this.put(segments);
  }

  // The per-token call: queued writes, the whole schedule, and an optional read, in one
  // submission made before the first await (so calls submit in call order), then the readback.
  async run(scheduleId, writes, readId, readOffset, readSize) {
    this.count("run");
    if (writes) this.applyWrites(writes);
    const compiled = this.compiles.length ? this.settleCompiles() : null;
    const encoder = this.device.createCommandEncoder();
    for (const segment of (scheduleId ? this.objects[scheduleId] : [])) {
      if (segment.copy) {
        const [src, srcOffset, dst, dstOffset, size] = segment.copy;
        encoder.copyBufferToBuffer(src, srcOffset, dst, dstOffset, size);
        continue;
      }
      const pass = encoder.beginComputePass();
      const d = segment.dispatches;
      let current = null;
      for (let i = 0; i < d.length; i += 5) {
        if (d[i] !== current) pass.setPipeline(current = d[i]);
        pass.setBindGroup(0, d[i + 1]);
        pass.dispatchWorkgroups(d[i + 2], d[i + 3], d[i + 4]);
      }
      pass.end();
    }
    let staging = null;
    const padded = Math.ceil(readSize / 4) * 4;
    if (readSize > 0) {
      staging = this.takeStaging(padded);
      encoder.copyBufferToBuffer(this.objects[readId], readOffset, staging, 0, padded);
    }
    this.queue.submit([encoder.finish()]);
    if (compiled) {
      const message = await compiled;
      if (message) throw new Error(message);
    }
    if (!staging) return this.raiseError(null);
    try {
      await staging.mapAsync(GPUMapMode.READ, 0, padded);
    } catch (err) {
      throw new Error(this.error || `reading back failed: ${err.message}`);
    }
    const bytes = new Uint8Array(staging.getMappedRange(0, padded).slice(0, readSize));
    staging.unmap();
    this.staging.get(padded).push(staging);
    return this.raiseError(bytes);
  }

  raiseError(value) {
    if (this.error) {
      const message = this.error;
      this.error = null;
      throw new Error(`WebGPU error: ${message}`);
    }
    return value;
  }

  takeStaging(size) {
    if (!this.staging.has(size)) this.staging.set(size, []);
    const idle = this.staging.get(size);
    return idle.length ? idle.pop()
      : this.device.createBuffer({ size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST, label: `staging ${size}` });
  }

  // Blob bytes [srcOffset, srcOffset + size) -> buffer at dstOffset, in slices, never via wasm.
  async uploadBlob(bufferId, blob, srcOffset, size, dstOffset, writes) {
    this.count("uploadBlob");
    if (writes) this.applyWrites(writes);
    const buffer = this.objects[bufferId];
    for (let done = 0; done < size; done += UPLOAD_CHUNK) {
      const n = Math.min(UPLOAD_CHUNK, size - done);
      const start = srcOffset + done;
      let bytes = new Uint8Array(await blob.slice(start, start + n).arrayBuffer());
      if (bytes.length !== n) {
        throw new CeraError("BadFile", `the file ends at byte ${start + bytes.length}, inside a tensor that ` +
          `needs bytes up to ${srcOffset + size}: the file is truncated (download it again)`);
      }
      if (n % 4) {               // writeBuffer moves whole words; buffers are sized up to 4 bytes
        const padded = new Uint8Array(Math.ceil(n / 4) * 4);
        padded.set(bytes);
        bytes = padded;
      }
      this.queue.writeBuffer(buffer, dstOffset + done, bytes);
      this.inFlight = (this.inFlight || 0) + n;
      if (this.inFlight >= UPLOAD_DRAIN) {   // bound the browser's staging memory on big models
        this.inFlight = 0;
        await this.queue.onSubmittedWorkDone();
      }
    }
  }

  // Synchronous read of a Blob range (workers have FileReaderSync): the GGUF header and the
  // few small tensors the core converts on the CPU.
  readBlob(blob, offset, size) {
    this.count("readBlob");
    return new Uint8Array(new FileReaderSync().readAsArrayBuffer(blob.slice(offset, offset + size)));
  }

  destroy() {
    this.device.destroy();
    this.objects = [null];
  }
}
