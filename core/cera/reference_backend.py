"""The numpy reference (cera.reference) behind the engine's backend interface (cera.backend):
what `Engine.load` runs on when no GPU device is given, and the tests' independent oracle.
"""
from __future__ import annotations

import numpy as np

from cera.backend import LOGITS_ALL, LOGITS_LAST, LOGITS_NONE
from cera.constrain import Matcher
from cera.errors import InvalidArgument
from cera.lora import LoraAdapter
from cera.prefix import Snapshot
from cera.reference import Reference
from cera.sampling import NO_TOKEN, Sampler


class ReferenceBackend:
    """The numpy reference (or a subclass of it) behind the backend interface."""
    dispatches_per_token = 0
    submits_per_prefill = 0

    def __init__(self, model: Reference):
        self.model = model
        self.ctx = model.ctx
        self.sampler: Sampler | None = None   # the sampler of the generation under way (sample_start)
        self._sampled: list[int] = []         # its sequence so far
        self._matcher: Matcher | None = None  # its constraint's walk through the reply
        self._last: np.ndarray | None = None  # (vocab,) logits of the last position run

    def reset(self) -> None:
        self.model.reset()

    async def add_lora(self, adapter: LoraAdapter, progress=None) -> None:
        self.model.loras.append(adapter)

    def use_loras(self, key: tuple[int, ...]) -> None:
        self.model.use_loras(key)

    async def forward(self, tokens: list[int], pos0: int, logits=LOGITS_NONE, sampled: bool = False):
        out = self.model.forward(tokens, pos0)                          # (T, vocab)
        self._last = out[-1]
        token = await self.choose(0) if sampled else int(np.argmax(out[-1]))
        return token, {LOGITS_NONE: None, LOGITS_LAST: out[-1], LOGITS_ALL: out}[logits]

    async def embed(self, tokens: list[int]) -> np.ndarray:
        return self.model.embed(tokens)

    @property
    def n_past(self) -> int:
        return self.model.n_past

    async def shift(self, keep: int, discard: int, n_past: int) -> None:
        self.model.shift(keep, discard)

    async def snapshot(self, tokens: list[int]) -> Snapshot:
        m, n = self.model, len(tokens)
        arrays = {f"{kind}.{i}": cache[i][:n].reshape(n, -1).copy()   # in the cache's dtype
                  for kind, cache in (("k", m.key_cache), ("v", m.value_cache)) for i in cache}
        arrays.update({f"conv.{i}": state.ravel().copy() for i, state in m.conv_state.items()})
        return Snapshot(tuple(tokens), arrays)

    def restore(self, snapshot: Snapshot) -> None:
        m = self.model
        for name, array in snapshot.arrays.items():
            kind, i = name.split(".")
            if kind == "conv":
                m.conv_state[int(i)][...] = array.reshape(m.conv_state[int(i)].shape)
            else:
                cache = (m.key_cache if kind == "k" else m.value_cache)[int(i)]   # (ctx, KVH, hd)
                if array.dtype != cache.dtype:   # rounded otherwise, it is not the state this cache would hold
                    raise InvalidArgument(f"snapshot {name} is {array.dtype}; this cache holds {cache.dtype}")
                cache[: len(array)] = array.reshape(len(array), *cache.shape[1:])
        m.n_past = len(snapshot.tokens)

    def sample_start(self, sampler: Sampler, history: list[int], matcher: Matcher | None = None) -> None:
        self.sampler, self._sampled, self._matcher = sampler, list(history), matcher

    async def choose(self, draw: int) -> int:
        """The sampler's token after the last position run, the reply's token `draw`."""
        matcher = self._matcher
        token = self.sampler.sample(self._last, self._sampled, draw, matcher.mask() if matcher else None)
        if token != NO_TOKEN:
            self._sampled.append(token)
            if matcher is not None:
                matcher.advance(token)
        return token

    async def decode(self, token: int, pos: int, n: int, draw: int | None = None):
        """The n tokens that follow `token` at `pos`, one forward step each: greedy, or drawn by
        the sampler of sample_start with a `draw` index."""
        for i in range(n):
            token, _ = await self.forward([token], pos + i)
            if draw is not None:
                token = await self.choose(draw + i)
            yield token
