"""The interface between the Engine (cera.engine) and what runs the model: exactly what the
engine asks of its backend. `GpuModel` (cera.gpu.model, the WGSL kernels on a Device, native
or browser) and `ReferenceBackend` (cera.reference_backend, the numpy reference) answer all of
it; `GpuEncoder` (cera.gpu.encoder) the part an embedding model meets (ctx, reset, use_loras,
add_lora, embed: the engine refuses to generate with an encoder before it asks for more). The
engine owns tokenizing, chat templates, stopping, streaming text, timing, scoring and pooling.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, AsyncIterator, Protocol, runtime_checkable

if TYPE_CHECKING:   # types only: the core's import of cera stays light
    import numpy as np

    from cera.constrain import Matcher
    from cera.lora import LoraAdapter
    from cera.prefix import Snapshot
    from cera.sampling import Sampler

LOGITS_NONE, LOGITS_LAST, LOGITS_ALL = None, "last", "all"   # forward's `logits`: none, the last row, every row


@runtime_checkable
class Backend(Protocol):
    """A model's runner behind the engine. One sequence lives in it: positions 0..n_past-1 are
    cached (their K and V, any conv state), and forward/decode extend it."""

    ctx: int   # positions the cache holds

    @property
    def n_past(self) -> int:
        """Positions of the sequence run so far (cached)."""

    def reset(self) -> None:
        """Forget the sequence: n_past becomes 0."""

    async def add_lora(self, adapter: LoraAdapter, progress=None) -> None:
        """Hold a loaded LoRA adapter (its index: the order added); progress(done, total) in bytes."""

    def use_loras(self, key: tuple[int, ...]) -> None:
        """Run what follows with the adapters of these indices (none: the base model)."""

    async def forward(self, tokens: list[int], pos0: int, logits=LOGITS_NONE, sampled: bool = False
                      ) -> tuple[int, np.ndarray | None]:
        """Run `tokens` at positions pos0.. -> (the next token, the logits asked for): the next
        token greedy, or with `sampled` the sampler's draw 0 (`sample_start`); logits None,
        (vocab,) of the last row (LOGITS_LAST) or (T, vocab) of every row (LOGITS_ALL)."""

    def decode(self, token: int, pos: int, n: int, draw: int | None = None) -> AsyncIterator[int]:
        """The n tokens that follow `token` at `pos`, one position each: greedy, or drawn by the
        sampler of sample_start, the first as its draw `draw`."""

    def sample_start(self, sampler: Sampler, history: list[int], matcher: Matcher | None = None) -> None:
        """Draw the tokens that follow with `sampler`, `history` the sequence so far (for its
        penalties), `matcher` the constraint's walk through the reply (None: unconstrained)."""

    async def choose(self, draw: int) -> int:
        """The sampler's token after the last position run, the reply's token `draw`."""

    async def embed(self, tokens: list[int]) -> np.ndarray:
        """Hidden states after the final norm (T, hidden) of tokens at positions 0..T-1, computed
        apart from the sequence held (n_past and the cache stay as they were)."""

    async def shift(self, keep: int, discard: int, n_past: int) -> None:
        """Context shift: drop cached positions keep..keep+discard-1 of the n_past cached, moving
        the rest down to follow the first `keep`."""

    async def snapshot(self, tokens: list[int]) -> Snapshot:
        """The state after `tokens` (the sequence held), for the prefix cache (cera.prefix)."""

    def restore(self, snapshot: Snapshot) -> None:
        """Hold the state of `snapshot`: n_past becomes its length."""
