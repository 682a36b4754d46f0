"""The worker's Python side: one model on one WebDevice, driven by messages from worker.js.

Results and errors go back as plain dicts; errors carry a `name` the page turns into
advice (BadFile, Unsupported, TooLarge, DeviceLost, ShaderError, Error).
"""
from __future__ import annotations

import gc
import time

from js import Object
from pyodide.ffi import to_js

from .host import WebDevice
from .sources import BlobSource

_POST_EVERY_S = 0.03     # stream text to the page at most this often (one postMessage each)
DEFAULT_CTX = 2048       # as `python -m cera --ctx`: the KV cache is allocated for this many positions
_sessions: list = []     # every Session made (one per worker): tests reach the device through it


def _js(value):
    return to_js(value, dict_converter=Object.fromEntries)


def classify(err: BaseException) -> dict:
    """An exception as {name, message} for the page."""
    message = str(err) or type(err).__name__
    low = message.lower()
    if "past end of file" in low or "header truncated" in low:
        message += " (the file is truncated: download it again)"
    if "failed to compile" in low:
        name = "ShaderError"
    elif low.startswith("webgpu error") or "offsetalignment" in low:
        name = "GPUError"
    elif "device" in low and "lost" in low:
        name = "DeviceLost"
    elif any(s in low for s in ("magic invalid", "truncated", "past end of file", "gguf version",
                                 "counts absurd", "not a gguf")):
        name = "BadFile"
    elif any(s in low for s in ("too large for this gpu", "largest buffer", "maxbuffersize",
                                 "maxstoragebufferbindingsize", "max_storage_buffer_binding_size",
                                 "storage binding limit",
                                 "workgroups in one dimension")):
        name = "TooLarge"
    elif any(s in low for s in ("unsupported", "not supported", "no matvec kernel", "unknown ggml type",
                                 "not implemented", "no rope layout", "cannot be dequantized")):
        name = "Unsupported"
    else:
        name = "Error"
    return {"name": name, "message": message}


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
        return _js({"adapter": d.adapter_name, "features": sorted(d.features),
                    "limits": dict(d.limits.__dict__)})

    def _progress(self, msg_id, phase):
        def progress(done, total):
            self.post(_js({"id": msg_id, "kind": "progress", "phase": phase, "done": done, "total": total}))
        return progress

    async def load(self, blob, msg_id, ctx=DEFAULT_CTX):
        """Parse the GGUF header from the Blob, build the plan, upload the weights."""
        try:
            from cera.engine import Engine
            from cera.gguf_file import GGUFFile

            t0 = time.perf_counter()
            self.engine = None
            gc.collect()                      # the previous model's buffers: freed on the GPU now
            self.device.release_unused()
            source = BlobSource(blob, self.host)
            gguf = GGUFFile(source)
            engine = await Engine.load(gguf, self.device, ctx=int(ctx), progress=self._progress(msg_id, "upload"))
            await self.device.check()
            self.engine, self.source = engine, source
            cfg = engine.cfg
            return _js({"ok": True, "name": source.name, "arch": gguf.arch, "bytes": source.size,
                        "layers": cfg.n_layers, "vocab": cfg.vocab_size, "ctx": engine.ctx,
                        "hasChatTemplate": bool(gguf.metadata.get("tokenizer.chat_template")),
                        "bytesThroughWasm": source.bytes_read,
                        "dispatchesPerToken": getattr(engine.backend, "dispatches_per_token", 0),
                        "loadSeconds": time.perf_counter() - t0})
        except Exception as err:   # noqa: BLE001 - every failure goes to the page with a name
            return _js({"ok": False, "error": classify(err)})

    def stop(self):
        self._stopping = True

    async def generate(self, prompt, max_tokens, chat, msg_id):
        if self.engine is None:
            return _js({"ok": False, "error": {"name": "Error", "message": "load a model first"}})
        pending, last = [], [time.perf_counter()]

        posts = [0]

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
            result = await self.engine.generate(str(prompt), max_tokens=int(max_tokens), chat=bool(chat),
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
            return _js({"ok": False, "error": classify(err)})
        finally:
            self._stopping = False
