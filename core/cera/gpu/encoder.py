"""An encoder (nomic-bert) on the GPU: a whole text in one submission, every token attending
to every token, its output rows read back (`GpuEncoder.embed`).

`EncoderBuilder` is the prefill builder with llm_build_bert's layer (post-LayerNorm blocks):
  x = layer_norm(token_embd[tokens] + token_types[0])               token_embd_norm
  per layer:
    q | k | v = W_qkv x                                              one matmul, rows of 3 hidden
    att = attention(rope(q), rope(k), v), bidirectional              rope_kv, prefill attention
    x = layer_norm(x + W_o att)                                      attn_output_norm
    x = layer_norm(x + W_down (silu(W_gate x) * (W_up x)))           layer_output_norm
The K and V of the text go through a KV cache of the text's length (the prefill attention
reads them there); nothing is kept between texts. A text is one step: the activations hold
`ctx` rows. bert differs by learned position rows added before the embedding norm (no RoPE),
q, k, v projected apart, biases on every projection, and GELU after up (no gate).
"""
from __future__ import annotations

import numpy as np

from cera.config import ModelConfig
from cera.device import Binding, Device, Dispatch, Flush
from cera.errors import InvalidArgument, Unsupported
from cera.gpu import attention, ops
from cera.gpu.footprint import footprint
from cera.gpu.numerics import EXACT, Numerics
from cera.gpu.plan import FLUSH_LAYERS, Plan, PrefillBuilder
from cera.gpu.residency import Weights
from cera.gpu.state import Activations, State, pack_step
from cera.kernels import Kernels


def check_gpu_encoder(cfg: ModelConfig) -> None:
    """Refuse an encoder these kernels do not run (it runs on the numpy reference)."""
    if cfg.ffn_gated and ({"ffn_gate", "ffn_up"} & set(cfg.biases)):
        raise Unsupported(f"{cfg.arch} on the GPU: biases on a gated FFN's gate or up are not supported (run it "
                          "on the numpy reference: no device)")


class EncoderBuilder(PrefillBuilder):
    """The encoder's steps for up to `act.rows` tokens (the whole text)."""

    def embed(self):
        """act.x = layer_norm(token rows [+ position rows] + token type 0's row)."""
        cfg, w = self.cfg, self.weights
        types = w.vector("token_types.weight") if cfg.token_types else None          # row 0 first
        positions = w.vector("position_embd.weight") if cfg.position_embeddings else None   # row t: position t
        return super().embed() + [self.post_norm("token_embd_norm", y=positions, v=types)]

    def post_norm(self, name: str, y: Binding | None = None, v: Binding | None = None) -> Dispatch:
        """act.x = layer_norm(act.x [+ y] [+ v]) with LayerNorm `name`'s weight and bias."""
        cfg, w = self.cfg, self.weights
        return ops.layer_norm(self.kernels, self.device, self.act.x, w.vector(name + ".weight"),
                                 w.vector(name + ".bias"), self.state.step, n=cfg.hidden, eps=cfg.eps,
                                 max_tokens=self.rows, y=y, v=v, label=name)

    def linear(self, out: Binding, name: str, x: Binding, **kw) -> list:
        """out = W x (+ b where the file has the bias) for blk.N.{name}.weight / .bias."""
        part = name.rsplit(".", 1)[1]
        bias = self.weights.vector(name + ".bias") if part in self.cfg.biases else None
        return self.proj(out, self.weights.matrix(name + ".weight"), x, bias=bias, **kw)

    def layer(self, i):
        cfg, b, a, h = self.cfg, f"blk.{i}.", self.act, self.cfg.hidden
        # q, k, v of every row: one matmul into rows q | k | v (nomic-bert), or three (bert)
        if cfg.qkv_fused:
            steps, width = self.linear(a.qkv, b + "attn_qkv", a.x), 3 * h
            q, k, v = (Binding(a.qkv.buffer, 4 * c, 4 * (width * self.rows - c)) for c in (0, h, 2 * h))
        else:
            steps, width, (q, k, v) = [], None, (a.q, a.k, a.v)
            for p, out in zip("qkv", (q, k, v)):
                steps += self.linear(out, b + f"attn_{p}", a.x)
        # RoPE (none for bert) as K and V go into the cache, then attention of every row to every row
        steps.append(self.rope_kv(i, q, k, v, width))
        steps.append(attention.prefill_attention(
            self.kernels, self.device, a.att, a.q_rot, self.state.key_cache[i], self.state.value_cache[i],
            self.state.step, head_dim=cfg.head_dim, n_heads=cfg.n_heads, n_kv_heads=cfg.n_heads,
            scale=cfg.attention_scale, max_rows=self.rows, cache_types=self.numerics.cache_types,
            bidirectional=True, label=f"{b}attention"))
        # the output projection, the residual and the post-attention LayerNorm
        steps += self.linear(a.xb, b + "attn_output", a.att)
        steps.append(self.post_norm(b + "attn_output_norm", y=a.xb))
        # the FFN: SwiGLU (nomic-bert) or GELU after up (bert), the residual, the output LayerNorm
        if cfg.ffn_gated:
            gate, up = self.weights.matrix(b + "ffn_gate.weight"), self.weights.matrix(b + "ffn_up.weight")
            if gate.wtype != up.wtype:
                raise Unsupported(f"{gate.name} and {up.name} differ in type: the fused GLU kernels need one type")
            steps += self.proj(a.hb, gate, a.x, w_up=up.binding, act=cfg.ffn_act)
        else:
            steps += self.linear(a.hb, b + "ffn_up", a.x)
            steps.append(ops.glu_act(self.kernels, self.device, a.hb, None, self.state.step, ff=cfg.ff,
                                        act=cfg.ffn_act, max_tokens=self.rows, label=f"{b}ffn_act"))
        steps += self.linear(a.xb, b + "ffn_down", a.hb)
        steps.append(self.post_norm(b + "layer_output_norm", y=a.xb))
        return steps + ([Flush()] if i in FLUSH_LAYERS else [])


class GpuEncoder:
    """An encoder's weights, buffers and one recorded schedule on a device, for texts of up to
    `ctx` tokens; the engine's backend for embed (generation is refused before it gets here)."""
    dispatches_per_token = 0
    submits_per_prefill = 1
    n_past = 0

    def __init__(self, cfg: ModelConfig, gguf_file, device: Device, ctx: int, numerics: Numerics = EXACT):
        check_gpu_encoder(cfg)
        self.footprint = footprint(cfg, gguf_file, ctx, ctx, device.limits, numerics)
        self.footprint.check(device.limits)   # before anything is allocated
        self.cfg, self.device, self.ctx, self.numerics = cfg, device, ctx, numerics
        self.kernels = Kernels(device)
        self.weights = Weights(cfg, gguf_file, device)
        self.state = State.allocate(device, cfg, ctx, ctx, numerics.cache_types)   # the text's K and V
        act = Activations.allocate(device, cfg, ctx, numerics.int8)              # every row of a text
        self.builder = EncoderBuilder(cfg, ctx, self.weights, self.state, act, self.kernels, None, numerics)
        self.plan = Plan(f"encode {ctx}", ctx, self.builder.body)
        self.schedule = device.schedule(self.plan.steps)

    async def load(self, progress=None) -> None:
        """Upload the weights the plan uses; progress(done, total) in bytes."""
        await self.weights.upload(progress)

    async def embed(self, tokens: list[int]) -> np.ndarray:
        """The encoder's output rows (T, hidden) of tokens at positions 0..T-1, one submission."""
        if not 0 < len(tokens) <= self.ctx:
            raise InvalidArgument(f"{len(tokens)} tokens: an encoder step holds 1..{self.ctx}")
        h = self.cfg.hidden
        self.device.write(self.state.tokens.buffer, np.asarray(tokens, np.uint32).tobytes())
        self.device.write(self.state.step.buffer, pack_step(0, len(tokens)))
        raw = await self.device.run(self.schedule, Binding(self.builder.act.x.buffer, 0, 4 * len(tokens) * h))
        return np.frombuffer(raw, np.float32).reshape(len(tokens), h).copy()   # (T, hidden)

    def reset(self) -> None:
        pass   # nothing is kept between texts

    def use_loras(self, key: tuple[int, ...]) -> None:
        if key:
            raise Unsupported("LoRA adapters on an encoder are not supported")

    async def add_lora(self, adapter, progress=None) -> None:
        raise Unsupported("LoRA adapters on an encoder are not supported")
