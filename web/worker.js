// The module Web Worker: WebGPU, Pyodide and cera run here, so the page never freezes.
//
// Messages in:  {id, kind: "init" | "load" | "generate" | "stop" | "python" | "stats", ...}
// Messages out: {id, kind: "progress", phase, done, total} | {id, kind: "token", text}
//               | {id, kind: "memory", total, weights, kv_cache, ...} (GPU memory, before upload)
//               | {id, kind: "done", result} | {id, kind: "error", name, message}
// An error without an id (device lost) concerns the whole session.

import { loadPyodide } from "./pyodide/pyodide.mjs";
import { openGpu } from "./gpu.js";
import { openModel } from "./models.js";

let booted = null;       // Promise of {pyodide, gpu, session}
const post = (message) => self.postMessage(message);

function boot(id, simulate) {
  booted ??= (async () => {
    post({ id, kind: "progress", phase: "python", done: 0, total: 0 });
    const pyodide = await loadPyodide({ indexURL: new URL("./pyodide/", import.meta.url).href });
    await pyodide.loadPackage(["cera-web"], { messageCallback: () => {}, errorCallback: (m) => console.warn(m) });
    const app = pyodide.pyimport("cera_web.app");
    post({ id, kind: "progress", phase: "webgpu", done: 0, total: 0 });
    const gpu = await openGpu(app.WANTED_FEATURES.toJs());
    gpu.lost.then((info) => post({
      kind: "error", name: "DeviceLost",
      message: `the GPU device was lost (${info.reason || "unknown"}: ${info.message}). ` +
        "Reload the page; if it happens again the model may be too large for this GPU's memory.",
    }));
    const session = app.Session(gpu, post, simulate ? pyodide.toPy(simulate) : null);
    return { pyodide, gpu, session };
  })();
  return booted;
}

async function handle(id, kind, data) {
  const { pyodide, gpu, session } = await boot(id, kind === "init" ? data.limits : null);
  switch (kind) {
    case "init":
      return { ...session.info(), pyodide: pyodide.version };
    case "load": {
      const onProgress = (done, total) => post({ id, kind: "progress", phase: "download", done, total });
      const model = await openModel(data.file ?? data.url, onProgress);
      const result = await session.load(model.blob, id, data.ctx);
      if (result.ok) Object.assign(result, { name: model.name, cached: model.cached }, memory(pyodide));
      return result;
    }
    case "generate":
      return session.generate(data.prompt, data.maxTokens, !!data.chat, id);
    case "stop":
      session.stop();
      return { ok: true };
    case "stats":
      return { ok: true, calls: { ...gpu.calls }, ...memory(pyodide) };
    case "python": {      // for tests and debugging: run Python in the worker, return its JSON
      const out = await pyodide.runPythonAsync(data.code);
      return { ok: true, value: typeof out === "string" ? out : String(out) };
    }
    default:
      throw new Error(`unknown message kind ${kind}`);
  }
}

function memory(pyodide) {
  return { wasmHeapBytes: pyodide._module.HEAPU8.buffer.byteLength };
}

self.onmessage = async (event) => {
  const { id, kind, ...data } = event.data;
  try {
    const result = await handle(id, kind, data);
    if (result && result.ok === false) post({ id, kind: "error", ...result.error });
    else post({ id, kind: "done", result });
  } catch (err) {
    post({ id, kind: "error", name: err.name && err.name !== "Error" ? err.name : "Error", message: err.message || String(err) });
  }
};
