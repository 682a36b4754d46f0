"""Real models from the catalogue on the GPU path (lavapipe here) against llama.cpp's golden
data (tests/data/golden/<model>.json, made by scripts/make_golden.py): greedy continuations
of the golden prompts and perplexity of a real passage."""
import asyncio
import json
from pathlib import Path

import pytest

from cera import catalogue
from cera.engine import Engine
from cera.gguf_file import GGUFFile

DATA = Path(__file__).parent / "data"
GREEDY_TOKENS = 16
PPL_TOLERANCE = 0.03   # relative, against llama.cpp's perplexity of the same tokens

MODELS = {"smollm2": "smollm2-135m-instruct", "qwen2.5-coder": "qwen2.5-coder-1.5b-instruct"}


def golden(name: str) -> dict:
    return json.loads((DATA / "golden" / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def engine(device, request):
    name = request.param
    path = catalogue.fetch(MODELS[name])
    return name, asyncio.run(Engine.load(GGUFFile.open(path), device, ctx=2048))


def _models(*names, slow=()):
    return pytest.mark.parametrize("engine", [pytest.param(n, marks=[pytest.mark.real_model] +
                                                           ([pytest.mark.slow] if n in slow else []))
                                              for n in names], indirect=True)


@_models("smollm2", "qwen2.5-coder", slow=("qwen2.5-coder",))
def test_greedy_matches_llama_cpp(engine):
    name, eng = engine
    for case in golden(name)["greedy"]:
        assert eng.prompt_tokens(case["prompt"]) == case["prompt_tokens"], "tokenizer differs from llama.cpp"
        result = asyncio.run(eng.generate(case["prompt_tokens"], GREEDY_TOKENS, stop_at_eos=False))
        assert result.tokens == case["tokens"][:GREEDY_TOKENS], f"prompt {case['prompt']!r}"


@_models("smollm2", "qwen2.5-coder", slow=("qwen2.5-coder",))
def test_perplexity_matches_llama_cpp(engine):
    name, eng = engine
    ppl = golden(name)["perplexity"]
    for window in ppl["windows"]:
        tokens = ppl["tokens"][: window["n_ctx"]]
        got = asyncio.run(eng.perplexity(tokens))
        print(f"{name}: perplexity over {len(tokens)} tokens: cera {got:.4f}, llama.cpp {window['ppl']:.4f}")
        assert abs(got / window["ppl"] - 1) < PPL_TOLERANCE
