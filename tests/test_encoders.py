"""Encoders (nomic-bert, bert): embeddings against llama.cpp's (`Llama(embedding=True)`,
tests/data/golden/encoder_*.json and nomic-embed-text_embeddings.json, made by
tests/data/golden/make_golden.py --encoders / --nomic), from the numpy reference and the GPU; the
header's pooling and normalisation; what an encoder refuses (generation, a causal or
rank-pooled header)."""
import asyncio

import numpy as np
import pytest

import synth
from cera import catalogue
from cera.config import ModelConfig
from cera.engine import Engine
from cera.errors import InvalidArgument, Unsupported
from cera.gguf_file import GGUFFile
from golden import GOLDEN_NUMERICS, NMSE_EXACT, NMSE_QUANT, load, nmse
from gpu_util import F16_CACHE_TOLERANCE, assert_close, cache_numerics

ENCODERS = list(synth.ENCODER_VARIANTS)
COSINE = 0.999     # the judgement's bar: every embedding within this cosine of llama.cpp's


def embed(engine, text, pooling=None, normalize=False):
    return asyncio.run(engine.embed(text, pooling, normalize))


def cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of (n, d) arrays."""
    return (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)


def check_against_llama_cpp(engine: Engine, g: dict) -> None:
    """Every golden text: llama.cpp's tokens, then every pooling's rows within nMSE (exact types:
    NMSE_EXACT; quantized: NMSE_QUANT, llama.cpp rounding activations to 8 bits) and cosine."""
    exact = g["write_model"]["wtype"] in ("f32", "f16")
    for case in g["texts"]:
        assert engine.embed_tokens(case["text"]) == case["tokens"], case["name"]
        for pooling, want in case["embeddings"].items():
            got, want = embed(engine, case["text"], pooling), np.array(want, np.float32)
            assert got.shape == want.shape, (case["name"], pooling)
            err = nmse(got, want)
            assert err <= (NMSE_EXACT if exact else NMSE_QUANT), (case["name"], pooling, err)
            assert cosines(got, want).min() >= COSINE, (case["name"], pooling)


@pytest.fixture(scope="module")
def encoders(synth_gguf):
    return {name: synth_gguf(name) for name in ENCODERS}


@pytest.mark.parametrize("name", ENCODERS)
def test_reference_matches_llama_cpp(encoders, name):
    g = load(f"encoder_{name}")
    engine = asyncio.run(Engine.load(encoders[name]))
    assert engine.pooling == g["pooling"]
    check_against_llama_cpp(engine, g)


@pytest.mark.parametrize("name", ENCODERS)
def test_gpu_matches_llama_cpp(encoders, device, name):
    g = load(f"encoder_{name}")
    engine = asyncio.run(Engine.load(encoders[name], device, numerics=GOLDEN_NUMERICS))
    check_against_llama_cpp(engine, g)


@pytest.mark.parametrize("kv", ["f32", "f16"])
@pytest.mark.parametrize("name", ["nomic_bert_q8_0", "bert_q8_0"])
def test_gpu_equals_the_reference(encoders, device, name, kv):
    """Every row of texts of several lengths (the longest the context) to f32 precision with an
    f32 cache; with an f16 one (both), within what rounding K and V to halves moves."""
    numerics = cache_numerics((kv, kv))
    gpu = asyncio.run(Engine.load(encoders[name], device, ctx=48, numerics=numerics))
    ref = asyncio.run(Engine.load(encoders[name], None, ctx=48, numerics=numerics))
    rng = np.random.default_rng(3)
    tolerance = 1e-4 if kv == "f32" else F16_CACHE_TOLERANCE
    for n in (1, 5, 17, 48):
        ids = rng.integers(5, synth.WPM_VOCAB_SIZE, n).tolist()
        assert_close(embed(gpu, ids, "none"), embed(ref, ids, "none"), atol=tolerance, rtol=tolerance, what=f"{n} tokens")


def test_config(encoders):
    nomic = ModelConfig.from_gguf(encoders["nomic_bert_f32"])
    assert (nomic.encoder, nomic.qkv_fused, nomic.ffn_gated, nomic.position_embeddings, nomic.rope_neox,
            nomic.pooling, nomic.biases) == (True, True, True, False, True, "mean", ())
    bert = ModelConfig.from_gguf(encoders["bert_f32"])
    assert (bert.encoder, bert.qkv_fused, bert.ffn_gated, bert.position_embeddings, bert.n_rot, bert.pooling,
            bert.biases) == (True, False, False, True, 0, "cls",
                             ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_down"))


def test_pooling_and_normalize(encoders):
    """The header's pooling by default; "cls" is the first row, "mean" the rows' mean;
    normalize divides each row by its norm."""
    engine = asyncio.run(Engine.load(encoders["nomic_bert_f32"]))
    text = "the cat sat on the mat"
    rows = embed(engine, text, "none")
    np.testing.assert_allclose(embed(engine, text), rows.mean(0, keepdims=True), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(embed(engine, text, "cls"), rows[:1])
    unit = embed(engine, text, "none", normalize=True)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(unit, rows / np.linalg.norm(rows, axis=1, keepdims=True), rtol=1e-6)


def test_an_encoder_refuses_to_generate(encoders):
    engine = asyncio.run(Engine.load(encoders["bert_f32"]))
    for call in (lambda: engine.generate("the cat", 4), lambda: engine.logits([2, 5, 3]),
                 lambda: engine.perplexity([2, 5, 3])):
        with pytest.raises(Unsupported, match="embedding model"):
            asyncio.run(call())
    with pytest.raises(InvalidArgument, match="pooling"):
        embed(engine, "the cat", "max")


@pytest.mark.parametrize("change, match", [
    ({"bert.attention.causal": True}, "causal"),
    ({"bert.pooling_type": 4}, "pooling_type 4"),
    ({"bert.attention.head_count_kv": 2}, "head_count_kv"),
])
def test_unsupported_headers(encoders, change, match):
    gf = encoders["bert_f32"]

    class Changed:   # the same file, its header changed
        metadata, tensors = {**gf.metadata, **change}, gf.tensors
    with pytest.raises(Unsupported, match=match):
        ModelConfig.from_gguf(Changed())


# ---- the real model: nomic-embed-text-v1.5 (274 MB) ---------------------------------------

def nomic_engine(device=None) -> tuple[dict, Engine]:
    path = catalogue.fetch("nomic-embed-text-v1.5")
    return load("nomic-embed-text_embeddings"), asyncio.run(Engine.load(GGUFFile.open(path), device, ctx=64,
                                                                        numerics=GOLDEN_NUMERICS))


def check_nomic(g: dict, engine: Engine) -> None:
    """llama.cpp's tokens, each sentence's embedding within COSINE of llama.cpp's, and each
    query nearer its own document than any other sentence."""
    got = {}
    for case in g["texts"]:
        assert engine.embed_tokens(case["text"]) == case["tokens"], case["name"]
        want = np.array(case["embeddings"][g["pooling"]], np.float32)          # (1, hidden)
        got[case["name"]] = embed(engine, case["text"], normalize=True)[0]     # the header's pooling
        assert cosines(got[case["name"]][None], want)[0] >= COSINE, case["name"]
    for topic in ("capital", "cat", "python"):
        query, own = got[f"{topic}_q"], got[f"{topic}_d"]
        others = [v for k, v in got.items() if k not in (f"{topic}_q", f"{topic}_d")]
        assert query @ own > max(query @ v for v in others), topic


@pytest.mark.slow
def test_nomic_reference_matches_llama_cpp():
    check_nomic(*nomic_engine())


@pytest.mark.slow
def test_nomic_gpu_matches_llama_cpp(device):
    check_nomic(*nomic_engine(device))



def test_cli(tmp_path):
    """`python -m cera embed` pools as the header says (and normalizes when asked), the GPU's
    equal to the reference's; generation from an encoder is refused with a message, no traceback."""
    from test_cli import cera, cera_json
    model = str(synth.write_variant(tmp_path / "nomic.gguf", "nomic_bert_f32"))
    args = ("embed", "-m", model, "--text", "the cat sat on the mat", "--ctx", "64")
    gpu, ref = cera_json(*args, "--normalize"), cera_json(*args, "--normalize", "--backend", "reference")
    assert gpu["pooling"] == "mean" and np.array(gpu["embeddings"]).shape == (1, 64)
    np.testing.assert_allclose(np.linalg.norm(gpu["embeddings"], axis=1), 1.0, rtol=1e-5)
    # the CLI's default f16 KV cache: K and V rounded to halves on both backends
    assert_close(np.array(gpu["embeddings"]), np.array(ref["embeddings"]), atol=F16_CACHE_TOLERANCE,
                 rtol=F16_CACHE_TOLERANCE, what="cli")
    proc = cera("generate", "-m", model, "-p", "the cat", ok=False)
    assert "embedding model" in proc.stderr and "Traceback" not in proc.stderr


def test_openai_embeddings_pool_as_the_header_says(encoders):
    """/v1/embeddings' rows (cera.openai_shapes): an encoder's header pooling (bert: CLS), unit length."""
    from cera.openai_shapes import embeddings
    engine = asyncio.run(Engine.load(encoders["bert_f32"]))
    texts = ["the cat sat on the mat", "a dog ran in the park"]
    out = asyncio.run(embeddings(engine, "bert", texts))
    for item, text in zip(out["data"], texts, strict=True):
        want = embed(engine, text, "cls", normalize=True)[0]
        np.testing.assert_allclose(item["embedding"], want, rtol=1e-5, atol=1e-6)
