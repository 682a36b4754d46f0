"""The worker's Python side: one model on one WebDevice, driven by messages from worker.js.

Results and errors go back as plain dicts; errors carry the `name` of their cera.errors
type, which the page turns into advice ("Error" alone is a bug).
"""
from __future__ import annotations

import gc
import time

from cera.device import WANTED_FEATURES
from cera.engine import DEFAULT_CTX, DEFAULT_MAX_TOKENS
from cera.errors import CeraError, InvalidArgument
from cera.gpu.model import DEFAULT_CHUNK
from js import Object
from pyodide.ffi import to_js

from .host import WebDevice
from .sources import BlobSource

__all__ = ["Session", "WANTED_FEATURES"]   # worker.js opens the GPU with these features

_POST_EVERY_S = 0.03     # stream text to the page at most this often (one postMessage each)
_sessions: list = []     # every Session made (one per worker): tests reach the device through it


def _js(value):
    return to_js(value, dict_converter=Object.fromEntries)


def error_dict(err: BaseException) -> dict:
    """An exception as {name, type, message} for the page: its cera.errors type, or "Error" (a bug)."""
    if isinstance(err, CeraError):
        return {"name": err.name, "type": err.type, "message": str(err)}
    return {"name": "Error", "type": "error", "message": f"{type(err).__name__}: {err}"}


class Session:
    def __init__(self, host, post, limits=None):
        self.host, self.post = host, post
        self.device = WebDevice(host, dict(limits) if limits else None)
        self.engine = None
        self.source = None
        self._stopping = False
        _sessions.append(self)

    def info(self):
        d = self.device
        return _js({"adapter": d.adapter_name, "features": sorted(d.features), "limits": vars(d.limits),
                    "defaults": {"ctx": DEFAULT_CTX, "maxTokens": DEFAULT_MAX_TOKENS}})

    def _progress(self, msg_id, phase):
        def progress(done, total):
            self.post(_js({"id": msg_id, "kind": "progress", "phase": phase, "done": done, "total": total}))
        return progress

    async def load(self, blob, msg_id, ctx=None):
        """Parse the GGUF header from the Blob, post the GPU memory the model will take (a
        "memory" message), build the plan, upload the weights (ctx None: DEFAULT_CTX positions).
        A model with a buffer this GPU cannot hold is refused (TooLarge) before any allocation."""
        try:
            from cera.config import ModelConfig
            from cera.engine import Engine
            from cera.gguf_file import GGUFFile
            from cera.gpu.footprint import footprint

            t0 = time.perf_counter()
            self.engine = None
            gc.collect()                      # the previous model's buffers: freed on the GPU now
            self.device.release_unused()
            source = BlobSource(blob, self.host)
            gguf = GGUFFile(source)
            cfg = ModelConfig.from_gguf(gguf)
            ctx = cfg.context(DEFAULT_CTX if ctx is None else int(ctx))
            memory = footprint(cfg, gguf, ctx, DEFAULT_CHUNK, self.device.limits)
            self.post(_js({"id": msg_id, "kind": "memory", **memory.to_dict(),
                           "maxBufferSize": self.device.limits.max_buffer_size}))
            engine = await Engine.load(gguf, self.device, ctx=ctx, progress=self._progress(msg_id, "upload"),
                                       prefill_chunk=DEFAULT_CHUNK)
            await self.device.check()
            self.engine, self.source = engine, source
            return _js({"ok": True, "name": source.name, "arch": gguf.arch, "bytes": source.size,
                        "layers": cfg.n_layers, "vocab": cfg.vocab_size, "ctx": engine.ctx,
                        "gpuBytes": memory.total,
                        "hasChatTemplate": bool(gguf.metadata.get("tokenizer.chat_template")),
                        "bytesThroughWasm": source.bytes_read,
                        "dispatchesPerToken": engine.backend.dispatches_per_token,
                        "loadSeconds": time.perf_counter() - t0})
        except Exception as err:   # noqa: BLE001 - every failure goes to the page with a name
            return _js({"ok": False, "error": error_dict(err)})

    def stop(self):
        self._stopping = True

    async def generate(self, prompt, max_tokens, chat, msg_id):
        """Generate after `prompt`, streaming text; max_tokens None: DEFAULT_MAX_TOKENS."""
        if self.engine is None:
            return _js({"ok": False, "error": error_dict(InvalidArgument("no model is loaded: load one first"))})
        pending, last, posts = [], [time.perf_counter()], [0]

        def on_text(piece):
            pending.append(piece)
            now = time.perf_counter()
            if now - last[0] >= _POST_EVERY_S:
                self.post(_js({"id": msg_id, "kind": "token", "text": "".join(pending)}))
                posts[0] += 1
                pending.clear()
                last[0] = now

        try:
            self._stopping = False
            calls0 = dict(self.device.calls())
            result = await self.engine.generate(str(prompt), max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else int(max_tokens), chat=bool(chat),
                                                on_text=on_text, should_stop=lambda: self._stopping)
            if pending:
                self.post(_js({"id": msg_id, "kind": "token", "text": "".join(pending)}))
            calls = {k: v - calls0.get(k, 0) for k, v in self.device.calls().items() if v != calls0.get(k, 0)}
            calls["postMessage"] = posts[0]   # streamed text (the final flush and the result not counted)
            return _js({"ok": True, "text": result.text, "tokens": list(result.tokens),   # ids, as `python -m cera generate --json`
                        "promptTokens": len(result.prompt_tokens),
                        "stopReason": result.stop_reason,
                        "prefillSeconds": result.prefill_s, "decodeSeconds": result.decode_s,
                        "decodeTokensPerS": result.decode_tokens_per_s,
                        "prefillTokensPerS": result.prefill_tokens_per_s,
                        "hostCalls": calls})
        except Exception as err:   # noqa: BLE001
            return _js({"ok": False, "error": error_dict(err)})
        finally:
            self._stopping = False
