"""Reusing cached state: a prompt that extends the live sequence, or a prefix saved in the
prefix cache, prefills only its tail, and gives the logits a cold prefill of the whole prompt
gives (GPU and reference)."""
import asyncio
from dataclasses import replace

import numpy as np
import pytest

from cera.engine import Engine
from cera.errors import InvalidArgument
from cera.gpu.numerics import Numerics
from cera.prefix import PrefixCache
from cera.runner import load_engine
from gpu_util import CACHES, F16_CACHE_TOLERANCE, Q8_CACHE, Q8_CACHE_TOLERANCE, cache_numerics
from synth import write_variant

RNG = np.random.default_rng(3)
A, B = RNG.integers(0, 200, 30).tolist(), RNG.integers(0, 200, 9).tolist()


@pytest.fixture(scope="module")
def models(synth_gguf):
    return {name: synth_gguf(name) for name in ("llama_q4_0", "qwen2_f32", "lfm2_q4_k", "gemma2_q4_k_m", "phi3_f32")}


def engine(g, device, backend, cache=None, numerics=Numerics()):
    return asyncio.run(Engine.load(g, device if backend == "gpu" else None, ctx=128, prefix_cache=cache,
                                   numerics=numerics))


def generate(e, ids, n=4):
    return asyncio.run(e.generate(ids, n, stop_at_eos=False, keep_logits=True))


# How far a warm state's logits may be from a cold prefill's, by K's and V's cache type: f32
# rounding where two kernel paths wrote the rows (decode's matvecs the reply's, prefill's matmuls
# the cold ones), and with an f16 or q8_0 cache its rounding of them (gpu_util.F16_CACHE_TOLERANCE,
# Q8_CACHE_TOLERANCE).
WARM_TOLERANCE = {("f32", "f32"): 1e-5, ("f16", "f16"): F16_CACHE_TOLERANCE, ("q8_0", "q8_0"): Q8_CACHE_TOLERANCE}
# variants whose head_dim is whole q8_0 blocks (32 values): they take the q8_0 cache too
Q8_NAMES = ("lfm2_q4_k", "gemma2_q4_k_m")


def with_caches(names):
    return [(name, kv) for name in names for kv in CACHES if kv != Q8_CACHE or name in Q8_NAMES]


def assert_same_logits(warm, cold, kv=("f32", "f32")):
    err = np.abs(warm.logits - cold.logits).max() / np.abs(cold.logits).max()
    assert err < WARM_TOLERANCE[kv] and warm.tokens == cold.tokens, f"{err:.2e}, {warm.tokens} vs {cold.tokens}"


@pytest.mark.parametrize("backend", ["gpu", "reference"])
@pytest.mark.parametrize("name,kv", with_caches(["llama_q4_0", "qwen2_f32", "lfm2_q4_k", "gemma2_q4_k_m", "phi3_f32"]))
def test_a_prompt_that_extends_the_conversation_prefills_only_its_tail(models, device, name, backend, kv):
    e = engine(models[name], device, backend, numerics=cache_numerics(kv))
    first = generate(e, A)
    turn = A + first.tokens + B                       # the reply, then the next message
    warm = generate(e, turn)
    # the last reply token never ran (it is the last one out); every token before it did
    assert warm.reused == len(A) + len(first.tokens) - 1 and warm.prefilled == len(B) + 1
    e.reset()
    assert_same_logits(warm, generate(e, turn), kv)


@pytest.mark.parametrize("stop", [3, 12])
@pytest.mark.parametrize("name,kv", with_caches(["llama_q4_0", "lfm2_q4_k"]))
def test_a_reply_stopped_mid_batch_is_resumed_where_it_stopped(models, device, name, stop, kv):
    """Greedy decode runs steps in batches, so a reply stopped early (here after `stop` tokens,
    in the first batch or the second) has run steps past it; those are not counted, and the
    conv state is rewound to the reply's last token: the next turn reuses everything before
    the stop and gives the logits of a cold prefill."""
    e = engine(models[name], device, "gpu", numerics=cache_numerics(kv))
    asked = iter(range(1, 100))
    first = asyncio.run(e.generate(A, 30, stop_at_eos=False, should_stop=lambda: next(asked) > stop))
    assert first.stop_reason == "stopped" and len(first.tokens) == stop
    turn = A + first.tokens + B
    warm = generate(e, turn)
    assert warm.reused == len(A) + len(first.tokens)
    e.reset()
    assert_same_logits(warm, generate(e, turn), kv)


@pytest.mark.parametrize("name", ["llama_q4_0", "lfm2_q4_k"])
def test_a_diverging_prompt_reuses_the_common_prefix_where_the_state_allows(models, device, name):
    """Attention caches rewind to any common prefix; a conv state only resumes at its end."""
    e = engine(models[name], device, "gpu")
    generate(e, A)
    other = A[:20] + B
    warm = generate(e, other)
    assert warm.reused == (0 if name.startswith("lfm2") else 20)
    e.reset()
    assert_same_logits(warm, generate(e, other))


@pytest.mark.parametrize("kv", CACHES)
@pytest.mark.parametrize("backend", ["gpu", "reference"])
def test_prefix_cache_hit_equals_cold_prefill(models, device, backend, kv, tmp_path):
    """With each cache type: a snapshot holds K and V as the cache does (f16 for an f16 cache,
    q8_0 blocks for a q8_0 one), in memory and on disk."""
    g, numerics = models["lfm2_q4_k"], cache_numerics(kv)
    cache = PrefixCache(64 << 20, tmp_path, namespace=f"lfm2-{backend}")
    e = engine(g, device, backend, cache, numerics)
    generate(e, A)
    generate(e, B)                                     # another conversation in between
    hit = generate(e, A + B)
    assert hit.reused == len(A) and hit.prefilled == len(B)
    snapshot = cache.lookup(A + B)
    assert {a.dtype for name, a in snapshot.arrays.items() if name[0] in "kv"} == set(map(np.dtype, numerics.kv_dtypes))
    cold = engine(g, device, backend, numerics=numerics)
    assert_same_logits(hit, generate(cold, A + B), kv)
    # a new engine with the same directory finds the snapshot on disk
    again = engine(g, device, backend, PrefixCache(64 << 20, tmp_path, namespace=f"lfm2-{backend}"), numerics)
    assert generate(again, A + B).reused == len(A)
    # a snapshot of another cache type is not this cache's state: refused, not rounded
    other = engine(g, device, backend, numerics=cache_numerics(("f32", "f16") if kv == ("f16", "f16") else ("f16", "f16")))
    with pytest.raises(InvalidArgument, match="snapshot k.1 is"):
        other.backend.restore(snapshot)


@pytest.mark.parametrize("backend", ["gpu", "reference"])
def test_prefix_cache_keeps_each_numerics_apart(tmp_path, backend):
    """The opt-in numerics and each cache type compute other states (cera.gpu.numerics): in one
    cache directory, an engine finds none of the snapshots another saved (the reference ignores
    the opt-ins, not the cache types)."""
    path = write_variant(tmp_path / "qwen2_q4_k_m.gguf", "qwen2_q4_k_m")

    def load(numerics):
        return asyncio.run(load_engine(path, 128, backend, prefix_cache_mb=64, prefix_cache_dir=tmp_path / "cache",
                                       numerics=numerics))[0]
    generate(load(Numerics(int8=True)), A)
    assert generate(load(Numerics()), A + B).reused == (0 if backend == "gpu" else len(A))
    assert generate(load(Numerics(int8=True)), A + B).reused == len(A)
    f32 = Numerics(cache_type_k="f32", cache_type_v="f32")
    assert generate(load(f32), A + B).reused == 0   # none of the f16 cache's states
    generate(load(f32), A)
    assert generate(load(replace(f32, cache_type_v="f16")), A + B).reused == 0
    assert generate(load(f32), A + B).reused == len(A)
    assert generate(load(replace(f32, cache_type_k="q8_0")), A + B).reused == 0


def test_prefix_cache_keeps_to_its_budget(models, device):
    e = engine(models["qwen2_f32"], device, "reference", PrefixCache(1))
    generate(e, A)
    assert len(e.prefix_cache) == 0       # a snapshot larger than the budget is not kept
    cache = PrefixCache(10 << 20)
    e = engine(models["qwen2_f32"], device, "reference", cache)
    for start in range(0, 60, 6):
        e.reset()
        generate(e, RNG.integers(0, 200, 20).tolist())
    assert 0 < cache.nbytes <= 10 << 20
