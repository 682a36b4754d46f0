// The demo page: controls, streaming output, errors with advice. It is cera.js's first user: the
// engine is the one any page gets.

import { Engine } from "./cera.js";

const $ = (id) => document.getElementById(id);

// What a user can do about each kind of error, by the name of its type (cera.errors, and the
// download errors of models.js). "Error" alone is a bug: it gets no advice.
const ADVICE = {
  NoGpu: "",
  DeviceLost: "The page reloads the model on a new GPU device and keeps the conversation: send the message " +
    "again once it says recovered.",
  InvalidArgument: "Check the request: load a model first, give a prompt, keep the numbers in range.",
  ContextFull: "The prompt does not fit the context: shorten it, or load the model with a larger context.",
  BadFile: "Check that the file is a complete .gguf model (re-download it if it was cut short).",
  TruncatedFile: "The file ends too early: download it again (or copy it again) and load the complete file.",
  ModelNotFound: "Check the model's name or path (for a Hugging Face id, the message says what its repo holds).",
  Unsupported: "The message says what cera cannot run in this file: pick a model of an architecture cera runs.",
  TooLarge: "Pick a smaller model or a smaller quantization, or load it with a shorter context: " +
    "this GPU's WebGPU limits cannot hold it.",
  FetchFailed: "Check the URL and the connection; the server must allow cross-origin requests (CORS), or load " +
    "the file from disk.",
  ShaderError: "This GPU's WebGPU compiler rejected a kernel; please report it with the adapter name.",
  GpuError: "WebGPU rejected an operation on this GPU (a cera bug for this adapter); please report it with the adapter name.",
};

let recovering = false;   // the GPU device was lost: the engine reloads the model on a new one

function showError(err, advice = ADVICE[err.name] || "") {
  const box = $("error");
  box.hidden = false;
  box.querySelector(".name").textContent = err.name;
  box.querySelector(".message").textContent = err.message;
  box.querySelector(".advice").textContent = advice;
  setStatus(recovering ? "recovering" : "error");
}

// The engine is back on a new device with the model and the conversation (its result:
// {model, restoredTokens, seconds}); the error box still says what happened.
function showRecovered({ restoredTokens, seconds }) {
  recovering = false;
  $("progress-text").textContent = `recovered from a lost GPU device in ${seconds.toFixed(1)} s: model reloaded, ` +
    `${restoredTokens} tokens of the conversation restored`;
  setStatus(model ? "ready" : "ready (no model)");
}

function clearError() { $("error").hidden = true; }
function setStatus(text) { $("status").textContent = text; $("status").dataset.state = text.split(" ")[0]; }

const mib = (n) => (n / 1048576).toFixed(1) + " MiB";
const rate = (r) => (r >= 10 ? r.toFixed(1) : r.toPrecision(2));

// The GPU memory the model needs (engine.reload's onMemory, before the upload starts).
function showMemory(m) {
  const fallbacks = m.fallbacks.length ? `; ${m.fallbacks.length} tensors without a GPU kernel held as F16` : "";
  $("memory").textContent = `${mib(m.total)} (weights ${mib(m.weights)}, KV cache ${mib(m.kv_cache)} at ` +
    `context ${m.ctx}, activations and state ${mib(m.activations + m.state)}; largest buffer ` +
    `${m.largest_buffer.name} ${mib(m.largest_buffer.bytes)} of ${mib(m.max_buffer_size)} allowed${fallbacks})`;
}

function showProgress({ phase, done, total }) {
  const bar = $("progress");
  const labels = { webgpu: "opening the GPU", python: "starting Python", download: "downloading", upload: "uploading to the GPU" };
  bar.max = total || 1;
  bar.value = total ? done : 0;
  $("progress-text").textContent = `${labels[phase] || phase}` + (total ? `: ${mib(done)} of ${mib(total)}` : "");
}

// ?limits=max_buffer_size:4096,... plays a GPU with smaller limits than this one (for testing).
const simulate = Object.fromEntries((new URLSearchParams(location.search).get("limits") || "")
  .split(",").filter(Boolean).map((pair) => pair.split(":")).map(([k, v]) => [k, Number(v)]));
const engine = new Engine({ limits: simulate, onProgress: showProgress,
  onError: (err) => { recovering = false; showError(err, ""); },   // the engine's end: its message says what to do
  onDeviceLost: (err) => { recovering = true; showError(err); },
  onRecovered: showRecovered });
const ready = engine.ready.then((info) => {
  $("adapter").textContent = info.adapter;
  $("adapter").title = `features: ${info.features.join(", ") || "none"}; ` +
    Object.entries(info.limits).map(([k, v]) => `${k} ${v}`).join(", ");
  $("max-tokens").value = info.defaults.maxTokens;   // the core's default, shown in the control
  $("progress-text").textContent = "";
  setStatus("ready (no model)");
  return info;
}, (err) => { showError(err); throw err; });

let model = null;

function setBusy(busy) {
  $("generate").disabled = busy || !model;
  $("stop").disabled = !busy;
  for (const id of ["file", "url", "load-url", "hub-endpoint", "catalogue", "load-catalogue", "int8", "cache-type"]) {
    $(id).disabled = busy;
  }
  $("lora-file").disabled = busy || !model;
}

// source: a File, a URL or a Hugging Face id, looked up at the Hub the page's setting names;
// loaded with the settings' 8-bit activations (cera.gpu.numerics) and KV cache type ("f16",
// "f32", "q8_0"); sha256: the file's, checked as a URL downloads.
async function load(source, { sha256 } = {}) {
  const int8 = $("int8").checked, cacheType = $("cache-type").value;
  const hubEndpoint = $("hub-endpoint").value.trim() || undefined;
  clearError();
  setBusy(true);
  setStatus("loading");
  try {
    model = null;
    newConversation();
    $("memory").textContent = "…";
    model = await engine.reload(source, { int8, cacheTypeK: cacheType, cacheTypeV: cacheType, sha256, hubEndpoint,
      onProgress: showProgress, onMemory: showMemory });
    $("loras").textContent = "none";
    $("model").textContent = `${model.name} (${model.arch}, ${mib(model.bytes)}` +
      `${model.cached ? ", from the browser cache" : ""}${model.numerics !== "exact" ? `, ${model.numerics}` : ""}` +
      `, ${model.cacheTypeK === model.cacheTypeV ? model.cacheTypeK : `K ${model.cacheTypeK}, V ${model.cacheTypeV}`} KV cache)`;
    $("chat").checked = model.hasChatTemplate;
    $("progress-text").textContent = `loaded in ${model.loadSeconds.toFixed(1)} s` +
      (model.cacheSkipped ? `; not cached: ${model.cacheSkipped}` : "");
    setStatus("ready");
    return model;
  } catch (err) {
    showError(err);
    throw err;
  } finally {
    setBusy(false);
  }
}

// The conversation so far (chat mode): every turn sends the whole history, which the engine
// renders with the model's template; it prefills only what its cached state does not hold.
let conversation = [];

function showTurn(role, text) {
  const item = document.createElement("li");
  item.className = role;
  item.textContent = text;
  $("conversation").append(item);
  $("new-conversation").hidden = false;
  return item;
}

function newConversation() {
  conversation = [];
  $("conversation").replaceChildren();
  $("new-conversation").hidden = true;
}

// A LoRA adapter for the loaded model (a File), applied to every request from now on.
async function loadLora(source) {
  clearError();
  try {
    const adapter = await engine.loadLora(source);
    $("loras").textContent = adapter.loras.join(", ");
    return adapter;
  } catch (err) {
    showError(err);
    throw err;
  }
}

// The sampling settings as request fields (OpenAI's, and llama.cpp server's min_p, repeat_penalty).
const SAMPLING = { temperature: Number, top_k: Number, top_p: Number, min_p: Number, repeat_penalty: Number,
  frequency_penalty: Number, presence_penalty: Number, seed: Number };
function samplingSettings() {
  return Object.fromEntries(Object.entries(SAMPLING).filter(([id]) => $(id).value !== "")
    .map(([id, parse]) => [id, parse($(id).value)]));
}

// Text after `prompt` (greedy unless `sampling` says otherwise), streamed into the page. With `chat`, `prompt` is the user's next
// message in the conversation and the reply joins it. Resolves to the text and the request's
// numbers (engine.runtimeStats().lastRequest: promptTokens, prefilledTokens, reusedTokens, ...).
async function generate(prompt, { maxTokens, chat = false, sampling = { temperature: 0 } } = {}) {
  clearError();
  setBusy(true);
  setStatus("generating");
  const out = chat ? null : $("output");
  if (out) out.textContent = "";
  const messages = chat ? [...conversation, { role: "user", content: prompt }] : null;
  let reply = null;
  try {
    const request = { max_tokens: maxTokens ?? (await ready).defaults.maxTokens, ...sampling, stream: true };
    const stream = await (chat ? engine.chat.completions.create({ ...request, messages })
      : engine.completions.create({ ...request, prompt }));
    if (chat) {
      showTurn("user", prompt);
      reply = showTurn("assistant", "");
    }
    let text = "";
    for await (const { choices: [choice] } of stream) {
      text += (chat ? choice.delta.content : choice.text) ?? "";
      (reply || out).textContent = text;
    }
    if (chat) conversation = [...messages, { role: "assistant", content: text }];
    const result = { text, ...(await engine.runtimeStats()).lastRequest };
    $("speed").textContent = `${result.completionTokens} tokens, ${rate(result.decodeTokensPerS)} tokens/s decode; ` +
      `prompt ${result.promptTokens} tokens, ${result.prefilledTokens} prefilled at ${rate(result.prefillTokensPerS)} ` +
      `tokens/s, ${result.reusedTokens} reused` + (result.stopReason === "cancelled" ? "; stopped" : "");
    setStatus("ready");
    return result;
  } catch (err) {
    reply?.parentElement && reply.remove();
    showError(err);
    throw err;
  } finally {
    setBusy(false);
  }
}

// Test-only: the demo's engine (cera.js's Engine, nothing else), for the browser tests of this
// page and scripts/h200/browser_bench.py, which drive the controls and read the numbers behind
// what the page shows (engine.info, engine.runtimeStats()) or run Python in its worker. A page of
// your own uses cera.js itself (example.html), not this.
window.testHook = { engine };

// --- controls ---------------------------------------------------------------------------
$("file").addEventListener("change", (e) => { if (e.target.files[0]) load(e.target.files[0]).catch(() => {}); });
$("load-url").addEventListener("click", () => { if ($("url").value.trim()) load($("url").value.trim()).catch(() => {}); });
$("lora-file").addEventListener("change", (e) => { if (e.target.files[0]) loadLora(e.target.files[0]).catch(() => {}); });
$("load-catalogue").addEventListener("click", () => {
  const entry = $("catalogue").selectedOptions[0];
  if (entry?.value) load(entry.value, { sha256: entry.dataset.sha256 }).catch(() => {});
});
$("generate").addEventListener("click", () => generate($("prompt").value, {
  maxTokens: Number($("max-tokens").value) || undefined, chat: $("chat").checked, sampling: samplingSettings(),
}).catch(() => {}));
$("stop").addEventListener("click", () => engine.interrupt());
$("new-conversation").addEventListener("click", newConversation);
$("chat").addEventListener("change", newConversation);

fetch("catalogue.json").then((r) => (r.ok ? r.json() : [])).catch(() => []).then((entries) => {
  const select = $("catalogue");
  for (const entry of entries) {
    const option = document.createElement("option");
    option.value = entry.url;
    option.dataset.sha256 = entry.sha256;   // checked as it downloads
    option.textContent = entry.label;
    select.append(option);
  }
  $("catalogue-row").hidden = entries.length === 0;
});
