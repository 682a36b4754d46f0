"""The GPU buffers a model computes in: activations per row count, and the state a sequence
carries from one step to the next. All f32 (but the KV caches, in their cache types:
cera.gpu.numerics), row-major, one row per token; allocated once.

A new kind of per-sequence state (a cache, a rolling buffer) goes in `State`, with what
`reset()` does to it at the start of a sequence.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, replace

from cera.config import ModelConfig
from cera.device import Binding, Device
from cera.gpu import attention, matmul, matvec
from cera.gpu.numerics import cache_row_bytes

STEP_FORMAT = "<4I"   # struct Step (shaders/common.wgsl) { pos: u32, n_tokens: u32, chain: u32, draw: u32 }
STEP_BYTES = struct.calcsize(STEP_FORMAT)
# Decode steps per chained submission (greedy or sampled). A submission costs the host a fixed
# amount beyond encoding its dispatches (command encoder, submit, a readback mapped and awaited, the
# Python between), and with one submission in flight ahead the GPU idles whenever that turnaround
# outlasts the queued work; 8 steps cut that fixed cost per token by 8x and queue 8 steps of GPU
# work ahead. A stop (EOS, a stop string) wastes what is in flight, up to 2 * 8 - 1 steps, and
# tokens reach the caller 8 at a time: more would buy little (the fixed cost is already an eighth)
# for more of both.
GREEDY_BATCH = 8


def pack_step(pos: int, n_tokens: int, draw: int = 0) -> bytes:
    return struct.pack(STEP_FORMAT, pos, n_tokens, 0, draw)


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
    qkv: Binding | None = None    # (rows, q_dim + 2 kv) q | k | v of a stacked projection
    q: Binding | None = None      # (rows, q_dim)
    k: Binding | None = None      # (rows, kv)
    v: Binding | None = None      # (rows, kv)
    q_rot: Binding | None = None  # (rows, q_dim) q after [QK-norm and] RoPE
    att: Binding | None = None    # (rows, q_dim) attention output
    bcx: Binding | None = None    # (rows, 3 hidden) lfm2 in_proj output: B, C, x
    conv_out: Binding | None = None   # (rows, hidden)
    lora_t: Binding | None = None     # (rows, rank) A x' of a LoRA pair (rank: the largest loaded)
    up: Binding | None = None         # (rows, ff) up projection of an FFN whose GLU runs apart (LoRA on gate/up)
    xi: Binding | None = None         # (rows, x_int_stride) u32: a matmul's x in integers (matmul.quantize_x);
                                      # decode's: a matvec's x that is not normed (matvec.record_words)
    xbi: Binding | None = None        # (rows, x_int_stride(hidden)) u32: xb in integers (matmul.rms_norm_x_int);
                                      # decode's (one row): as its matvecs read them (matvec.record_words)
    parts: Binding | None = None      # (SPLIT_MAX, rows, hidden): K's parts of a split matmul (matmul.k_parts)

    @staticmethod
    def shapes(cfg: ModelConfig, rows: int, int8: bool = False) -> dict[str, tuple[int, ...]]:
        """field -> f32 shape of every buffer `allocate` makes for `rows` rows (with `int8`:
        cera.gpu.numerics' prefill on 8-bit x, which quantizes x into xi)."""
        h, r = cfg.hidden, rows
        a = dict(x=(r, h), xb=(r, h), hb=(r, cfg.ff))
        if rows > 1 and max(cfg.ff, cfg.q_dim) >= 2 * matmul.SPLIT_MIN_K:   # a K that may be split
            a["parts"] = (matmul.SPLIT_MAX, r, h)
        if rows > 1 and int8:
            a["xi"] = (r, matmul.x_int_stride(-(-max(h, cfg.ff, cfg.q_dim) // 256) * 256))
            if h % 256 == 0:
                a["xbi"] = (r, matmul.x_int_stride(h))
        if rows == 1 and h >= matvec.RECORD_MIN_K and h % 256 == 0:   # decode's records of x (matvec.uses_record)
            a["xbi"] = (r, matvec.record_words(h, max(matvec.X_BITS)))
            a["xi"] = (r, matvec.record_words(-(-max(cfg.ff, cfg.q_dim) // 256) * 256, max(matvec.X_BITS)))
        if cfg.attention_layers:
            kv = max(cfg.kv_dim(i) for i in cfg.attention_layers)
            a.update(qkv=(r, cfg.q_dim + 2 * kv), q=(r, cfg.q_dim), k=(r, kv), v=(r, kv),
                     q_rot=(r, cfg.q_dim), att=(r, cfg.q_dim))
        if cfg.conv_layers:
            a.update(bcx=(r, 3 * h), conv_out=(r, h))
        return a

    @classmethod
    def allocate(cls, device: Device, cfg: ModelConfig, rows: int, int8: bool = False) -> "Activations":
        return cls(rows, **{name: f32_buffer(device, f"{name}@{rows}", *shape)
                            for name, shape in cls.shapes(cfg, rows, int8).items()})

    def with_lora(self, device: Device, cfg: ModelConfig, rank: int) -> "Activations":
        """These activations plus the scratch LoRA adapters of up to `rank` compute in."""
        buf = lambda name, *shape: f32_buffer(device, f"{name}@{self.rows}", *shape)
        return replace(self, lora_t=buf("lora_t", self.rows, rank), up=buf("up", self.rows, cfg.ff))


@dataclass(frozen=True)
class State:
    """Per-model buffers that outlive a step: the Step uniform, token ids, logits, and per layer
    the KV cache or conv state."""
    step: Binding                          # the Step uniform: position and row count of a submission
    tokens: Binding                        # (chunk,) u32 token ids; tokens[0] = the last argmax
    logits: Binding                        # (vocab,) of one row
    key_cache: dict[int, Binding]          # layer -> (ctx, kv heads, head_dim) in K's cache type
    value_cache: dict[int, Binding]        # layer -> (ctx, kv heads, head_dim) in V's cache type
    conv_state: dict[int, Binding]         # layer -> (conv_kernel - 1, hidden) rolling B*x rows
    attention_scratch: Binding | None      # split-KV partials of decode attention, shared by the layers

    @staticmethod
    def sizes(cfg: ModelConfig, ctx: int, chunk: int, cache_types: tuple[str, str]) -> dict[str, int]:
        """label -> bytes of every buffer `allocate` makes; the KV caches hold (K's, V's) cache
        type (cera.gpu.numerics)."""
        b = {"step": STEP_BYTES, "tokens": 4 * chunk, "logits": 4 * cfg.vocab_size}
        k_row, v_row = (cache_row_bytes(t, cfg.head_dim) for t in cache_types) if cfg.attention_layers else (0, 0)
        for i in cfg.attention_layers:
            b[f"blk.{i}.key_cache"] = k_row * ctx * cfg.n_kv_heads[i]
            b[f"blk.{i}.value_cache"] = v_row * ctx * cfg.n_kv_heads[i]
        for i in cfg.conv_layers:
            b[f"blk.{i}.conv_state"] = 4 * (cfg.conv_kernel - 1) * cfg.hidden
        if cfg.attention_layers:
            b["attention_scratch"] = attention.attention_scratch_bytes(head_dim=cfg.head_dim, n_heads=cfg.n_heads,
                                                                    max_ctx=ctx)
        return b

    @classmethod
    def allocate(cls, device: Device, cfg: ModelConfig, ctx: int, chunk: int, cache_types: tuple[str, str]) -> "State":
        sizes = cls.sizes(cfg, ctx, chunk, cache_types)
        buf = lambda label, **kw: Binding(device.buffer(sizes[label], label, **kw), 0, sizes[label])
        return cls(buf("step", uniform=True), Binding(buf("tokens").buffer, 0, 4), buf("logits"),
                   {i: buf(f"blk.{i}.key_cache") for i in cfg.attention_layers},
                   {i: buf(f"blk.{i}.value_cache") for i in cfg.attention_layers},
                   {i: buf(f"blk.{i}.conv_state") for i in cfg.conv_layers},
                   buf("attention_scratch") if cfg.attention_layers else None)

    def reset(self, device: Device) -> None:
        """Start a sequence: zero the conv states. The KV caches need no clearing: attention
        reads only the positions the current sequence has written."""
        for b in self.conv_state.values():
            device.write(b.buffer, bytes(b.size))


@dataclass(frozen=True)
class GreedyChain:
    """What a chained batch (plan.chain_plan: up to `batch` decode steps in one submission, greedy
    or sampled) runs through: the token each step chose, and the conv states after each step, in
    two halves (alternate batches), for rewinding a batch the caller stopped in."""
    batch: int
    tokens: Binding                   # (batch,) u32 the token each step chose
    conv: dict[int, Binding]          # layer -> (2, batch, conv_kernel - 1, hidden)

    @staticmethod
    def sizes(cfg: ModelConfig, batch: int = GREEDY_BATCH) -> dict[str, int]:
        """label -> bytes of every buffer `allocate` makes."""
        b = {"greedy.tokens": 4 * batch}
        for i in cfg.conv_layers:
            b[f"blk.{i}.conv_records"] = 4 * 2 * batch * (cfg.conv_kernel - 1) * cfg.hidden
        return b

    @classmethod
    def allocate(cls, device: Device, cfg: ModelConfig, batch: int = GREEDY_BATCH) -> "GreedyChain":
        sizes = cls.sizes(cfg, batch)
        buf = lambda label: Binding(device.buffer(sizes[label], label), 0, sizes[label])
        return cls(batch, buf("greedy.tokens"),
                   {i: buf(f"blk.{i}.conv_records") for i in cfg.conv_layers})
