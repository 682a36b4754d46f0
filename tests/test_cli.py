"""`python -m cera` as a user runs it: the JSON contracts other tools rely on, GPU against the
numpy reference, sampling, chat templates, and the errors a user can act on."""
import json
import subprocess
import sys

import numpy as np
import pytest

from cera.chat import render
from cera.engine import Sampler
from cera.gguf_file import GGUFFile
from synth import write_variant


def cera(*args, ok=True):
    proc = subprocess.run([sys.executable, "-m", "cera", *args], capture_output=True, text=True, timeout=600)
    assert (proc.returncode == 0) == ok, proc.stderr
    return proc


def cera_json(*args):
    return json.loads(cera(*args, "--json").stdout)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(write_variant(tmp_path_factory.mktemp("cli") / "qwen3.gguf", "qwen3_q4_0"))


def test_generate_json_gpu_equals_reference(model):
    gpu = cera_json("generate", "-m", model, "-p", "hello world", "-n", "12", "--ctx", "64")
    ref = cera_json("generate", "-m", model, "-p", "hello world", "-n", "12", "--ctx", "64",
                    "--backend", "reference")
    for key in ("text", "tokens", "prompt_tokens", "stop_reason", "prefill_tokens_per_s", "decode_tokens_per_s",
                "dispatches_per_token", "adapter"):
        assert key in gpu, key
    assert gpu["tokens"] == ref["tokens"] and gpu["text"] == ref["text"]
    assert gpu["prompt_tokens"] == cera_json("tokenize", "-m", model, "--text", "hello world")["tokens"]
    assert gpu["dispatches_per_token"] > 0 and gpu["adapter"]


def test_chat_uses_the_template(model):
    out = cera_json("generate", "-m", model, "-p", "hi", "-n", "2", "--chat", "--ctx", "64")
    meta = GGUFFile.open(model).metadata
    text = render(meta["tokenizer.chat_template"], [{"role": "user", "content": "hi"}])
    assert out["prompt_tokens"] == cera_json("tokenize", "-m", model, "--text", text)["tokens"]


def test_perplexity_json(model, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 8)
    gpu = cera_json("perplexity", "-m", model, "-f", str(text), "--ctx", "48", "--prefill-chunk", "16")
    ref = cera_json("perplexity", "-m", model, "-f", str(text), "--ctx", "48", "--backend", "reference")
    assert gpu["n_tokens"] == ref["n_tokens"] == 48
    assert gpu["ppl"] == pytest.approx(ref["ppl"], rel=1e-4)


def test_sampling_is_seeded_and_top_k_1_is_greedy(model):
    args = ("generate", "-m", model, "-p", "abc", "-n", "10", "--ctx", "64", "--temperature", "1.5")
    assert cera_json(*args, "--seed", "7")["tokens"] == cera_json(*args, "--seed", "7")["tokens"]
    greedy = cera_json("generate", "-m", model, "-p", "abc", "-n", "10", "--ctx", "64")["tokens"]
    assert cera_json(*args, "--top-k", "1")["tokens"] == greedy


def test_sampler_nucleus():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    picks = {Sampler(1.0, top_k=0, top_p=0.7, seed=s).sample(logits) for s in range(200)}
    assert picks == {0, 1}   # the smallest set whose probability reaches 0.7


def test_info_json(model):
    out = cera_json("info", model)
    assert (out["arch"], out["layers"]) == ("qwen3", 2) and "adapter" in out


@pytest.mark.parametrize("args, message", [
    (("generate", "-m", "/nonexistent.gguf", "-p", "x"), "no such model file or catalogue name"),
    (("generate", "-m", __file__, "-p", "x"), "GGUF magic invalid"),
    (("generate", "-p", "x " * 100, "--ctx", "16", "-m", "MODEL"), "the context holds 16"),
    (("generate", "-p", "x", "--temperature", "-1", "-m", "MODEL", "--backend", "reference"), "temperature"),
    (("generate", "-p", "x", "--prefill-chunk", "0", "-m", "MODEL"), "prefill chunk"),
])
def test_errors_say_what_to_do(model, args, message):
    proc = cera(*[model if a == "MODEL" else a for a in args], ok=False)
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_help_explains_every_command():
    for command in ("generate", "perplexity", "tokenize", "info", "bench", "models"):
        assert "--" in cera(command, "--help").stdout or command == "models"


def test_generation_stops_when_the_context_is_full(model):
    out = cera("generate", "-m", model, "-p", "hello", "-n", "100", "--ctx", "24")
    assert "context of 24 tokens is full" in out.stderr
    result = cera_json("generate", "-m", model, "-p", "hello", "-n", "100", "--ctx", "24")
    assert result["stop_reason"] == "context_full"
    assert len(result["prompt_tokens"]) + len(result["tokens"]) == 24 + 1   # the last token is never run


def test_should_stop_ends_generation(model, device):
    import asyncio
    from cera.engine import Engine
    engine = asyncio.run(Engine.load(GGUFFile.open(model), device, ctx=64))
    seen = []
    result = asyncio.run(engine.generate("hello", 20, stop_at_eos=False, on_text=seen.append,
                                         should_stop=lambda: len(seen) >= 3))
    assert result.stop_reason == "stopped" and len(seen) == 3
    again = asyncio.run(engine.generate("hello", 6, stop_at_eos=False))   # the abandoned step leaves no trace
    assert again.tokens == asyncio.run(engine.generate("hello", 6, stop_at_eos=False)).tokens
