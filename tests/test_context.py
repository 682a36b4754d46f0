"""Context shift: when the context fills, the first `keep` positions stay, half of the rest go,
and the retained keys are re-rotated to their new positions, on the GPU and in the reference.
The oracle is a fresh prefill of the retained tokens at their new positions."""
import asyncio

import numpy as np
import pytest

from cera.engine import Engine
from cera.errors import ContextFull
from cera.gguf_file import GGUFFile
from cera import ops, weights
from cera.gpu.numerics import CACHE_TYPES
from gpu_util import CACHES, F16_CACHE, F32_CACHE, Q8_CACHE, as_cached, assert_close, cache_numerics, cache_tolerance
from synth import write_model, write_variant

# NORM and NEOX RoPE, Llama-3 frequency factors, QK-norm, a hybrid with conv state, per-layer
# RoPE bases and sliding windows (gemma3), soft-caps (gemma2), LongRoPE factors and attention factor (phi3)
VARIANTS = ("llama_f32", "qwen2_f32", "llama_f32_ropefreqs", "qwen3_f32", "lfm2_f32", "gemma2_f32", "gemma3_f32",
            "phi3_f32")
# those whose head_dim is whole q8_0 blocks (32 values)
Q8_VARIANTS = ("qwen3_f32", "gemma2_f32", "gemma3_f32")
CTX = 48


def with_caches(names):
    """(variant, cache) pairs: every variant with the f32 and f16 caches, the Q8_VARIANTS with q8_0 too."""
    return [(name, cache) for name in names for cache in CACHES if cache != Q8_CACHE or name in Q8_VARIANTS]


@pytest.fixture(scope="module")
def engines(tmp_path_factory, device):
    folder, made = tmp_path_factory.mktemp("shift"), {}

    def get(name: str, backend: str, cache=F16_CACHE) -> Engine:
        if (name, backend, cache) not in made:
            g = GGUFFile.open(write_variant(folder / f"{name}.gguf", name))
            made[name, backend, cache] = asyncio.run(Engine.load(g, device if backend == "gpu" else None, ctx=CTX,
                                                                 numerics=cache_numerics(cache)))
        return made[name, backend, cache]
    return get


def read(engine, binding, shape, cache_type="f32"):
    """A buffer read back as f32; a cache of `cache_type`."""
    dtype = CACHE_TYPES[cache_type]
    raw = np.frombuffer(asyncio.run(engine.backend.device.read(binding.buffer, 0, binding.size)), dtype)
    return ops.from_cache(raw.reshape(ops.cache_shape(dtype, *shape)))


@pytest.mark.parametrize("name,cache", with_caches(VARIANTS))
def test_shift_moves_the_cache_and_rerotates_its_keys(engines, name, cache):
    """On the GPU, against numpy: rows before `keep` stay, rows keep+discard.. move down by
    `discard`, keys turned by -discard positions (ops.rope, with the layer's base and scale; an
    f16 key rounded again, within an ulp of numpy's; a q8_0 key dequantized, turned and
    requantized, as llama.cpp's shift does, within a q8_0 step), values as they were; conv states
    stay."""
    engine = engines(name, "gpu", cache)
    cfg, state, keep, discard = engine.cfg, engine.backend.state, 3, 20
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, CTX).tolist()
    engine.backend.reset()
    asyncio.run(engine.backend.forward(tokens, 0))
    shape = lambda i: (CTX, cfg.n_kv_heads[i], cfg.head_dim)
    caches = lambda i: (read(engine, state.key_cache[i], shape(i), cache[0]),
                        read(engine, state.value_cache[i], shape(i), cache[1]))
    before = {i: caches(i) for i in cfg.attention_layers}
    conv = {i: read(engine, b, (cfg.conv_kernel - 1, cfg.hidden)) for i, b in state.conv_state.items()}
    asyncio.run(engine.backend.shift(keep, discard, CTX))
    factors = cfg.rope_factors(CTX)
    freq = weights.tensor(engine.gguf, factors) if factors else None
    moved = CTX - keep - discard
    for i, (k, v) in before.items():
        k_after, v_after = caches(i)
        want_k = ops.rope(k[keep + discard:], np.full(moved, -discard * cfg.layer_rope_freq_scale[i]),
                          cfg.layer_rope_theta[i], cfg.rope_neox, cfg.n_rot, freq)
        tolerance = {"f32": (1e-5, 1e-4), "f16": cache_tolerance("f16"),
                     "q8_0": (1.01 * np.abs(want_k).max() / 127, 1e-4)}[cache[0]]   # a step of the largest block
        assert_close(k_after[:keep], k[:keep], 0, 0, f"layer {i} kept keys")
        assert_close(k_after[keep: keep + moved], as_cached(want_k, cache[0]), *tolerance, f"layer {i} moved keys")
        assert_close(v_after[keep: keep + moved], v[keep + discard:], 0, 0, f"layer {i} moved values")
    for i, c in conv.items():
        assert_close(read(engine, state.conv_state[i], c.shape), c, 0, 0, f"layer {i} conv state")


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("backend", ["gpu", "reference"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "phi3"])
def test_one_layer_shift_equals_a_fresh_prefill_of_what_it_keeps(tmp_path, device, arch, backend, cache):
    """With one layer, keys and values depend on their own token and position only, so the
    shifted cache must give exactly the logits of a fresh prefill of the retained tokens at their
    new positions (with more layers the retained keys also remember the dropped context, in
    cera as in llama.cpp). An f16 cache rounds a moved key twice (before and after its turn), a
    fresh one once: within what an f16 ulp of the keys moves the logits; a q8_0 cache likewise
    requantizes a moved key (heads of 32 values here: whole q8_0 blocks)."""
    heads = dict(n_heads=2, n_kv_heads=1, head_dim=32) if cache == Q8_CACHE and arch != "qwen3" else {}   # hidden 64
    g = GGUFFile.open(write_model(tmp_path / "one.gguf", arch, n_layers=1, **heads))
    b = asyncio.run(Engine.load(g, device if backend == "gpu" else None, ctx=CTX,
                                numerics=cache_numerics(cache))).backend
    keep, discard = 3, 20
    tokens = np.random.default_rng(1).integers(0, 200, CTX + 1).tolist()
    b.reset()
    asyncio.run(b.forward(tokens[:CTX], 0))                                     # the context, full
    asyncio.run(b.shift(keep, discard, CTX))
    shifted = asyncio.run(b.forward(tokens[CTX:], CTX - discard, "last"))[1]   # the next token, after the shift
    b.reset()
    fresh = asyncio.run(b.forward(tokens[:keep] + tokens[keep + discard:], 0, "last"))[1]
    err = np.abs(shifted - fresh).max() / np.abs(fresh).max()
    print(f"{arch} {backend} {cache}: max |shifted - fresh| / max |fresh| = {err:.2e}")
    bound = {F32_CACHE: 1e-4, F16_CACHE: 1e-3, Q8_CACHE: 3e-2}[cache]
    assert err < bound and int(np.argmax(shifted)) == int(np.argmax(fresh))


@pytest.mark.parametrize("name,cache", with_caches(["llama_f32", "qwen2_f32", "gemma2_f32", "gemma3_f32", "lfm2_f32",
                                                    "phi3_f32"]))
def test_long_generation_shifts_and_matches_the_reference(engines, name, cache):
    """300 tokens in a 48-token context: several shifts, the GPU's greedy tokens equal the
    reference's with the same cache type, and the reason is max_tokens. Greedy runs in batches
    up to each context end (a run of 43 steps, then 23 after each shift: batches of 8 and a
    remainder)."""
    gpu, ref = engines(name, "gpu", cache), engines(name, "reference", cache)
    runs = [asyncio.run(e.generate("hello world", 300, stop_at_eos=False)) for e in (gpu, ref)]
    assert [r.stop_reason for r in runs] == ["max_tokens", "max_tokens"]
    assert len(runs[0].tokens) == 300 and runs[0].tokens == runs[1].tokens


def test_without_context_shift_generation_stops_when_full(engines):
    result = asyncio.run(engines("llama_f32", "gpu").generate("hello world", 300, stop_at_eos=False,
                                                               context_shift=False))
    assert result.stop_reason == "context_full"
    assert len(result.prompt_tokens) + len(result.tokens) == CTX + 1   # the last token is never run


def test_keep_must_leave_room(engines):
    with pytest.raises(ValueError, match="keep"):
        asyncio.run(engines("llama_f32", "gpu").generate("hello", 5, keep=CTX))


def test_a_prompt_no_tokenization_fits_is_refused_before_tokenizing(engines, monkeypatch):
    """20 MB of text cannot be fewer than 20 MB / (the longest token's bytes) tokens: past the
    context, ContextFull comes at once, the tokenizer never called; a text that may fit is
    tokenized and checked as before."""
    engine = engines("llama_q4_0", "reference")
    tokenize = engine.tokenizer.encode
    monkeypatch.setattr(engine.tokenizer, "encode", lambda *a, **k: pytest.fail("tokenized"))
    for chat in (False, True):
        with pytest.raises(ContextFull, match="bytes are at least"):
            asyncio.run(engine.generate("x" * 20_000_000, 1, chat=chat))
    monkeypatch.setattr(engine.tokenizer, "encode", tokenize)
    longest = engine.tokenizer.max_token_bytes
    assert longest == max(len(t.encode()) for t in engine.tokenizer.tokens)
    with pytest.raises(ContextFull, match="prompt has"):
        asyncio.run(engine.generate("ab " * engine.ctx, 1))
