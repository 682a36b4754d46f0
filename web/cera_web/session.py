"""The worker's Python side: one model on one WebDevice, driven by messages from worker.js.

Requests come type-checked by cera.js and leave as ready OpenAI objects, shaped by
cera.openai_shapes like the native server's; they run through cera.jobs.run_job (stop
strings, cancelling) one at a time. Results and errors go back as plain dicts; errors carry
the `name` of their cera.errors type, which the page turns into advice ("Error" alone is a bug).
When the GPU device is lost, `recover` loads the same model on a new one and prefills the
sequence the last request left, so the conversation goes on.
"""
from __future__ import annotations

import asyncio
import gc
import json
import time

from cera import hub
from cera.device import WANTED_FEATURES, WANTED_LANGUAGE_FEATURES
from cera.engine import DEFAULT_CTX, DEFAULT_MAX_TOKENS
from cera.errors import CeraError, InvalidArgument, Unsupported
from cera.gpu.model import DEFAULT_CHUNK
from cera.gpu.numerics import DEFAULT_CACHE_TYPE, Numerics
from cera.openai_shapes import ChatCompletion, TextCompletion, chat_job, completion_job, embeddings
from cera.jobs import Job, run_job
from js import Object
from pyodide.ffi import to_js

from .grammar import XGrammar
from .host import WebDevice, settle
from .sources import BlobSource

# worker.js opens the GPU with these features, and names these WGSL language features where it has them
__all__ = ["Session", "WANTED_FEATURES", "WANTED_LANGUAGE_FEATURES"]

_POST_EVERY_S = 0.03     # stream chunks to the page at most this often (one postMessage each)
sessions: list = []      # every Session made (one per worker): tests and benchmarks reach the device through it


def _js(value):
    return to_js(value, dict_converter=Object.fromEntries)


def error_dict(err: BaseException) -> dict:
    """An exception as {name, type, message} for the page: its cera.errors type, or "Error" (a bug)."""
    if isinstance(err, CeraError):
        return {"name": err.name, "type": err.type, "message": str(err)}
    return {"name": "Error", "type": "error", "message": f"{type(err).__name__}: {err}"}


class _Chunks:
    """A streamed request's chunks, posted to the page in batches (at most one postMessage per
    _POST_EVERY_S). The first batch holds the start chunk and the first text: a request that
    fails before any text posts nothing, so cera.js can reject it as a whole."""

    def __init__(self, post, msg_id, shape):
        self.post, self.id, self.shape = post, msg_id, shape
        self.pending = [shape.start()]
        self.posts = 0                        # postMessages while generating (the final one not counted)
        self.last = time.perf_counter()

    def piece(self, text: str) -> None:
        self.pending.append(self.shape.piece(text))
        now = time.perf_counter()
        if now - self.last >= _POST_EVERY_S:
            self.flush()
            self.posts += 1
            self.last = now

    def flush(self, *last) -> None:
        self.post(_js({"id": self.id, "kind": "chunks", "chunks": self.pending + list(last)}))
        self.pending = []


class Session:
    def __init__(self, host, post, limits=None, grammar_host=None):
        """host: the GpuHost (web/gpu.js); grammar_host: the GrammarHost class (web/grammar.js),
        started over a model's vocabulary by its first constrained request."""
        self.host, self.post, self.grammar_host = host, post, grammar_host
        self._limits = dict(limits) if limits else None
        self.device = WebDevice(host, self._limits)
        self.engine = None
        self.model = None                  # the loaded model's name: "model" in the OpenAI objects
        # what `recover` rebuilds: the load's (blob, name, ctx, numerics), its adapters' (blob,
        # name, scale), and the tokens the last request left in the KV cache with the adapters
        # it asked for (None: all)
        self._source = None
        self._loras: list[tuple] = []
        self._held: tuple[list[int], tuple | None] | None = None
        self.last = None                   # numbers of the last finished request (runtimeStats)
        self._turn = asyncio.Lock()        # loads and requests run one at a time, in arrival order
        self._running = None               # id of the request generating now
        self._interrupted: set = set()     # ids of requests told to stop
        self._grammars_for = None          # the engine whose grammars are XGrammar's (web/cera_web/grammar.py)
        sessions.append(self)

    def info(self):
        d = self.device
        return _js({"adapter": d.adapter_name, "features": sorted(d.features), "limits": vars(d.limits),
                    "defaults": {"ctx": DEFAULT_CTX, "maxTokens": DEFAULT_MAX_TOKENS}})

    def hub_repo(self, text):
        """The repo of the Hugging Face id `text` (cera.hub's forms), or None: text that is no
        id is a URL. worker.js then fetches the repo's listing for `hub_file`."""
        name = hub.hub_name(str(text))
        return name.repo if name else None

    def hub_file(self, text, listing, endpoint):
        """{path, sha256} of the file the Hugging Face id `text` names, picked by cera.hub's
        rules from its repo's listing (the JSON of the Hub's tree API, fetched from `endpoint`);
        sha256: the one the Hub lists for an LFS file, else None. A split model is refused: the
        page loads a model from one Blob."""
        try:
            entries = json.loads(str(listing))
            files = {e["path"]: (e.get("lfs") or {}).get("oid") for e in entries if e.get("type") == "file"}
            parts = hub.choose(hub.hub_name(str(text)), files, str(endpoint))
            if len(parts) > 1:
                raise Unsupported(f"{text} is a model split in {len(parts)} files ({parts[0]}, ...): the page loads "
                                  "a model in one file (join the parts with llama.cpp's llama-gguf-split --merge)")
            return _js({"path": parts[0], "sha256": files[parts[0]]})
        except Exception as err:   # noqa: BLE001 - every failure goes to the page with a name
            return _js({"ok": False, "error": error_dict(err)})

    def _progress(self, msg_id, phase):
        def progress(done, total):
            self.post(_js({"id": msg_id, "kind": "progress", "phase": phase, "done": done, "total": total}))
        return progress

    async def load(self, blob, name, msg_id, ctx=None, int8=False, f16=False, cache_type_k=None, cache_type_v=None):
        """Parse the GGUF header from the Blob, post the GPU memory the model will take (a
        "memory" message), build the plan, upload the weights (ctx None: DEFAULT_CTX positions;
        int8, f16: the kernels' opt-ins, cache_type_k, cache_type_v: the KV cache's types, None
        the default; cera.gpu.numerics).
        A model with a buffer this GPU cannot hold is refused (TooLarge) before anything is
        allocated. Waits for the requests ahead of it."""
        async with self._turn:
            try:
                numerics = Numerics(int8=bool(int8), f16=bool(f16), cache_type_k=str(cache_type_k or DEFAULT_CACHE_TYPE),
                                    cache_type_v=str(cache_type_v or DEFAULT_CACHE_TYPE))
                source = (blob, str(name), ctx, numerics)
                self._source, self._loras, self._held = None, [], None
                result = await self._load(*source, msg_id)
                self._source = source
                return _js(result)
            except Exception as err:   # noqa: BLE001 - every failure goes to the page with a name
                return _js({"ok": False, "error": error_dict(err)})

    async def _load(self, blob, name, ctx, numerics, msg_id):
        from cera.config import ModelConfig
        from cera.engine import Engine
        from cera.gguf_file import GGUFFile
        from cera.gpu.footprint import footprint

        t0 = time.perf_counter()
        self.engine = self.model = None
        gc.collect()                      # the previous model's buffers: freed on the GPU now
        self.device.release_unused()
        source = BlobSource(blob, self.host)
        gguf = GGUFFile(source)
        if gguf.metadata.get("split.count", 1) != 1:
            raise Unsupported(f"{name} is a part of a model split in {gguf.metadata['split.count']} files: the page "
                              "loads a model in one file (join the parts with llama.cpp's llama-gguf-split --merge)")
        cfg = ModelConfig.from_gguf(gguf)
        ctx = cfg.context(DEFAULT_CTX if ctx is None else int(ctx))
        memory = {**footprint(cfg, gguf, ctx, DEFAULT_CHUNK, self.device.limits, numerics).to_dict(),
                  "max_buffer_size": self.device.limits.max_buffer_size}
        self.post(_js({"id": msg_id, "kind": "memory", "memory": memory}))
        engine = await Engine.load(gguf, self.device, ctx=ctx, progress=self._progress(msg_id, "upload"),
                                   prefill_chunk=DEFAULT_CHUNK, numerics=numerics)
        await self.device.check()
        self.engine, self.model = engine, name
        return {"name": name, "arch": gguf.arch, "bytes": source.size,
                "layers": cfg.n_layers, "vocab": cfg.vocab_size, "ctx": engine.ctx, "gpuMemory": memory,
                "hasChatTemplate": bool(gguf.metadata.get("tokenizer.chat_template")),
                "bytesThroughWasm": source.bytes_read,
                "dispatchesPerToken": engine.backend.dispatches_per_token, "numerics": numerics.label,
                "cacheTypeK": numerics.cache_type_k, "cacheTypeV": numerics.cache_type_v,
                "loadSeconds": time.perf_counter() - t0}

    async def load_lora(self, blob, name, scale, msg_id):
        """Load the LoRA adapter in the Blob for the loaded model under `name` (requests pick
        adapters by it: the "lora" field), its delta times `scale` (None: 1)."""
        async with self._turn:
            try:
                if self.engine is None:
                    raise InvalidArgument("no model is loaded: load one first")
                lora = (blob, str(name), 1.0 if scale is None else float(scale))
                adapter = await self._load_lora(*lora, msg_id)
                self._loras.append(lora)
                return _js({"name": adapter.name, "scale": adapter.scale, "pairs": len(adapter.pairs),
                            "rank": adapter.max_rank, "loras": [lora.name for lora in self.engine.loras]})
            except Exception as err:   # noqa: BLE001 - every failure goes to the page with a name
                return _js({"ok": False, "error": error_dict(err)})

    async def _load_lora(self, blob, name, scale, msg_id):
        from cera.gguf_file import GGUFFile
        adapter = await self.engine.load_lora(GGUFFile(BlobSource(blob, self.host)), name, scale,
                                              progress=self._progress(msg_id, "upload"))
        await self.device.check()
        return adapter

    async def recover(self, host):
        """After the GPU device was lost: on `host` (a Promise of the new GpuHost), the model
        loaded as it was (same file, ctx, numerics, LoRA adapters) and the sequence the last
        request left prefilled, so the next request reuses it as it would have. Requests wait
        their turn meanwhile (the one in flight ended with DeviceLost). Posts the reload's
        progress without an id; returns {model, restoredTokens, seconds}."""
        async with self._turn:
            try:
                t0 = time.perf_counter()
                self.host = await settle(host, lambda js: js)
                self.device = WebDevice(self.host, self._limits)
                result, tokens = None, []
                if self._source is not None:
                    result = await self._load(*self._source, None)
                    for lora in self._loras:
                        await self._load_lora(*lora, None)
                if self._held is not None:
                    # a one-token generation prefills the sequence; the next request rewinds past its token
                    tokens, adapters = self._held
                    await run_job(self.engine, Job(prompt=tokens, max_tokens=1, adapters=adapters))
                return _js({"model": result, "restoredTokens": len(tokens), "seconds": time.perf_counter() - t0})
            except Exception as err:   # noqa: BLE001 - every failure goes to the page with a name
                return _js({"ok": False, "error": error_dict(err)})

    def interrupt(self, target=None):
        """Stop request `target` (None: the one generating now) before its next token."""
        target = self._running if target is None else target
        if target is not None:
            self._interrupted.add(target)

    async def create(self, endpoint, request, msg_id):
        """A "chat", "completion" or "embeddings" request (OpenAI's fields; cera.js has checked
        their types and that a model is loaded). Returns the chat.completion / text_completion /
        embeddings list object; with `stream`, posts the chunks and returns None."""
        try:
            body = request.to_py()
            stream = body.pop("stream", False)
            usage = body.pop("stream_options", {}).get("include_usage", False)
            for checked in ("model", "n"):   # cera.js checked them: the loaded model, one choice
                body.pop(checked, None)
            if endpoint == "embeddings":
                async with self._turn:
                    return _js(await embeddings(self.engine, self.model, **body))
            async with self._turn:
                if endpoint == "chat":
                    job, shape = chat_job(ctx=self.engine.ctx, **body), ChatCompletion(self.model, self.engine.tokenizer)
                else:
                    job, shape = completion_job(**body), TextCompletion(self.model, self.engine.tokenizer)
                if job.constrained and self._grammars_for is not self.engine:   # XGrammar, started on first use
                    self.engine.grammars = await XGrammar.load(self.grammar_host, self.engine.tokenizer,
                                                               self.engine.cfg.vocab_size)
                    self._grammars_for = self.engine
                chunks = _Chunks(self.post, msg_id, shape) if stream else None
                result = await self._run(job, msg_id, chunks)
            if not stream:
                return _js(shape.whole(result))
            chunks.flush(shape.end(result), *([shape.usage_chunk(result)] if usage else []))
            return None
        except Exception as err:   # noqa: BLE001
            return _js({"ok": False, "error": error_dict(err)})
        finally:
            self._interrupted.discard(msg_id)

    async def _run(self, job, msg_id, chunks):
        self._running = msg_id
        calls0 = dict(self.device.calls())
        try:
            result = await run_job(self.engine, job, chunks.piece if chunks else None,
                                   lambda: msg_id in self._interrupted)
        finally:
            self._running = None
        self._held = (self.engine.history[: self.engine.backend.n_past], job.adapters)
        calls = {k: v - calls0.get(k, 0) for k, v in self.device.calls().items() if v != calls0.get(k, 0)}
        calls["postMessage"] = chunks.posts if chunks else 0   # streamed chunks (the final batch not counted)
        self.last = {"promptTokens": len(result.prompt_tokens), "completionTokens": len(result.tokens),
                     "prefilledTokens": result.prefilled, "reusedTokens": result.reused,   # of the prompt
                     "tokens": list(result.tokens),   # ids, as `python -m cera generate --json`
                     "stopReason": result.stop_reason,
                     "prefillSeconds": result.prefill_s, "decodeSeconds": result.decode_s,
                     "prefillTokensPerS": result.prefill_tokens_per_s,
                     "decodeTokensPerS": result.decode_tokens_per_s,
                     "hostCalls": calls}
        return result

    async def embed(self, text, pooling=None):
        """The embeddings of `text` (cera.js checked that it is a non-empty string and that a model
        is loaded), as `python -m cera embed --json`: {embeddings, tokens}; pooling None: the
        model's own (its header's pooling_type, else "none").
        They run on the engine's scratch state: the conversation it holds stays as it was."""
        try:
            async with self._turn:
                ids = self.engine.embed_tokens(text)
                rows = await self.engine.embed(ids, pooling)
            return _js({"embeddings": rows.tolist(), "tokens": ids})
        except Exception as err:   # noqa: BLE001
            return _js({"ok": False, "error": error_dict(err)})

    def stats(self):
        """The adapter, the model, the last request's numbers, and calls into GpuHost so far."""
        return _js({"adapter": self.device.adapter_name, "model": self.model,
                    "arch": self.engine.gguf.arch if self.engine else None,
                    "lastRequest": self.last, "calls": self.device.calls()})
