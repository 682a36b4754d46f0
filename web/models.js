// Getting a model's bytes as a Blob: a local File as is, a URL through the Origin Private
// File System (downloaded once, reused on reload), or, where OPFS is unavailable, a Blob
// of the downloaded chunks (JS memory, never wasm memory).

import { CeraError } from "./errors.js";

const DIR = "cera-models";
const INDEX = "index.json";   // url -> {file, size}: only complete downloads are listed

async function modelDir() {
  if (!navigator.storage?.getDirectory) return null;
  try {
    const root = await navigator.storage.getDirectory();
    return await root.getDirectoryHandle(DIR, { create: true });
  } catch {
    return null;   // e.g. a private window without OPFS
  }
}

async function readIndex(dir) {
  try {
    const file = await (await dir.getFileHandle(INDEX)).getFile();
    return JSON.parse(await file.text());
  } catch {
    return {};
  }
}

async function writeIndex(dir, index) {
  const writable = await (await dir.getFileHandle(INDEX, { create: true })).createWritable();
  await writable.write(JSON.stringify(index));
  await writable.close();
}

async function fileName(url) {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(url));
  return [...new Uint8Array(digest).slice(0, 12)].map((b) => b.toString(16).padStart(2, "0")).join("") + ".gguf";
}

// {blob, name, cached}; onProgress(done, total) while downloading.
export async function openModel(source, onProgress) {
  if (source instanceof Blob) return { blob: source, name: source.name || "model.gguf", cached: false };
  const url = new URL(source, self.location.href).href;
  const name = decodeURIComponent(url.split("/").pop().split("?")[0]) || "model.gguf";
  const dir = await modelDir();
  if (dir) {
    const index = await readIndex(dir);
    const entry = index[url];
    if (entry) {
      try {
        const blob = await (await dir.getFileHandle(entry.file)).getFile();
        if (blob.size === entry.size) {
          onProgress(blob.size, blob.size);
          return { blob, name, cached: true };
        }
      } catch { /* evicted: download again */ }
    }
  }
  let response;
  try {
    response = await fetch(url);
  } catch (err) {
    throw new CeraError("FetchFailed", `could not fetch ${url}: ${err.message} (offline, or the server does not allow cross-origin requests)`);
  }
  if (!response.ok) throw new CeraError("FetchFailed", `could not fetch ${url}: HTTP ${response.status}`);
  const total = Number(response.headers.get("content-length")) || 0;
  const reader = response.body.getReader();
  let done = 0;
  onProgress(0, total);
  if (dir) {
    try {
      const file = await fileName(url);
      const handle = await dir.getFileHandle(file, { create: true });
      const writable = await handle.createWritable();
      for (;;) {
        const { value, done: end } = await reader.read();
        if (end) break;
        await writable.write(value);
        done += value.length;
        onProgress(done, total);
      }
      await writable.close();
      if (total && done !== total) throw new CeraError("TruncatedFile", `download of ${url} stopped at ${done} of ${total} bytes`);
      const index = await readIndex(dir);
      index[url] = { file, size: done };
      await writeIndex(dir, index);
      return { blob: await handle.getFile(), name, cached: false };
    } catch (err) {
      if (err instanceof CeraError) throw err;
      if (done > 0) {
        throw new CeraError("StorageFull", `the browser's storage refused the model after ${done} bytes ` +
          `(${err.name}: ${err.message})`);
      }
      // OPFS refused before any byte: fall through to memory
    }
  }
  const chunks = [];
  for (;;) {
    const { value, done: end } = await reader.read();
    if (end) break;
    chunks.push(value);
    done += value.length;
    onProgress(done, total);
  }
  return { blob: new Blob(chunks), name, cached: false };
}

export async function clearCache() {
  const root = await navigator.storage.getDirectory();
  await root.removeEntry(DIR, { recursive: true }).catch(() => {});
}
