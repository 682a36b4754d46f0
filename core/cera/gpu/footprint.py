"""The GPU memory a model will take, from its GGUF header and config alone (nothing is
allocated): the weights as they will sit on the GPU (`cera.gpu.residency`'s rules), the KV
cache in its cache types (`cera.gpu.numerics`) and the rest of the per-sequence state at a context, and the activations of a decode
step and of a prefill chunk (`cera.gpu.state`).

`GpuModel` checks it against the adapter's limits before it allocates anything. WebGPU has
no total-memory limit to check against, only the largest buffer (`max_buffer_size`): a
model with a buffer above it is refused, naming the buffer; the total is shown, not checked.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from cera.config import ROPE_FACTORS, ROPE_LONG, ROPE_SHORT, ModelConfig
from cera.device import Limits, buffer_size
from cera.errors import TooLarge
from cera.gpu.numerics import EXACT, Numerics
from cera.gpu.residency import is_vector, qkv_runs, resident_bytes, resident_type
from cera.gpu.sample import SamplerBuffers
from cera.gpu.state import Activations, GreedyChain, State

DEFAULT_ALIGNMENT = 256   # WebGPU's default minStorageBufferOffsetAlignment, when no adapter is known


@dataclass(frozen=True)
class Fallback:
    """A matrix whose type has no GPU kernel, dequantized to F16 at load."""
    tensor: str
    type_name: str
    file_bytes: int
    gpu_bytes: int


@dataclass(frozen=True)
class Footprint:
    """Every buffer a model on the GPU allocates at load, label -> bytes, by kind."""
    ctx: int
    chunk: int                    # rows of a prefill chunk (1: prompts run through the decode plan)
    cache_types: tuple[str, str]  # what the KV cache stores K and V in
    weights: dict[str, int]
    state: dict[str, int]         # KV caches, conv states, Step uniform, token ids, logits, scratch,
                                  # the greedy chain's tokens and conv records
    activations: dict[str, int]   # per row count: "x@1", "x@512", ...
    fallbacks: tuple[Fallback, ...]

    @property
    def buffers(self) -> dict[str, int]:
        return {**self.weights, **self.state, **self.activations}

    @property
    def kv_cache(self) -> int:
        return sum(n for label, n in self.state.items() if label.endswith(("key_cache", "value_cache")))

    @property
    def total(self) -> int:
        return sum(self.buffers.values())

    def check(self, limits: Limits) -> None:
        """Raise TooLarge, naming the largest buffer, if any buffer is above limits.max_buffer_size."""
        limit = limits.max_buffer_size
        over = sorted(((n, label) for label, n in self.buffers.items() if n > limit), reverse=True)
        if not over:
            return
        n, label = over[0]
        more = f" (and {len(over) - 1} more buffers)" if len(over) > 1 else ""
        shrink = " A smaller context shrinks the KV cache." if label in self.state else ""
        raise TooLarge(f"{label} needs {n} bytes; this GPU's largest buffer is {limit} bytes{more}. "
                       f"The model needs {_mib(self.total)} of GPU memory in all at context {self.ctx}.{shrink}")

    def to_dict(self) -> dict:
        largest = max(self.buffers.items(), key=lambda item: item[1])
        return {"ctx": self.ctx, "prefill_chunk": self.chunk, "weights": sum(self.weights.values()),
                "kv_cache": self.kv_cache, "cache_type_k": self.cache_types[0], "cache_type_v": self.cache_types[1], "state": sum(self.state.values()) - self.kv_cache,
                "activations": sum(self.activations.values()), "total": self.total,
                "largest_buffer": {"name": largest[0], "bytes": largest[1]},
                "fallbacks": [vars(f) for f in self.fallbacks]}


def footprint(cfg: ModelConfig, gguf_file, ctx: int, chunk: int, limits: Limits | None = None,
              numerics: Numerics = EXACT) -> Footprint:
    """What `GpuModel(cfg, gguf_file, device, ctx, chunk, numerics)` allocates at load on a device
    with `limits` (their offset alignment decides which q/k/v projections are stacked): the KV
    cache in numerics' cache types, and with its int8 a buffer of x in integers for the prefill
    chunk."""
    chunk = ctx if cfg.encoder else min(chunk, ctx)   # an encoder (cera.gpu.encoder): a text a step
    align = limits.min_storage_buffer_offset_alignment if limits else DEFAULT_ALIGNMENT
    weights, fallbacks = _weights(cfg, gguf_file.tensors, align, ctx)
    activations = {f"{name}@{rows}": 4 * math.prod(shape) for rows in sorted({chunk} if cfg.encoder else {1, chunk})
                   for name, shape in Activations.shapes(cfg, rows, numerics.int8).items()}
    sized = lambda d: {label: buffer_size(n) for label, n in d.items()}
    state = State.sizes(cfg, ctx, chunk, numerics.cache_types)
    if not cfg.encoder:   # an encoder neither decodes nor samples
        state |= GreedyChain.sizes(cfg) | SamplerBuffers.sizes(cfg, ctx)
    return Footprint(ctx, chunk, numerics.cache_types, weights, sized(state), sized(activations), fallbacks)


def _weights(cfg: ModelConfig, tensors: dict, align: int, ctx: int) -> tuple[dict[str, int], tuple[Fallback, ...]]:
    """Weight buffers, label -> bytes: every tensor the model reads, with q/k/v stacked (and
    their biases) as decode and prefill read them, and the one set of RoPE frequency factors a
    context of ctx uses (LongRoPE's long or short). (A LoRA adapter on one of them has a prefill
    chunk read the projections one by one, inside the stacked buffer where their offsets allow,
    stacked_parts, else from buffers of their own, uncounted here.)"""
    names = dict.fromkeys([*cfg.all_tensors(), *[cfg.lm_head] * (not cfg.encoder)])
    for name in (ROPE_FACTORS, ROPE_LONG, ROPE_SHORT):
        if name != cfg.rope_factors(ctx):
            names.pop(name, None)
    stacked = {}
    for i in () if cfg.qkv_fused else cfg.attention_layers:
        for run in qkv_runs(cfg, tensors, i, align) or []:
            if len(run) == 1:
                continue
            parts = [tensors[f"blk.{i}.attn_{p}.weight"] for p in run]
            stacked[f"blk.{i}.attn_{run}.weight"] = sum(t.nbytes for t in parts)
            if cfg.qkv_bias:
                stacked[f"blk.{i}.attn_{run}.bias"] = 4 * sum(t.shape[0] for t in parts)
            for p in run:   # read only stacked: no buffer of its own
                for name in (f"blk.{i}.attn_{p}.weight", f"blk.{i}.attn_{p}.bias"):
                    names.pop(name, None)
    weights = {name: resident_bytes(tensors[name], is_vector(name)) for name in names} | stacked
    for i in cfg.attention_layers if cfg.qk_norm else ():   # q's and k's norms: one buffer (Weights.vectors)
        norms = (f"blk.{i}.attn_q_norm.weight", f"blk.{i}.attn_k_norm.weight")
        weights[" | ".join(norms)] = sum(weights.pop(name) for name in norms)
    fallbacks = []
    for name in names:
        t = tensors[name]
        if not is_vector(name) and resident_type(t, vector=False) != t.ggml_type:
            fallbacks.append(Fallback(name, t.type_name, t.nbytes, weights[name]))
    return {label: buffer_size(n) for label, n in weights.items()}, tuple(fallbacks)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
