"""The sampler on the GPU: cera.sampling's chain as the last dispatches of a decode step, so a
sampled token feeds the next step on the GPU as greedy's argmax does and a batch of steps reads
back 4 bytes a token (plan.chain_plan):

    sample_adjust   z = the logits after penalties, logit bias and the step's mask, one
                    invocation a token (only for a sampler that adjusts anything)
    sample          the kept set and the draw -> result (shaders/sample.wgsl): one workgroup per
                    SLICE tokens selects its slice's k best (top-k 0: its WG best, its count, mass
                    and best draw), then one workgroup draws from those; for top-k 0 a third
                    dispatch walks the whole vocabulary when the kept set reaches past the WG
                    best (a flat row's top-p or min-p) and otherwise returns at once
    sample_advance  result -> tokens[0] and the batch's tokens; the Step moves to the next
                    position and draw; with penalties the token enters the window's counts

The penalty window lives on the GPU as a count per token and a ring of the window's tokens,
loaded from the sequence when a generation starts (`SamplerBuffers.load`) and kept by
sample_advance from then on.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from cera.config import ModelConfig
from cera.device import Binding, Device, Dispatch
from cera.errors import Unsupported
from cera.sampling import Sampler, as_words

# struct Sampling (shaders/common.wgsl) { top_k: u32, top_p: f32, log_min_p: f32, inv_temperature: f32,
#   seed_lo: u32, seed_hi: u32, repeat_penalty: f32, repeat_inv: f32, frequency: f32, presence: f32,
#   window: u32, _pad: u32 }
SAMPLING_FORMAT = "<I3f2I4f2I"
SAMPLING_BYTES = struct.calcsize(SAMPLING_FORMAT)
WG = 256                 # sample.wgsl's workgroup; a top_k up to it is selected and sorted in workgroup memory
LOADS = 8                # keys an invocation of sample.wgsl loads at once (its LOADS)
# Tokens a SELECT workgroup takes: one round of LOADS loads an invocation. A pass of one workgroup
# over a whole vocabulary is bound by its loads' latency, which the slices spread over the GPU:
# SmolLM2's 49,152 in 24 workgroups, Qwen2.5's 151,936 in 75.
SLICE = LOADS * WG
WINDOW_ALL = 0xFFFFFFFF  # Sampling.window: the whole sequence
NO_TOKEN = 0xFFFFFFFF    # result[0] when no token is a candidate
MIN_P_OFF = -1e30        # Sampling.log_min_p when min-p is off: every finite z is above z_best - 1e30


def pack_sampling(s: Sampler, ctx: int) -> bytes:
    # a window past the context is the whole sequence (which holds ctx + 1 at most)
    window = 0 if not s.penalized else s.penalty_last_n if 0 < s.penalty_last_n <= ctx else WINDOW_ALL
    return struct.pack(SAMPLING_FORMAT, min(s.top_k, 0xFFFFFFFF), s.top_p, math.log(s.min_p) if s.min_p > 0 else MIN_P_OFF,
                       1 / s.temperature if s.temperature > 0 else 0.0, s.seed & 0xFFFFFFFF, s.seed >> 32,
                       s.repeat_penalty, 1 / s.repeat_penalty, s.frequency_penalty, s.presence_penalty, window, 0)


def pack_mask(allowed: np.ndarray | None, vocab: int) -> bytes:
    """The allowed tokens (bool (vocab,), those bits already packed as uint32 words, or None:
    all) as sample_adjust.wgsl's bits: bit i % 32 of word i // 32 for token i."""
    if allowed is None:
        return np.full(-(-vocab // 32), 0xFFFFFFFF, np.uint32).tobytes()
    return as_words(allowed, vocab).tobytes()


@dataclass(frozen=True)
class SamplerBuffers:
    """What the sampler's kernels read and keep."""
    params: Binding    # struct Sampling (uniform)
    counts: Binding    # (vocab,) u32: each token's occurrences in the penalty window
    ring: Binding      # (2 + ctx,) u32: tokens pushed so far, then the window's tokens, a ring
    bias: Binding      # (vocab,) f32 logit bias
    mask: Binding      # (ceil(vocab / 32),) u32: the allowed tokens, a bit each
    z: Binding         # (vocab,) f32 adjusted logits
    candidates: Binding  # (slices, WG) u32 pairs: each slice's best keys (sample.wgsl SELECT)
    summary: Binding   # (slices, 4) u32: each slice's count, mass and best draw (top-k 0)
    result: Binding    # (2,) u32: the token chosen (NO_TOKEN: none), how many tokens were kept

    @staticmethod
    def sizes(cfg: ModelConfig, ctx: int) -> dict[str, int]:
        """label -> bytes of every buffer `allocate` makes."""
        v = cfg.vocab_size
        return {"sampling": SAMPLING_BYTES, "sampler.counts": 4 * v, "sampler.ring": 4 * (2 + ctx),
                "sampler.bias": 4 * v, "sampler.mask": 4 * -(-v // 32), "sampler.z": 4 * v,
                "sampler.candidates": 8 * WG * -(-v // SLICE), "sampler.summary": 16 * -(-v // SLICE),
                "sampler.result": 8}

    @classmethod
    def allocate(cls, device: Device, cfg: ModelConfig, ctx: int) -> "SamplerBuffers":
        sizes = cls.sizes(cfg, ctx)
        buf = lambda label, **kw: Binding(device.buffer(sizes[label], label, **kw), 0, sizes[label])
        return cls(buf("sampling", uniform=True), *(buf(label) for label in list(sizes)[1:]))

    def load(self, device: Device, sampler: Sampler, history: list[int], vocab: int, ctx: int) -> None:
        """Start sampling after `history` (prompt and reply so far) with `sampler`: its settings,
        the penalty window's counts and ring, the logit bias, every token allowed."""
        device.write(self.params.buffer, pack_sampling(sampler, ctx))
        if not sampler.adjusts:
            return
        window = sampler.window(history)
        device.write(self.counts.buffer, np.bincount(np.asarray(window, np.intp), minlength=vocab)
                     .astype(np.uint32).tobytes())
        if 0 < sampler.penalty_last_n <= ctx:   # oldest first from slot 0: the next one pushed goes to len % size
            device.write(self.ring.buffer, np.asarray([len(window), *window], np.uint32).tobytes())
        bias = np.zeros(vocab, np.float32)
        for token, b in sampler.logit_bias.items():
            bias[token] = b
        device.write(self.bias.buffer, bias.tobytes())
        self.allow(device, None, vocab)

    def allow(self, device: Device, allowed: np.ndarray | None, vocab: int) -> None:
        """The next step's mask: the tokens allowed (as pack_mask takes them), None: all."""
        device.write(self.mask.buffer, pack_mask(allowed, vocab))


def choose(kernels, buffers: SamplerBuffers, logits: Binding, tokens: Binding, chain_tokens: Binding,
           step: Binding, sampler: Sampler, vocab: int) -> list[Dispatch]:
    """The sampler's dispatches after a decode step wrote `logits`: [adjust,] sample, advance,
    leaving the token in tokens[0], chain_tokens[step.chain] and buffers.result."""
    b, steps = buffers, []
    z = logits
    if sampler.adjusts:
        steps.append(kernels.dispatch("sample_adjust.wgsl", [logits, b.params, b.counts, b.bias, b.mask, b.z],
                                      (-(-vocab // 256), 1, 1), "sample adjust", reads=12 * vocab + vocab // 8,
                                      writes=4 * vocab, N=vocab))
        z = b.z
    steps += sample(kernels, b, z, step, b.result, vocab, selects(sampler))
    extra = [b.params, b.counts, b.ring] if sampler.penalized else []
    steps.append(kernels.dispatch("sample_advance.wgsl", [b.result, tokens, chain_tokens, step, *extra], (1, 1, 1),
                                  "sample advance", reads=8 + step.nbytes, writes=8 + step.nbytes,
                                  **({"PENALTIES": True} if sampler.penalized else {})))
    return steps


def selects(sampler: Sampler) -> bool:
    """Whether the sampler's top-k is one the slices' selection holds whole (1..WG)."""
    return 1 <= sampler.top_k <= WG


def sample(kernels, buffers: SamplerBuffers, z: Binding, step: Binding, result: Binding, vocab: int, select: bool,
           draws: int = 1) -> list[Dispatch]:
    """result[2 w], result[2 w + 1] = the token of draw step.draw + w and the count kept, for w <
    draws, from adjusted logits z (vocab,) (shaders/sample.wgsl): each slice's best first, then the
    draw from those; without `select` (top-k 0 or past WG), the whole vocabulary's form after,
    which one draw only may need."""
    slices = -(-vocab // SLICE)
    if slices > WG or (draws > 1 and not select):
        raise Unsupported(f"the GPU sampler takes vocabularies of up to {WG * SLICE} tokens, and one draw at a "
                          f"time for top-k 0 (asked: {vocab}, {draws})")
    digits = max(1, -(-(vocab - 1).bit_length() // 8))
    ids = dict(VOCAB=vocab, WG=WG, LOADS=LOADS, IDX_DIGITS=digits, IDX_MASK=(1 << 8 * digits) - 1)
    b = buffers
    steps = [kernels.dispatch("sample.wgsl", [z, b.params, step, b.candidates, b.summary], (slices, 1, 1),
                              f"sample select {vocab}", reads=4 * vocab, writes=b.candidates.nbytes + b.summary.nbytes,
                              N=SLICE, SELECT=True, **ids),
             kernels.dispatch("sample.wgsl", [b.candidates, b.params, step, result, b.summary], (draws, 1, 1),
                              f"sample {slices}x{WG}", reads=b.candidates.nbytes + b.summary.nbytes, writes=8 * draws,
                              N=slices * WG, CANDIDATES=True, **ids)]
    if not select:
        steps.append(kernels.dispatch("sample.wgsl", [z, b.params, step, result], (1, 1, 1), f"sample {vocab}",
                                      reads=4 * vocab, writes=8, N=vocab, **ids))
    return steps
