"""Sampling (cera.sampling): each step of llama.cpp's chain against numpy written here from its
definition; the GPU's top-k selection (shaders/topk.wgsl) against numpy's argpartition; the
candidates read back from the GPU against the whole row; seeded runs that repeat; and what a
step reads back."""
import asyncio

import numpy as np
import pytest

from cera.device import Binding
from cera.engine import Engine
from cera.gpu import layers
from cera.gpu.model import greedy_batches
from cera.gpu.state import GREEDY_BATCH
from cera.sampling import Sampler, TopK
from gpu_util import read, submit, upload, zeros

VOCAB = 1000
RNG = np.random.default_rng(7)
LOGITS = np.round(RNG.standard_normal(VOCAB) * 3, 1).astype(np.float32)   # both signs, many ties
BEST = np.argsort(-LOGITS, kind="stable")[:5]
HISTORY = RNG.choice(np.r_[np.arange(50), BEST], 100).tolist()   # prompt + reply so far: repeats, the best too
NEUTRAL = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, frequency_penalty=0.0,
               presence_penalty=0.0, penalty_last_n=64)


def chain(logits, history, temperature, top_k, top_p, min_p, repeat_penalty, frequency_penalty, presence_penalty,
          penalty_last_n) -> np.ndarray:
    """llama.cpp's default chain from its definitions -> the probability of every token id."""
    z = logits.astype(np.float64)
    window = history if penalty_last_n == -1 else history[len(history) - penalty_last_n:] if penalty_last_n else []
    for token in set(window):   # penalties: every token seen in the window
        count = window.count(token)
        z[token] = z[token] * repeat_penalty if z[token] <= 0 else z[token] / repeat_penalty
        z[token] -= count * frequency_penalty + presence_penalty
    order = sorted(range(len(z)), key=lambda i: (-z[i], i))   # best first, the lower id on ties
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
    "everything": dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.2, frequency_penalty=0.3,
                       presence_penalty=0.4, penalty_last_n=32),
}


@pytest.mark.parametrize("case", CASES)
def test_each_step_matches_its_definition(case):
    settings = NEUTRAL | CASES[case]
    ids, probs = Sampler(**settings).distribution(LOGITS, HISTORY)
    np.testing.assert_allclose(as_row(ids, probs), chain(LOGITS, HISTORY, **settings), rtol=1e-9, atol=1e-12)
    assert np.all(np.diff(probs) <= 1e-15), "best first"


CANDIDATE_CASES = {
    "top_k": dict(top_k=17),
    "penalties": dict(top_k=40, repeat_penalty=1.7, frequency_penalty=0.6),
    "penalties push the best out": dict(top_k=3, repeat_penalty=4.0, frequency_penalty=2.0),
    "a penalty pulls others in": dict(top_k=3, presence_penalty=-6.0),
    "greedy after penalties": CASES["greedy after penalties"],
    "everything": CASES["everything"],
}


@pytest.mark.parametrize("case", CANDIDATE_CASES)
def test_candidates_give_the_whole_rows_distribution(case):
    """The GPU reads back the k + w best and the w penalized tokens' logits (TopK); the sampler
    draws from exactly what it would draw from with the whole row, also where penalties push
    the best tokens out (positive) or pull others in (negative)."""
    sampler = Sampler(**NEUTRAL | CANDIDATE_CASES[case])
    request = sampler.request(HISTORY, VOCAB)
    assert isinstance(request, TopK)
    whole, candidates = sampler.distribution(LOGITS, HISTORY), sampler.distribution(request.select(LOGITS), HISTORY)
    np.testing.assert_array_equal(candidates[0], whole[0])
    np.testing.assert_allclose(candidates[1], whole[1], rtol=1e-12)


def test_requests():
    assert Sampler(temperature=0.7, top_k=0).request(HISTORY, VOCAB) is None   # top-p over all of them: the row
    assert Sampler(temperature=0.7, top_k=40).request(HISTORY, VOCAB) == TopK(40)   # no penalty: nothing to watch
    penalized = Sampler(temperature=0.7, top_k=40, repeat_penalty=1.1, penalty_last_n=8).request(HISTORY, VOCAB)
    assert set(penalized.watch) == set(HISTORY[-8:]) and penalized.k == 40 + len(penalized.watch)
    assert Sampler(temperature=0.7, top_k=250, repeat_penalty=1.1).request(HISTORY, VOCAB) is None   # past 256
    assert Sampler(temperature=0, repeat_penalty=1.1).request(HISTORY, VOCAB).k == 1 + len(set(HISTORY[-64:]))
    assert Sampler(temperature=0).greedy and not Sampler(temperature=0, presence_penalty=0.1).greedy


def test_seeded_sampling_repeats():
    def draws(seed):
        sampler = Sampler(temperature=1.0, top_k=0, top_p=1.0, seed=seed)
        return [sampler.sample(LOGITS, HISTORY) for _ in range(20)]
    assert draws(5) == draws(5) != draws(6)


def test_draws_follow_the_distribution():
    sampler = Sampler(temperature=1.0, top_k=4, top_p=1.0, seed=0)
    ids, probs = sampler.distribution(LOGITS, HISTORY)
    draws = np.array([sampler.sample(LOGITS, HISTORY) for _ in range(4000)])
    freq = np.array([(draws == i).mean() for i in ids])
    assert set(draws) <= set(ids) and np.abs(freq - probs).max() < 0.03


def test_bad_settings_are_invalid_arguments():
    from cera.errors import InvalidArgument
    for bad in (dict(temperature=-1), dict(top_p=0), dict(min_p=1.5), dict(repeat_penalty=0), dict(penalty_last_n=-2)):
        with pytest.raises(InvalidArgument):
            Sampler(**bad)


# --- the GPU's top-k selection ------------------------------------------------------------
def gpu_top_k(gpu, x: np.ndarray, k: int, watch) -> tuple:
    logits = upload(gpu, x.astype(np.float32), "logits")
    params = upload(gpu, np.frombuffer(layers.pack_top_k(k, watch), np.uint32), "params")
    out = zeros(gpu, 3 * layers.TOP_K_MAX, "out")
    submit(gpu, layers.top_k(gpu.kernels, gpu.device, Binding(out), Binding(logits), Binding(params), n=len(x)))
    return layers.unpack_top_k(read(gpu, out, (8 * k + 4 * len(watch),), np.uint8).tobytes(), k)


@pytest.mark.parametrize("n, k", [(7, 3), (255, 1), (300, 256), (1000, 40), (4099, 104), (49153, 256),
                                  (151936, 40)])
@pytest.mark.parametrize("values", ["random", "ties", "constant"])
def test_gpu_top_k_equals_argpartition(gpu, n, k, values):
    """k best by numpy's argpartition (the same values), best first; among equal logits the lower
    index first (numpy's stable sort), and the watched logits. Vocabularies that are not
    multiples of the workgroup; ties everywhere (few distinct values, or all equal, where more
    than the kernel's workgroup memory reach the bound and it selects over the logits)."""
    rng = np.random.default_rng(n + k)
    x = rng.standard_normal(n).astype(np.float32) * 3
    x = {"random": x, "ties": np.round(x), "constant": np.full(n, -0.5, np.float32)}[values]
    x[rng.integers(0, n, 3)] = [0.0, -0.0, -np.inf]
    watch = rng.integers(0, n, 9).tolist()
    ids, logits, watched = gpu_top_k(gpu, x, k, watch)
    np.testing.assert_array_equal(np.sort(logits), np.sort(x[np.argpartition(-x, k - 1)[:k]]))
    np.testing.assert_array_equal(ids, np.argsort(-x, kind="stable")[:k])
    np.testing.assert_array_equal(logits, x[ids])
    np.testing.assert_array_equal(watched, x[watch])


# --- the engine ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model(synth_gguf):
    return synth_gguf("llama_q4_0")


@pytest.mark.parametrize("settings", [dict(temperature=0.9, top_k=20, repeat_penalty=1.3, presence_penalty=-0.5),
                                      dict(temperature=1.2, top_k=0, top_p=0.9, min_p=0.05, frequency_penalty=0.5),
                                      dict(temperature=0, frequency_penalty=1.0, top_k=0)],
                         ids=["top-k candidates", "whole row", "greedy with penalties"])
def test_gpu_samples_as_the_reference_and_repeats(model, device, settings):
    gpu, ref = (asyncio.run(Engine.load(model, d, ctx=64)) for d in (device, None))
    run = lambda engine, seed: asyncio.run(engine.generate("once upon a time", 16, stop_at_eos=False,
                                                            sampler=Sampler(**settings, seed=seed))).tokens
    first = run(gpu, 11)
    assert first == run(gpu, 11) == run(ref, 11)
    if settings["temperature"]:
        assert first != run(gpu, 12)


def test_a_step_reads_back_only_what_the_sampler_needs(model, device, monkeypatch):
    """Greedy: the 4-byte argmax of each token (the prompt's, then a greedy batch's tokens at
    once), never logits. Top-k sampling: the k + w candidates and the w watched logits,
    never the row (4 * vocab bytes)."""
    engine = asyncio.run(Engine.load(model, device, ctx=64))
    sizes, run = [], device.run

    def spy(schedule, read=None):
        sizes.append(read.nbytes if read else 0)
        return run(schedule, read)

    monkeypatch.setattr(device, "run", spy)
    asyncio.run(engine.generate("hello", 8, stop_at_eos=False))
    assert sizes == [4] + [4 * n for n in greedy_batches(7, GREEDY_BATCH)]
    sizes.clear()
    sampler = Sampler(temperature=0.8, top_k=10, repeat_penalty=1.2, penalty_last_n=4, seed=0)
    asyncio.run(engine.generate("hello", 8, stop_at_eos=False, sampler=sampler))
    prompt = len(engine.history) - 8
    watched = [len(set(engine.history[: prompt + i][-4:])) for i in range(8)]   # w before each token
    assert [n for n in sizes if n != 4] == [8 * (10 + w) + 4 * w for w in watched]
