#!/usr/bin/env python3
"""What a sampled token costs to read back, on whatever WebGPU adapter is present: the GPU's
top-k selection (shaders/topk.wgsl: 8 (k + w) + 4 w bytes back) against the whole row of
logits (4 * vocab bytes back), each followed by the sampler's own work on the CPU.

  1. per step, on a logits buffer of each vocabulary size (SmolLM2's 49152, Qwen2.5's 151936):
     submit + read back + sample, repeated until --min-time seconds pass; the best of --repeat
     rounds, in ms;
  2. whole decode, on a real model (--model, a catalogue name or GGUF path; "" skips it):
     tokens/s of `Engine.generate` with the same sampler, through the top-k selection and
     with the whole row forced, alternating, the best of --repeat runs each. (On lavapipe a
     decode step takes hundreds of ms and varies more than the readbacks differ.)

The sampler: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, repeat penalty 1.1 over the
last 64 tokens (w: the distinct tokens among them).

    python scripts/bench_sampling.py
    python scripts/bench_sampling.py --model "" --min-time 0.5
"""
from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

from cera import catalogue
from cera.device import Binding
from cera.engine import Engine
from cera.gguf_file import GGUFFile
from cera.gpu import layers
from cera.kernels import Kernels
from cera.sampling import Candidates, Sampler

VOCABS = {"smollm2": 49152, "qwen2.5": 151936}
SETTINGS = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1, penalty_last_n=64)


def timed(step, min_time: float, repeat: int) -> float:
    """Best of `repeat` rounds of the mean seconds per call of step(), each round >= min_time."""
    best = float("inf")
    for _ in range(repeat):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < min_time:
            step()
            n += 1
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def bench_step(device, kernels, vocab: int, min_time: float, repeat: int) -> dict:
    """ms per sampled token for each readback, on random logits of `vocab`."""
    rng = np.random.default_rng(0)
    row = (rng.standard_normal(vocab) * 3).astype(np.float32)
    history = rng.integers(0, vocab, 64).tolist() * 2           # prompt + reply: w = 64 distinct tokens
    logits = device.buffer(4 * vocab, "logits")
    device.write(logits, row.tobytes())
    params = Binding(device.buffer(4 * (2 + layers.TOP_K_MAX), "top_k.params"))
    out = Binding(device.buffer(4 * 3 * layers.TOP_K_MAX, "top_k.out"))
    schedule = device.schedule([layers.top_k(kernels, device, out, Binding(logits), params, n=vocab)])
    sampler = Sampler(**SETTINGS, seed=0)
    request = sampler.request(history, vocab)

    def top_k():
        device.write(params.buffer, layers.pack_top_k(request.k, request.watch))
        raw = asyncio.run(device.run(schedule, Binding(out.buffer, 0, 8 * request.k + 4 * len(request.watch))))
        ids, values, watched = layers.unpack_top_k(raw, request.k)
        sampler.sample(Candidates(np.concatenate([ids, np.asarray(request.watch)]), np.concatenate([values, watched])),
                       history)

    def whole_row():
        sampler.sample(np.frombuffer(asyncio.run(device.read(logits, 0, 4 * vocab)), np.float32), history)

    top_k()   # compiles the kernel
    return {"top_k_bytes": 8 * request.k + 4 * len(request.watch), "row_bytes": 4 * vocab,
            "top_k_ms": 1e3 * timed(top_k, min_time, repeat), "row_ms": 1e3 * timed(whole_row, min_time, repeat)}


def bench_decode(device, model: str, tokens: int, repeat: int) -> dict:
    """Decode tokens/s with the sampler, through the top-k selection and through the whole row."""
    engine = asyncio.run(Engine.load(GGUFFile.open(catalogue.resolve(model)), device, ctx=256, prefill_chunk=16))
    best = {"top_k": 0.0, "row": 0.0}
    for _ in range(repeat):
        for path in best:
            sampler = Sampler(**SETTINGS, seed=0)
            if path == "row":
                sampler.request = lambda history, vocab: None   # what the engine falls back to without top-k
            engine.reset()
            result = asyncio.run(engine.generate("Once upon a time", tokens, sampler=sampler, stop_at_eos=False))
            best[path] = max(best[path], result.decode_tokens_per_s)
    return best


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds of repeats per measurement")
    ap.add_argument("--repeat", type=int, default=3, help="rounds per measurement; the best is reported")
    ap.add_argument("--model", default=catalogue.DEFAULT_MODEL,
                    help="model for the whole-decode comparison (catalogue name or GGUF path; '' skips it)")
    ap.add_argument("--tokens", type=int, default=24, help="tokens decoded per whole-decode run")
    args = ap.parse_args(argv)

    from cera.native import NativeDevice
    device = NativeDevice()
    print(f"adapter: {device.adapter_name}")
    print(f"sampler: {SETTINGS}")
    kernels = Kernels(device)
    for name, vocab in VOCABS.items():
        r = bench_step(device, kernels, vocab, args.min_time, args.repeat)
        print(f"{name} vocab {vocab}: top-k {r['top_k_ms']:.2f} ms/token ({r['top_k_bytes']} B back), "
              f"whole row {r['row_ms']:.2f} ms/token ({r['row_bytes']} B back): "
              f"top-k {r['row_ms'] / r['top_k_ms']:.2f}x faster")
    if args.model:
        r = bench_decode(device, args.model, args.tokens, args.repeat)
        print(f"{args.model} decode, {args.tokens} sampled tokens: top-k {r['top_k']:.2f} tok/s, "
              f"whole row {r['row']:.2f} tok/s")


if __name__ == "__main__":
    main()
