// Types of cera.js: GGUF language models on WebGPU, in a Web Worker of your page, behind an
// API shaped like OpenAI's client. The objects it resolves to are the ones `python -m cera serve`
// answers with (the same Python code shapes both).

/** The names an error of cera's rejects with (`err.name`); "Error" alone is a bug. */
export type CeraErrorName =
  | "InvalidArgument" | "ModelNotFound" | "BadFile" | "TruncatedFile" | "Unsupported" | "TooLarge"
  | "ContextFull" | "NoGpu" | "DeviceLost" | "ShaderError" | "GpuError"
  | "FetchFailed";   // downloading a model by URL

export interface Progress {
  phase: "python" | "webgpu" | "download" | "upload";
  done: number;    // bytes (download, upload), 0 while booting
  total: number;   // 0 when unknown
}

export interface EngineOptions {
  /** WebGPU limits (snake_case, e.g. max_storage_buffer_binding_size) to report lower than the GPU's, to try a smaller GPU. */
  limits?: Record<string, number>;
  /** Booting, and reloading the model after a lost GPU device. */
  onProgress?: (progress: Progress) => void;
  /** The GPU device was lost (DeviceLost): the request in flight rejects with it, and the engine
   * reloads the model on a new device and prefills the conversation it held (calls made
   * meanwhile wait for it). */
  onDeviceLost?: (error: Error) => void;
  /** The engine is back after a lost GPU device: the model reloaded, the conversation restored. */
  onRecovered?: (recovery: Recovery) => void;
  /** An error outside any call after which the engine cannot go on (a lost GPU device it could
   * not recover from). Later calls reject with it. */
  onError?: (error: Error) => void;
}

export interface Recovery {
  model: Omit<ModelInfo, "cached" | "cacheSkipped" | "wasmHeapBytes"> | null;   // null: none was loaded
  restoredTokens: number;      // of the sequence the last request left, prefilled again
  seconds: number;
}

export type CacheType = "f16" | "f32" | "q8_0";

export interface LoadOptions {
  /** Positions of context to allocate (default info.defaults.ctx, capped at the model's). */
  ctx?: number;
  /** Opt-in speed: 8-bit activations for Q4_K and Q6_K weights, as llama.cpp's CPU backend rounds them (results no longer equal the exact path's). */
  int8?: boolean;
  /** Opt-in speed: f16 prefill tiles where the adapter has shader-f16. */
  f16?: boolean;
  /** What the KV cache stores K in, by llama.cpp's name: "f16" (the default: half of f32's memory, as llama.cpp's cache), "f32" or "q8_0" (llama.cpp's 8-bit blocks of 32 values, 1.125 bytes a value; a head_dim that is a multiple of 32); others reject as Unsupported. */
  cacheTypeK?: CacheType;
  /** The same for V. */
  cacheTypeV?: CacheType;
  /** The file's SHA-256 (64 hex digits): a URL's download must have it (else BadFile), and so must the cached copy used. */
  sha256?: string;
  /** Where Hugging Face ids are looked up: the Hub (https://huggingface.co, the default) or a mirror. */
  hubEndpoint?: string;
  onProgress?: (progress: Progress) => void;
  /** The GPU memory the model needs, once its header is read: before the upload, and also when it is refused (TooLarge). */
  onMemory?: (memory: GpuMemory) => void;
}

/** The GPU memory a model takes at a context, from its header (cera.gpu.footprint), in bytes. */
export interface GpuMemory {
  ctx: number;
  prefill_chunk: number;
  weights: number;             // as they sit on the GPU (quantized; F16 for types without a kernel)
  kv_cache: number;
  cache_type_k: CacheType;     // what it stores K in ...
  cache_type_v: CacheType;     // ... and V
  state: number;               // the rest of the per-sequence state (logits, scratch, ...)
  activations: number;
  total: number;               // shown, not checked: WebGPU has no total-memory limit
  largest_buffer: { name: string; bytes: number };   // refused (TooLarge) above max_buffer_size
  max_buffer_size: number;     // this adapter's
  fallbacks: { tensor: string; type_name: string; file_bytes: number; gpu_bytes: number }[];
}

export interface CreateEngineOptions extends EngineOptions, LoadOptions {
  /** A .gguf by URL (resolved against the page; downloaded once into the Origin Private File System), by
   * Hugging Face id (ORG/REPO:QUANT, the repo's file of that quant type, Q4_K_M if left out; ORG/REPO/FILE.gguf;
   * looked up at hubEndpoint, checked against the SHA-256 the Hub lists, cached as a URL is) or a File/Blob. */
  model: string | URL | Blob;
}

export interface ModelInfo {
  name: string;                // "model" in the responses: the file's name
  arch: string;                // general.architecture
  bytes: number;
  layers: number;
  vocab: number;
  ctx: number;
  gpuMemory: GpuMemory;
  hasChatTemplate: boolean;
  cached: boolean;             // came from the browser's storage, not the network
  cacheSkipped: string | null; // why a download was not stored in the browser's storage (full, no size to check, ...)
  loadSeconds: number;
  bytesThroughWasm: number;    // model bytes that entered Python's memory (the header; weights go Blob -> GPU in JS)
  dispatchesPerToken: number;
  numerics: string;            // "exact", or the opt-ins taken: "int8", "f16", "int8+f16"
  cacheTypeK: CacheType;       // what the KV cache stores K in ...
  cacheTypeV: CacheType;       // ... and V
  wasmHeapBytes: number;
}

export interface LoraInfo {
  name: string;                // the adapter's file name: what a request's `lora` field names
  scale: number;
  pairs: number;               // adapted weight matrices
  rank: number;
  loras: string[];             // every adapter loaded, in order (indices for `lora`)
  cached: boolean;
  cacheSkipped: string | null;
}

export interface EngineInfo {
  adapter: string;
  features: string[];
  limits: Record<string, number>;
  defaults: { ctx: number; maxTokens: number };
  pyodide: string;
  model: ModelInfo | null;
}

export interface RequestStats {
  promptTokens: number;
  prefilledTokens: number;     // of the prompt: run now ...
  reusedTokens: number;        // ... and taken from the state a previous request left (a conversation's history)
  completionTokens: number;
  tokens: number[];            // the generated token ids
  stopReason: "eos" | "max_tokens" | "context_full" | "stop_string" | "cancelled";
  prefillSeconds: number;
  decodeSeconds: number;
  prefillTokensPerS: number;
  decodeTokensPerS: number;
  hostCalls: Record<string, number>;   // calls from Python into JavaScript during the request
}

export interface RuntimeStats {
  adapter: string;
  model?: string;              // absent while no model is loaded
  arch?: string;
  lastRequest?: RequestStats;  // the last finished request
  calls: Record<string, number>;   // calls from Python into JavaScript since the worker started
  wasmHeapBytes: number;
}

// ---- requests: the OpenAI fields cera honours (others reject with InvalidArgument) ----

export type TextPart = { type: "text"; text: string };
export interface Message {
  role: "system" | "user" | "assistant" | "tool" | string;
  content?: string | TextPart[] | null;
  tool_calls?: ToolCall[];      // an assistant's calls, as a reply gave them
  tool_call_id?: string;        // a tool's answer: to which call
}

export interface Sampling {
  /** Only the loaded model's name, if given. */
  model?: string;
  max_tokens?: number;
  /** 0 is greedy; default 1 (OpenAI's). */
  temperature?: number;
  top_p?: number;
  /** An extension (as llama.cpp's server): 0, the default, keeps the whole vocabulary. */
  top_k?: number;
  /** Lowers the logit of each token among the last 64 of prompt and reply by this times its count (llama.cpp's penalties). */
  frequency_penalty?: number;
  /** Lowers the logit of each token among the last 64 of prompt and reply by this, once. */
  presence_penalty?: number;
  /** Extensions, as llama.cpp's server names them: min-p filtering, the repetition penalty and
   * how many recent tokens the penalties look at (-1: all; default 64). */
  min_p?: number;
  repeat_penalty?: number;
  penalty_last_n?: number;
  /** Seeds the random stream: a seeded reply is the same in the page and natively. */
  seed?: number;
  /** OpenAI's logit bias: token id (a string of digits) -> a number added to its logit. */
  logit_bias?: Record<string, number>;
  /** Generation ends before the first of these; the text leaves it out. */
  stop?: string | string[];
  stream?: boolean;
  stream_options?: { include_usage?: boolean };
  n?: 1;
  /** An extension: the loaded LoRA adapters to apply, by name or index; [] for none; absent: all. */
  lora?: (string | number)[];
  /** What the reply must be: any JSON object, or JSON valid under a schema (one of these three). */
  response_format?: { type: "text" } | { type: "json_object" } |
    { type: "json_schema"; json_schema: { name?: string; schema?: object; strict?: boolean } };
  /** llama.cpp server's: JSON valid under this schema. */
  json_schema?: object | boolean;
  /** llama.cpp server's: a text in this GBNF grammar (llama.cpp's grammars/ work as they are). */
  grammar?: string;
}

export interface Tool {
  type: "function";
  function: { name: string; description?: string; parameters?: object };
}

export interface ToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };   // arguments: JSON text
}

export interface ChatCompletionRequest extends Sampling {
  messages: Message[];
  /** Default: until the context is full. */
  max_completion_tokens?: number;
  /** Functions the reply may call (rendered by the model's chat template); calls come back in message.tool_calls. */
  tools?: Tool[];
  /** "auto" (default), "none" (no tools told), "required" or a named function: the call constrained by its schema. */
  tool_choice?: "auto" | "none" | "required" | { type: "function"; function: { name: string } };
  /** Each token's log-probability under the model, and the top_logprobs most likely tokens'. */
  logprobs?: boolean;
  top_logprobs?: number;
}

export interface CompletionRequest extends Sampling {
  /** Text, or token ids. max_tokens defaults to 16 (OpenAI's). */
  prompt: string | number[];
  /** Each token's log-probability and this many most likely tokens' (0 to 5). */
  logprobs?: number;
}

// ---- responses: OpenAI's objects ----

/** A chat token's log-probability (streamed: every token's, in the chunk with the finish_reason). */
export interface TokenLogprob {
  token: string;
  logprob: number;
  bytes: number[];
  top_logprobs: { token: string; logprob: number; bytes: number[] }[];
}

export type FinishReason = "stop" | "length" | "tool_calls";   // "stop": EOS, a stop string, or interrupt()
export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  /** Prompt tokens whose state the engine still held from the previous request (not prefilled again). */
  prompt_tokens_details: { cached_tokens: number };
}

interface Response<Kind extends string, Choice> {
  id: string;                  // "chatcmpl-..." / "cmpl-..."
  object: Kind;
  created: number;             // seconds since 1970
  model: string;
  choices: (Choice & { index: 0; logprobs: null })[];
}

export interface ChatCompletion extends Response<"chat.completion",
  { message: { role: "assistant"; content: string | null; tool_calls?: ToolCall[] }; finish_reason: FinishReason;
    logprobs: { content: TokenLogprob[] } | null }> { usage: Usage }

/** The first has delta {role: "assistant", content: ""}, the last of a reply {} and a finish_reason;
 * with stream_options.include_usage, one more with no choices and the usage. */
export interface ChatCompletionChunk extends Response<"chat.completion.chunk",
  { delta: { role?: "assistant"; content?: string; tool_calls?: (ToolCall & { index: number })[] };
    finish_reason: FinishReason | null; logprobs: { content: TokenLogprob[] } | null }> { usage?: Usage }

export interface Completion extends Response<"text_completion",
  { text: string; finish_reason: FinishReason }> { usage: Usage }

export interface CompletionChunk extends Response<"text_completion",
  { text: string; finish_reason: FinishReason | null }> { usage?: Usage }

/** OpenAI's embeddings request, as `serve`'s POST /v1/embeddings takes it. */
export interface EmbeddingRequest {
  /** A text, token ids, or a batch of texts or of token-id arrays. */
  input: string | number[] | string[] | number[][];
  model?: string;
  /** "float" (the default): numbers; "base64": each vector's little-endian float32 bytes in base64. */
  encoding_format?: "float" | "base64";
}

/** One vector per input: its hidden states after the final norm, mean-pooled, at unit length. */
export interface EmbeddingList {
  object: "list";
  data: { object: "embedding"; index: number; embedding: number[] | string }[];
  model: string;
  usage: { prompt_tokens: number; total_tokens: number };
}

/** As `python -m cera embed --json`. */
export interface Embeddings {
  /** A row of hidden-size numbers per token (pooling "none"), or one: their mean, the last, or the first ("cls"). */
  embeddings: number[][];
  /** The text's token ids (BOS as the model says; special tokens read as text). */
  tokens: number[];
}

// ---- the engine ----

export class Engine {
  /** Starts a worker: Pyodide and the GPU boot in the background; no model yet (see reload). */
  constructor(options?: EngineOptions);
  /** Resolves to info once the worker has Python and a GPU; rejects with NoGpu etc. */
  readonly ready: Promise<EngineInfo>;
  /** null until ready; info.model is null until a model is loaded. */
  readonly info: EngineInfo | null;

  readonly chat: {
    completions: {
      create(request: ChatCompletionRequest & { stream?: false }): Promise<ChatCompletion>;
      create(request: ChatCompletionRequest & { stream: true }): Promise<AsyncIterableIterator<ChatCompletionChunk>>;
    };
  };
  readonly completions: {
    create(request: CompletionRequest & { stream?: false }): Promise<Completion>;
    create(request: CompletionRequest & { stream: true }): Promise<AsyncIterableIterator<CompletionChunk>>;
  };
  /** As `serve`'s /v1/embeddings; apart from the conversation the engine holds. */
  readonly embeddings: { create(request: EmbeddingRequest): Promise<EmbeddingList> };

  /** Loads a model, replacing the one loaded (after the requests ahead of it). */
  reload(model: string | URL | Blob, options?: LoadOptions): Promise<ModelInfo>;
  /** Loads a LoRA adapter GGUF for the loaded model (its delta times `scale`, default 1); requests
   * apply every loaded adapter unless their `lora` field names the ones to use. */
  loadLora(adapter: string | URL | Blob, options?: { scale?: number; hubEndpoint?: string }): Promise<LoraInfo>;
  /** Stops the generation in flight before its next token; it ends with finish_reason "stop".
   * (Leaving a stream's for-await loop early stops that request the same way.) */
  interrupt(): void;
  /** Ends the worker (model, GPU device, Python); calls in flight and later reject with InvalidArgument. */
  unload(): Promise<void>;
  runtimeStats(): Promise<RuntimeStats>;
  /** The hidden states after the final norm of `text` (apart from the conversation the engine holds). */
  embed(text: string, options?: { pooling?: "none" | "mean" | "last" | "cls" }): Promise<Embeddings>;
  /** Runs Python in the worker; resolves to its last expression as a string. For debugging and tests:
   * it reaches cera's internals (cera_web.session.sessions), which are no stable API. */
  python(code: string): Promise<string>;
}

/** An engine with `model` loaded: new Engine(options), then reload(model, options). */
export function createEngine(options: CreateEngineOptions): Promise<Engine>;
