// cera.js: GGUF language models on the user's GPU, from any page. Each engine runs cera (its
// Python core in Pyodide, its WGSL kernels on WebGPU) in a Web Worker of its own, behind an
// API shaped like OpenAI's client:
//
//   import * as cera from "./cera.js";
//   const engine = await cera.createEngine({ model: "models/model.gguf", onProgress: console.log });
//   const engine = await cera.createEngine({ model: "ORG/REPO:Q4_K_M" });   // a Hugging Face id
//   const reply = await engine.chat.completions.create({ messages: [{ role: "user", content: "Hi!" }] });
//   for await (const chunk of await engine.chat.completions.create({ messages, stream: true })) ...
//   const { data } = await engine.embeddings.create({ input: ["Hi!", "Hello!"] });   // unit vectors, as serve's
//   const { embeddings } = await engine.embed("Hi!", { pooling: "mean" });   // as `python -m cera embed`
//
// The worker answers with finished OpenAI objects, shaped by the same Python code as
// `python -m cera serve` (cera.openai_shapes); this file checks argument types, routes messages
// and passes the objects through. Values (temperature's range, a prompt that does not fit the
// context) are the engine's to judge, as natively. Types: cera.d.ts.
//
// Errors reject as an Error whose `name` is the cera.errors type (InvalidArgument, BadFile,
// TruncatedFile, Unsupported, TooLarge, ContextFull, NoGpu, DeviceLost, ShaderError, GpuError,
// ModelNotFound) or a download error (FetchFailed); "Error" alone is a bug. When the GPU device is lost,
// the request in flight rejects with DeviceLost, onDeviceLost is called, the worker reloads the
// model and the conversation on a new device (later calls wait for it), then onRecovered.

import { CeraError } from "./errors.js";

const WORKER = new URL("./worker.js", import.meta.url);
const invalid = (message) => new CeraError("InvalidArgument", message);

// --- argument checks: [test, what the value must be] per field -----------------------------
const isObject = (v) => typeof v === "object" && v !== null && !Array.isArray(v);
const isText = (v) => typeof v === "string";
const POSITIVE = [(v) => Number.isSafeInteger(v) && v > 0, "a positive integer"];
const FUNCTION = [(v) => typeof v === "function", "a function"];
const BOOLEAN = [(v) => typeof v === "boolean", "true or false"];
const MODEL = [(v) => v instanceof Blob || v instanceof URL || (isText(v) && v !== ""),
  "the model's source: a URL, a Hugging Face id (ORG/REPO:QUANT, ORG/REPO/FILE.gguf) or a File/Blob of a .gguf"];
const SOURCE_OPTIONS = { hubEndpoint: [(v) => isText(v) && /^https?:\/\/[^/]/i.test(v),
  "the Hugging Face Hub's URL, where ids are looked up (default https://huggingface.co)"] };
const ENGINE_OPTIONS = { limits: [isObject, "an object of WebGPU limits to lower (snake_case names)"],
  onProgress: FUNCTION, onError: FUNCTION, onDeviceLost: FUNCTION, onRecovered: FUNCTION };
const CACHE_TYPE = [isText, "a KV cache type by llama.cpp's name (\"f16\", \"f32\", \"q8_0\")"];
const LOAD_OPTIONS = { ctx: POSITIVE, int8: BOOLEAN, f16: BOOLEAN, cacheTypeK: CACHE_TYPE, cacheTypeV: CACHE_TYPE,
  onProgress: FUNCTION, onMemory: FUNCTION,
  sha256: [(v) => isText(v) && /^[0-9a-f]{64}$/i.test(v), "the file's SHA-256 as 64 hex digits"], ...SOURCE_OPTIONS };

const isMessage = (m) => isObject(m) && isText(m.role) && (m.content == null || isText(m.content) ||
  (Array.isArray(m.content) && m.content.every((p) => isObject(p) && p.type === "text" && isText(p.text)))) &&
  (m.tool_calls == null || (Array.isArray(m.tool_calls) && m.tool_calls.every((c) => isText(c.function?.name))));
const SAMPLING = {
  model: [isText, "the loaded model's name"],
  max_tokens: POSITIVE,
  temperature: [Number.isFinite, "a number"],
  top_p: [Number.isFinite, "a number"],
  top_k: [(v) => Number.isSafeInteger(v) && v >= 0, "a non-negative integer"],
  frequency_penalty: [Number.isFinite, "a number"],
  presence_penalty: [Number.isFinite, "a number"],
  min_p: [Number.isFinite, "a number"],            // extensions, as llama.cpp's server names them
  repeat_penalty: [Number.isFinite, "a number"],
  penalty_last_n: [Number.isSafeInteger, "an integer"],
  seed: [Number.isSafeInteger, "an integer"],
  logit_bias: [(v) => isObject(v) && Object.entries(v).every(([id, b]) => /^\d+$/.test(id) && Number.isFinite(b)),
    "an object of token ids (\"50256\") to biases"],
  stop: [(v) => isText(v) || (Array.isArray(v) && v.every(isText)), "a string or an array of strings"],
  stream: BOOLEAN,
  stream_options: [(v) => isObject(v) && [undefined, true, false].includes(v.include_usage),
    "{include_usage: true or false}"],
  n: [(v) => v === 1, "1 (one choice per request)"],
  lora: [(v) => Array.isArray(v) && v.every((a) => isText(a) || Number.isSafeInteger(a)),
    "an array of loaded LoRA adapters' names or indices ([] for none; absent: all of them)"],
  response_format: [(v) => isObject(v) && ["text", "json_object", "json_schema"].includes(v.type),
    "{type: \"text\"}, {type: \"json_object\"} or {type: \"json_schema\", json_schema: {name, schema}}"],
  json_schema: [(v) => isObject(v) || typeof v === "boolean", "a JSON schema (llama.cpp server's field)"],
  grammar: [(v) => isText(v) && v !== "", "a GBNF grammar (llama.cpp server's field)"],
};
const TOOLS = {
  tools: [(v) => Array.isArray(v) && v.every((t) => isObject(t) && isObject(t.function) && isText(t.function.name)),
    "an array of {type: \"function\", function: {name, description, parameters}}"],
  tool_choice: [(v) => ["auto", "none", "required"].includes(v) || (isObject(v) && isText(v.function?.name)),
    "\"auto\", \"none\", \"required\" or {type: \"function\", function: {name}}"],
  logprobs: BOOLEAN,
  top_logprobs: [(v) => Number.isSafeInteger(v) && v >= 0 && v <= 20, "an integer from 0 to 20"],
};
const REQUESTS = {
  chat: { method: "chat.completions.create", required: "messages", rules: {
    messages: [(v) => Array.isArray(v) && v.length > 0 && v.every(isMessage),
      "a non-empty array of {role, content} (content a string or [{type: \"text\", text}]; an assistant's " +
      "tool_calls, a tool's tool_call_id)"],
    max_completion_tokens: POSITIVE, ...SAMPLING, ...TOOLS } },
  completion: { method: "completions.create", required: "prompt", rules: {
    prompt: [(v) => isText(v) || (Array.isArray(v) && v.length > 0 && v.every((t) => Number.isSafeInteger(t) && t >= 0)),
      "a string or an array of token ids"],
    logprobs: [(v) => Number.isSafeInteger(v) && v >= 0 && v <= 5, "an integer from 0 to 5"],
    ...SAMPLING } },
  embeddings: { method: "embeddings.create", required: "input", rules: {
    model: SAMPLING.model,
    input: [(v) => isText(v) || (Array.isArray(v) && (v.every(isText) || v.every(Number.isSafeInteger) ||
      v.every((ids) => Array.isArray(ids) && ids.every(Number.isSafeInteger)))),
      "a string, an array of token ids, or an array of strings or of token-id arrays"],
    encoding_format: [(v) => ["float", "base64"].includes(v), "\"float\" or \"base64\""] } },
};
const EMBED = { text: [(v) => isText(v) && v !== "", "a non-empty string"],
  pooling: [isText, "\"none\" (a row per token), \"mean\", \"last\" or \"cls\" (the first)"] };

function shown(value) {
  try {
    return JSON.stringify(value)?.slice(0, 80) ?? typeof value;
  } catch {
    return typeof value;
  }
}

// The fields of `values` that are set (neither undefined nor null), each passing its rule; an
// InvalidArgument names the first one unknown, of the wrong type, or required and missing.
function check(method, values, rules, required = null) {
  if (!isObject(values)) throw invalid(`${method}: expected an object, not ${shown(values)}`);
  const set = {};
  for (const [name, value] of Object.entries(values)) {
    if (value === undefined || value === null) continue;
    if (!Object.hasOwn(rules, name)) {
      throw invalid(`${method}: unknown field ${name} (cera takes ${Object.keys(rules).join(", ")})`);
    }
    const [ok, what] = rules[name];
    if (!ok(value)) throw invalid(`${method}: ${name} must be ${what}, not ${shown(value)}`);
    set[name] = value;
  }
  if (required && !(required in set)) throw invalid(`${method}: ${required} is required: ${rules[required][1]}`);
  return set;
}

// A model's source for the worker: a Blob as is; text (a URL or a Hugging Face id, which the worker tells
// apart) with the page's URL, which a relative URL is resolved against (the worker lives elsewhere).
const modelSource = (model, hubEndpoint) => ({ source: model instanceof Blob ? model : String(model),
  base: globalThis.document?.baseURI ?? location.href, hubEndpoint });

// --- the engine ----------------------------------------------------------------------------

// The chunks of one streamed request, as an async iterator (for await ... of). Leaving the loop
// early (break, return, an exception) stops the generation, as a client leaving the native server does.
class ChunkStream {
  #queue = [];
  #end = null;      // {error}: the request ended (error null: normally)
  #wake = null;
  #stop;

  constructor(stop) { this.#stop = stop; }

  push(chunks) {
    if (this.#end) return;
    this.#queue.push(...chunks);
    this.#wake?.();
  }

  finish(error = null) {
    this.#end ??= { error };
    this.#wake?.();
  }

  async next() {
    while (!this.#queue.length && !this.#end) await new Promise((wake) => { this.#wake = wake; });
    if (this.#queue.length) return { value: this.#queue.shift(), done: false };
    const { error } = this.#end;
    this.#end = { error: null };
    if (error) throw error;
    return { value: undefined, done: true };
  }

  async return() {
    if (!this.#end) this.#stop();
    this.#end = { error: null };
    this.#queue = [];
    return { value: undefined, done: true };
  }

  [Symbol.asyncIterator]() { return this; }
}

export class Engine {
  #worker;
  #calls = new Map();   // message id -> {resolve, reject, onProgress, onMemory, onChunks}
  #nextId = 1;
  #failure = null;      // what every later call rejects with: the engine was unloaded, or cannot go on
  #events;              // the callbacks of engine messages: {onProgress, onError, onDeviceLost, onRecovered}

  // Starts the worker: Pyodide and the GPU boot in the background (`ready`); no model yet.
  constructor(options = {}) {
    const { limits, ...events } = check("new Engine", options, ENGINE_OPTIONS);
    this.#events = events;
    this.info = null;   // once ready: {adapter, features, limits, defaults, pyodide, model}
    this.chat = { completions: { create: (request) => this.#create("chat", request) } };
    this.completions = { create: (request) => this.#create("completion", request) };
    this.embeddings = { create: (request) => this.#create("embeddings", request) };
    this.#worker = new Worker(WORKER, { type: "module" });
    this.#worker.onmessage = ({ data }) => this.#receive(data);
    this.#worker.onerror = (event) => this.#fail(new CeraError("Error", `cera's worker failed: ${event.message}`));
    this.ready = this.#send("init", { limits }, { onProgress: events.onProgress })
      .then((info) => (this.info = { ...info, model: null }));
    this.ready.catch(() => {});   // every call that needs it reports its failure
  }

  // Loads a model (a URL or a Hugging Face id, cached in the browser's storage, or a File/Blob),
  // replacing the one loaded; waits for the requests ahead of it. Resolves to the model's info.
  // onMemory gets the GPU memory it needs once its header is read, before the upload (also when
  // it is refused). int8, f16: the kernels' opt-ins for speed (cera.gpu.numerics), off by
  // default. cacheTypeK, cacheTypeV: what the KV cache stores K and V in, "f16" (the default),
  // "f32" or "q8_0" (llama.cpp's 8-bit blocks, for a head_dim that is a multiple of 32; the core
  // refuses the others, and q8_0 for other heads, as Unsupported). sha256: the file's, checked as a URL
  // downloads (and against the cached copy's; a Hub id's file is checked against the SHA-256 the
  // Hub lists). hubEndpoint: where ids are looked up.
  async reload(model, options = {}) {
    const { ctx, int8, f16, cacheTypeK, cacheTypeV, sha256, hubEndpoint, onProgress, onMemory } = check("reload",
      { ...options, model }, { model: MODEL, ...LOAD_OPTIONS }, "model");
    await this.ready;
    this.info.model = null;
    this.info.model = await this.#send("load", { ...modelSource(model, hubEndpoint), ctx, int8, f16, cacheTypeK,
      cacheTypeV, sha256 }, { onProgress, onMemory });
    return this.info.model;
  }

  // Loads a LoRA adapter GGUF (a URL, a Hugging Face id or a File/Blob) for the loaded model,
  // its delta times `scale`; requests apply it unless their `lora` field leaves it out. Resolves
  // to {name, scale, pairs, rank, loras (every adapter loaded)}.
  async loadLora(adapter, options = {}) {
    const { scale, hubEndpoint } = check("loadLora", { ...options, adapter }, { adapter: MODEL,
      scale: [Number.isFinite, "a number"], ...SOURCE_OPTIONS }, "adapter");
    await this.ready;
    if (!this.info.model) throw invalid("loadLora: no model is loaded: load one first (createEngine or reload)");
    return this.#send("lora", { ...modelSource(adapter, hubEndpoint), scale });
  }

  // Stops the generation in flight before its next token: it ends with finish_reason "stop".
  interrupt() {
    this.#worker.postMessage({ kind: "interrupt", target: null });
  }

  // Ends the worker, freeing the model, the GPU device and Python's memory; later calls reject.
  async unload() {
    this.#fail(invalid("this engine was unloaded"));
    this.#worker.terminate();
  }

  // {adapter, model, arch, lastRequest: {promptTokens, completionTokens, decodeTokensPerS, ...}, ...}
  runtimeStats() {
    return this.#send("stats");
  }

  // The hidden states after the final norm of `text`, as `python -m cera embed --json`:
  // {embeddings: a row per token (pooling "none") or one ("mean", "last", "cls"), tokens}; by
  // default the model's own pooling (its header's pooling_type: an encoder's, else "none").
  // They run apart from the conversation the engine holds, which stays as it was.
  async embed(text, options = {}) {
    const { pooling } = check("embed", { ...options, text }, EMBED, "text");
    await this.ready;
    this.#model("embed");
    return this.#send("embed", { text, pooling });
  }

  // Runs Python in the worker and resolves to the string it ends with (tests, debugging).
  async python(code) {
    return (await this.#send("python", { code })).value;
  }

  async #create(endpoint, request) {
    const { method, rules, required } = REQUESTS[endpoint];
    const body = check(method, request, rules, required);
    await this.ready;
    const model = this.#model(method);
    if (body.model && body.model !== model) throw invalid(`${method}: model ${body.model}: this engine runs ${model}`);
    if (!body.stream) return this.#send("create", { endpoint, request: body });
    // resolves with the first chunks: a request refused before any text rejects, as natively
    return new Promise((resolve, reject) => {
      let stream = null;
      const id = this.#post("create", { endpoint, request: body }, {
        onChunks: (chunks) => {
          if (!stream) resolve(stream = new ChunkStream(() => this.#worker.postMessage({ kind: "interrupt", target: id })));
          stream.push(chunks);
        },
        resolve: () => stream.finish(),   // the last chunks always come first
        reject: (err) => (stream ? stream.finish(err) : reject(err)),
      });
    });
  }

  // The loaded model's name; none is an InvalidArgument of `method`.
  #model(method) {
    const model = this.info.model?.name;
    if (!model) throw invalid(`${method}: no model is loaded: load one first (createEngine or reload)`);
    return model;
  }

  #post(kind, data, call) {
    if (this.#failure) throw this.#failure;
    const id = this.#nextId++;
    this.#calls.set(id, call);
    this.#worker.postMessage({ id, kind, ...data });
    return id;
  }

  #send(kind, data = {}, handlers = {}) {
    return new Promise((resolve, reject) => this.#post(kind, data, { resolve, reject, ...handlers }));
  }

  #receive(msg) {
    if (msg.id === undefined) return this.#engineMessage(msg);
    const call = this.#calls.get(msg.id);
    if (!call) return;
    if (msg.kind === "progress") call.onProgress?.({ phase: msg.phase, done: msg.done, total: msg.total });
    else if (msg.kind === "memory") call.onMemory?.(msg.memory);
    else if (msg.kind === "chunks") call.onChunks(msg.chunks);
    else {
      this.#calls.delete(msg.id);
      if (msg.kind === "done") call.resolve(msg.result);
      else call.reject(new CeraError(msg.name, msg.message));
    }
  }

  // A message of the whole engine (worker.js): its GPU device lost, the reload's progress, the
  // model and conversation back on a new device, or an error it cannot go on after.
  #engineMessage(msg) {
    const { onProgress, onError, onDeviceLost, onRecovered } = this.#events;
    if (msg.kind === "lost") onDeviceLost?.(new CeraError(msg.name, msg.message));
    else if (msg.kind === "progress") onProgress?.({ phase: msg.phase, done: msg.done, total: msg.total });
    else if (msg.kind === "recovered") onRecovered?.(msg.result);
    else if (msg.kind === "error") {
      const err = new CeraError(msg.name, msg.message);
      this.#failure ??= err;
      onError?.(err);
    }
  }

  #fail(err) {
    this.#failure ??= err;
    for (const call of this.#calls.values()) call.reject(err);
    this.#calls.clear();
  }
}

// An engine with `model` loaded: new Engine(...) then reload(model, ...).
export async function createEngine(options = {}) {
  const { model, ctx, int8, f16, cacheTypeK, cacheTypeV, sha256, hubEndpoint, onProgress, onMemory, ...rest } = check(
    "createEngine", options, { model: MODEL, ...LOAD_OPTIONS, ...ENGINE_OPTIONS }, "model");
  const engine = new Engine({ onProgress, ...rest });
  try {
    await engine.reload(model, { ctx, int8, f16, cacheTypeK, cacheTypeV, sha256, hubEndpoint, onProgress, onMemory });
  } catch (err) {
    await engine.unload();
    throw err;
  }
  return engine;
}
