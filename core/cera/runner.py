"""An Engine on its own thread and event loop, for callers that are not async (`cera.load`) or
whose event loop must stay free while the GPU works (`python -m cera serve`).

The native host waits for the GPU inside its coroutines without yielding to the event loop, so a
generation run on a server's loop would stall every other connection until it ended. Here the
engine gets a private loop in a daemon thread; callers on any thread submit `Job`s and get
`concurrent.futures.Future`s back. Jobs run one at a time, in the order they were submitted.
The browser has no threads: its worker (web/cera_web) runs Jobs with `run_job` on its own loop.
"""
from __future__ import annotations

import asyncio
import os
import sys
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path

from cera import catalogue, hub
from cera.engine import DEFAULT_CTX, DEFAULT_MAX_TOKENS, Engine, Result
from cera.errors import InvalidArgument, ModelNotFound
from cera.gguf_file import GGUFFile
from cera.gpu.model import DEFAULT_CHUNK
from cera.gpu.numerics import EXACT, Numerics
from cera.prefix import PrefixCache
from cera.sampling import Sampler
from cera.tools import CallText, Tools, call_format, forced_call

BACKENDS = ("auto", "gpu", "reference")
DEFAULT_BACKEND = os.environ.get("CERA_BACKEND", "auto")
# 1: the GPU as WebGPU's default limits and no shader-f16 or subgroups leave it (a portability check)
WEBGPU_BASELINE = os.environ.get("CERA_WEBGPU_BASELINE") == "1"


@dataclass
class Job:
    """One generation. `prompt` is text or token ids, sent as is; `messages` (instead of a
    prompt) is a conversation, rendered with the model's chat template. Generation ends at
    the first of `stop` (that text and what follows are left out), EOS, or `max_tokens`."""
    prompt: str | list[int] | None = None
    messages: list[dict] | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    sampler: Sampler = field(default_factory=Sampler)
    stop: tuple[str, ...] = ()
    adapters: tuple[str | int, ...] | None = None   # LoRA adapters by name or index; None: every one loaded
    tools: Tools | None = None   # the functions a chat reply may call (cera.tools)
    logprobs: int | None = None  # report each token's log-probability and this many alternatives' (Engine.generate)

    @property
    def constrained(self) -> bool:
        """Whether the reply is constrained (a grammar engine is needed)."""
        return self.sampler.constraint is not None or bool(self.tools and self.tools.forced)

    def prompt_ids(self, engine: Engine) -> list[int]:
        if (self.prompt is None) == (self.messages is None):
            raise InvalidArgument("a Job takes a prompt or messages, not both")
        if self.tools is not None and self.messages is None:
            raise InvalidArgument("tools go with a conversation (messages), not a plain prompt")
        if self.messages is not None:
            return engine.chat_tokens(self.messages, self.tools)
        return engine.prompt_tokens(self.prompt) if isinstance(self.prompt, str) else list(self.prompt)


class StopText:
    """Cuts streamed text at the first stop string. push() returns the text that is safe to
    show: a tail that could still grow into a stop string is held back until it cannot."""

    def __init__(self, stops):
        self.stops = [s for s in stops if s]
        self.held = ""
        self.hit = False

    def push(self, piece: str) -> str:
        if self.hit:
            return ""
        text = self.held + piece
        found = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if found:
            self.hit, self.held = True, ""
            return text[:min(found)]
        keep = max((n for s in self.stops for n in range(min(len(s) - 1, len(text)), 0, -1)
                    if text.endswith(s[:n])), default=0)
        self.held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held


async def run_job(engine: Engine, job: Job, on_text=None, should_stop=None) -> Result:
    """Run `job` on the caller's event loop. Text goes to on_text(piece) cut at the first stop
    string (a tail that may still become one is held back), and with tools, up to where a call
    may begin (the calls come back parsed in the Result's tool_calls; cera.tools). should_stop(),
    asked before the job starts and before each token, ends it early. stop_reason: the engine's,
    or "stop_string", "cancelled" (should_stop said so) or "tool_calls"."""
    on_text = on_text or (lambda piece: None)
    should_stop = should_stop or (lambda: False)
    if should_stop():   # left while waiting its turn: nothing to run
        return Result("", [], [], "cancelled", 0.0, 0.0)
    stops = StopText(job.stop)
    fmt = call_format(engine.chat_template) if job.tools is not None else None
    calls = CallText(fmt, job.tools.names) if fmt else None
    shown = []

    def show(piece: str) -> None:
        if text := stops.push(piece):
            shown.append(text)
            if calls is not None:
                text = calls.push(text)
            if text:
                on_text(text)

    adapters = range(len(engine.loras)) if job.adapters is None else job.adapters
    sampler, ids = job.sampler, job.prompt_ids(engine)
    call = forced_call(job.tools, fmt) if fmt else None
    if call is not None:
        if sampler.constraint is not None:
            raise InvalidArgument("a reply is a tool call (tool_choice) or fits a response_format, not both")
        sampler = replace(sampler, constraint=call.constraint)
        ids += engine.tokenizer.encode(call.opening, add_special=False, parse_special=True)
        calls.push(call.opening)
    result = await engine.generate(ids, job.max_tokens, on_text=show, sampler=sampler,
                                   should_stop=lambda: stops.hit or should_stop(), adapters=adapters,
                                   logprobs=job.logprobs)
    if tail := stops.flush():
        shown.append(tail)
        on_text(calls.push(tail) if calls else tail)
    reason = "stop_string" if stops.hit else "cancelled" if result.stop_reason == "stopped" \
        else result.stop_reason
    text, found = "".join(shown), []
    if calls is not None:
        if call is not None and result.stop_reason == "eos":
            calls.push(call.closing)
        held, text, found = calls.end()
        if held:
            on_text(held)
        reason = "tool_calls" if found else reason
    return replace(result, text=text or "", stop_reason=reason, tool_calls=found)


def lora_path(adapter: str | Path) -> Path:
    """A LoRA adapter's GGUF: a path, a URL or a Hugging Face id (cera.hub), downloaded on first
    use; it is checked against the model when loaded (Engine.load_lora)."""
    adapter = str(adapter)
    if Path(adapter).is_file():
        return Path(adapter)
    if not hub.is_remote(adapter):
        raise ModelNotFound(f"no such LoRA adapter file: {adapter!r} (or a URL, or a Hugging Face id: "
                            "ORG/REPO:QUANT, ORG/REPO/FILE.gguf)")
    return hub.fetch(adapter, catalogue.url_cache())


async def load_loras(engine: Engine, loras, progress=None) -> None:
    """Load LoRA adapters given as (name, scale) into `engine`, each named by its file's name."""
    for adapter, scale in loras:
        path = lora_path(adapter)
        await engine.load_lora(GGUFFile.open(path), path.name, scale, progress)


def open_device(backend: str):
    """The native GPU device, or None for the numpy reference. "auto" takes the GPU unless its
    adapter emulates one on the CPU (lavapipe, SwiftShader): there the numpy reference is much
    faster (docs/PERFORMANCE.md, decisions), so it runs, saying so."""
    if backend not in BACKENDS:
        raise InvalidArgument(f"backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if backend == "reference":
        return None
    from cera.native import NativeDevice   # the native host; the core never imports it otherwise
    device = NativeDevice(baseline=WEBGPU_BASELINE)
    if backend == "auto" and device.cpu_emulated:
        print(f"cera: the GPU adapter is {device.adapter_name}, a CPU emulation: running the numpy reference, "
              "which is faster there (--backend gpu runs the kernels anyway)", file=sys.stderr, flush=True)
        return None
    return device


async def load_engine(model: str | Path = catalogue.DEFAULT_MODEL, ctx: int | None = DEFAULT_CTX,
                      backend: str = DEFAULT_BACKEND, prefill_chunk: int = DEFAULT_CHUNK, progress=None,
                      prefix_cache_mb: int = 0, prefix_cache_dir: str | None = None, lora=(),
                      numerics: Numerics = EXACT):
    """(engine, device or None) for `model` (catalogue.resolve's names) on `backend`
    (`open_device`), with its LoRA adapters loaded. prefix_cache_mb > 0 keeps the states after
    earlier prompts (cera.prefix), apart for each backend and numerics, cache types included
    (their states differ; the reference ignores the opt-ins)."""
    device, path = open_device(backend), catalogue.resolve(str(model))
    kind = f"gpu-{numerics.tag}" if device else f"reference-{replace(numerics, int8=False, f16=False).tag}"
    cache = PrefixCache.for_model(path, kind, prefix_cache_mb, prefix_cache_dir) if prefix_cache_mb else None
    engine = await Engine.load(GGUFFile.open(path), device, ctx=ctx, progress=progress, prefill_chunk=prefill_chunk,
                               prefix_cache=cache, numerics=numerics)
    await load_loras(engine, lora, progress)
    return engine, device


class Runner:
    """One engine behind a private event loop thread. Build it with `Runner.load`."""

    def __init__(self):
        self.engine: Engine | None = None
        self.adapter: str | None = None
        self._loop = asyncio.new_event_loop()
        self._turn = asyncio.Lock()   # FIFO: jobs run in the order they were submitted
        self._thread = threading.Thread(target=self._loop.run_forever, name="cera-engine", daemon=True)
        self._thread.start()

    @classmethod
    def load(cls, model: str | Path = catalogue.DEFAULT_MODEL, ctx: int | None = DEFAULT_CTX,
             backend: str = DEFAULT_BACKEND,
             prefill_chunk: int = DEFAULT_CHUNK, progress=None, prefix_cache_mb: int = 0,
             prefix_cache_dir: str | None = None, lora=(), numerics: Numerics = EXACT) -> "Runner":
        """Load `model` on the engine thread (`load_engine`'s arguments; lora: jobs pick among
        the adapters); raises what loading raises."""
        runner = cls()
        try:
            runner.call(runner._load(model, ctx, backend, prefill_chunk, progress, prefix_cache_mb, prefix_cache_dir,
                                     lora, numerics))
        except BaseException:
            runner.close()
            raise
        return runner

    async def _load(self, *args) -> None:
        self.engine, device = await load_engine(*args)
        self.adapter = device.adapter_name if device else None

    def call(self, coro):
        """Run a coroutine on the engine thread and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def submit(self, job: Job, on_text=None, should_stop=None) -> Future:
        """Queue `job`; the Future gives its Result. on_text(piece) is called on the engine
        thread as text becomes final. should_stop() (called from the engine thread, before the
        job starts and before each token) ends it early: stop_reason "cancelled"."""
        return self.queue(lambda engine: run_job(engine, job, on_text, should_stop))

    def queue(self, work) -> Future:
        """Queue `work(engine)`, a coroutine function, behind the jobs before it (FIFO); the
        Future gives what it returns."""
        return asyncio.run_coroutine_threadsafe(self._in_turn(work), self._loop)

    async def _in_turn(self, work):
        async with self._turn:
            return await work(self.engine)

    def close(self) -> None:
        """Cancel the jobs (one in progress ends after its current step) and stop the thread."""
        if self._thread.is_alive():
            self.call(self._cancel_all())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    @staticmethod
    async def _cancel_all() -> None:
        jobs = asyncio.all_tasks() - {asyncio.current_task()}
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
