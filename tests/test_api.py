"""The synchronous API (`cera.load`): generate / chat / stream / embed give the async engine's
greedy output and embeddings, with no event loop in the caller."""
import asyncio
import subprocess
import sys

import numpy as np
import pytest

import cera
from cera.chat import render
from cera.engine import Engine
from cera.errors import ContextFull
from cera.gguf_file import GGUFFile
from synth import write_variant

CONVERSATION = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"}, {"role": "user", "content": "and now?"}]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_variant(tmp_path_factory.mktemp("api") / "qwen3.gguf", "qwen3_q4_0")


@pytest.fixture(scope="module")
def m(model_path):
    with cera.load(model_path, ctx=256) as model:
        yield model


@pytest.fixture(scope="module")
def engine(model_path, device):
    return asyncio.run(Engine.load(GGUFFile.open(model_path), device, ctx=256))


def test_generate_equals_the_engine(m, engine):
    want = asyncio.run(engine.generate("hello world", 12))
    got = m.generate("hello world", max_tokens=12)
    assert (got.text, got.tokens, got.prompt_tokens, got.stop_reason) == \
        (want.text, want.tokens, want.prompt_tokens, want.stop_reason)


def test_chat_renders_the_whole_conversation(m, engine):
    want = asyncio.run(engine.generate(engine.chat_tokens(CONVERSATION), 12))
    got = m.chat(CONVERSATION, max_tokens=12)
    assert (got.text, got.tokens) == (want.text, want.tokens)
    text = render(engine.gguf.metadata["tokenizer.chat_template"], CONVERSATION)
    assert "be brief" in text and "and now?" in text
    assert got.prompt_tokens == engine.tokenizer.encode(text, add_special=True, parse_special=True)


def test_embed_equals_the_engine(m, engine):
    np.testing.assert_array_equal(m.embed("hello world", pooling="mean"), asyncio.run(engine.embed("hello world", "mean")))


def test_stream_yields_the_text_as_it_comes(m):
    pieces = list(m.stream("hello world", max_tokens=12))
    assert len(pieces) > 1 and "".join(pieces) == m.generate("hello world", max_tokens=12).text
    assert "".join(m.stream_chat(CONVERSATION, max_tokens=8)) == m.chat(CONVERSATION, max_tokens=8).text


def test_leaving_a_stream_early_leaves_no_trace(m):
    pieces = m.stream("hello", max_tokens=50)
    next(pieces)
    pieces.close()   # stops that generation
    assert m.generate("hello", max_tokens=6).tokens == m.generate("hello", max_tokens=6).tokens


def test_sampling_and_stop_strings(m):
    sampled = dict(temperature=1.0, top_k=0, top_p=1.0, seed=3)
    assert m.generate("abc", 10, **sampled).tokens == m.generate("abc", 10, **sampled).tokens
    assert m.generate("abc", 10, temperature=1.5, top_k=1).tokens == m.generate("abc", 10).tokens
    full = m.generate("hello world", 16).text
    stop = full[len(full) // 2: len(full) // 2 + 2]
    cut = m.generate("hello world", 16, stop=[stop])
    assert cut.text == full[:full.index(stop)] and cut.stop_reason == "stop_string"


def test_the_reference_backend_agrees(m, model_path):
    with cera.load(model_path, ctx=256, backend="reference") as ref:
        assert ref.generate("hello world", 8).tokens == m.generate("hello world", 8).tokens


def test_errors_reach_the_caller(m):
    with pytest.raises(ContextFull, match="the context holds 256"):
        m.generate("hello " * 300, max_tokens=4)
    with pytest.raises(FileNotFoundError, match="no such model"):
        cera.load("/nonexistent.gguf")
    assert m.generate("hello", max_tokens=2).tokens   # still serving


def test_import_cera_stays_light():
    code = ("import sys, cera, cera.engine, cera.api; "
            "print(sorted(m for m in ('wgpu', 'starlette', 'uvicorn', 'cera.server', 'cera.native') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
