"""Choosing the next token from a row of logits: llama.cpp's default sampler chain,

    penalties -> logit bias and mask -> top-k -> top-p -> min-p -> temperature -> draw

defined here once, in numpy, as the reference the GPU's sampler (cera.gpu.sample,
shaders/sample*.wgsl) agrees with token for token:

- adjusted logits z (float32, as the GPU computes them): a token seen c > 0 times in the last
  `penalty_last_n` tokens of the sequence (prompt and reply; -1: all of it, 0: none) has its
  logit multiplied by 1/repeat_penalty (by repeat_penalty where it is not positive), then
  lowered by c * frequency_penalty + presence_penalty; then `logit_bias[id]` is added; a token
  the step's mask leaves out, or whose z is -inf or NaN, is not a candidate at all;
- order: candidates best first by z, ties by the lower id;
- kept: the first n of that order, n the least of top_k (0: all), the shortest prefix whose
  softmax mass reaches top_p of the top-k's mass (1: all), and the count with
  z >= z_best + log(min_p) (0: all);
- draw: temperature 0 keeps the best; else the kept token with the largest z / T + g, g a Gumbel
  variate made from the counter-based random stream `uniform(seed, draw, id)`, draw the index of
  the token in the reply. That is a draw from softmax(z / T) over the kept tokens (the Gumbel-max
  trick); it depends only on (seed, draw, the kept tokens and their z): not on how many steps a
  submission chains, on the prefix cache or on the host.

The mask is where constrained output enters: a `constraint` (cera.constrain: a JSON schema, a
regular expression, a grammar) says which tokens may come next at each step; the GPU applies it
as one bit a token, the reference as `allowed` (bool (vocab,) or those bits, uint32 words).
"""
from __future__ import annotations

import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from cera.constrain import Constraint
from cera.errors import InvalidArgument

NO_TOKEN = -1   # what a draw returns when no token is a candidate (a mask or bias that leaves none)


def pcg4d(v: np.ndarray) -> np.ndarray:
    """Jarzynski and Olano's pcg4d hash ("Hash Functions for GPU Rendering", 2020) of uint32
    columns v (4, n) -> (4, n); shaders/sample.wgsl's `pcg4d` step for step."""
    x, y, z, w = (np.asarray(c, np.uint32) * np.uint32(1664525) + np.uint32(1013904223) for c in v)
    for i in range(2):
        x = x + y * w
        y = y + z * x
        z = z + x * y
        w = w + y * z
        if i == 0:
            x, y, z, w = x ^ (x >> 16), y ^ (y >> 16), z ^ (z >> 16), w ^ (w >> 16)
    return np.stack([x, y, z, w])


def uniform(seed: int, draw: int, ids: np.ndarray) -> np.ndarray:
    """The random stream: a uniform variate in (0, 1) for each token id of draw `draw` under
    `seed` (64 bits), 24 bits of a hash of (seed, draw, id), exact in float32."""
    ids = np.asarray(ids, np.uint32)
    n = len(ids)
    v = np.stack([np.full(n, seed & 0xFFFFFFFF, np.uint32), np.full(n, seed >> 32 & 0xFFFFFFFF, np.uint32),
                  np.full(n, draw & 0xFFFFFFFF, np.uint32), ids])
    return ((pcg4d(v)[0] >> 8).astype(np.float64) + 0.5) / (1 << 24)


def gumbel(seed: int, draw: int, ids: np.ndarray) -> np.ndarray:
    """-log(-log(u)) of the stream's variates: the noise whose argmax added to z / T draws from
    softmax(z / T)."""
    return -np.log(-np.log(uniform(seed, draw, ids)))


def best_first(ids: np.ndarray, z: np.ndarray, k: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The k best (all for k = 0) of (ids, z), best first, ties broken by the lower id."""
    if 0 < k < len(z):
        cut = np.partition(z, len(z) - k)[len(z) - k]   # the k-th largest
        keep = np.flatnonzero(z >= cut)
        ids, z = ids[keep], z[keep]
    order = np.lexsort((ids, -z))[: k or None]
    return ids[order], z[order]


def as_bools(allowed: np.ndarray, vocab: int) -> np.ndarray:
    """A mask as bool (vocab,): given so, or as bits (uint32 words, bit i % 32 of word i // 32)."""
    allowed = np.asarray(allowed)
    if allowed.dtype == np.uint32:
        return np.unpackbits(allowed.view(np.uint8), bitorder="little")[:vocab].astype(bool)
    return allowed.astype(bool)


def as_words(allowed: np.ndarray, vocab: int) -> np.ndarray:
    """A mask as bits, (ceil(vocab / 32),) uint32 words (bit i % 32 of word i // 32): given so,
    or as bool (vocab,)."""
    allowed = np.asarray(allowed)
    bits = allowed.view(np.uint8) if allowed.dtype == np.uint32 else np.packbits(allowed.astype(bool), bitorder="little")
    return np.pad(bits, (0, 4 * -(-vocab // 32) - len(bits))).view(np.uint32)


@dataclass
class Sampler:
    """The sampling settings of a generation (module docstring). `seed` None: a random one,
    chosen here (so the run can be repeated from `seed`)."""
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    seed: int | None = None
    logit_bias: Mapping[int, float] = field(default_factory=dict)   # token id -> added to its logit
    constraint: Constraint | None = None   # what the reply must match (module docstring); None: anything

    def __post_init__(self):
        if not (self.temperature >= 0 and self.top_k >= 0 and 0 < self.top_p <= 1 and 0 <= self.min_p <= 1):
            raise InvalidArgument("sampling needs temperature >= 0, top_k >= 0, 0 < top_p <= 1 and 0 <= min_p <= 1")
        if not self.repeat_penalty > 0 or self.penalty_last_n < -1:
            raise InvalidArgument("sampling needs repeat_penalty > 0 and penalty_last_n >= -1 (-1: the whole sequence)")
        for token, bias in dict(self.logit_bias).items():
            if type(token) is not int or token < 0 or not isinstance(bias, (int, float)) or not bias < float("inf"):
                raise InvalidArgument(f"logit_bias {{{token!r}: {bias!r}}}: ids are non-negative integers and "
                                      f"biases numbers")
        self.logit_bias = {int(t): float(b) for t, b in dict(self.logit_bias).items()}
        if self.seed is None:
            self.seed = secrets.randbits(64)
        self.seed &= (1 << 64) - 1

    @property
    def penalized(self) -> bool:
        return self.penalty_last_n != 0 and (self.repeat_penalty, self.frequency_penalty,
                                             self.presence_penalty) != (1.0, 0.0, 0.0)

    @property
    def adjusts(self) -> bool:
        """Whether z differs from the logits anywhere (penalties, bias, a mask)."""
        return self.penalized or bool(self.logit_bias) or self.constraint is not None

    @property
    def greedy(self) -> bool:
        """The GPU's plain argmax is the answer: temperature 0 and the logits unadjusted."""
        return self.temperature == 0 and not self.adjusts

    @property
    def label(self) -> str:
        """The chain in a line, for reports: its filters and any penalty, bias or mask."""
        if self.greedy:
            return "greedy"
        parts = [f"temperature {self.temperature:g}" if self.temperature else "greedy", f"top-k {self.top_k}",
                 f"top-p {self.top_p:g}", f"min-p {self.min_p:g}"]
        if self.penalized:
            parts.append(f"penalties {self.repeat_penalty:g}/{self.frequency_penalty:g}/{self.presence_penalty:g} "
                         f"over {self.penalty_last_n}")
        if self.logit_bias:
            parts.append(f"{len(self.logit_bias)} biased")
        if self.constraint is not None:
            parts.append(f"constrained by a {self.constraint.label}")
        return ", ".join(parts)

    def check(self, vocab: int) -> None:
        """Refuse a logit bias on an id past the vocabulary."""
        if bad := [t for t in self.logit_bias if t >= vocab]:
            raise InvalidArgument(f"logit_bias names token {bad[0]}; the vocabulary has ids 0..{vocab - 1}")

    def window(self, history: list[int]) -> list[int]:
        """The tokens the penalties look at: the last penalty_last_n of the history."""
        if not self.penalized:
            return []
        return list(history) if self.penalty_last_n == -1 else list(history[-self.penalty_last_n:])

    def adjusted(self, logits: np.ndarray, history: list[int], allowed: np.ndarray | None = None) -> np.ndarray:
        """z (vocab,) float32: the logits after penalties and bias; -inf where `allowed` says no."""
        z = np.array(logits, np.float32)
        counts = Counter(self.window(history))
        if counts:
            seen = np.fromiter(counts, np.int64, len(counts))
            c = np.fromiter(counts.values(), np.float32, len(counts))
            zs = z[seen]
            zs = np.where(zs <= 0, zs * np.float32(self.repeat_penalty), zs * np.float32(1 / self.repeat_penalty))
            z[seen] = zs - (c * np.float32(self.frequency_penalty) + np.float32(self.presence_penalty))
        for token, bias in self.logit_bias.items():
            z[token] += np.float32(bias)
        if allowed is not None:
            z[~as_bools(allowed, len(z))] = -np.inf
        return z

    def kept(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The kept tokens of adjusted logits z, best first, and their z (module docstring)."""
        valid = np.flatnonzero(z > -np.inf)   # NaN compares false too
        ids, zk = best_first(valid, z[valid], self.top_k)
        if not len(ids):
            return ids, zk
        n = len(ids)
        if self.top_p < 1:   # the first prefix whose mass reaches top_p of the whole (the goal, in float32 as on the GPU)
            mass = np.cumsum(np.exp(zk.astype(np.float64) - zk[0]))
            goal = np.float32(self.top_p) * np.float32(mass[-1])
            n = min(n, int(np.searchsorted(mass, goal)) + 1)
        if self.min_p > 0:
            n = min(n, int(np.count_nonzero(zk >= zk[0] + np.float32(np.log(self.min_p)))))
        return ids[:n], zk[:n]

    def distribution(self, logits: np.ndarray, history: list[int], allowed: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
        """The tokens the next one is drawn from and their probabilities (ids, probs), best first."""
        ids, z = self.kept(self.adjusted(logits, history, allowed))
        if self.temperature == 0 or not len(ids):
            return ids[:1], np.ones(min(1, len(ids)))
        probs = np.exp((z.astype(np.float64) - z[0]) / self.temperature)
        return ids, probs / probs.sum()

    def sample(self, logits: np.ndarray, history: list[int], draw: int, allowed: np.ndarray | None = None) -> int:
        """The next token after `history` (prompt and reply so far), the reply's token `draw`;
        NO_TOKEN when no token is a candidate."""
        ids, z = self.kept(self.adjusted(logits, history, allowed))
        if not len(ids):
            return NO_TOKEN
        if self.temperature == 0:
            return int(ids[0])
        perturbed = z.astype(np.float64) * float(np.float32(1 / self.temperature)) + gumbel(self.seed, draw, ids)
        best = np.flatnonzero(perturbed == perturbed.max())
        return int(ids[best].min())
