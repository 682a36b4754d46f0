// Getting a model's bytes as a Blob: a local File as is, a URL through the Origin Private
// File System (downloaded once, reused on reload), or, where OPFS is unavailable or refuses
// the file (its quota), a Blob of the downloaded chunks (JS memory, never wasm memory). A
// Hugging Face id becomes the URL of a file of its repo: `hubListing` fetches the repo's
// listing from the Hub's HTTP API, and cera.hub's rules, in the worker's Python, pick the file.
//
// A download becomes a cache entry only once it is known whole: its stream ended without an
// error, its size is the Content-Length the server declared (a response without one is not
// cached: a close-delimited body cut short would look whole), and its SHA-256, computed as it
// streams, is the one the caller names, if any. The file is written through a writable stream,
// whose swap file replaces the entry's file only on close(), and listed in the index last. An
// entry is used while its file still has the listed size and, if the caller names a SHA-256,
// the one listed is that; a download that replaces an entry unlists it first.

import { CeraError } from "./errors.js";
import { sha256 as SHA256 } from "./noble-hashes/sha2.js";   // @noble/hashes, copied in by the site build
import { bytesToHex } from "./noble-hashes/utils.js";

const DIR = "cera-models";
const INDEX = "index.json";   // url -> {file, size, sha256}: only whole, checked downloads are listed

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

export const HUB = "https://huggingface.co";   // the Hub's endpoint unless the caller names another (a mirror)

// The files of the Hub repo `repo` on `endpoint`, as JSON text: what GET
// {endpoint}/api/models/{repo}/tree/main?recursive=true answers (entries {type, path, lfs: {oid: sha256}}).
// An unknown or private repo is ModelNotFound (the page sends no token); a failed request FetchFailed.
export async function hubListing(repo, endpoint) {
  const url = `${endpoint}/api/models/${repo}/tree/main?recursive=true`;
  let response;
  try {
    response = await fetch(url);
  } catch (err) {
    throw new CeraError("FetchFailed", `could not list ${repo} at ${endpoint}: ${err.message} (offline, or the ` +
      "endpoint does not allow cross-origin requests)");
  }
  if (response.status === 401 || response.status === 404) {
    throw new CeraError("ModelNotFound", `no model repo ${repo} at ${endpoint} (the page reaches public repos only)`);
  }
  if (!response.ok) throw new CeraError("FetchFailed", `could not list ${repo} at ${endpoint}: HTTP ${response.status}`);
  return response.text();
}

// Where the file at `path` in Hub repo `repo` downloads from.
export const hubFileUrl = (endpoint, repo, path) =>
  `${endpoint}/${repo}/resolve/main/${path.split("/").map(encodeURIComponent).join("/")}`;

// {blob, name, cached, cacheSkipped}: cacheSkipped says why a download was not cached (null if
// it was, or came from the cache or a File). sha256: the file's, as 64 hex digits, or null.
// onProgress(done, total) while downloading.
export async function openModel(source, onProgress, sha256 = null) {
  if (source instanceof Blob) {
    return { blob: source, name: source.name || "model.gguf", cached: false, cacheSkipped: null };
  }
  const url = new URL(source, self.location.href).href;
  const name = decodeURIComponent(url.split("/").pop().split("?")[0]) || "model.gguf";
  const want = sha256?.toLowerCase() ?? null;
  const dir = await modelDir();
  const entry = dir && await cachedFile(dir, url, want);
  if (entry) {
    onProgress(entry.size, entry.size);
    return { blob: entry, name, cached: true, cacheSkipped: null };
  }
  let response = await download(url);
  const total = Number(response.headers.get("content-length")) || 0;
  let cacheSkipped = !dir ? "this browser gives the page no storage (OPFS)"
    : !total ? "the server did not say the file's size (Content-Length) to check the download against" : null;
  if (!cacheSkipped) {
    try {
      const blob = await downloadToCache(dir, url, response, total, want, onProgress);
      return { blob, name, cached: false, cacheSkipped };
    } catch (err) {
      if (err instanceof CeraError) throw err;   // the download's fault, not the storage's
      cacheSkipped = `the browser's storage refused the file (${err.name}: ${err.message}); loaded without the cache`;
      if (response.bodyUsed) response = await download(url);   // what was read went with the swap file
    }
  }
  const chunks = [];
  await pump(url, response, total, want, (chunk) => chunks.push(chunk), onProgress);
  return { blob: new Blob(chunks), name, cached: false, cacheSkipped };
}

// The File of url's entry if it is whole and (sha256 given) has that hash; else null.
async function cachedFile(dir, url, sha256) {
  const entry = (await readIndex(dir))[url];
  if (!entry || (sha256 && entry.sha256 !== sha256)) return null;
  try {
    const file = await (await dir.getFileHandle(entry.file)).getFile();
    return file.size === entry.size ? file : null;
  } catch {
    return null;   // evicted: download again
  }
}

async function download(url) {
  let response;
  try {
    response = await fetch(url);
  } catch (err) {
    throw new CeraError("FetchFailed", `could not fetch ${url}: ${err.message} (offline, or the server does not ` +
      "allow cross-origin requests)");
  }
  if (!response.ok) throw new CeraError("FetchFailed", `could not fetch ${url}: HTTP ${response.status}`);
  return response;
}

// The response into url's cache entry, listed once checked -> its File. A storage error is
// thrown as is (the caller falls back to memory), after the partial file is removed.
async function downloadToCache(dir, url, response, total, sha256, onProgress) {
  const file = await fileName(url);
  const index = await readIndex(dir);
  if (index[url]) {        // replaced: never trusted half-way
    delete index[url];
    await writeIndex(dir, index);
  }
  let writable = null;
  try {
    writable = await (await dir.getFileHandle(file, { create: true })).createWritable();
    const checked = await pump(url, response, total, sha256, (chunk) => writable.write(chunk), onProgress);
    await writable.close();
    await writeIndex(dir, { ...(await readIndex(dir)), [url]: { file, ...checked } });
    return await (await dir.getFileHandle(file)).getFile();
  } catch (err) {
    await writable?.abort().catch(() => {});
    await removeFile(dir, file);
    throw err;
  }
}

// Removes `file`, waiting out the lock an aborted writable may still hold on it for a moment
// (Chromium releases it after abort() resolves); gives up quietly after about 1.6 s.
async function removeFile(dir, file) {
  for (let attempt = 0; attempt < 6; attempt++) {
    try {
      return await dir.removeEntry(file);
    } catch (err) {
      if (err.name === "NotFoundError") return;
      await new Promise((resolve) => setTimeout(resolve, 25 * 2 ** attempt));
    }
  }
}

// The response's bytes, each chunk to `sink` (awaited), hashed as they pass -> {size, sha256}.
// A cut stream is FetchFailed, a size other than `total` TruncatedFile, a hash other than
// `sha256` BadFile; a sink's error cancels the download and is thrown as is.
async function pump(url, response, total, sha256, sink, onProgress) {
  const reader = response.body.getReader(), hash = SHA256.create();
  let size = 0;
  onProgress(0, total);
  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch (err) {
      throw new CeraError("FetchFailed", `the download of ${url} was cut after ${size} of ${total || "?"} bytes ` +
        `(${err.message}): try again`);
    }
    if (chunk.done) break;
    try {
      await sink(chunk.value);
    } catch (err) {
      await reader.cancel().catch(() => {});
      throw err;
    }
    hash.update(chunk.value);
    size += chunk.value.length;
    onProgress(size, total);
  }
  if (total && size !== total) {
    throw new CeraError("TruncatedFile", `the download of ${url} stopped at ${size} of ${total} bytes: try again`);
  }
  const digest = bytesToHex(hash.digest());
  if (sha256 && digest !== sha256) {
    throw new CeraError("BadFile", `the download of ${url} has SHA-256 ${digest}, not the ${sha256} asked for ` +
      "(cut short, or another file): try again, or check the hash");
  }
  return { size, sha256: digest };
}
