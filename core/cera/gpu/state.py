"""The GPU buffers a model computes in: activations per row count, and the state a sequence
carries from one step to the next. All f32, row-major, one row per token; allocated once.

A new kind of per-sequence state (a cache, a rolling buffer) goes in `State`, with what
`reset()` does to it at the start of a sequence.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from cera.config import ModelConfig
from cera.device import Binding, Device
from cera.gpu import layers

STEP_BYTES = 16


def pack_step(pos: int, n_tokens: int) -> bytes:
    # struct Step (shaders/common.wgsl) { pos: u32, n_tokens: u32, _pad0: u32, _pad1: u32 }
    return struct.pack("<4I", pos, n_tokens, 0, 0)


def f32_buffer(device: Device, label: str, *shape: int) -> Binding:
    """A zeroed f32 buffer of `shape` (the shape comment lives at the call)."""
    n = 1
    for d in shape:
        n *= d
    return Binding(device.buffer(4 * n, label), 0, 4 * n)


@dataclass(frozen=True)
class Activations:
    """What one step of up to `rows` tokens computes in."""
    rows: int
    x: Binding                    # (rows, hidden) residual stream
    xb: Binding                   # (rows, hidden) normed block input (prefill: the norm runs apart)
    hb: Binding                   # (rows, ff) ffn hidden: silu(gate) * up
    qkv: Binding | None = None    # (q_dim + 2 kv,) q | k | v of a stacked matvec (decode)
    q: Binding | None = None      # (rows, q_dim)
    k: Binding | None = None      # (rows, kv)
    v: Binding | None = None      # (rows, kv)
    q_rot: Binding | None = None  # (rows, q_dim) q after [QK-norm and] RoPE
    att: Binding | None = None    # (rows, q_dim) attention output
    bcx: Binding | None = None    # (rows, 3 hidden) lfm2 in_proj output: B, C, x
    conv_out: Binding | None = None   # (rows, hidden)

    @classmethod
    def allocate(cls, device: Device, cfg: ModelConfig, rows: int) -> "Activations":
        h, r = cfg.hidden, rows
        buf = lambda name, *shape: f32_buffer(device, f"{name}@{r}", *shape)
        a = dict(x=buf("x", r, h), xb=buf("xb", r, h), hb=buf("hb", r, cfg.ff))
        if cfg.attention_layers:
            kv = max(cfg.kv_dim(i) for i in cfg.attention_layers)
            if r == 1:
                a["qkv"] = buf("qkv", cfg.q_dim + 2 * kv)
            a.update(q=buf("q", r, cfg.q_dim), k=buf("k", r, kv), v=buf("v", r, kv),
                     q_rot=buf("q_rot", r, cfg.q_dim), att=buf("att", r, cfg.q_dim))
        if cfg.conv_layers:
            a.update(bcx=buf("bcx", r, 3 * h), conv_out=buf("conv_out", r, h))
        return cls(rows, **a)


@dataclass(frozen=True)
class State:
    """Per-model buffers that outlive a step: the Step uniform, token ids, logits, and per layer
    the KV cache or conv state."""
    step: Binding                          # the Step uniform: position and row count of a submission
    tokens: Binding                        # (chunk,) u32 token ids; tokens[0] = the last argmax
    logits: Binding                        # (vocab,) of one row
    key_cache: dict[int, Binding]          # layer -> (ctx, kv heads, head_dim)
    value_cache: dict[int, Binding]        # layer -> (ctx, kv heads, head_dim)
    conv_state: dict[int, Binding]         # layer -> (conv_kernel - 1, hidden) rolling B*x rows
    attention_scratch: Binding | None      # split-KV partials of decode attention, shared by the layers

    @classmethod
    def allocate(cls, device: Device, cfg: ModelConfig, ctx: int, chunk: int) -> "State":
        step = Binding(device.buffer(STEP_BYTES, "step", uniform=True), 0, STEP_BYTES)
        tokens = Binding(device.buffer(4 * chunk, "tokens"), 0, 4)
        kv = lambda name, i: f32_buffer(device, f"blk.{i}.{name}", ctx, cfg.kv_dim(i))
        scratch = None
        if cfg.attention_layers:
            scratch = Binding(device.buffer(layers.attention_scratch_bytes(
                head_dim=cfg.head_dim, n_heads=cfg.n_heads, max_ctx=ctx), "attention_scratch"))
        return cls(step, tokens, f32_buffer(device, "logits", cfg.vocab_size),
                   {i: kv("key_cache", i) for i in cfg.attention_layers},
                   {i: kv("value_cache", i) for i in cfg.attention_layers},
                   {i: f32_buffer(device, f"blk.{i}.conv_state", cfg.conv_kernel - 1, cfg.hidden)
                    for i in cfg.conv_layers},
                   scratch)

    def reset(self, device: Device) -> None:
        """Start a sequence: zero the conv states. The KV caches need no clearing: attention
        reads only the positions the current sequence has written."""
        for b in self.conv_state.values():
            device.write(b.buffer, bytes(b.size))
