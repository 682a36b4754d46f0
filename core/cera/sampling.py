"""Choosing the next token from a row of logits, as llama.cpp's default sampler chain does:

    penalties -> top-k -> top-p -> min-p -> temperature -> draw

- penalties (llama.cpp's `llama_sampler_init_penalties`): a token that occurs c > 0 times in the
  last `penalty_last_n` tokens of the sequence (prompt and reply; -1: all of it, 0: none) has its
  logit divided by `repeat_penalty` (multiplied, where it is not positive), then lowered by
  c * frequency_penalty + presence_penalty;
- top-k keeps the k best (0: all); top-p the smallest best-first set whose probability reaches
  top_p; min-p the tokens at least min_p times as likely as the best one (0: off);
- temperature divides the logits left, and a token is drawn from their softmax; temperature 0
  takes the best of them instead (greedy, after the penalties).

Only what the rule needs is read back from the GPU. Greedy without penalties is the GPU's own
argmax (4 bytes). With top-k, the k best tokens after the penalties are among the k + w best
before them (w: the distinct penalized tokens, each at most one of the k + w), and a penalized
token outside those may still rise (a negative penalty): so the GPU selects the k + w best
(`TopK`, cera.gpu.layers.top_k) and reads the w penalized tokens' own logits, 8 (k + w) + 4 w
bytes instead of 4 * vocab (`scripts/bench_sampling.py` measures both). Without top-k, the row.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from cera.errors import InvalidArgument
from cera.gpu.layers import TOP_K_MAX


@dataclass(frozen=True)
class TopK:
    """A readback: the k best (id, logit) of a row, best first (ties: the lower id), and the
    logits of the `watch` ids."""
    k: int
    watch: tuple[int, ...] = ()

    def select(self, row: np.ndarray) -> "Candidates":
        """This selection made on the CPU from the whole row (vocab,)."""
        ids, logits = best_first(np.arange(len(row)), row, self.k)
        watch = np.asarray(self.watch, np.int64)
        return Candidates(np.concatenate([ids, watch]), np.concatenate([logits, row[watch]]))


@dataclass(frozen=True)
class Candidates:
    """Some tokens of a row with their logits (an id may repeat, with the same logit)."""
    ids: np.ndarray      # (n,) int
    logits: np.ndarray   # (n,) float


def best_first(ids: np.ndarray, logits: np.ndarray, k: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The k best (all for k = 0) of (ids, logits), best first, ties broken by the lower id."""
    if 0 < k < len(logits):
        cut = np.partition(logits, len(logits) - k)[len(logits) - k]   # the k-th largest logit
        keep = np.flatnonzero(logits >= cut)
        ids, logits = ids[keep], logits[keep]
    order = np.lexsort((ids, -logits))[: k or None]
    return ids[order], logits[order]


@dataclass
class Sampler:
    """The sampling settings of a generation, and its random stream (seeded by `seed`)."""
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    seed: int | None = None
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self):
        if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1 or not 0 <= self.min_p <= 1:
            raise InvalidArgument("sampling needs temperature >= 0, top_k >= 0, 0 < top_p <= 1 and 0 <= min_p <= 1")
        if self.repeat_penalty <= 0 or self.penalty_last_n < -1:
            raise InvalidArgument("sampling needs repeat_penalty > 0 and penalty_last_n >= -1 (-1: the whole sequence)")
        self.rng = np.random.default_rng(self.seed)

    @property
    def penalized(self) -> bool:
        return self.penalty_last_n != 0 and (self.repeat_penalty, self.frequency_penalty,
                                             self.presence_penalty) != (1.0, 0.0, 0.0)

    @property
    def greedy(self) -> bool:
        """The GPU's argmax is the answer: temperature 0 and no penalty."""
        return self.temperature == 0 and not self.penalized

    def counts(self, history: list[int]) -> Counter:
        """How often each token occurs in the window the penalties look at (empty: no penalty)."""
        if not self.penalized:
            return Counter()
        return Counter(history if self.penalty_last_n == -1 else history[-self.penalty_last_n:])

    def request(self, history: list[int], vocab: int) -> TopK | None:
        """What to read back for the next token after `history`: a TopK, or None for the row."""
        watch = tuple(self.counts(history))
        k = 1 if self.temperature == 0 else self.top_k   # temperature 0: the best one
        if 0 < k and k + len(watch) <= TOP_K_MAX:
            return TopK(min(k + len(watch), vocab), watch)
        return None

    def distribution(self, logits: np.ndarray | Candidates, history: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The tokens the next one is drawn from and their probabilities (ids, probs), best
        first; `logits` is a row (vocab,) or the Candidates `request` asked for."""
        if isinstance(logits, Candidates):
            ids, first = np.unique(logits.ids, return_index=True)
            z = logits.logits[first].astype(np.float64)
        else:
            ids, z = np.arange(len(logits)), logits.astype(np.float64)
        z = self._penalize(ids, z, self.counts(history))
        ids, z = best_first(ids, z, self.top_k)
        if self.temperature == 0:
            return ids[:1], np.ones(1)
        probs = np.exp(z - z[0])
        probs /= probs.sum()
        if self.top_p < 1:   # the smallest set reaching top_p (all when rounding keeps the sum below it)
            keep = min(int(np.searchsorted(np.cumsum(probs), self.top_p)) + 1, len(ids))
            ids, z = ids[:keep], z[:keep]
        if self.min_p > 0:
            keep = z >= z[0] + np.log(self.min_p)
            ids, z = ids[keep], z[keep]
        probs = np.exp((z - z[0]) / self.temperature)
        return ids, probs / probs.sum()

    def sample(self, logits: np.ndarray | Candidates, history: list[int]) -> int:
        """The next token after `history` (prompt and reply so far)."""
        ids, probs = self.distribution(logits, history)
        if len(ids) == 1:
            return int(ids[0])
        cdf = np.cumsum(probs)
        return int(ids[min(int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right")), len(ids) - 1)])

    def _penalize(self, ids: np.ndarray, z: np.ndarray, counts: Counter) -> np.ndarray:
        """Logits z of tokens ids (distinct) after the repetition, frequency and presence penalties."""
        if not counts:
            return z
        seen = np.fromiter(counts, np.int64, len(counts))
        at = np.flatnonzero(np.isin(ids, seen))
        c = np.array([counts[int(i)] for i in ids[at]], np.float64)
        z = z.copy()
        z[at] = np.where(z[at] <= 0, z[at] * self.repeat_penalty, z[at] / self.repeat_penalty)
        z[at] -= c * self.frequency_penalty + self.presence_penalty
        return z
