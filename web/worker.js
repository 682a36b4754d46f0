// The module Web Worker that cera.js starts for each engine: WebGPU, Pyodide and cera run here,
// so the page never freezes.
//
// Messages in:  {id, kind: "init" | "load" | "lora" | "create" | "embed" | "stats" | "python", ...}
//               (load and lora: {source, base, hubEndpoint, ...}, source a File/Blob, a URL relative to
//               `base` (the page's) or a Hugging Face id; lora: {..., scale}, a LoRA adapter GGUF for the
//               loaded model, named by its file)
//               | {kind: "interrupt", target} (no answer: stops request `target`, or the one running)
// Messages out: {id, kind: "progress", phase, done, total} | {id, kind: "chunks", chunks}
//               | {id, kind: "memory", memory} (a load's GPU memory figure, before the upload)
//               | {id, kind: "done", result} | {id, kind: "error", name, message}
// Messages without an id concern the whole engine: {kind: "lost", name: "DeviceLost", message}
// (the GPU device was lost; the model reloads on a new one), its {kind: "progress", ...}, then
// {kind: "recovered", result} or {kind: "error", name, message} (the engine cannot go on).
// Results and chunks are the OpenAI objects cera.js hands its caller, made in Python (cera_web/session.py).

import { loadPyodide } from "./pyodide/pyodide.mjs";
import { lostError, openGpu } from "./gpu.js";
import { GrammarHost } from "./grammar.js";
import { CeraError } from "./errors.js";
import { HUB, hubFileUrl, hubListing, openModel } from "./models.js";

let booted = null;       // Promise of {pyodide, session}
const post = (message) => self.postMessage(message);

function boot(id, simulate) {
  booted ??= (async () => {
    post({ id, kind: "progress", phase: "python", done: 0, total: 0 });
    const pyodide = await loadPyodide({ indexURL: new URL("./pyodide/", import.meta.url).href });
    await pyodide.loadPackage(["cera-web"], { messageCallback: () => {}, errorCallback: (m) => console.warn(m) });
    const sessions = pyodide.pyimport("cera_web.session");
    post({ id, kind: "progress", phase: "webgpu", done: 0, total: 0 });
    const wanted = [sessions.WANTED_FEATURES.toJs(), sessions.WANTED_LANGUAGE_FEATURES.toJs()];
    const gpu = await openGpu(...wanted);
    const session = sessions.Session(gpu, post, simulate ? pyodide.toPy(simulate) : null, GrammarHost);
    survive(gpu, session, wanted);
    return { pyodide, session };
  })();
  return booted;
}

// When the device is lost: say so, and have the session reload its model and conversation on a
// new device (requests wait for it). Failing that, or losing that device too meanwhile, ends the engine.
function survive(gpu, session, wanted) {
  gpu.lost.then(async (info) => {
    const lost = lostError(info);
    post({ kind: "lost", name: lost.name, message: `${lost.message}: reloading the model on a new device` });
    const next = openGpu(...wanted);
    const result = await session.recover(next);
    if (result.ok === false) {
      post({ kind: "error", name: result.error.name, message: `${result.error.message} (recovering from a lost ` +
        "GPU device). Reload the page; if it happens again the model may be too large for this GPU's memory." });
      return;
    }
    survive(await next, session, wanted);
    post({ kind: "recovered", result });
  });
}

// What openModel opens for a model as cera.js sends it: a File/Blob as is; a Hugging Face id (cera.hub's
// forms, told apart by Python, which picks the file from the repo's listing) as the URL of that file on
// the Hub at `hubEndpoint`, with the SHA-256 the Hub lists for it; other text as a URL relative to `base`.
async function modelSource(session, { source, base, hubEndpoint }) {
  if (source instanceof Blob) return { source, sha256: null };
  const repo = session.hub_repo(source);
  if (repo == null) return { source: new URL(source, base).href, sha256: null };
  const endpoint = (hubEndpoint ?? HUB).replace(/\/+$/, "");
  const file = session.hub_file(source, await hubListing(repo, endpoint), endpoint);
  if (file.ok === false) throw new CeraError(file.error.name, file.error.message);
  return { source: hubFileUrl(endpoint, repo, file.path), sha256: file.sha256 ?? null };
}

async function handle(id, kind, data) {
  const { pyodide, session } = await boot(id, kind === "init" ? data.limits : null);
  switch (kind) {
    case "init":
      return { ...session.info(), pyodide: pyodide.version };
    case "load": {
      const onProgress = (done, total) => post({ id, kind: "progress", phase: "download", done, total });
      const source = await modelSource(session, data);
      const model = await openModel(source.source, onProgress, data.sha256 ?? source.sha256);
      const result = await session.load(model.blob, model.name, id, data.ctx, Boolean(data.int8), Boolean(data.f16),
        data.cacheTypeK ?? null, data.cacheTypeV ?? null);
      if (result.ok !== false) Object.assign(result, { cached: model.cached, cacheSkipped: model.cacheSkipped }, memory(pyodide));
      return result;
    }
    case "create":
      return session.create(data.endpoint, data.request, id);
    case "lora": {
      const onProgress = (done, total) => post({ id, kind: "progress", phase: "download", done, total });
      const source = await modelSource(session, data);
      const adapter = await openModel(source.source, onProgress, source.sha256);
      const result = await session.load_lora(adapter.blob, adapter.name, data.scale, id);
      if (result.ok !== false) Object.assign(result, { cached: adapter.cached, cacheSkipped: adapter.cacheSkipped });
      return result;
    }
    case "embed":
      return session.embed(data.text, data.pooling);
    case "stats":
      return { ...session.stats(), ...memory(pyodide) };
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
  if (kind === "interrupt") return booted?.then(({ session }) => session.interrupt(data.target ?? null), () => {});
  try {
    const result = await handle(id, kind, data);
    if (result && result.ok === false) post({ id, kind: "error", ...result.error });
    else post({ id, kind: "done", result });
  } catch (err) {
    post({ id, kind: "error", name: err.name && err.name !== "Error" ? err.name : "Error", message: err.message || String(err) });
  }
};
