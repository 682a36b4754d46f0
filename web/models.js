// Getting a model's bytes as a Blob: a local File as is, a URL through the Origin Private
// File System (downloaded once, reused on reload), or, where OPFS is unavailable or refuses
// the file (its quota), a Blob of the downloaded chunks (JS memory, never wasm memory).
//
// A download becomes a cache entry only once it is known whole: its stream ended without an
// error, its size is the Content-Length the server declared (a response without one is not
// cached: a close-delimited body cut short would look whole), and its SHA-256, computed as it
// streams, is the one the caller names, if any. The file is written through a writable stream,
// whose swap file replaces the entry's file only on close(), and listed in the index last. An
// entry is used while its file still has the listed size and, if the caller names a SHA-256,
// the one listed is that; a download that replaces an entry unlists it first.

import { CeraError } from "./errors.js";

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
    await dir.removeEntry(file).catch(() => {});
    throw err;
  }
}

// The response's bytes, each chunk to `sink` (awaited), hashed as they pass -> {size, sha256}.
// A cut stream is FetchFailed, a size other than `total` TruncatedFile, a hash other than
// `sha256` BadFile; a sink's error cancels the download and is thrown as is.
async function pump(url, response, total, sha256, sink, onProgress) {
  const reader = response.body.getReader(), hash = new Sha256();
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
  const digest = hash.hex();
  if (sha256 && digest !== sha256) {
    throw new CeraError("BadFile", `the download of ${url} has SHA-256 ${digest}, not the ${sha256} asked for ` +
      "(cut short, or another file): try again, or check the hash");
  }
  return { size, sha256: digest };
}

export async function clearCache() {
  const root = await navigator.storage.getDirectory();
  await root.removeEntry(DIR, { recursive: true }).catch(() => {});
}

// --- SHA-256 (FIPS 180-4) over bytes that arrive in pieces: WebCrypto hashes only a whole
// buffer, and a download is checked as it streams, never held whole in memory.

const K = new Int32Array([   // int32 throughout: V8 keeps such values unboxed
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
]);

const rotr = (x, n) => (x >>> n) | (x << (32 - n));

class Sha256 {
  #state = new Int32Array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19]);
  #block = new Uint8Array(64);   // the bytes of an unfinished block
  #filled = 0;                   // ... how many
  #length = 0;                   // bytes hashed so far
  #w = new Int32Array(64);       // the message schedule

  update(bytes) {
    this.#length += bytes.length;
    let at = 0;
    if (this.#filled) {
      at = Math.min(64 - this.#filled, bytes.length);
      this.#block.set(bytes.subarray(0, at), this.#filled);
      this.#filled += at;
      if (this.#filled < 64) return this;
      compress(this.#state, this.#w, this.#block, 0);
    }
    for (; at + 64 <= bytes.length; at += 64) compress(this.#state, this.#w, bytes, at);
    this.#block.set(bytes.subarray(at));
    this.#filled = bytes.length - at;
    return this;
  }

  // The digest as 64 hex digits; the hash takes no more bytes after it.
  hex() {
    const bits = this.#length * 8, pad = (this.#filled < 56 ? 56 : 120) - this.#filled;
    const tail = new Uint8Array(pad + 8);
    tail[0] = 0x80;
    const view = new DataView(tail.buffer);
    view.setUint32(pad, Math.floor(bits / 2 ** 32));
    view.setUint32(pad + 4, bits >>> 0);
    this.update(tail);
    return [...this.#state].map((word) => (word >>> 0).toString(16).padStart(8, "0")).join("");
  }
}

// One 64-byte block of `bytes` at `at` into the state `s`; `w`: scratch for the message schedule.
function compress(s, w, bytes, at) {
  for (let t = 0; t < 16; t++, at += 4) w[t] = (bytes[at] << 24) | (bytes[at + 1] << 16) | (bytes[at + 2] << 8) | bytes[at + 3];
  for (let t = 16; t < 64; t++) {
    const x = w[t - 15], y = w[t - 2];
    w[t] = (w[t - 16] + (rotr(x, 7) ^ rotr(x, 18) ^ (x >>> 3)) + w[t - 7] + (rotr(y, 17) ^ rotr(y, 19) ^ (y >>> 10))) | 0;
  }
  let a = s[0], b = s[1], c = s[2], d = s[3], e = s[4], f = s[5], g = s[6], h = s[7];
  for (let t = 0; t < 64; t++) {
    const t1 = (h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t]) | 0;
    const t2 = ((rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
    h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
  }
  s[0] += a; s[1] += b; s[2] += c; s[3] += d; s[4] += e; s[5] += f; s[6] += g; s[7] += h;
}
