"""Sampling (cera.sampling, cera.gpu.sample): the numpy sampler against llama.cpp's chain written
here from its definitions; its random stream against an independent integer implementation of
pcg4d; the GPU's choice (shaders/sample*.wgsl) against the numpy sampler token for token and
kept set for kept set, on adversarial rows (ties, all equal, masked, vocabularies past the
kernel's workgroup memory); the distribution of 10,000 seeded draws; and whole models, where the
GPU's chained sampled tokens equal the numpy reference's, a step at a time or 8 a submission."""
import asyncio
import re
import struct
import types
from importlib import resources

import numpy as np
import pytest

from cera.device import Binding
from cera.engine import Engine
from cera.errors import InvalidArgument
from cera.gpu import sample
from cera.gpu.model import greedy_batches
from cera.gpu import state
from cera.gpu.state import GREEDY_BATCH, pack_step
from cera.constrain import Constraint
from cera.sampling import NO_TOKEN, Sampler, as_words, uniform
from gpu_util import F32_CACHE, cache_numerics

VOCAB = 1000
RNG = np.random.default_rng(7)
LOGITS = np.round(RNG.standard_normal(VOCAB) * 3, 1).astype(np.float32)   # both signs, many ties
BEST = np.argsort(-LOGITS, kind="stable")[:5]
HISTORY = RNG.choice(np.r_[np.arange(50), BEST], 100).tolist()   # prompt + reply so far: repeats, the best too
NEUTRAL = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, frequency_penalty=0.0,
               presence_penalty=0.0, penalty_last_n=64)



@pytest.mark.parametrize("name, fmt", [("Step", state.STEP_FORMAT), ("Sampling", sample.SAMPLING_FORMAT)])
def test_uniform_packing_follows_the_wgsl_struct(name, fmt):
    """The Python packing of a uniform struct has the fields common.wgsl declares, type by type."""
    wgsl = resources.files("cera.shaders").joinpath("common.wgsl").read_text()
    fields = re.findall(r"^\s*\w+: (u32|f32),", re.search(rf"struct {name} {{(.*?)}}", wgsl, re.S)[1], re.M)
    packed = "".join(c * int(n or 1) for n, c in re.findall(r"(\d*)([If])", fmt))
    assert packed == "".join({"u32": "I", "f32": "f"}[f] for f in fields)
    assert struct.calcsize(fmt) == 4 * len(fields)

def chain(logits, history, temperature, top_k, top_p, min_p, repeat_penalty, frequency_penalty, presence_penalty,
          penalty_last_n, logit_bias=None, allowed=None) -> np.ndarray:
    """llama.cpp's default chain from its definitions -> the probability of every token id."""
    z = logits.astype(np.float64)
    window = history if penalty_last_n == -1 else history[len(history) - penalty_last_n:] if penalty_last_n else []
    for token in set(window):   # penalties: every token seen in the window
        count = window.count(token)
        z[token] = z[token] * repeat_penalty if z[token] <= 0 else z[token] / repeat_penalty
        z[token] -= count * frequency_penalty + presence_penalty
    for token, bias in (logit_bias or {}).items():
        z[token] += bias
    candidates = [i for i in range(len(z)) if np.isfinite(z[i]) and (allowed is None or allowed[i])]
    order = sorted(candidates, key=lambda i: (-z[i], i))     # best first, the lower id on ties
    kept = order[:top_k] if top_k else order                 # top-k
    if top_p < 1:                                            # top-p: best first until the mass reaches top_p
        p = np.exp(z[kept] - z[kept].max())
        p /= p.sum()
        kept = kept[: next((i + 1 for i in range(len(kept)) if p[: i + 1].sum() >= top_p), len(kept))]
    if min_p > 0:                                            # min-p: p_i >= min_p * p_max
        p = np.exp(z[kept] - z[kept].max())
        kept = [t for t, pi in zip(kept, p / p.sum()) if pi >= min_p * (p / p.sum()).max()]
    probs = np.zeros(len(z))
    if temperature == 0:                                     # greedy, after the penalties
        probs[kept[0]] = 1
        return probs
    probs[kept] = np.exp((z[kept] - z[kept].max()) / temperature)
    return probs / probs.sum()


def as_row(ids, probs, vocab=VOCAB) -> np.ndarray:
    row = np.zeros(vocab)
    row[ids] = probs
    return row


ODD = np.arange(VOCAB) % 2 == 1
ANYTHING = Constraint("regex", "(?s:.*)")   # a constraint, for a sampler that masks (the tests give the masks)
CASES = {
    "temperature": dict(temperature=0.6),
    "top_k": dict(top_k=17),
    "top_p": dict(top_p=0.8),
    "min_p": dict(min_p=0.2),
    "repeat_penalty": dict(repeat_penalty=1.7),
    "frequency_penalty": dict(frequency_penalty=0.6),
    "presence_penalty": dict(presence_penalty=-2.0),     # negative: lifts the seen tokens
    "penalties over the whole sequence": dict(repeat_penalty=1.3, penalty_last_n=-1),
    "no penalty window": dict(repeat_penalty=1.3, frequency_penalty=1.0, penalty_last_n=0),
    "greedy after penalties": dict(temperature=0.0, frequency_penalty=3.0, top_k=0),
    "logit bias": dict(logit_bias={int(BEST[0]): -np.inf, 3: 4.0, 4: -1.5}),
    "mask": dict(top_k=40, allowed=ODD),
    "everything": dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.2, frequency_penalty=0.3,
                       presence_penalty=0.4, penalty_last_n=32, logit_bias={7: 2.5}),
}


def settings_of(case: str) -> tuple[dict, np.ndarray | None]:
    """(Sampler keywords, the mask) of a case."""
    settings = NEUTRAL | CASES[case]
    return {k: v for k, v in settings.items() if k != "allowed"}, settings.get("allowed")


@pytest.mark.parametrize("case", CASES)
def test_each_step_matches_its_definition(case):
    settings, allowed = settings_of(case)
    ids, probs = Sampler(**settings).distribution(LOGITS, HISTORY, allowed)
    want = chain(LOGITS, HISTORY, **settings, allowed=allowed)
    np.testing.assert_array_equal(np.flatnonzero(as_row(ids, probs)), np.flatnonzero(want), "the kept tokens")
    np.testing.assert_allclose(as_row(ids, probs), want, rtol=1e-5, atol=1e-12)
    assert np.all(np.diff(probs) <= 1e-12), "best first"


def test_a_mask_as_bits_is_the_mask():
    """A mask given as the GPU's bits (uint32 words, bit i % 32 of word i // 32) is that bool mask."""
    words = as_words(ODD, VOCAB)
    for settings in (dict(temperature=0.0), dict(temperature=0.7, top_k=40)):
        sampler = Sampler(**NEUTRAL | settings, seed=5)
        for got, want in zip(sampler.distribution(LOGITS, HISTORY, words), sampler.distribution(LOGITS, HISTORY, ODD)):
            np.testing.assert_array_equal(got, want)
        assert sampler.sample(LOGITS, HISTORY, 3, words) == sampler.sample(LOGITS, HISTORY, 3, ODD)


def test_the_random_stream_is_pcg4d():
    """uniform(seed, draw, ids) from an independent pcg4d (Jarzynski and Olano 2020) in Python
    integers: 24 bits of the hash's first word, centred in their interval."""
    def pcg4d(v):
        m = 0xFFFFFFFF
        x, y, z, w = ((c * 1664525 + 1013904223) & m for c in v)
        for i in range(2):
            x = (x + y * w) & m
            y = (y + z * x) & m
            z = (z + x * y) & m
            w = (w + y * z) & m
            if i == 0:
                x, y, z, w = x ^ x >> 16, y ^ y >> 16, z ^ z >> 16, w ^ w >> 16
        return x
    seed, draw = 0x0123456789ABCDEF, 77
    want = [((pcg4d((seed & 0xFFFFFFFF, seed >> 32, draw, i)) >> 8) + 0.5) / (1 << 24) for i in range(50)]
    np.testing.assert_array_equal(uniform(seed, draw, np.arange(50)), want)


def test_seeded_draws_repeat_and_depend_on_seed_and_draw():
    sampler = lambda seed: Sampler(temperature=1.0, top_k=0, top_p=1.0, seed=seed)
    draws = lambda seed: [sampler(seed).sample(LOGITS, HISTORY, d) for d in range(40)]
    assert draws(5) == draws(5) != draws(6)
    assert len(set(draws(5))) > 10
    assert Sampler().seed != Sampler().seed   # unseeded: a random seed each


def test_a_mask_or_bias_that_leaves_nothing_draws_no_token():
    banned = {i: -np.inf for i in range(VOCAB)}
    assert Sampler(temperature=0.7, logit_bias=banned).sample(LOGITS, HISTORY, 0) == NO_TOKEN
    assert Sampler(temperature=0.0).sample(LOGITS, HISTORY, 0, np.zeros(VOCAB, bool)) == NO_TOKEN


def test_bad_settings_are_invalid_arguments():
    for bad in (dict(temperature=-1), dict(top_p=0), dict(min_p=1.5), dict(repeat_penalty=0), dict(penalty_last_n=-2),
                dict(logit_bias={"a": 1.0}), dict(logit_bias={-1: 1.0}), dict(logit_bias={3: float("nan")}),
                dict(logit_bias={3: float("inf")})):
        with pytest.raises(InvalidArgument):
            Sampler(**bad)
    with pytest.raises(InvalidArgument, match="token 1000"):
        Sampler(logit_bias={1000: 1.0}).check(VOCAB)


# --- the GPU's choice ---------------------------------------------------------------------
class Chooser:
    """sample.choose's dispatches over a row of `vocab` logits, with buffers of their own."""

    def __init__(self, gpu, vocab: int, ctx: int = 256):
        dev = gpu.device
        self.gpu, self.vocab, self.ctx = gpu, vocab, ctx
        self.buffers = sample.SamplerBuffers.allocate(dev, types.SimpleNamespace(vocab_size=vocab), ctx)
        buf = lambda size, label, **kw: Binding(dev.buffer(size, label, **kw), 0, size)
        self.logits, self.tokens = buf(4 * vocab, "logits"), buf(4, "tokens")
        self.chain, self.step = buf(4 * GREEDY_BATCH, "chain"), buf(16, "step", uniform=True)

    def __call__(self, row, sampler: Sampler, history, draw: int, allowed=None) -> tuple[int, int]:
        """(token, kept count) of draw `draw` (NO_TOKEN's bits when there is none)."""
        dev = self.gpu.device
        dev.write(self.logits.buffer, np.asarray(row, np.float32).tobytes())
        self.buffers.load(dev, sampler, history, self.vocab, self.ctx)
        if allowed is not None:
            self.buffers.allow(dev, allowed, self.vocab)
        dev.write(self.step.buffer, pack_step(0, 1, draw))
        steps = sample.choose(self.gpu.kernels, self.buffers, self.logits, self.tokens, self.chain, self.step,
                              sampler, self.vocab)
        raw = asyncio.run(dev.run(dev.schedule(steps), Binding(self.buffers.result.buffer, 0, 8)))
        return tuple(np.frombuffer(raw, np.uint32).tolist())

    def draws(self, row, sampler: Sampler, n: int) -> np.ndarray:
        """n draws (draw 0 .. n-1) of the sample kernel alone, a workgroup each."""
        dev, b = self.gpu.device, self.buffers
        dev.write(self.logits.buffer, np.asarray(row, np.float32).tobytes())
        b.load(dev, sampler, [], self.vocab, self.ctx)
        dev.write(self.step.buffer, pack_step(0, 1, 0))
        result = Binding(dev.buffer(8 * n, "results"), 0, 8 * n)
        steps = sample.sample(self.gpu.kernels, b, self.logits, self.step, result, self.vocab, sample.selects(sampler), n)
        raw = asyncio.run(dev.run(dev.schedule(steps), result))
        return np.frombuffer(raw, np.uint32).reshape(n, 2)[:, 0].astype(np.int64)


    def settled(self, row, sampler: Sampler) -> tuple[int, int]:
        """(token, kept count) of draw 0 from the slices alone (top-k 0: without the last form)."""
        dev, b = self.gpu.device, self.buffers
        dev.write(self.logits.buffer, np.asarray(row, np.float32).tobytes())
        b.load(dev, sampler, [], self.vocab, self.ctx)
        dev.write(self.step.buffer, pack_step(0, 1, 0))
        steps = sample.sample(self.gpu.kernels, b, self.logits, self.step, b.result, self.vocab, False)[:2]
        return tuple(np.frombuffer(asyncio.run(dev.run(dev.schedule(steps), b.result)), np.uint32).tolist())


def numpy_choice(row, sampler: Sampler, history, draw: int, allowed=None) -> tuple[int, int]:
    token = sampler.sample(row, history, draw, allowed)
    kept = len(sampler.kept(sampler.adjusted(row, history, allowed))[0])
    return (sample.NO_TOKEN if token == NO_TOKEN else token), kept


def rows(vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(vocab)
    x = (rng.standard_normal(vocab) * 2).astype(np.float32)
    masked = x.copy()
    masked[rng.integers(0, vocab, vocab // 3)] = -np.inf
    masked[:2] = [0.0, -0.0]
    peaked = (-0.05 * rng.permutation(vocab)).astype(np.float32)   # top-p's and min-p's cuts within the 256 best
    return {"random": x, "ties": np.round(x), "all equal": np.zeros(vocab, np.float32), "masked": masked,
            "one best": np.where(np.arange(vocab) == vocab // 2, 8.0, -1.0).astype(np.float32), "peaked": peaked}


GPU_CASES = {
    "greedy": dict(temperature=0.0, top_k=40),
    "top-k 1": dict(temperature=0.7, top_k=1),
    "top-k 40": dict(temperature=0.7, top_k=40),
    "top-k 256": dict(temperature=1.3, top_k=256),
    "top-k past the workgroup": dict(temperature=1.0, top_k=300, top_p=1.0),
    "top-k past 32 bits": dict(temperature=1.0, top_k=1 << 40, top_p=0.9),
    "whole vocabulary": dict(temperature=1.0, top_k=0, top_p=1.0),
    "top-p": dict(temperature=1.0, top_k=0, top_p=0.9),
    "top-p small": dict(temperature=0.8, top_k=0, top_p=0.05),
    "top-p of 1": dict(temperature=0.9, top_k=40, top_p=1.0),
    "top-p with top-k 40": dict(temperature=0.9, top_k=40, top_p=0.5),
    "top-p with top-k 300": dict(temperature=0.9, top_k=300, top_p=0.7),
    "min-p": dict(temperature=0.9, top_k=0, top_p=1.0, min_p=0.1),
    "min-p of 0": dict(temperature=0.9, top_k=40, top_p=1.0, min_p=0.0),
    "min-p with top-k": dict(temperature=0.9, top_k=40, top_p=1.0, min_p=0.3),
    "penalties": dict(temperature=0.8, top_k=40, repeat_penalty=1.5, frequency_penalty=0.4, presence_penalty=0.3,
                      penalty_last_n=16),
    "greedy after penalties": dict(temperature=0.0, top_k=0, repeat_penalty=1.3, penalty_last_n=-1),
    "logit bias": dict(temperature=0.7, top_k=0, top_p=0.95, logit_bias={5: 3.0, 6: -np.inf, 7: -100.0}),
    "everything": dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.2, frequency_penalty=0.3,
                       presence_penalty=0.4, penalty_last_n=32, logit_bias={9: 1.5}),
}


@pytest.fixture(scope="module")
def chooser(gpu):
    return Chooser(gpu, VOCAB)


@pytest.mark.parametrize("case", GPU_CASES)
def test_gpu_choice_equals_numpy(chooser, case):
    """Each filter alone and the full chain, on rows of every kind: the token and the number of
    tokens kept (the kept set: a prefix of the order) are numpy's, in three draws."""
    history = np.random.default_rng(1).integers(0, VOCAB, 60).tolist()
    for name, row in rows(VOCAB).items():
        sampler = Sampler(**GPU_CASES[case], seed=12345)
        for draw in range(3):
            assert chooser(row, sampler, history, draw) == numpy_choice(row, sampler, history, draw), (name, draw)


def test_gpu_mask_equals_numpy(chooser):
    """A mask: only allowed tokens are chosen, greedy or sampled; none allowed: no token."""
    history, rng = [1, 2, 3], np.random.default_rng(2)
    for name, row in rows(VOCAB).items():
        allowed = rng.random(VOCAB) < 0.1
        for settings in (dict(temperature=0.0), dict(temperature=0.9, top_k=0, top_p=0.8), dict(temperature=0.9)):
            sampler = Sampler(**settings, seed=3, constraint=ANYTHING)
            got = chooser(row, sampler, history, 0, allowed)
            assert got == numpy_choice(row, sampler, history, 0, allowed), (name, settings)
            assert allowed[got[0]]
    nothing = Sampler(temperature=0.0, constraint=ANYTHING)
    assert chooser(LOGITS, nothing, [], 0, np.zeros(VOCAB, bool)) == (sample.NO_TOKEN, 0)


@pytest.mark.parametrize("vocab", [49153, 151936])
def test_gpu_choice_on_big_vocabularies(gpu, vocab):
    """Vocabularies of real models (SmolLM2's 49,152 plus one, Qwen2.5's 151,936): more ties at
    the top-k bound than the workgroup memory holds (the radix select), and top-p over the
    whole vocabulary (the bisection). There the GPU sums tens of thousands of float32 masses
    (numpy: float64), and a top-p cut within a float32 rounding of the goal (the random row:
    4e-8 of it; the one-best row's 151,935 tied masses: 6e-6) may keep one token more or less;
    the token drawn is the same."""
    choose, history = Chooser(gpu, vocab), list(range(100))
    for name, row in rows(vocab).items():
        for settings in (dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.1),
                         dict(temperature=1.0, top_k=0, top_p=0.9), dict(temperature=1.0, top_k=0, top_p=1.0),
                         dict(temperature=0.7, top_k=0, top_p=1.0, min_p=0.2)):
            sampler = Sampler(**settings, seed=99)
            (token, kept), (want_token, want_kept) = (choose(row, sampler, history, 4),
                                                      numpy_choice(row, sampler, history, 4))
            assert token == want_token and abs(kept - want_kept) <= (vocab > 2 ** 16 or name == "random"), (name, settings, kept, want_kept)


@pytest.mark.parametrize("settings", [dict(temperature=0.9, top_p=0.9), dict(temperature=0.9, top_p=1.0, min_p=0.2),
                                      dict(temperature=1.0, top_p=1.0), dict(temperature=0.0, top_p=0.5)])
def test_top_k_0_is_settled_by_the_slices(gpu, settings):
    """Top-k 0 over 49,153 tokens (24 slices) where top-p's or min-p's cut falls within the 256
    best, or neither filter is on: the slices' selection and summaries settle the draw without
    the walk over the whole vocabulary, as numpy draws it."""
    row = rows(49153)["peaked"]
    sampler = Sampler(top_k=0, seed=21, **settings)
    assert Chooser(gpu, 49153).settled(row, sampler) == numpy_choice(row, sampler, [], 0)


@pytest.mark.parametrize("where", ["numpy", "gpu"])
def test_draws_follow_the_distribution(chooser, where):
    """10,000 seeded draws from a fixed row after top-k, top-p and min-p: each kept token's
    frequency within 3 standard errors of its probability, and nothing else drawn."""
    row = np.linspace(2.0, -2.0, VOCAB).astype(np.float32)
    sampler = Sampler(temperature=0.7, top_k=12, top_p=0.9, min_p=0.01, seed=2024)
    ids, probs = sampler.distribution(row, [])
    n = 10_000
    if where == "gpu":
        draws = chooser.draws(row, sampler, n)
    else:
        draws = np.array([sampler.sample(row, [], d) for d in range(n)])
    assert set(draws.tolist()) <= set(ids.tolist())
    freq = np.array([(draws == i).mean() for i in ids])
    se = np.sqrt(probs * (1 - probs) / n)
    assert np.all(np.abs(freq - probs) <= 3 * se + 1e-12), np.c_[ids, probs, freq]


# --- whole models ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model(synth_gguf):
    return synth_gguf("llama_q4_0")


FULL_CHAIN = dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.1, penalty_last_n=16)


@pytest.mark.parametrize("settings", [FULL_CHAIN, dict(temperature=1.2, top_k=0, top_p=0.9, frequency_penalty=0.5),
                                      dict(temperature=0, frequency_penalty=1.0, top_k=0)],
                         ids=["full chain", "whole vocabulary", "greedy with penalties"])
def test_gpu_samples_as_the_reference_and_repeats(model, device, settings):
    """Chained 8 steps a submission, a step at a time (logits read back each step) and the numpy
    reference: the same tokens for a seed; another seed, other tokens."""
    gpu, ref = (asyncio.run(Engine.load(model, d, ctx=64)) for d in (device, None))
    run = lambda engine, seed, **kw: asyncio.run(engine.generate("once upon a time", 20, stop_at_eos=False,
                                                                  sampler=Sampler(**settings, seed=seed), **kw)).tokens
    first = run(gpu, 11)
    assert first == run(gpu, 11, keep_logits=True) == run(ref, 11)
    if settings["temperature"]:
        assert first != run(gpu, 12)


@pytest.fixture(scope="module")
def smollm2_engines(device):
    """The real SmolLM2-135M on the GPU and on the numpy reference, with f32 KV caches. With f16's,
    a last-bit difference between the two hosts' products can round a cached value the other way;
    that moves a logit by ~1e-4, enough for a seeded draw near a boundary to pick the neighbour on
    some adapters (CI's did, at the full chain's sixth token). The sampler, not the cache, is what
    these tests judge; the f16 cache has its own tests (test_kernels_layers, test_gpu_model)."""
    from cera import catalogue
    from cera.gguf_file import GGUFFile
    g = GGUFFile.open(catalogue.fetch("smollm2-135m-instruct"))
    return tuple(asyncio.run(Engine.load(g, d, ctx=128, numerics=cache_numerics(F32_CACHE))) for d in (device, None))


@pytest.mark.parametrize("settings", [dict(temperature=0.7, top_k=40, top_p=1.0), dict(temperature=0.9, top_k=0, top_p=0.9),
                                      dict(temperature=0.9, top_k=0, top_p=1.0, min_p=0.1),
                                      dict(temperature=0.0, top_k=0, repeat_penalty=1.5, frequency_penalty=0.5),
                                      dict(temperature=1.0, top_k=0, top_p=1.0, logit_bias={11: 5.0}), FULL_CHAIN],
                         ids=["top-k", "top-p", "min-p", "penalties", "bias", "full chain"])
def test_real_smollm2_samples_as_the_reference(smollm2_engines, settings):
    """Real logits (peaked, not synthetic): each filter alone and the full chain, seeded, a chat
    reply's 24 tokens from the GPU's sampler equal the numpy reference's."""
    gpu, ref = smollm2_engines
    run = lambda engine: asyncio.run(engine.generate("Write a haiku about GPUs", 24, chat=True, stop_at_eos=False,
                                                     sampler=Sampler(**settings, seed=17))).tokens
    assert run(gpu) == run(ref)


@pytest.mark.parametrize("variant", ["qwen2_q4_k_m", "qwen3_q4_0", "granite_q5_1", "lfm2_q4_k", "gemma2_q4_k_m", "gemma3_q4_k_m"])
def test_every_arch_samples_as_the_reference(synth_gguf, device, variant):
    g = synth_gguf(variant)
    gpu, ref = (asyncio.run(Engine.load(g, d, ctx=64)) for d in (device, None))
    run = lambda engine: asyncio.run(engine.generate([1, 2, 3, 4], 12, stop_at_eos=False,
                                                     sampler=Sampler(**FULL_CHAIN, seed=5))).tokens
    assert run(gpu) == run(ref)


def test_sampling_through_a_context_shift(model, device):
    """The penalty window restarts from the shortened sequence after a shift, on both."""
    gpu, ref = (asyncio.run(Engine.load(model, d, ctx=24)) for d in (device, None))
    sampler = lambda: Sampler(temperature=0.9, top_k=20, repeat_penalty=1.4, penalty_last_n=-1, seed=8)
    run = lambda engine: asyncio.run(engine.generate("hello there", 40, stop_at_eos=False, sampler=sampler())).tokens
    assert run(gpu) == run(ref)


class Thirds:
    """A grammar engine for tests (cera.constrain.Grammars): token i of a reply must be i mod 3."""

    def __init__(self, vocab: int):
        self.ids = np.arange(vocab)

    def matcher(self, constraint):
        return self

    def mask(self) -> np.ndarray:
        return as_words(self.ids % 3 == self.n % 3, len(self.ids))

    def advance(self, token: int) -> None:
        self.n += 1


@pytest.mark.parametrize("variant", [None, "lfm2_q4_k"], ids=["attention", "conv states"])
def test_a_constraint_masks_the_model(model, synth_gguf, device, variant):
    """A constraint's matcher, asked before each token and told each one chosen: every token it
    allows, the GPU's as the reference's, through context shifts (ctx 16, 30 tokens) as
    within one, a pass ahead of the caller or (conv states) not; a bias that bans every token
    ends the reply."""
    model = synth_gguf(variant) if variant else model
    gpu, ref = (asyncio.run(Engine.load(model, d, ctx=16)) for d in (device, None))
    results = []
    for engine in (gpu, ref):
        engine.grammars = Thirds(gpu.cfg.vocab_size)
        for temperature in (0.0, 0.9):
            engine.grammars.n = 0
            s = Sampler(temperature=temperature, seed=4, constraint=ANYTHING)
            r = asyncio.run(engine.generate([5, 6, 7], 30, stop_at_eos=False, sampler=s))
            assert [t % 3 for t in r.tokens] == [i % 3 for i in range(30)]
            results.append(r.tokens)
        engine.grammars.n, stops = 0, iter(range(100))   # stopped early, then a next turn from where it stopped
        s = Sampler(temperature=0.9, seed=5, constraint=ANYTHING, repeat_penalty=1.3)
        first = asyncio.run(engine.generate([5, 6, 7], 12, stop_at_eos=False, sampler=s,
                                            should_stop=lambda: next(stops) == 4)).tokens
        engine.grammars.n = 0
        results.append(first + asyncio.run(engine.generate([5, 6, 7, *first, 8], 6, stop_at_eos=False,
                                                           sampler=s)).tokens)
    assert results[:3] == results[3:]
    banned = Sampler(temperature=0.5, logit_bias={i: -np.inf for i in range(gpu.cfg.vocab_size)})
    r = asyncio.run(gpu.generate([5, 6, 7], 10, sampler=banned))
    assert (r.tokens, r.stop_reason) == ([], "no_allowed_token")


def test_a_step_reads_back_only_its_token(model, device, monkeypatch):
    """Greedy and sampled alike: 4 bytes for the prompt's token (chosen in the prefill's own
    submission), then a chained batch's tokens at once, never logits."""
    engine = asyncio.run(Engine.load(model, device, ctx=64))
    sizes, run = [], device.run

    def spy(schedule, read=None):
        sizes.append(read.nbytes if read else 0)
        return run(schedule, read)

    monkeypatch.setattr(device, "run", spy)
    asyncio.run(engine.generate("hello", 8, stop_at_eos=False))
    assert sizes == [4] + [4 * n for n in greedy_batches(7, GREEDY_BATCH)]
    sizes.clear()
    asyncio.run(engine.generate("hello", 8, stop_at_eos=False, sampler=Sampler(**FULL_CHAIN, seed=0)))
    assert sizes == [4] + [4 * n for n in greedy_batches(7, GREEDY_BATCH)]
