"""A model on the GPU: its weights (`residency`), the buffers it computes in (`state`), its
plans (`plan`) recorded once as schedules, and the loop that submits them.

Decode is one submission per token: embed the token the last argmax wrote, run every layer,
LM head, argmax into `tokens[0]`, and read those 4 bytes back. Everything that changes per
token (the position) lives in the Step uniform, written once per submission, so the same
schedule serves every token. Prefill goes through the batched kernels in chunks of up to
`chunk` tokens, one submission per chunk; the KV caches and conv states carry across
chunks. Only the last row of the last chunk is projected to logits, unless all logits are
asked for (scoring). A sampler's candidates come from a top-k selection of those logits on the
GPU, submitted after the step. Embeddings run the layers and the final norm on scratch state
of their own, so they never disturb the sequence held here.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from cera.config import ModelConfig
from cera.device import Binding, Device
from cera.errors import InvalidArgument, Unsupported
from cera.gpu.layers import SHIFT_BYTES, TOP_K_MAX, pack_shift, pack_top_k, unpack_top_k
from cera.gpu.plan import (Builder, DecodeBuilder, Plan, PrefillBuilder, decode_plan, embed_plan, prefill_plan,
                           shift_plan)
from cera.gpu.residency import Weights
from cera.gpu.state import Activations, State, f32_buffer, pack_step
from cera.kernels import Kernels
from cera.prefix import Snapshot
from cera.sampling import Candidates, TopK

DEFAULT_CHUNK = 512      # prompt tokens per prefill submission
PREFILL_SCHEDULES = 8    # prefill schedules kept (one per chunk length seen; most prompts end in a new one)


class GpuModel:
    """Weights, buffers and schedules of one model on one device, for up to `ctx` positions."""

    def __init__(self, cfg: ModelConfig, gguf_file, device: Device, ctx: int, chunk: int = DEFAULT_CHUNK):
        if chunk < 1:
            raise InvalidArgument(f"prefill chunk {chunk} must be at least 1")
        if cfg.rope_freq_scale != 1.0:
            raise Unsupported("linear RoPE scaling is not implemented on the GPU yet")
        self.cfg, self.device, self.ctx = cfg, device, ctx
        self.chunk = min(chunk, ctx)
        self.kernels = Kernels(device)
        self.weights = Weights(cfg, gguf_file, device)
        self.state = State.allocate(device, cfg, ctx, self.chunk)
        self.decode = DecodeBuilder(cfg, ctx, self.weights, self.state, Activations.allocate(device, cfg, 1),
                                    self.kernels)
        self.prefill = self.decode if self.chunk == 1 else PrefillBuilder(
            cfg, ctx, self.weights, self.state, Activations.allocate(device, cfg, self.chunk), self.kernels)
        self.decode_plan = decode_plan(self.decode)
        self.decode_schedule = device.schedule(self.decode_plan.steps)
        self.prefill.body   # builds the chunk's layers now, so load() uploads every weight they use
        self._logits_all = None                  # (chunk, vocab) for scoring, allocated when first asked for
        self._prefill_schedules = OrderedDict()  # (rows, scoring) -> schedule, the most recent last
        self._gpu_token = None                   # the token id tokens[0] holds (argmax wrote it)
        self._shift = None                       # ((k, v) scratch, Shift uniform) of shift(), made on first use
        self._top_k = None                       # (params, out, schedule) of _select(), made on first use
        self._embedder = None                    # (builder on scratch state, schedule) of embed(), likewise
        self.n_past = 0                          # positions of the sequence run so far (cached)
        self.submits_per_prefill = 0             # submissions the last multi-token forward() took

    @property
    def dispatches_per_token(self) -> int:
        return self.decode_plan.dispatches

    async def load(self, progress=None) -> None:
        """Upload the weights the plans use; progress(done, total) in bytes."""
        await self.weights.upload(progress)

    def plan(self, n: int, scoring: bool = False) -> Plan:
        """The plan of a submission of n tokens (n == 1 and not scoring: the decode plan)."""
        if not scoring and (n == 1 or self.chunk == 1):
            return self.decode_plan
        if scoring and self._logits_all is None:
            self._logits_all = f32_buffer(self.device, "logits_all", self.chunk, self.cfg.vocab_size)
        return prefill_plan(self.prefill, self.decode, n, self._logits_all if scoring else None)

    def _schedule(self, n: int, scoring: bool):
        if not scoring and (n == 1 or self.chunk == 1):
            return self.decode_schedule
        key = (n, scoring)
        if key not in self._prefill_schedules:
            self._prefill_schedules[key] = self.device.schedule(self.plan(n, scoring).steps)
            if len(self._prefill_schedules) > PREFILL_SCHEDULES:
                self._prefill_schedules.popitem(last=False)
        self._prefill_schedules.move_to_end(key)
        return self._prefill_schedules[key]

    # --- running -------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the sequence."""
        self.state.reset(self.device)
        self.n_past = 0

    async def snapshot(self, tokens: list[int]) -> Snapshot:
        """The state after `tokens` (the first len(tokens) cached positions), read back."""
        n, arrays, state = len(tokens), {}, self.state
        for i in self.cfg.attention_layers:
            for name, cache in (("k", state.key_cache[i]), ("v", state.value_cache[i])):
                raw = await self.device.read(cache.buffer, 0, 4 * n * self.cfg.kv_dim(i))
                arrays[f"{name}.{i}"] = np.frombuffer(raw, np.float32).reshape(n, self.cfg.kv_dim(i))
        for i, b in state.conv_state.items():
            arrays[f"conv.{i}"] = np.frombuffer(await self.device.read(b.buffer, 0, b.size), np.float32)
        return Snapshot(tuple(tokens), arrays)

    def restore(self, snapshot: Snapshot) -> None:
        """Make `snapshot` the sequence so far."""
        state = self.state
        for name, array in snapshot.arrays.items():
            kind, i = name.split(".")
            target = {"k": state.key_cache, "v": state.value_cache, "conv": state.conv_state}[kind][int(i)]
            self.device.write(target.buffer, np.ascontiguousarray(array, np.float32).tobytes())
        self.n_past = len(snapshot.tokens)

    async def shift(self, keep: int, discard: int, n_past: int) -> None:
        """Context shift: drop cached positions keep..keep+discard-1 of the n_past cached, moving
        the later ones down by `discard` with their keys re-rotated; the conv states, which
        carry no position, stay."""
        n = n_past - keep - discard
        self.n_past = n_past - discard
        if keep < 0 or discard < 1 or n < 0:
            raise InvalidArgument(f"shift of {discard} positions after {keep} of {n_past}: out of range")
        if n == 0:
            return
        if self._shift is None:   # scratch for the moved rows and the Shift uniform, made on first use
            kv = max(self.cfg.kv_dim(i) for i in self.cfg.attention_layers)
            scratch = (f32_buffer(self.device, "shift_k", self.ctx, kv), f32_buffer(self.device, "shift_v", self.ctx, kv))
            self._shift = scratch, Binding(self.device.buffer(SHIFT_BYTES, "shift", uniform=True), 0, SHIFT_BYTES)
        scratch, uniform = self._shift
        self.device.write(uniform.buffer, pack_shift(keep, discard, n))
        await self.device.run(self.device.schedule(shift_plan(self.decode, keep, n, scratch, uniform).steps))

    async def forward(self, tokens: list[int], pos0: int, logits=None):
        """Run tokens at positions pos0.. in chunks (one submission each); return the greedy next
        token after the last one, and logits: None, "last" (vocab,), "all" (T, vocab), or for a
        TopK the Candidates it asks for."""
        rows, vocab, scoring = [], self.cfg.vocab_size, logits == "all"
        chunks = [tokens[s: s + self.chunk] for s in range(0, len(tokens), self.chunk)]
        for c, chunk in enumerate(chunks):
            n, last = len(chunk), c == len(chunks) - 1
            self._token_of(await self._run(self.state, self._schedule(n, scoring), chunk, pos0 + c * self.chunk,
                                           self.state.tokens))
            if scoring:
                raw = await self.device.read(self._logits_all.buffer, 0, 4 * n * vocab)
                rows.append(np.frombuffer(raw, np.float32).reshape(n, vocab))
            elif last and isinstance(logits, TopK):
                rows.append(await self._select(logits))
            elif last and logits:
                raw = await self.device.read(self.state.logits.buffer, 0, 4 * vocab)
                rows.append(np.frombuffer(raw, np.float32).copy())
        if len(tokens) > 1:
            self.submits_per_prefill = len(chunks)
        self.n_past = pos0 + len(tokens)
        if scoring:
            return self._gpu_token, np.concatenate(rows)
        return self._gpu_token, rows[-1] if logits else None

    def _run(self, state: State, schedule, tokens: list[int], pos: int, read: Binding):
        """Submit `schedule` for `tokens` at positions pos.. of `state`, reading `read` back."""
        self.device.write(state.tokens.buffer, np.asarray(tokens, np.uint32).tobytes())
        self.device.write(state.step.buffer, pack_step(pos, len(tokens)))
        return self.device.run(schedule, read)

    async def _select(self, request: TopK) -> Candidates:
        """The candidates `request` asks for, from the logits the last step wrote: the GPU picks
        the k best (layers.top_k) and 8 k + 4 len(watch) bytes come back."""
        k, watch = request.k, request.watch
        if not 0 < k <= min(TOP_K_MAX, self.cfg.vocab_size) or len(watch) > TOP_K_MAX:
            raise InvalidArgument(f"top-k of {k} (watching {len(watch)}): the GPU selects 1..{TOP_K_MAX}")
        if self._top_k is None:   # the params, the output and the schedule, made on first use
            params = Binding(self.device.buffer(4 * (2 + TOP_K_MAX), "top_k.params"))      # (2 + watch,) u32
            out = Binding(self.device.buffer(4 * 3 * TOP_K_MAX, "top_k.out"))              # (2 k + watch,) u32
            self._top_k = params, out, self.device.schedule([self.decode.top_k(out, params)])
        params, out, schedule = self._top_k
        self.device.write(params.buffer, pack_top_k(k, watch))
        raw = await self.device.run(schedule, Binding(out.buffer, 0, 8 * k + 4 * len(watch)))
        ids, logits, watched = unpack_top_k(raw, k)
        return Candidates(np.concatenate([ids, np.asarray(watch, np.int64)]), np.concatenate([logits, watched]))

    async def embed(self, tokens: list[int]) -> np.ndarray:
        """The hidden states after the final norm (T, hidden) of tokens run from position 0 (the
        plans' layers, then embed_plan's norm, a chunk per submission), on scratch state: KV
        caches and conv states of their own, made for the longest text so far. The sequence
        held here (its caches, n_past) stays as it was."""
        builder, schedule = self._embedder_for(len(tokens))
        builder.state.reset(self.device)
        h, rows = self.cfg.hidden, []
        for start in range(0, len(tokens), self.chunk):
            chunk = tokens[start: start + self.chunk]
            xb = Binding(builder.act.xb.buffer, 0, 4 * len(chunk) * h)
            raw = await self._run(builder.state, schedule, chunk, start, xb)
            rows.append(np.frombuffer(raw, np.float32).reshape(len(chunk), h))   # (chunk, hidden)
        return np.concatenate(rows)

    def _embedder_for(self, n: int) -> tuple[Builder, object]:
        """The builder and schedule of embed() for n tokens: the prefill builder's kind and
        activations (a step's scratch) over a State of its own, of the next power of two >= n
        positions (at least 64, at most ctx), remade only for a longer text. Its layers are the
        plans' own, so it places no weight that load() did not upload."""
        if self._embedder is None or self._embedder[0].ctx < n:
            positions = min(self.ctx, max(64, 1 << (n - 1).bit_length()))
            state = State.allocate(self.device, self.cfg, positions, self.chunk)
            builder = type(self.prefill)(self.cfg, positions, self.weights, state, self.prefill.act, self.kernels)
            self._embedder = builder, self.device.schedule(embed_plan(builder).steps)
        return self._embedder

    async def greedy(self, token: int, pos: int, n: int):
        """Yield the n greedy tokens that follow `token` at `pos`, keeping one step in flight:
        the argmax stays on the GPU and feeds the next step's embedding, so step i+1 is
        submitted before step i's 4-byte readback is awaited (host encoding overlaps GPU work)."""
        if token != self._gpu_token:
            self.device.write(self.state.tokens.buffer, np.array([token], np.uint32).tobytes())
        pending = None
        try:
            for i in range(n):
                self.device.write(self.state.step.buffer, pack_step(pos + i, 1))
                previous, pending = pending, self.device.run(self.decode_schedule, self.state.tokens)
                self.n_past = pos + i + 1
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
