"""A model on the GPU: weights uploaded once, activations allocated once, and the schedules
built once.

Decode is one submission per token: embed the token the last argmax wrote, run every layer,
LM head, argmax into `tokens[0]`, and read those 4 bytes back. Everything that changes per
token (the position) lives in the Step uniform, written once per submission, so the same
dispatch list serves every token. Each block's RMSNorm is fused into its first matvec.

Prefill goes through the batched kernels in chunks of up to `chunk` tokens, one submission
per chunk; the KV caches and conv states carry across chunks. Only the last row of the last
chunk is projected to logits, unless all logits are asked for (scoring).
"""
from __future__ import annotations

import sys

import numpy as np
from gguf.constants import GGMLQuantizationType

from cera import weights
from cera.config import ATTENTION, ModelConfig
from cera.device import Binding, Copy
from cera.gpu import batched, layers, matmul
from cera.gpu.step import STEP_BYTES, pack_step
from cera.kernels import Kernels

F16, F32 = GGMLQuantizationType.F16, GGMLQuantizationType.F32
DEFAULT_CHUNK = 512


def warn(message: str) -> None:
    print(f"cera: {message}", file=sys.stderr, flush=True)


class GpuModel:
    """Buffers, kernels and schedules of one model on one device, for up to `ctx` positions."""
    name = "gpu"

    def __init__(self, cfg: ModelConfig, gguf_file, device, ctx: int, chunk: int = DEFAULT_CHUNK):
        if chunk < 1:
            raise ValueError(f"prefill chunk {chunk} must be at least 1")
        self.cfg, self.gguf, self.device, self.ctx = cfg, gguf_file, device, ctx
        self.chunk = min(chunk, ctx)
        self.kernels = Kernels(device)
        self.buffers: dict[str, Binding] = {}    # name -> weights (raw GGUF bytes or f32) or activations
        self.wtypes: dict[str, int] = {}          # weight name -> the ggml type its buffer holds
        self.shapes = {n: t.shape for n, t in gguf_file.tensors.items()}   # (+ the stacked qkv)
        self.shapes[cfg.lm_head] = (cfg.vocab_size, cfg.hidden)   # head rows past the vocabulary: unused
        self._pending = []                        # (buffer, tensor info, dst offset) uploads to do
        self._prefill_schedules = {}              # (rows, all logits) -> schedule
        self._gpu_token = None                    # the token id tokens[0] holds (argmax wrote it)
        self.dispatches_per_token = 0
        self.submits_per_prefill = 0              # submissions the last multi-token forward() took

    # --- weights -------------------------------------------------------------------------
    def _tensor(self, name: str) -> Binding:
        """The GPU buffer holding tensor `name` as stored: quantized blocks stay quantized. A
        type without a kernel is dequantized once, on the CPU, to F16, and says so."""
        if name not in self.buffers:
            info = self.gguf.tensors[name]
            if info.ggml_type in matmul.MATVEC_TYPES:
                self._check_size(name, info.nbytes)
                buffer = self.device.buffer(info.nbytes, name)
                self._pending.append((buffer, info, 0))
                self.buffers[name], self.wtypes[name] = Binding(buffer), info.ggml_type
            else:
                warn(f"{name} is {info.type_name}, which has no GPU kernel: dequantized to F16 at load")
                data = weights.tensor(self.gguf, name).astype(np.float16)
                self._check_size(name, data.nbytes)
                buffer = self.device.buffer(data.nbytes, name)
                self.device.write(buffer, data.tobytes() + bytes(-data.nbytes % 4))
                self.buffers[name], self.wtypes[name] = Binding(buffer), F16
        return self.buffers[name]

    def _f32(self, name: str) -> Binding:
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

    def _check_size(self, name: str, nbytes: int) -> None:
        if nbytes > self.device.limits.max_buffer_size:
            raise ValueError(f"tensor {name} is {nbytes} bytes; this GPU's largest buffer is "
                             f"{self.device.limits.max_buffer_size} bytes (model too large for this GPU)")

    async def load(self, progress=None) -> None:
        """Build the schedules (which decide what lives on the GPU), then upload the weights."""
        self._build_decode()
        self._build_prefill()
        total = sum(info.nbytes for _, info, _ in self._pending)
        done = 0
        for buffer, info, offset in self._pending:
            await self.device.upload(buffer, self.gguf.source, info.offset, info.nbytes, offset)
            done += info.nbytes
            if progress:
                progress(done, total)
        self._pending.clear()

    # --- building blocks -----------------------------------------------------------------
    def _act(self, name: str, *shape: int) -> Binding:
        """An f32 activation or state buffer; the shape comment lives at the call."""
        nbytes = 4 * int(np.prod(shape))
        self.buffers[name] = Binding(self.device.buffer(nbytes, name), 0, nbytes)
        return self.buffers[name]

    def _proj(self, out, name: str, x, rows: int, *, norm: str | None = None, **kw) -> list:
        """out = W x for one row (a matvec, the block's RMSNorm fused in) or for a chunk of
        `rows` (the tiled matmul, after a separate batched RMSNorm of x into `xb`)."""
        w, wtype = self._tensor(name), self.wtypes[name]
        m, k = self.shapes[name]
        if "w_up" in kw:
            kw["w_up"] = self._tensor(kw["w_up"])
        try:   # a matrix bigger than one storage binding goes in row tiles
            if rows == 1:
                normed = dict(norm=self._f32(norm), eps=self.cfg.eps) if norm else {}
                return matmul.matvec_tiled(self.kernels, self.device, out, w, x, wtype=wtype, k=k, m=m,
                                           **normed, **kw)
            steps = []
            if norm:
                xb = self.buffers[f"xb@{rows}"]
                steps.append(layers.rms_norm(self.kernels, self.device, xb, x, self._f32(norm), self.step,
                                             n=self.cfg.hidden, eps=self.cfg.eps, max_tokens=rows, label=norm))
                x = xb
            return steps + batched.matmul_tiled(self.kernels, self.device, out, w, x, self.step, wtype=wtype,
                                                k=k, m=m, max_rows=rows, **kw)
        except ValueError as err:
            raise ValueError(f"tensor {name}: {err} (model too large for this GPU's limits)") from None

    def _qkv_runs(self, i: int) -> list[str] | None:
        """blk.i's q, k, v projections grouped into runs of consecutive same-type matrices ("qkv",
        or "qk" + "v" when v is quantized differently), each run one matvec writing its part of
        the stacked q | k | v buffer. None when those parts cannot be bound at aligned offsets."""
        cfg, align = self.cfg, self.device.limits.min_storage_buffer_offset_alignment
        if (4 * cfg.q_dim) % align or (4 * cfg.kv_dim(i)) % align:
            return None
        infos = [self.gguf.tensors[f"blk.{i}.attn_{p}.weight"] for p in "qkv"]
        runs = ["q"]
        for p, prev, info in zip("kv", infos, infos[1:]):
            same = (info.ggml_type == prev.ggml_type and info.ggml_type in matmul.MATVEC_TYPES
                    and info.nbytes % 4 == 0 and prev.nbytes % 4 == 0)
            runs[-1:] = [runs[-1] + p] if same else [runs[-1], p]
        return runs

    def _stacked(self, i: int, run: str) -> tuple[str, Binding | None]:
        """The weight (and bias) of a run of projections: a tensor of the file, or for "qk" /
        "qkv" their rows stacked into one buffer at load."""
        b, cfg = f"blk.{i}.", self.cfg
        bias = lambda p: f"{b}attn_{p}.bias"
        if len(run) == 1:
            return f"{b}attn_{run}.weight", self._f32(bias(run)) if cfg.qkv_bias else None
        w_name, infos = f"{b}attn_{run}.weight", [self.gguf.tensors[f"{b}attn_{p}.weight"] for p in run]
        if w_name not in self.buffers:
            w = self.device.buffer(sum(t.nbytes for t in infos), w_name)
            offsets = np.cumsum([0] + [t.nbytes for t in infos[:-1]])
            self._pending += [(w, t, int(o)) for t, o in zip(infos, offsets)]
            self.buffers[w_name], self.wtypes[w_name] = Binding(w), infos[0].ggml_type
            self.shapes[w_name] = (sum(t.shape[0] for t in infos), cfg.hidden)
            if cfg.qkv_bias:
                self.buffers[bias(run)] = self._upload_f32(bias(run), np.concatenate(
                    [weights.tensor(self.gguf, bias(p)) for p in run]))
        return w_name, self.buffers[bias(run)] if cfg.qkv_bias else None

    # --- one layer, for one row (decode) or a chunk of rows (prefill) ----------------------
    def _layer(self, i: int, rows: int, a: dict) -> list:
        """The dispatches of layer i; `a` holds the activation buffers for `rows` rows."""
        mixer = self._attention if self.cfg.block_kinds[i] == ATTENTION else self._shortconv
        return mixer(i, rows, a) + self._ffn(i, rows, a)

    def _qkv(self, i: int, rows: int, a: dict) -> tuple[list, Binding, Binding, Binding]:
        """q, k, v = Wq, Wk, Wv (+ biases) applied to attn_norm(x): (steps, q, k, v)."""
        cfg, b, x = self.cfg, f"blk.{i}.", a["x"]
        kv, q_dim, norm = cfg.kv_dim(i), cfg.q_dim, b + "attn_norm.weight"
        runs = self._qkv_runs(i) if rows == 1 else None
        steps = []
        if runs:                                           # q | k | v in one buffer, a matvec per run
            qkv = a["qkv"].buffer
            offset = {"q": 0, "k": 4 * q_dim, "v": 4 * (q_dim + kv)}
            size = {"q": 4 * q_dim, "k": 4 * kv, "v": 4 * kv}
            for run in runs:
                w_name, bias = self._stacked(i, run)
                out = Binding(qkv, offset[run[0]], sum(size[p] for p in run))
                steps += self._proj(out, w_name, x, rows, norm=norm, bias=bias)
            return (steps, *(Binding(qkv, offset[p], size[p]) for p in "qkv"))
        q, k, v = a["q"], Binding(a["k"].buffer, 0, 4 * rows * kv), Binding(a["v"].buffer, 0, 4 * rows * kv)
        for j, (p, out) in enumerate(zip("qkv", (q, k, v))):
            bias = self._f32(f"{b}attn_{p}.bias") if cfg.qkv_bias else None
            if rows == 1 or j == 0:   # the norm: fused into each matvec, or run once into xb
                steps += self._proj(out, f"{b}attn_{p}.weight", x, rows, norm=norm, bias=bias)
            else:
                steps += self._proj(out, f"{b}attn_{p}.weight", a["xb"], rows, bias=bias)
        return steps, q, k, v

    def _attention(self, i: int, rows: int, a: dict) -> list:
        """x += residual_scale * Wo attention(rope(q), rope(k), v), writing k and v to the cache."""
        cfg, k, dev, b = self.cfg, self.kernels, self.device, f"blk.{i}."
        kv = cfg.kv_dim(i)
        steps, q, kb, vb = self._qkv(i, rows, a)
        k_cache = self.buffers.get(f"{b}key_cache") or self._act(f"{b}key_cache", self.ctx, kv)  # (ctx, kv heads, hd)
        v_cache = self.buffers.get(f"{b}value_cache") or self._act(f"{b}value_cache", self.ctx, kv)
        qk_norm = dict(q_norm=self._f32(b + "attn_q_norm.weight"), k_norm=self._f32(b + "attn_k_norm.weight"),
                       eps=cfg.eps) if cfg.qk_norm else {}
        freq = self._f32("rope_freqs.weight") if cfg.rope_freq_factors else None
        shape = dict(head_dim=cfg.head_dim, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads[i])
        steps.append(layers.rope_kv(k, dev, a["q_rot"], k_cache, v_cache, q, kb, vb, self.step,
                                    theta=cfg.rope_theta, neox=cfg.rope_neox, n_rot=cfg.n_rot,
                                    freq_factors=freq, max_tokens=rows, label=f"{b}rope", **qk_norm, **shape))
        if rows == 1:
            scratch = self.buffers.get("attn_scratch") or self._act(   # split-KV partials, shared by the layers
                "attn_scratch", layers.attention_scratch_bytes(head_dim=cfg.head_dim, n_heads=cfg.n_heads,
                                                               max_ctx=self.ctx) // 4)
            steps += layers.attention(k, dev, a["att"], a["q_rot"], k_cache, v_cache, self.step, max_ctx=self.ctx,
                                      scratch=scratch, scale=cfg.attention_scale, label=f"{b}attention", **shape)
        else:
            steps.append(batched.prefill_attention(k, dev, a["att"], a["q_rot"], k_cache, v_cache, self.step,
                                                   scale=cfg.attention_scale, max_rows=rows, **shape))
        return steps + self._proj(a["x"], f"{b}attn_output.weight", a["att"], rows, accumulate=True,
                                  scale=cfg.residual_scale)

    def _shortconv(self, i: int, rows: int, a: dict) -> list:
        """LFM2: x += residual_scale * W_out (C * conv(B * x')), (B, C, x') = W_in attn_norm(x)."""
        cfg, b = self.cfg, f"blk.{i}."
        state = self.buffers.get(f"{b}conv_state") or self._act(f"{b}conv_state", cfg.conv_kernel - 1,
                                                                  cfg.hidden)   # rolling B*x rows
        steps = self._proj(a["bcx"], f"{b}shortconv.in_proj.weight", a["x"], rows, norm=b + "attn_norm.weight")
        steps.append(layers.shortconv(self.kernels, self.device, a["conv_out"], a["bcx"],
                                      self._f32(b + "shortconv.conv.weight"), state, self.step, hidden=cfg.hidden,
                                      kernel=cfg.conv_kernel, label=f"{b}shortconv"))
        return steps + self._proj(a["x"], f"{b}shortconv.out_proj.weight", a["conv_out"], rows, accumulate=True,
                                  scale=cfg.residual_scale)

    def _ffn(self, i: int, rows: int, a: dict) -> list:
        """x += residual_scale * W_down (silu(W_gate h) * (W_up h)), h = ffn_norm(x)."""
        b = f"blk.{i}."
        gate, up = self.gguf.tensors[b + "ffn_gate.weight"], self.gguf.tensors[b + "ffn_up.weight"]
        if gate.ggml_type != up.ggml_type:
            raise ValueError(f"{gate.name} ({gate.type_name}) and {up.name} ({up.type_name}) differ in type: "
                             "the fused SwiGLU kernels need one type")
        steps = self._proj(a["hb"], gate.name, a["x"], rows, norm=b + "ffn_norm.weight", w_up=up.name)
        return steps + self._proj(a["x"], f"{b}ffn_down.weight", a["hb"], rows, accumulate=True,
                                  scale=self.cfg.residual_scale)

    def _activations(self, rows: int) -> dict:
        """Activation buffers for steps of up to `rows` tokens (row-major, one row per token)."""
        cfg, h, r = self.cfg, self.cfg.hidden, rows
        a = {"x": self._act(f"x@{r}", r, h),                   # residual stream
             "xb": self._act(f"xb@{r}", r, h),                 # normed block input (chunks only)
             "hb": self._act(f"hb@{r}", r, cfg.ff)}            # ffn hidden: silu(gate) * up
        if cfg.attention_layers:
            kv = max(cfg.kv_dim(i) for i in cfg.attention_layers)
            if r == 1:
                a["qkv"] = self._act("qkv@1", cfg.q_dim + 2 * kv)     # q | k | v of a stacked matvec
            a["q"] = self._act(f"q@{r}", r, cfg.q_dim)
            a["k"], a["v"] = self._act(f"k@{r}", r, kv), self._act(f"v@{r}", r, kv)
            a["q_rot"] = self._act(f"q_rot@{r}", r, cfg.q_dim)        # q after [QK-norm and] RoPE
            a["att"] = self._act(f"att@{r}", r, cfg.q_dim)            # attention output
        if cfg.conv_layers:
            a["bcx"] = self._act(f"bcx@{r}", r, 3 * h)                # lfm2 in_proj output: B, C, x
            a["conv_out"] = self._act(f"conv_out@{r}", r, h)
        return a

    def _embed(self, x, rows: int) -> list:
        """x (rows, hidden) = the embeddings of tokens[0..rows) (times Granite's embedding_scale)."""
        name = "token_embd.weight"
        try:
            return matmul.embed_tiled(self.kernels, self.device, x, self._tensor(name),
                                      Binding(self.tokens.buffer, 0, 4 * rows), self.step, wtype=self.wtypes[name],
                                      k=self.cfg.hidden, rows=self.gguf.tensors[name].shape[0], max_rows=rows,
                                      scale=self.cfg.embedding_scale)
        except ValueError as err:
            raise ValueError(f"tensor {name}: {err} (model too large for this GPU's limits)") from None

    def _head(self, x) -> list:
        """logits = W_head rms_norm(x) / logit_scale for one row, then its argmax -> tokens[0]."""
        cfg = self.cfg
        steps = self._proj(self.logits, cfg.lm_head, x, 1, norm=cfg.final_norm, scale=1.0 / cfg.logit_scale)
        return steps + [matmul.argmax(self.kernels, self.device, self.tokens, self.logits, n=cfg.vocab_size)]

    # --- the schedules -------------------------------------------------------------------
    def _build_decode(self) -> None:
        cfg, dev = self.cfg, self.device
        if cfg.rope_freq_scale != 1.0:
            raise ValueError("linear RoPE scaling is not implemented on the GPU yet")
        self.step = Binding(dev.buffer(STEP_BYTES, "step", uniform=True), 0, STEP_BYTES)
        self.tokens = Binding(dev.buffer(4 * self.chunk, "tokens"), 0, 4)   # (chunk,) u32 token ids
        self.logits = self._act("logits", cfg.vocab_size)
        self.decode_act = a = self._activations(1)
        steps = self._embed(a["x"], 1)
        for i in range(cfg.n_layers):
            steps += self._layer(i, 1, a)
        steps += self._head(a["x"])
        self.decode_steps = steps
        self.decode_schedule = dev.schedule(steps)
        self.dispatches_per_token = len(steps)
        # the KV caches need no clearing between sequences: attention reads only the positions
        # the current sequence has written; the conv states are read whole
        self._state = [b for name, b in self.buffers.items() if name.endswith("conv_state")]

    def _build_prefill(self) -> None:
        """The chunk's layers: embed + every layer, for up to `chunk` rows."""
        rows = self.chunk
        self.prefill_act = a = self._activations(rows) if rows > 1 else self.decode_act
        steps = self._embed(a["x"], rows)
        for i in range(self.cfg.n_layers):
            steps += self._layer(i, rows, a)
        self.prefill_steps = steps

    def _prefill_schedule(self, n: int, all_logits: bool):
        """A chunk of n rows: the layers, then either the last row through the decode head
        (logits and argmax of that row) or every row through a batched head (scoring)."""
        key = (n, all_logits)
        if key not in self._prefill_schedules:
            h = self.cfg.hidden
            x = self.prefill_act["x"]
            if all_logits:
                tail = self._scoring_head(n)
            elif self.chunk == 1:
                tail = self._head(x)
            else:   # copy row n-1 of the chunk into the decode row and run the decode head on it
                tail = [Copy(x.buffer, 4 * (n - 1) * h, self.decode_act["x"].buffer, 0, 4 * h)]
                tail += self._head(self.decode_act["x"])
            self._prefill_schedules[key] = self.device.schedule(self.prefill_steps + tail)
        return self._prefill_schedules[key]

    def _scoring_head(self, n: int) -> list:
        """logits (n, vocab) for every row of the chunk, and the last row's argmax."""
        cfg = self.cfg
        if "logits_all" not in self.buffers:
            self._act("logits_all", self.chunk, cfg.vocab_size)
        logits_all = self.buffers["logits_all"]
        steps = self._proj(logits_all, cfg.lm_head, self.prefill_act["x"], self.chunk, norm=cfg.final_norm,
                           scale=1.0 / cfg.logit_scale)
        steps.append(Copy(logits_all.buffer, 4 * (n - 1) * cfg.vocab_size, self.logits.buffer, 0,
                          4 * cfg.vocab_size))
        return steps + [matmul.argmax(self.kernels, self.device, self.tokens, self.logits, n=cfg.vocab_size)]

    # --- running -------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the sequence: zero the conv states (the KV caches are overwritten as it goes)."""
        for b in self._state:
            self.device.write(b.buffer, bytes(b.size))

    async def forward(self, tokens: list[int], pos0: int, logits=None):
        """Run tokens at positions pos0.. in chunks (one submission each); return the greedy next
        token after the last one, and logits: None, "last" (vocab,) or "all" (T, vocab)."""
        rows, vocab = [], self.cfg.vocab_size
        chunks = [tokens[s: s + self.chunk] for s in range(0, len(tokens), self.chunk)]
        for c, chunk in enumerate(chunks):
            pos, n, last = pos0 + c * self.chunk, len(chunk), c == len(chunks) - 1
            self.device.write(self.tokens.buffer, np.asarray(chunk, np.uint32).tobytes())
            self.device.write(self.step.buffer, pack_step(pos, n))
            all_logits = logits == "all"
            if n == 1 and not all_logits:
                schedule = self.decode_schedule
            else:
                schedule = self._prefill_schedule(n, all_logits)
            self._token_of(await self.device.run(schedule, self.tokens))
            if all_logits:
                raw = await self.device.read(self.buffers["logits_all"].buffer, 0, 4 * n * vocab)
                rows.append(np.frombuffer(raw, np.float32).reshape(n, vocab))
            elif last and logits:
                rows.append(np.frombuffer(await self.device.read(self.logits.buffer, 0, 4 * vocab), np.float32))
        if len(tokens) > 1:
            self.submits_per_prefill = len(chunks)
        if logits == "all":
            return self._gpu_token, np.concatenate(rows)
        return self._gpu_token, rows[-1].copy() if logits else None

    async def greedy(self, token: int, pos: int, n: int):
        """Yield the n greedy tokens that follow `token` at `pos`, keeping one step in flight:
        the argmax stays on the GPU and feeds the next step's embedding, so step i+1 is
        submitted before step i's 4-byte readback is awaited (host encoding overlaps GPU work)."""
        if token != self._gpu_token:
            self.device.write(self.tokens.buffer, np.array([token], np.uint32).tobytes())
        pending = None
        try:
            for i in range(n):
                self.device.write(self.step.buffer, pack_step(pos + i, 1))
                previous, pending = pending, self.device.run(self.decode_schedule, self.tokens)
                if previous is not None:
                    token = self._token_of(await previous)
                    self._gpu_token = None   # the step in flight overwrites it
                    yield token
            if pending is not None:
                last, pending = pending, None
                yield self._token_of(await last)
        finally:
            if pending is not None:   # closed early: let the step in flight finish
                await pending

    def _token_of(self, readback: bytes) -> int:
        self._gpu_token = int(np.frombuffer(readback, np.uint32)[0])
        return self._gpu_token
