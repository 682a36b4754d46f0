// The JavaScript half of the browser host (cera_web/host.py is the Python half, and the
// policy — limits, pass grouping, staging buffers, upload chunking — is cera.device's).
//
// This file only creates WebGPU objects, replays recorded schedules and moves Blob ranges.
// Python holds small integer handles; the GPU objects live in the table here. Hot paths are
// one call from Python each: run() applies the queued writes, encodes a whole recorded
// schedule, submits it (in parts, at its flushes), and (when asked) maps a staging copy and
// resolves to its bytes; uploadBlob() moves a Blob range straight to queue.writeBuffer, never through wasm memory.
//
// Errors thrown here carry a `name` that cera_web/host.py maps to a cera.errors type.

import { CeraError } from "./errors.js";

const ADAPTER_TRIES = 3;   // Chromium's GPU process was seen failing its first start on Linux/NVIDIA
const LOST_WAIT_MS = 2000;   // Chromium rejects a map on a lost device a moment before `device.lost` settles

// The DeviceLost error of a GPUDeviceLostInfo.
export function lostError(info) {
  return new CeraError("DeviceLost", `the GPU device was lost (${info.reason || "unknown"}: ${info.message})`);
}

// A device with every adapter limit at its maximum and the wanted features it has; its features
// as the core sees them name the wanted WGSL language features the browser's compiler has too
// (both lists are cera.device's: WANTED_FEATURES, WANTED_LANGUAGE_FEATURES).
export async function openGpu(wantedFeatures, wantedLanguageFeatures = []) {
  if (!("gpu" in navigator)) {
    throw new CeraError("NoGpu", "This browser does not expose WebGPU (navigator.gpu is missing). " +
      "Use a recent Chrome or Edge (113+), or Firefox 141+ / Safari 26+; on Linux Chrome, enable " +
      "chrome://flags/#enable-unsafe-webgpu and chrome://flags/#enable-vulkan. The page must be served " +
      "over https:// or from localhost.");
  }
  let adapter = null;
  for (let i = 0; i < ADAPTER_TRIES && !adapter; i++) {
    adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
  }
  if (!adapter) {
    throw new CeraError("NoGpu", "WebGPU is present but no GPU adapter was granted (blocklisted " +
      "driver or GPU disabled). In Chrome, check chrome://gpu; try enabling chrome://flags/#enable-unsafe-webgpu.");
  }
  const requiredLimits = {};
  for (const name in adapter.limits) requiredLimits[name] = adapter.limits[name];
  const requiredFeatures = wantedFeatures.filter((f) => adapter.features.has(f));
  const device = await adapter.requestDevice({ requiredLimits, requiredFeatures });
  const info = adapter.info || {};
  const name = [info.vendor, info.architecture, info.device, info.description].filter(Boolean).join(" ") || "unknown GPU";
  const languageFeatures = wantedLanguageFeatures.filter((f) => navigator.gpu.wgslLanguageFeatures?.has(f));
  return new GpuHost(device, name, [...requiredFeatures, ...languageFeatures]);
}

const USAGE = {
  storage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
  uniform: GPUBufferUsage.UNIFORM | GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST,
  readback: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
};

export class GpuHost {
  constructor(device, adapterName, features) {
    this.device = device;
    this.queue = device.queue;
    this.adapterName = adapterName;
    this.features = features;
    this.objects = [null];          // handle -> GPUBuffer | GPUComputePipeline | GPUBindGroup | schedule
    this.free = [];                 // reusable handles
    this.compiles = [];             // pending compile checks: Promise<string|null>
    this.error = null;              // first uncaptured GPU error since the last run
    this.calls = {};                // entry point -> calls from Python (for the per-token count)
    this.lost = device.lost;
    device.addEventListener("uncapturederror", (e) => { this.error ??= e.error.message; });
  }

  limit(name) { return this.device.limits[name]; }

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

  buffer(size, label, usage) {
    this.count("buffer");
    return this.put(this.device.createBuffer({ size, usage: USAGE[usage], label }));
  }

  // Queued writes, packed by Python: per write three f64 (handle, offset, length), then the data
  // padded to 8 bytes. Applied in order.
  write(packed) {
    this.count("write");
    this.applyWrites(packed);
  }

  applyWrites(packed) {
    const view = new DataView(packed.buffer, packed.byteOffset, packed.byteLength);
    for (let at = 0; at < packed.byteLength;) {
      const id = view.getFloat64(at, true), offset = view.getFloat64(at + 8, true), n = view.getFloat64(at + 16, true);
      at += 24;
      this.queue.writeBuffer(this.objects[id], offset, packed.buffer, packed.byteOffset + at, n);
      at += Math.ceil(n / 8) * 8;
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
      return [name, lines.length ? lines.join("; ") : error.message];
    }));
    return this.put(pipeline);
  }

  // Resolves to null, or [kernel name, compiler message] of the first kernel made since the
  // last check that failed to compile.
  checkCompiles() {
    this.count("checkCompiles");
    return this.settleCompiles();
  }

  async settleCompiles() {
    const pending = this.compiles;
    this.compiles = [];
    for (const failure of await Promise.all(pending)) if (failure) return failure;
    return null;
  }

  // entries: per binding three f64 (buffer handle, offset, size).
  bind(kernelId, entries) {
    this.count("bind");
    const list = [];
    for (let i = 0; i < entries.length; i += 3) {
      list.push({ binding: i / 3, resource: { buffer: this.objects[entries[i]], offset: entries[i + 1], size: entries[i + 2] } });
    }
    const layout = this.objects[kernelId].getBindGroupLayout(0);
    return this.put(this.device.createBindGroup({ layout, entries: list }));
  }

  // Recorded segments, packed by Python: a compute pass is (0, n) then n times (kernel, bind
  // group, x, y, z); a copy is (1, src, src offset, dst, dst offset, size); a flush is (2).
  schedule(packed) {
    this.count("schedule");
    return this.put(this.segments(packed));
  }

  segments(packed) {
    const segments = [];
    for (let i = 0; i < packed.length;) {
      if (packed[i] === 0) {
        const n = packed[i + 1], dispatches = [];
        for (let j = i + 2; j < i + 2 + 5 * n; j += 5) {
          dispatches.push(this.objects[packed[j]], this.objects[packed[j + 1]], packed[j + 2], packed[j + 3], packed[j + 4]);
        }
        segments.push({ dispatches });
        i += 2 + 5 * n;
      } else if (packed[i] === 2) {
        segments.push({ flush: true });
        i += 1;
      } else {
        segments.push({ copy: [this.objects[packed[i + 1]], packed[i + 2], this.objects[packed[i + 3]], packed[i + 4], packed[i + 5]] });
        i += 6;
      }
    }
    return segments;
  }

  // The per-token call: queued writes, the whole schedule (0: none), and an optional copy of
  // [readOffset, readOffset + readSize) of buffer readId into the staging buffer stagingId, in
  // one submission made before the first await (so calls submit in call order); then the readback.
  async run(scheduleId, writes, readId, readOffset, readSize, stagingId) {
    this.count("run");
    if (writes) this.applyWrites(writes);
    const compiled = this.compiles.length ? this.settleCompiles() : null;
    let encoder = this.device.createCommandEncoder();
    for (const segment of (scheduleId ? this.objects[scheduleId] : [])) {
      if (segment.flush) {   // the GPU starts on what is encoded while the rest is
        this.queue.submit([encoder.finish()]);
        encoder = this.device.createCommandEncoder();
        continue;
      }
      if (segment.copy) {
        encoder.copyBufferToBuffer(...segment.copy);
        continue;
      }
      encodePass(encoder, segment.dispatches);
    }
    const staging = stagingId ? this.objects[stagingId] : null;
    if (staging) encoder.copyBufferToBuffer(this.objects[readId], readOffset, staging, 0, readSize);
    this.queue.submit([encoder.finish()]);
    if (compiled) {
      const failure = await compiled;
      if (failure) throw new CeraError("ShaderError", `shader ${failure[0]} failed to compile: ${failure[1]}`);
    }
    if (!staging) return this.raiseError(null);
    try {
      await staging.mapAsync(GPUMapMode.READ, 0, readSize);
    } catch (err) {
      throw await this.readbackError(`reading back failed: ${err.message}`);
    }
    const bytes = new Uint8Array(staging.getMappedRange(0, readSize).slice(0));
    staging.unmap();
    return this.raiseError(bytes);
  }

  // Compute passes packed as schedule() packs them, each timed by timestamps at its beginning
  // and end, in one submission after the queued writes: resolves to each pass's ns (Float64Array).
  async timePasses(packed, writes) {
    this.count("timePasses");
    if (writes) this.applyWrites(writes);
    const passes = this.segments(packed), n = 2 * passes.length;
    const querySet = this.device.createQuerySet({ type: "timestamp", count: n });
    const resolved = this.device.createBuffer({ size: 8 * n, usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC });
    const staging = this.device.createBuffer({ size: 8 * n, usage: USAGE.readback });
    const encoder = this.device.createCommandEncoder();
    passes.forEach((segment, i) => encodePass(encoder, segment.dispatches, {
      querySet, beginningOfPassWriteIndex: 2 * i, endOfPassWriteIndex: 2 * i + 1 }));
    encoder.resolveQuerySet(querySet, 0, n, resolved, 0);
    encoder.copyBufferToBuffer(resolved, 0, staging, 0, 8 * n);
    this.queue.submit([encoder.finish()]);
    try {
      await staging.mapAsync(GPUMapMode.READ);
      const stamps = new BigUint64Array(staging.getMappedRange());
      return Float64Array.from(passes, (_, i) => Number(stamps[2 * i + 1] - stamps[2 * i]));
    } catch (err) {
      throw await this.readbackError(`reading timestamps back failed: ${err.message}`);
    } finally {
      for (const object of [querySet, resolved, staging]) object.destroy();
    }
  }

  // A failed map: DeviceLost when the device was lost (the map fails first: wait for the loss
  // a moment), else a GpuError.
  async readbackError(message) {
    const lost = await Promise.race([this.lost, new Promise((settle) => setTimeout(settle, LOST_WAIT_MS))]);
    return lost ? lostError(lost) : new CeraError("GpuError", this.error || message);
  }

  raiseError(value) {
    if (this.error) {
      const message = this.error;
      this.error = null;
      throw new CeraError("GpuError", `WebGPU error: ${message}`);
    }
    return value;
  }

  // Blob bytes [srcOffset, srcOffset + size) -> buffer at dstOffset, padded to whole words.
  async uploadBlob(bufferId, blob, srcOffset, size, dstOffset, writes) {
    this.count("uploadBlob");
    if (writes) this.applyWrites(writes);
    let bytes = new Uint8Array(await blob.slice(srcOffset, srcOffset + size).arrayBuffer());
    if (bytes.length !== size) {
      throw new CeraError("TruncatedFile", `the file ends at byte ${srcOffset + bytes.length}, inside a tensor that ` +
        `needs bytes up to ${srcOffset + size}: the file is truncated (download it again)`);
    }
    if (size % 4) {
      const padded = new Uint8Array(Math.ceil(size / 4) * 4);
      padded.set(bytes);
      bytes = padded;
    }
    this.queue.writeBuffer(this.objects[bufferId], dstOffset, bytes);
  }

  drain() {
    this.count("drain");
    return this.queue.onSubmittedWorkDone();
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

// One compute pass of (pipeline, bind group, x, y, z) quintuples; timestampWrites optional.
function encodePass(encoder, d, timestampWrites) {
  const pass = encoder.beginComputePass(timestampWrites ? { timestampWrites } : undefined);
  let current = null;
  for (let i = 0; i < d.length; i += 5) {
    if (d[i] !== current) pass.setPipeline(current = d[i]);
    pass.setBindGroup(0, d[i + 1]);
    pass.dispatchWorkgroups(d[i + 2], d[i + 3], d[i + 4]);
  }
  pass.end();
}
