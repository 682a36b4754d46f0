"""A model on the GPU: its weights (`residency`), the buffers it computes in (`state`), its
plans (`plan`) recorded once as schedules, and the loop that submits them.

Decode is one step per token: embed the token the last step chose, run every layer, LM head,
then choose the next into `tokens[0]`: the argmax (greedy), or the sampler's dispatches
(`cera.gpu.sample`, set up by `sample_start`). Everything that changes per token (the position,
the draw) lives in the Step uniform, so the same schedule serves every token. A step alone
(`forward`, one submission) reads its 4 bytes back; decode chains up to GREEDY_BATCH (state.py)
steps in one submission (`plan.chain_plan`: the Step moved on by the GPU, each token appended to
a small buffer) and reads the batch's tokens back at once. Prefill goes through the batched
kernels in chunks of up to `chunk` tokens, one submission per chunk; the KV caches and conv
states carry across chunks. Only the last row of the last chunk is projected to logits, unless
all logits are asked for (scoring); `choose` draws the token after a prompt from them.
Embeddings run the layers and the final norm on scratch state of their own, so they never
disturb the sequence held here.

LoRA adapters (cera.lora) are uploaded once (`add_lora`) and stay loaded; `use_loras` picks the
set the next submissions apply. Each set gets its own builders and schedules, made on its
first use and kept (the base model is the empty set).
"""
from __future__ import annotations

from collections import OrderedDict
from contextlib import aclosing
from dataclasses import dataclass, field

import numpy as np

from cera.config import ModelConfig
from cera.device import Binding, Copy, Device
from cera.errors import InvalidArgument, Unsupported
from cera.gpu.footprint import footprint
from cera.gpu import sample
from cera.gpu.ops import SHIFT_BYTES, pack_shift
from cera.gpu.numerics import CACHE_TYPES, EXACT, Numerics, cache_row_bytes
from cera.gpu.plan import (Adapters, Builder, DecodeBuilder, Plan, PrefillBuilder, chain_plan, decode_plan,
                           embed_plan, prefill_plan, shift_plan)
from cera.gpu.residency import Weights
from cera.gpu.sample import SamplerBuffers
from cera.gpu.state import Activations, GreedyChain, State, f32_buffer, pack_step
from cera.kernels import Kernels
from cera.lora import LoraAdapter
from cera.prefix import Snapshot
from cera.constrain import Matcher
from cera.sampling import NO_TOKEN, Sampler

DEFAULT_CHUNK = 512      # prompt tokens per prefill submission
PREFILL_SCHEDULES = 8    # prefill schedules kept (one per chunk length seen; most prompts end in a new one)


@dataclass
class Schedules:
    """What runs for one set of LoRA adapters: its builders, its decode plan recorded once, the
    chained batches recorded on first use ((steps, half, sampler variant) -> schedule), and the
    prefill schedules made so far ((rows, scoring) -> schedule, the most recent last)."""
    decode: DecodeBuilder
    prefill: Builder
    decode_plan: Plan
    decode_schedule: object
    chain_schedules: dict = field(default_factory=dict)
    prefill_schedules: OrderedDict = field(default_factory=OrderedDict)


class GpuModel:
    """Weights, buffers and schedules of one model on one device, for up to `ctx` positions,
    computed with the kernels' `numerics` (cera.gpu.numerics: exact by default)."""

    def __init__(self, cfg: ModelConfig, gguf_file, device: Device, ctx: int, chunk: int = DEFAULT_CHUNK,
                 numerics: Numerics = EXACT):
        if chunk < 1:
            raise InvalidArgument(f"prefill chunk {chunk} must be at least 1")
        if cfg.encoder:
            raise Unsupported(f"{cfg.arch} is an encoder (embeddings only): it runs as cera.gpu.encoder.GpuEncoder, "
                              "with no decode or prefill plans")
        self.footprint = footprint(cfg, gguf_file, ctx, chunk, device.limits, numerics)
        self.footprint.check(device.limits)   # before anything is allocated
        self.cfg, self.device, self.ctx, self.numerics = cfg, device, ctx, numerics
        self.chunk = self.footprint.chunk
        self.kernels = Kernels(device)
        self.weights = Weights(cfg, gguf_file, device)
        self.state = State.allocate(device, cfg, ctx, self.chunk, numerics.cache_types)
        self.chain = GreedyChain.allocate(device, cfg)   # chained batches' tokens and conv records
        self.sampling = SamplerBuffers.allocate(device, cfg, ctx)   # the sampler's settings and state
        self._act = [Activations.allocate(device, cfg, 1)]     # decode's, then the chunk's (chunk > 1)
        if self.chunk > 1:
            self._act.append(Activations.allocate(device, cfg, self.chunk, numerics.int8))
        self._lora_act = None                    # the same with the LoRA scratch, once an adapter is loaded
        self.loras: list[tuple[LoraAdapter, Adapters]] = []   # loaded: each adapter and its pairs on the GPU
        self._sets = {(): self._schedules(())}   # adapter set (indices into loras) -> its Schedules
        self.active = self._sets[()]
        self.active.prefill.body   # builds the chunk's layers now, so load() uploads every weight they use
        self._logits_all = None                  # (chunk, vocab) for scoring, allocated when first asked for
        self._gpu_token = None                   # the token id tokens[0] holds (argmax wrote it)
        self._shift = None                       # ((k, v) scratch, Shift uniform) of shift(), made on first use
        self._choose = {}                        # sampler variant -> the schedule of choose() alone
        self.sampler: Sampler | None = None      # the sampler of the generation under way (sample_start)
        self._sampled: list[int] = []            # its sequence so far, for its penalties
        self._matcher: Matcher | None = None     # its constraint's walk through the reply
        self._embedder = None                    # (builder on scratch state, schedule) of embed(), likewise
        self.n_past = 0                          # positions of the sequence run so far (cached)
        self.submits_per_prefill = 0             # submissions the last multi-token forward() took

    @property
    def decode_plan(self) -> Plan:
        return self.active.decode_plan

    @property
    def decode_schedule(self):
        return self.active.decode_schedule

    @property
    def dispatches_per_token(self) -> int:
        return self.decode_plan.dispatches

    async def load(self, progress=None) -> None:
        """Upload the weights the plans use; progress(done, total) in bytes."""
        await self.weights.upload(progress)

    # --- LoRA adapters -------------------------------------------------------------------
    async def add_lora(self, adapter: LoraAdapter, progress=None) -> None:
        """Upload an adapter's tensors (progress(done, total) in bytes); it becomes loras[-1]."""
        tensors = Weights(self.cfg, adapter.gguf, self.device)
        pairs = {p.target: [(tensors.matrix(p.a), tensors.matrix(p.b), p.scale)] for p in adapter.pairs.values()}
        await tensors.upload(progress)
        rank = max(a.max_rank for a, _ in self.loras) if self.loras else 0
        if adapter.max_rank > rank:   # the scratch grows; sets built before keep the buffers they bound
            self._lora_act = [act.with_lora(self.device, self.cfg, adapter.max_rank) for act in self._act]
        self.loras.append((adapter, pairs))

    def use_loras(self, key: tuple[int, ...]) -> None:
        """Apply the adapters loras[i] for i in `key` (in that order) from the next submission on;
        () is the base model. The sequence's state is not touched (the caller decides)."""
        if key not in self._sets:
            self._sets[key] = self._schedules(key)
        self.active = self._sets[key]

    def _schedules(self, key: tuple[int, ...]) -> Schedules:
        """Builders and the decode schedule for the adapter set `key`."""
        adapters: Adapters = {}
        for i in key:
            for target, pairs in self.loras[i][1].items():
                adapters.setdefault(target, []).extend(pairs)
        acts = self._lora_act if key else self._act
        common = (self.cfg, self.ctx, self.weights, self.state)
        decode = DecodeBuilder(*common, acts[0], self.kernels, adapters, self.numerics)
        prefill = decode if self.chunk == 1 else PrefillBuilder(*common, acts[1], self.kernels, adapters,
                                                                self.numerics)
        plan = decode_plan(decode)
        return Schedules(decode, prefill, plan, self.device.schedule(plan.steps))

    # --- plans ---------------------------------------------------------------------------
    def _runs_decode(self, n: int, scoring: bool) -> bool:
        """Whether a submission of n tokens is the decode plan (one row, or no prefill chunks)."""
        return not scoring and (n == 1 or self.chunk == 1)

    def plan(self, n: int, scoring: bool = False) -> Plan:
        """The plan of a submission of n tokens (n == 1 and not scoring: the decode plan)."""
        if self._runs_decode(n, scoring):
            return self.decode_plan
        if scoring and self._logits_all is None:
            self._logits_all = f32_buffer(self.device, "logits_all", self.chunk, self.cfg.vocab_size)
        return prefill_plan(self.active.prefill, self.active.decode, n, self._logits_all if scoring else None)

    def chain_plan(self, steps: int, half: int = 0, sampler: Sampler | None = None) -> Plan:
        """The plan of `steps` decode steps chained (plan.chain_plan): greedy, or with `sampler`'s
        dispatches (its variant: whether it adjusts the logits, whether it penalizes)."""
        return chain_plan(self.active.decode, steps, self.chain, half, sampler and self._choose_steps(sampler))

    def _choose_steps(self, sampler: Sampler) -> list:
        state = self.state
        return sample.choose(self.kernels, self.sampling, state.logits, state.tokens, self.chain.tokens,
                             state.step, sampler, self.cfg.vocab_size)

    def _chain_schedule(self, steps: int, half: int, sampler: Sampler | None):
        half = half if self.chain.conv else 0   # without conv states the halves are the same plan
        key, made = (steps, half, sampler and _variant(sampler)), self.active.chain_schedules
        if key not in made:
            made[key] = self.device.schedule(self.chain_plan(steps, half, sampler).steps)
        return made[key]

    def _schedule(self, n: int, scoring: bool, sampler: Sampler | None = None):
        """The schedule of a submission of n tokens, ending in `sampler`'s choice if given."""
        if self._runs_decode(n, scoring):
            return self.decode_schedule if sampler is None else self._chain_schedule(1, 0, sampler)
        key, made = (n, scoring, sampler and _variant(sampler)), self.active.prefill_schedules
        if key not in made:
            choose = self._choose_steps(sampler) if sampler else []
            made[key] = self.device.schedule(self.plan(n, scoring).steps + tuple(choose))
            if len(made) > PREFILL_SCHEDULES:
                made.popitem(last=False)
        made.move_to_end(key)
        return made[key]

    # --- running -------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the sequence."""
        self.state.reset(self.device)
        self.n_past = 0

    async def snapshot(self, tokens: list[int]) -> Snapshot:
        """The state after `tokens` (the first len(tokens) cached positions), read back: K and V
        rows as the cache holds them (numpy's float16 for an f16 cache, cera.ops.Q8_0_BLOCK
        blocks for a q8_0 one)."""
        n, arrays, state, cfg = len(tokens), {}, self.state, self.cfg
        for i in cfg.attention_layers:
            for name, cache, cache_type in zip("kv", (state.key_cache[i], state.value_cache[i]), self.numerics.cache_types):
                raw = await self.device.read(cache.buffer, 0, n * cfg.n_kv_heads[i] * cache_row_bytes(cache_type, cfg.head_dim))
                arrays[f"{name}.{i}"] = np.frombuffer(raw, CACHE_TYPES[cache_type]).reshape(n, -1)
        for i, b in state.conv_state.items():
            arrays[f"conv.{i}"] = np.frombuffer(await self.device.read(b.buffer, 0, b.size), np.float32)
        return Snapshot(tuple(tokens), arrays)

    def restore(self, snapshot: Snapshot) -> None:
        """Make `snapshot` the sequence so far. Its K and V rows must be of this cache's types:
        state rounded otherwise is not the state these kernels would have made."""
        state, (k_type, v_type) = self.state, self.numerics.kv_dtypes
        for name, array in snapshot.arrays.items():
            kind, i = name.split(".")
            target = {"k": state.key_cache, "v": state.value_cache, "conv": state.conv_state}[kind][int(i)]
            dtype = {"k": k_type, "v": v_type, "conv": np.float32}[kind]
            if array.dtype != dtype:
                raise InvalidArgument(f"snapshot {name} is {array.dtype}; this model's cache holds {np.dtype(dtype)}")
            self.device.write(target.buffer, np.ascontiguousarray(array).tobytes())
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
        if self._shift is None:   # scratch for the moved rows (as the caches hold them) and the Shift uniform
            kv_heads = max(self.cfg.n_kv_heads[i] for i in self.cfg.attention_layers)
            size = [cache_row_bytes(t, self.cfg.head_dim) * self.ctx * kv_heads for t in self.numerics.cache_types]
            scratch = tuple(Binding(self.device.buffer(n, label), 0, n) for n, label in zip(size, ("shift_k", "shift_v")))
            self._shift = scratch, Binding(self.device.buffer(SHIFT_BYTES, "shift", uniform=True), 0, SHIFT_BYTES)
        scratch, uniform = self._shift
        self.device.write(uniform.buffer, pack_shift(keep, discard, n))
        await self.device.run(self.device.schedule(shift_plan(self.active.decode, keep, n, scratch, uniform).steps))

    async def forward(self, tokens: list[int], pos0: int, logits=None, sampled: bool = False):
        """Run tokens at positions pos0.. in chunks (one submission each); return the next token
        after the last one, and logits: None, "last" (vocab,) or "all" (T, vocab). The token is
        the argmax, or with `sampled` the choice of sample_start's sampler (its draw 0: a reply's
        first token), made at the end of the last chunk's submission."""
        rows, vocab, scoring = [], self.cfg.vocab_size, logits == "all"
        chunks = [tokens[s: s + self.chunk] for s in range(0, len(tokens), self.chunk)]
        for c, chunk in enumerate(chunks):
            n, last = len(chunk), c == len(chunks) - 1
            sampler = self.sampler if sampled and last else None
            if sampler is not None:
                self._mask_next()
            read = Binding(self.sampling.result.buffer, 0, 4) if sampler else self.state.tokens
            raw = await self._run(self.state, self._schedule(n, scoring, sampler), chunk, pos0 + c * self.chunk, read)
            token = self._chosen(raw) if sampler else self._token_of(raw)
            if scoring:
                raw = await self.device.read(self._logits_all.buffer, 0, 4 * n * vocab)
                rows.append(np.frombuffer(raw, np.float32).reshape(n, vocab))
            elif last and logits:
                raw = await self.device.read(self.state.logits.buffer, 0, 4 * vocab)
                rows.append(np.frombuffer(raw, np.float32).copy())
        if len(tokens) > 1:
            self.submits_per_prefill = len(chunks)
        self.n_past = pos0 + len(tokens)
        if scoring:
            return token, np.concatenate(rows)
        return token, rows[-1] if logits else None

    def _run(self, state: State, schedule, tokens: list[int], pos: int, read: Binding):
        """Submit `schedule` for `tokens` at positions pos.. of `state`, reading `read` back."""
        self.device.write(state.tokens.buffer, np.asarray(tokens, np.uint32).tobytes())
        self.device.write(state.step.buffer, pack_step(pos, len(tokens)))
        return self.device.run(schedule, read)

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
        prefill = self.active.prefill   # its kind, activations and adapters
        if self._embedder is None or self._embedder[0].ctx < n or self._embedder[0].adapters is not prefill.adapters:
            positions = min(self.ctx, max(64, 1 << (n - 1).bit_length()))
            state = State.allocate(self.device, self.cfg, positions, self.chunk, self.numerics.cache_types)
            builder = type(prefill)(self.cfg, positions, self.weights, state, prefill.act, self.kernels,
                                    prefill.adapters, self.numerics)
            self._embedder = builder, self.device.schedule(embed_plan(builder).steps)
        return self._embedder

    # --- sampling --------------------------------------------------------------------------
    def sample_start(self, sampler: Sampler, history: list[int], matcher: Matcher | None = None) -> None:
        """Draw the next tokens with `sampler` (choose, decode with a draw index), after `history`
        (prompt and reply so far): its settings and penalty window go to the GPU. `matcher`: the
        sampler's constraint on this reply (cera.constrain), which masks every choice."""
        self.sampling.load(self.device, sampler, history, self.cfg.vocab_size, self.ctx)
        self.sampler, self._sampled, self._matcher = sampler, list(history), matcher

    async def choose(self, draw: int) -> int:
        """The sampler's token after the last position run (the reply's token `draw`), from the
        logits that step left on the GPU; NO_TOKEN when none is allowed."""
        self._mask_next()
        return self._chosen(await self._submit_choice(draw, self.n_past))

    def _submit_choice(self, draw: int, positions: int):
        """Submit choose()'s dispatches for the logits after `positions` positions; the
        awaitable yields the token's 4 bytes."""
        key = _variant(self.sampler)
        if key not in self._choose:
            self._choose[key] = self.device.schedule(self._choose_steps(self.sampler))
        self.device.write(self.state.step.buffer, pack_step(positions, 1, draw))
        return self.device.run(self._choose[key], Binding(self.sampling.result.buffer, 0, 4))

    def _mask_next(self) -> None:
        """The mask of the sampler's next choice: its matcher's, after the reply so far."""
        if self._matcher is not None:
            self.sampling.allow(self.device, self._matcher.mask(), self.cfg.vocab_size)

    def _chosen(self, readback: bytes) -> int:
        """The token the sampler chose, read back: into the sequence and, if any, its matcher."""
        token = self._token_of(readback)
        if token != NO_TOKEN:
            self._sampled.append(token)
            if self._matcher is not None:
                self._matcher.advance(token)
        return token

    async def decode(self, token: int, pos: int, n: int, draw: int | None = None):
        """Yield the n tokens that follow `token` at `pos` (pos + n <= ctx): greedy, or with a
        `draw` index, drawn by the sampler of sample_start (the first being the reply's token
        `draw`). A batch of decode steps goes in one submission (greedy_batches) with one batch in
        flight ahead: the choice stays on the GPU and feeds the next step, so batch k+1 is
        submitted before batch k's tokens are awaited. A sampler with a mask runs a step at a
        time instead (_masked). n_past counts the positions of the tokens yielded so far; when
        the caller stops early, steps run beyond its last token are not counted, and conv states
        are rewound to that token's step (the KV rows beyond are simply overwritten later)."""
        if n < 0 or pos + n > self.ctx:
            raise InvalidArgument(f"{n} decode steps from position {pos}: the context holds {self.ctx}")
        sampler = None if draw is None else self.sampler
        if sampler is not None and self._matcher is not None:
            async with aclosing(self._masked(token, pos, n, draw)) as steps:
                async for token in steps:
                    yield token
            return
        if token != self._gpu_token:
            self.device.write(self.state.tokens.buffer, np.array([token], np.uint32).tobytes())
        batches, ran, done, last = greedy_batches(n, self.chain.batch), 0, 0, None   # steps submitted, yielded
        previous = pending = None   # (steps, readback) of the batch being read, of the one ahead
        try:
            for k, steps in enumerate(batches + [0]):   # a batch submitted, then the one before it read
                previous, pending = pending, None
                if steps:   # the Step's position and draw then move on the GPU (greedy_advance, sample_advance)
                    self.device.write(self.state.step.buffer, pack_step(pos + ran, 1, (draw or 0) + ran))
                    pending = steps, self.device.run(self._chain_schedule(steps, k % 2, sampler),
                                                     Binding(self.chain.tokens.buffer, 0, 4 * steps))
                    ran += steps
                if previous is not None:
                    size, readback = previous
                    previous = None
                    for last in np.frombuffer(await readback, np.uint32)[:size].tolist():
                        done += 1
                        self.n_past = pos + done
                        yield _token(last)
        finally:
            for p in (previous, pending):   # closed early: let the batches in flight finish
                if p is not None:
                    await p[1]
            self._gpu_token = last if ran == done and _token(last) != NO_TOKEN else None   # what tokens[0] holds
            if ran > done:
                await self._rewind_conv(done, batches)

    async def _masked(self, token: int, pos: int, n: int, draw: int):
        """decode() for a sampler with a constraint, a token at a time, the host's work hidden
        behind the GPU's: step i + 1's forward pass is submitted behind step i's choice, before
        token i is read back (the pass takes the token from the GPU's own buffer); once token i
        is read, the host computes choice i + 1's mask and submits it while that pass runs, and
        only then hands token i to the caller. What runs past the caller's last token is
        simply overwritten later. A model with conv states waits for the caller instead (a pass
        past its last token would move those states on)."""
        ahead = not self.chain.conv
        if token != self._gpu_token:
            self.device.write(self.state.tokens.buffer, np.array([token], np.uint32).tobytes())
        forward = self._forward_step(pos)
        chosen = self._masked_choice(draw, pos + 1)
        try:
            for i in range(n):
                await forward
                forward = self._forward_step(pos + i + 1) if i + 1 < n and ahead else None
                token = self._chosen(await chosen)
                chosen = self._masked_choice(draw + i + 1, pos + i + 2) if forward is not None else None
                self.n_past = pos + i + 1
                yield token
                if i + 1 < n and not ahead:
                    forward = self._forward_step(pos + i + 1)
                    chosen = self._masked_choice(draw + i + 1, pos + i + 2)
        finally:   # closed early: let what is in flight finish; tokens[0] holds a choice not yielded
            if forward is not None:
                await forward
            if chosen is not None:
                await chosen
                self._gpu_token = None

    def _masked_choice(self, draw: int, positions: int):
        """Submit the choice of the reply's token `draw` after `positions` positions, masked."""
        self._mask_next()
        return self._submit_choice(draw, positions)

    def _forward_step(self, pos: int):
        """Submit the decode step at `pos` on the token tokens[0] holds."""
        self.device.write(self.state.step.buffer, pack_step(pos, 1))
        return self.device.run(self.decode_schedule)

    async def _rewind_conv(self, done: int, batches: list[int]) -> None:
        """After a stop: make the conv states those after step done-1 of a greedy run of
        `batches` (read from the records its batch left), or, before any step, forget the
        sequence (nothing holds the state it started from)."""
        if not self.chain.conv:
            return
        if done == 0:
            self.reset()
            return
        k, j = 0, done - 1
        while j >= batches[k]:
            j, k = j - batches[k], k + 1
        record = (k % 2) * self.chain.batch + j
        copies = [Copy(saved.buffer, record * self.state.conv_state[i].nbytes, self.state.conv_state[i].buffer, 0,
                       self.state.conv_state[i].nbytes) for i, saved in self.chain.conv.items()]
        await self.device.run(self.device.schedule(copies))

    def _token_of(self, readback: bytes) -> int:
        """The token id tokens[0] holds, read back (NO_TOKEN: the sampler found none)."""
        token = _token(int(np.frombuffer(readback, np.uint32)[0]))
        self._gpu_token = None if token == NO_TOKEN else token
        return token


def _token(read: int) -> int:
    """A token id read back from the GPU, its NO_TOKEN sentinel as cera.sampling's."""
    return NO_TOKEN if read == sample.NO_TOKEN else read


def _variant(sampler: Sampler) -> tuple[bool, bool, bool]:
    """What a sampler's dispatches depend on: whether it adjusts the logits, whether it penalizes,
    whether its top-k is selected by slices first."""
    return sampler.adjusts, sampler.penalized, sample.selects(sampler)


def greedy_batches(n: int, batch: int) -> list[int]:
    """Steps per submission of n greedy steps: full batches, then the remainder as powers of two
    (so at most log2(batch) + 1 schedules per adapter set, each run exactly as far as asked)."""
    sizes = [batch] * (n // batch)
    rest = n % batch
    while rest:
        sizes.append(1 << (rest.bit_length() - 1))
        rest -= sizes[-1]
    return sizes
