"""A model on the GPU: weights uploaded once, activations allocated once, and the
per-token schedule built once.

Decode is one submission per token: embed the token the last argmax wrote, run every
layer, norm, LM head, argmax into `tokens[0]`, and read those 4 bytes back. Everything
that changes per token (the position) lives in the Step uniform, written once per
submission, so the same encoded dispatch list serves every token.
"""
from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType

from cera import weights
from cera.config import ATTENTION, ModelConfig
from cera.device import Binding
from cera.gpu import layers, matmul
from cera.gpu.step import STEP_BYTES, pack_step
from cera.kernels import Kernels

F32 = GGMLQuantizationType.F32


class GpuModel:
    """Buffers, kernels and schedules of one model on one device, for up to `ctx` positions."""
    name = "gpu"

    def __init__(self, cfg: ModelConfig, gguf_file, device, ctx: int):
        self.cfg, self.gguf, self.device, self.ctx = cfg, gguf_file, device, ctx
        self.kernels = Kernels(device)
        self.buffers: dict[str, Binding] = {}    # name -> weights (raw GGUF bytes or f32) or activations
        self._pending = []                      # (buffer, tensor info[, dst offset]) uploads to do
        self._gpu_token = None                  # the token id tokens[0] holds (argmax wrote it)
        self.dispatches_per_token = 0
        self.submits_per_prefill = 0   # submissions the last forward() took

    # --- weights -------------------------------------------------------------------------
    def _tensor(self, name: str):
        """The GPU buffer holding tensor `name` as stored (quantized blocks stay quantized)."""
        if name not in self.buffers:
            info = self.gguf.tensors[name]
            self._check_binding(name, info.nbytes)
            buffer = self.device.buffer(info.nbytes, name)
            self._pending.append((buffer, info))
            self.buffers[name] = Binding(buffer)
        return self.buffers[name]

    def _f32(self, name: str):
        """A small tensor (norms, biases, conv taps, frequency factors) as f32 on the GPU."""
        if name not in self.buffers:
            if self.gguf.tensors[name].ggml_type == F32:
                return self._tensor(name)
            self.buffers[name] = self._upload_f32(name, weights.tensor(self.gguf, name))
        return self.buffers[name]

    def _upload_f32(self, name: str, data: np.ndarray) -> Binding:
        buffer = self.device.buffer(data.nbytes, name)
        self.device.write(buffer, data.astype(np.float32).tobytes())
        return Binding(buffer)

    def _check_binding(self, name: str, nbytes: int) -> None:
        if nbytes > self.device.limits.max_buffer_size:
            raise ValueError(f"tensor {name} is {nbytes} bytes; this GPU's largest buffer is "
                             f"{self.device.limits.max_buffer_size} bytes (model too large for this GPU)")

    async def load(self, progress=None) -> None:
        """Build the schedule (which decides what lives on the GPU), then upload the weights."""
        self._build()
        total = sum(p[1].nbytes for p in self._pending)
        done = 0
        for buffer, info, *dst in self._pending:
            await self.device.upload(buffer, self.gguf.source, info.offset, info.nbytes, dst[0] if dst else 0)
            done += info.nbytes
            if progress:
                progress(done, total)
        self._pending.clear()

    # --- the schedule --------------------------------------------------------------------
    def _act(self, name: str, *shape: int) -> Binding:
        """An f32 activation or state buffer; the shape comment lives at the call."""
        nbytes = 4 * int(np.prod(shape))
        self.buffers[name] = Binding(self.device.buffer(nbytes, name), 0, nbytes)
        return self.buffers[name]

    def _build(self) -> None:
        cfg, dev, k = self.cfg, self.device, self.kernels
        h, ff = cfg.hidden, cfg.ff
        self.step = Binding(dev.buffer(STEP_BYTES, "step", uniform=True), 0, STEP_BYTES)
        self.tokens = Binding(dev.buffer(4, "tokens"), 0, 4)  # (1,) u32: the current token id
        x = self._act("x", h)                                 # residual stream
        xb = self._act("xb", h)                               # normed input of a block
        hb = self._act("hb", ff)                              # ffn hidden: silu(gate) * up
        self.logits = self._act("logits", cfg.vocab_size)
        conv_bcx = conv_out = None
        if cfg.conv_layers:
            conv_bcx = self._act("bcx", 3 * h)                # lfm2 in_proj output: B, C, x
            conv_out = self._act("conv_out", h)
        if cfg.attention_layers:
            kv_max = max(cfg.kv_dim(i) for i in cfg.attention_layers)
            qkv = self._act("qkv", cfg.q_dim + 2 * kv_max)   # q, k, v of the current token, stacked
            q_rot = self._act("q_rot", cfg.q_dim)              # q after [QK-norm and] RoPE
            att = self._act("att", cfg.q_dim)
        freq = self._f32("rope_freqs.weight") if cfg.rope_freq_factors else None
        if cfg.rope_freq_scale != 1.0:
            raise ValueError("linear RoPE scaling is not implemented on the GPU yet")

        embd = self.gguf.tensors["token_embd.weight"]
        steps = matmul.embed_tiled(k, dev, x, self._tensor("token_embd.weight"), self.tokens, self.step,
                                   wtype=embd.ggml_type, k=h, rows=cfg.embedding_rows, max_rows=1,
                                   scale=cfg.embedding_scale)
        for i in range(cfg.n_layers):
            b = f"blk.{i}."
            steps.append(layers.rms_norm(k, dev, xb, x, self._f32(b + "attn_norm.weight"), self.step,
                                         n=h, eps=cfg.eps, label=f"{b}attn_norm"))
            if cfg.block_kinds[i] == ATTENTION:
                kv = cfg.kv_dim(i)
                q, kb, vb = (Binding(qkv.buffer, 0, 4 * cfg.q_dim), Binding(qkv.buffer, 4 * cfg.q_dim, 4 * kv),
                             Binding(qkv.buffer, 4 * (cfg.q_dim + kv), 4 * kv))
                steps += self._qkv(i, xb, qkv, q, kb, vb)
                k_cache = self._act(f"{b}key_cache", self.ctx, kv)     # (ctx, n_kv_heads, head_dim)
                v_cache = self._act(f"{b}value_cache", self.ctx, kv)
                qk_norm = dict(q_norm=self._f32(b + "attn_q_norm.weight"),
                               k_norm=self._f32(b + "attn_k_norm.weight"), eps=cfg.eps) if cfg.qk_norm else {}
                steps.append(layers.rope_kv(
                    k, dev, q_rot, k_cache, v_cache, q, kb, vb, self.step,
                    head_dim=cfg.head_dim, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads[i],
                    theta=cfg.rope_theta, neox=cfg.rope_neox, n_rot=cfg.n_rot, freq_factors=freq,
                    label=f"{b}rope", **qk_norm))
                steps.append(layers.attention(k, dev, att, q_rot, k_cache, v_cache, self.step,
                                              head_dim=cfg.head_dim, n_heads=cfg.n_heads,
                                              n_kv_heads=cfg.n_kv_heads[i], scale=cfg.attention_scale,
                                              label=f"{b}attention"))
                steps.append(self._matvec(x, f"{b}attn_output.weight", att, accumulate=True,
                                          scale=cfg.residual_scale))
            else:
                steps.append(self._matvec(conv_bcx, f"{b}shortconv.in_proj.weight", xb))
                state = self._act(f"{b}conv_state", cfg.conv_kernel - 1, h)  # rolling Bx rows
                steps.append(layers.shortconv(k, dev, conv_out, conv_bcx, self._f32(b + "shortconv.conv.weight"),
                                              state, self.step, hidden=h, kernel=cfg.conv_kernel,
                                              label=f"{b}shortconv"))
                steps.append(self._matvec(x, f"{b}shortconv.out_proj.weight", conv_out, accumulate=True,
                                          scale=cfg.residual_scale))
            steps.append(layers.rms_norm(k, dev, xb, x, self._f32(b + "ffn_norm.weight"), self.step,
                                         n=h, eps=cfg.eps, label=f"{b}ffn_norm"))
            steps += self._ffn(i, xb, hb)
            steps.append(self._matvec(x, f"{b}ffn_down.weight", hb, accumulate=True, scale=cfg.residual_scale))

        self.body_schedule = dev.schedule(steps)             # a prompt token whose logits nobody needs
        steps.append(layers.rms_norm(k, dev, xb, x, self._f32(cfg.final_norm), self.step,
                                     n=h, eps=cfg.eps, label="output_norm"))
        steps += self._lm_head(xb)
        steps.append(matmul.argmax(k, dev, self.tokens, self.logits, n=cfg.vocab_size))
        self.decode_schedule = dev.schedule(steps)
        self.dispatches_per_token = len(steps)
        self._state = [b for name, b in self.buffers.items() if name.endswith(("_cache", "conv_state"))]

    def _matvec(self, out, name: str, x, *, rows: int | None = None, **kw):
        info = self.gguf.tensors[name]
        return matmul.matvec(self.kernels, self.device, out, self._tensor(name), x, wtype=info.ggml_type,
                             k=info.shape[1], m=rows or info.shape[0], **kw)

    def _qkv(self, i: int, xb, qkv, q, k, v) -> list:
        """q, k, v = Wq xb (+bq), Wk xb (+bk), Wv xb (+bv). When the three matrices share a type
        and both their bytes and their outputs stay aligned, they are stacked into one buffer at
        load and one matvec writes all of `qkv`; otherwise three matvecs write its parts."""
        b, cfg, dev = f"blk.{i}.", self.cfg, self.device
        names = [f"{b}attn_{p}.weight" for p in "qkv"]
        infos = [self.gguf.tensors[n] for n in names]
        align = dev.limits.min_storage_buffer_offset_alignment
        if len({t.ggml_type for t in infos}) > 1 or any(t.shape[0] * 4 % align or t.nbytes % 4 for t in infos):
            bias = {p: self._f32(f"{b}attn_{p}.bias") for p in "qkv"} if cfg.qkv_bias else {}
            return [self._matvec(out, name, xb, bias=bias.get(p))
                    for p, name, out in zip("qkv", names, (q, k, v))]
        label, rows = f"{b}attn_qkv.weight", sum(t.shape[0] for t in infos)
        self._check_binding(label, sum(t.nbytes for t in infos))
        w = dev.buffer(sum(t.nbytes for t in infos), label)
        offsets = np.cumsum([0] + [t.nbytes for t in infos[:-1]])
        self._pending += [(w, t, int(o)) for t, o in zip(infos, offsets)]
        self.buffers[label] = Binding(w)
        bias = None
        if cfg.qkv_bias:
            bias = self.buffers[f"{b}attn_qkv.bias"] = self._upload_f32(f"{b}attn_qkv.bias", np.concatenate(
                [weights.tensor(self.gguf, f"{b}attn_{p}.bias") for p in "qkv"]))
        return [matmul.matvec(self.kernels, dev, Binding(qkv.buffer, 0, 4 * rows), Binding(w), xb,
                              wtype=infos[0].ggml_type, k=cfg.hidden, m=rows, bias=bias)]

    def _ffn(self, i: int, xb, hb) -> list:
        """hb = silu(Wgate xb) * (Wup xb): one fused matvec when gate and up share a type."""
        b = f"blk.{i}."
        gate, up = self.gguf.tensors[b + "ffn_gate.weight"], self.gguf.tensors[b + "ffn_up.weight"]
        if gate.ggml_type != up.ggml_type:
            raise ValueError(f"{b}ffn_gate ({gate.type_name}) and ffn_up ({up.type_name}) differ in type: "
                             "the fused SwiGLU matvec needs one type")
        return [self._matvec(hb, gate.name, xb, w_up=self._tensor(up.name))]

    def _lm_head(self, xb) -> list:
        """logits = W_head xb / logit_scale, in row tiles that fit the binding limit."""
        cfg, dev = self.cfg, self.device
        info = self.gguf.tensors[cfg.lm_head]
        return matmul.matvec_tiled(self.kernels, dev, self.logits, self._tensor(cfg.lm_head), xb,
                                   wtype=info.ggml_type, k=cfg.hidden, m=cfg.vocab_size,
                                   scale=1.0 / cfg.logit_scale)

    # --- running -------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the sequence: clear the KV caches and conv states."""
        for b in self._state:
            self.device.write(b.buffer, bytes(b.size))

    async def forward(self, tokens: list[int], pos0: int, logits=None):
        """Run tokens at positions pos0.. one submission each; return the greedy next token after
        the last one, and logits: None, "last" (vocab,) or "all" (T, vocab)."""
        rows = []
        if len(tokens) > 1:
            self.submits_per_prefill = len(tokens)
        for t, token in enumerate(tokens):
            if token != self._gpu_token:   # after a greedy step the GPU already holds it
                self.device.write(self.tokens.buffer, np.array([token], np.uint32).tobytes())
            self.device.write(self.step.buffer, pack_step(pos0 + t, 1))
            if t + 1 < len(tokens) and logits != "all":
                await self.device.run(self.body_schedule)
                self._gpu_token = token
                continue
            self._token_of(await self.device.run(self.decode_schedule, self.tokens))
            if logits:
                raw = await self.device.read(self.logits.buffer, 0, self.logits.size)
                rows.append(np.frombuffer(raw, np.float32))
        if logits == "all":
            return self._gpu_token, np.stack(rows)
        return self._gpu_token, rows[-1].copy() if logits else None

    async def greedy(self, token: int, pos: int, n: int):
        """Yield the n greedy tokens that follow `token` at `pos`, keeping one step in flight:
        the argmax stays on the GPU and feeds the next step's embedding, so step i+1 is
        submitted before step i's 4-byte readback is awaited (host encoding overlaps GPU work)."""
        if token != self._gpu_token:
            self.device.write(self.tokens.buffer, np.array([token], np.uint32).tobytes())
        pending = None
        for i in range(n):
            self.device.write(self.step.buffer, pack_step(pos + i, 1))
            submitted = self.device.run(self.decode_schedule, self.tokens)
            if pending is not None:
                token = self._token_of(await pending)
                self._gpu_token = None   # the step in flight has overwritten it
                yield token
            pending = submitted
        if pending is not None:
            yield self._token_of(await pending)

    def _token_of(self, readback: bytes) -> int:
        self._gpu_token = int(np.frombuffer(readback, np.uint32)[0])
        return self._gpu_token
