"""An Engine on its own thread and event loop, for callers that are not async (`cera.load`) or
whose event loop must stay free while the GPU works (`python -m cera serve`).

The native host waits for the GPU inside its coroutines without yielding to the event loop, so a
generation run on a server's loop would stall every other connection until it ended. Here the
engine gets a private loop in a daemon thread; callers on any thread submit `Job`s and get
`concurrent.futures.Future`s back. Jobs run one at a time, in the order they were submitted.
The browser has no threads: its worker (web/cera_web) runs Jobs (cera.jobs) with `run_job` on its
own loop.
"""
from __future__ import annotations

import asyncio
import os
import sys
import threading
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

from cera import catalogue, hub
from cera.engine import DEFAULT_CTX, Engine
from cera.errors import InvalidArgument, ModelNotFound
from cera.jobs import Job, run_job
from cera.gguf_file import GGUFFile
from cera.gpu.model import DEFAULT_CHUNK
from cera.gpu.numerics import EXACT, Numerics
from cera.prefix import PrefixCache

BACKENDS = ("auto", "gpu", "reference")
DEFAULT_BACKEND = os.environ.get("CERA_BACKEND", "auto")
# 1: the GPU as WebGPU's default limits and no shader-f16 or subgroups leave it (a portability check)
WEBGPU_BASELINE = os.environ.get("CERA_WEBGPU_BASELINE") == "1"


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
