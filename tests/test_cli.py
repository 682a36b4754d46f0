"""`python -m cera` as a user runs it: the JSON contracts other tools rely on, GPU against the
numpy reference, sampling, embeddings, chat templates, and the errors a user can act on."""
import json
import subprocess
import sys
import types

import numpy as np
import pytest

from cera.chat import render
from cera.device import Device
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


@pytest.mark.parametrize("name, cpu", [("llvmpipe (LLVM 15.0.6, 256 bits) via Vulkan", True),
                                       ("google swiftshader Subzero", True), ("NVIDIA H200 via Vulkan", False)])
def test_cpu_emulated_adapters_are_told_by_name(name, cpu):
    assert Device.cpu_emulated.fget(types.SimpleNamespace(adapter_name=name)) == cpu


def test_auto_backend_runs_the_reference_on_a_cpu_emulated_adapter(model, device):
    """The default backend: the GPU, unless the adapter emulates one on the CPU (lavapipe here),
    where the faster numpy reference runs and one line says so."""
    proc = cera("generate", "-m", model, "-p", "hello", "-n", "2", "--ctx", "64", "--json", "--backend", "auto")
    out = json.loads(proc.stdout)
    assert out["backend"] == ("reference" if device.cpu_emulated else "gpu")
    assert ("a CPU emulation" in proc.stderr) == device.cpu_emulated


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


def test_q8_0_cache_gpu_equals_reference(model, tmp_path):
    """--cache-type-k/-v q8_0 on either backend (the reference quantizes its cache alike): the same
    greedy tokens; a model whose heads are not whole q8_0 blocks is refused as unsupported,
    naming the caches it can take."""
    flags = ("--cache-type-k", "q8_0", "--cache-type-v", "q8_0")
    gpu, ref = (cera_json("generate", "-m", model, "-p", "hello world", "-n", "12", "--ctx", "64", "--backend", b,
                          *flags) for b in ("gpu", "reference"))
    assert gpu["tokens"] == ref["tokens"]
    small = str(write_variant(tmp_path / "llama.gguf", "llama_f32"))   # head_dim 16
    proc = cera("generate", "-m", small, "-p", "x", "--ctx", "16", "--json", "--cache-type-v", "q8_0", ok=False)
    assert proc.returncode == 5 and json.loads(proc.stdout)["error"] == {
        "type": "unsupported", "message": "a q8_0 KV cache needs a head_dim that is a multiple of 32, not 16 (use "
                                          "the f32 or f16 cache: --cache-type-k/-v)"}


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


def test_sampling_flags_gpu_equals_reference(model):
    args = ("generate", "-m", model, "-p", "abc abc abc", "-n", "12", "--ctx", "64", "--temperature", "0.9",
            "--top-k", "30", "--top-p", "0.9", "--min-p", "0.05", "--repeat-penalty", "1.3", "--frequency-penalty",
            "0.2", "--presence-penalty", "-0.1", "--penalty-last-n", "16", "--seed", "3")
    assert cera_json(*args)["tokens"] == cera_json(*args, "--backend", "reference")["tokens"]


def test_logit_bias_flag(model):
    """--logit-bias in llama.cpp's form: a large bias makes greedy pick that token; -inf bans the
    greedy one; a bad form is a usage error."""
    args = ("generate", "-m", model, "-p", "abc", "-n", "4", "--ctx", "64")
    assert cera_json(*args, "--logit-bias", "42+100")["tokens"] == [42] * 4
    best = int(np.argmax(cera_json(*args, "--logits")["logits"]))   # the prompt's greedy token (EOS, here)
    banned = cera_json(*args, "--logit-bias", f"{best}-inf")["tokens"]
    assert len(banned) == 4 and best not in banned
    bad = subprocess.run([sys.executable, "-m", "cera", *args, "--logit-bias", "42"], capture_output=True, text=True)
    assert bad.returncode == 2 and "TOKEN_ID+BIAS" in bad.stderr


def test_plan_and_bench_take_the_sampling_flags(model):
    plan = cera_json("plan", "-m", model, "--ctx", "64", "--temperature", "0.7", "--repeat-penalty", "1.1")
    assert [s["kernel"] for s in plan["steps"]][-4:] == ["sample adjust", "sample select 309", "sample 1x256",
                                                         "sample advance"]
    bench = cera_json("bench", "-m", model, "--ctx", "64", "--prompt-tokens", "8", "--gen-tokens", "8",
                      "--repeat", "1", "--temperature", "0.7", "--top-k", "40", "--seed", "1")
    assert bench["sampling"] == "temperature 0.7, top-k 40, top-p 0.95, min-p 0" and bench["decode_tokens_per_s"] > 0


def test_embed_json(model):
    """One row per token, or one pooled row; the GPU's equal the reference's."""
    args = ("embed", "-m", model, "--text", "hello world, hello", "--ctx", "64")
    gpu, ref = cera_json(*args), cera_json(*args, "--backend", "reference")
    rows = np.array(gpu["embeddings"])
    assert rows.shape == (len(gpu["tokens"]), 64) and gpu["tokens"] == ref["tokens"]
    np.testing.assert_allclose(rows, ref["embeddings"], rtol=1e-4, atol=1e-4)
    mean = np.array(cera_json(*args, "--pooling", "mean")["embeddings"])
    np.testing.assert_allclose(mean, rows.mean(0, keepdims=True), rtol=1e-5, atol=1e-6)


def test_info_json(model, device):
    out = cera_json("info", "-m", model)
    assert (out["arch"], out["layers"]) == ("qwen3", 2)
    assert out["adapter"] == device.adapter_name


@pytest.mark.parametrize("args, message", [
    (("generate", "-m", "/nonexistent.gguf", "-p", "x"), "no such model file or catalogue name"),
    (("generate", "-m", __file__, "-p", "x"), "GGUF magic invalid"),
    (("generate", "-p", "x " * 100, "--ctx", "16", "-m", "MODEL"), "the context holds 16"),
    (("generate", "-p", "x", "--temperature", "-1", "-m", "MODEL", "--backend", "reference"), "temperature"),
    (("generate", "-p", "x", "--prefill-chunk", "0", "-m", "MODEL"), "prefill chunk"),
    (("generate", "-p", "x", "--top-p", "0", "-m", "MODEL", "--backend", "reference"), "top_p"),
    (("embed", "--text", "x " * 100, "--ctx", "16", "-m", "MODEL"), "context of 16"),
])
def test_errors_say_what_to_do(model, args, message):
    proc = cera(*[model if a == "MODEL" else a for a in args], ok=False)
    assert message in proc.stderr and "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def broken(tmp_path_factory, model):
    """Files a user might hand the CLI: name -> path."""
    folder, whole = tmp_path_factory.mktemp("broken"), open(model, "rb").read()
    files = {"not_gguf": b"this is not a model\n" * 100, "truncated": whole[: len(whole) * 2 // 3],
             "unsupported_arch": whole.replace(b"qwen3", b"gpt-j")}
    for name, data in files.items():
        (folder / f"{name}.gguf").write_bytes(data)
    return {name: str(folder / f"{name}.gguf") for name in files} | {"missing": str(folder / "missing.gguf")}


@pytest.mark.parametrize("file, type_, status", [
    ("missing", "model_not_found", 3), ("not_gguf", "bad_file", 4), ("truncated", "truncated_file", 12),
    ("unsupported_arch", "unsupported", 5), ("too_long_prompt", "context_full", 7)])
def test_json_errors_have_a_type_and_an_exit_status(broken, model, file, type_, status):
    """Each kind of bad input: its own error type under --json, and its own exit status."""
    path, prompt = (model, "x " * 100) if file == "too_long_prompt" else (broken[file], "x")
    proc = cera("generate", "-m", path, "-p", prompt, "--ctx", "16", "--json", ok=False)
    assert proc.returncode == status, proc.stderr
    error = json.loads(proc.stdout)["error"]
    assert error["type"] == type_ and error["message"] and "Traceback" not in proc.stderr


def test_int8_is_an_opt_in_of_the_engine_commands(tmp_path):
    """--int8 (cera.gpu.numerics): a Q4_K model's prefill plan takes the integer kernels with it
    only, and bench says which numerics it measured."""
    path = str(write_variant(tmp_path / "qwen2.gguf", "qwen2_q4_k_m"))
    plan = lambda *flags: [s["kernel"] for s in cera_json("plan", "-m", path, "--rows", "16", "--ctx", "64",
                                                         *flags)["steps"]]
    assert not any(" x8" in kernel for kernel in plan())
    assert any(kernel.startswith("matmul Q4_K") and " x8" in kernel for kernel in plan("--int8"))
    bench = ("bench", "-m", path, "--ctx", "64", "--prompt-tokens", "8", "--gen-tokens", "2", "--repeat", "1")
    assert cera_json(*bench)["numerics"] == "exact" and cera_json(*bench, "--int8")["numerics"] == "int8"


def test_help_explains_every_option():
    """Every option of every subcommand has help text, and --help shows it."""
    from cera.cli import parser
    sub = next(a for a in parser()._actions if a.dest == "command")
    for command, p in sub.choices.items():
        text = " ".join(cera(command, "--help").stdout.split())
        for action in p._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{command} {action.option_strings[0]} has no help"
                assert action.option_strings[-1] in text and " ".join(action.help.split()[:3]) in text, \
                    f"{command} --help does not explain {action.option_strings[-1]}"


def test_generation_shifts_the_context_unless_told_not_to(model):
    args = ("generate", "-m", model, "-p", "hello", "-n", "100", "--ctx", "24")
    shifted = cera_json(*args)
    assert shifted["stop_reason"] in ("max_tokens", "eos") and len(shifted["tokens"]) > 24
    out = cera(*args, "--no-context-shift")
    assert "context of 24 tokens is full" in out.stderr
    result = cera_json(*args, "--no-context-shift")
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


def test_chat_turns_prefill_only_their_new_tokens(model):
    """Three turns through `python -m cera chat --json`: each reply equals a cold `generate` of
    the whole rendered conversation, and turns after the first prefill only what is new."""
    proc = subprocess.run([sys.executable, "-m", "cera", "chat", "-m", model, "--ctx", "256", "-n", "6", "--json"],
                          input="hello\nhow are you\nbye\n", capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    turns = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(turns) == 3 and turns[0]["reused"] == 0
    for previous, turn in zip(turns, turns[1:]):   # at least the whole previous prompt is reused
        assert turn["reused"] >= previous["prompt_tokens"] and turn["prefilled"] == turn["prompt_tokens"] - turn["reused"]
    import asyncio
    from cera.engine import Engine
    engine = asyncio.run(Engine.load(GGUFFile.open(model), None, ctx=256))
    messages = []
    for turn, user in zip(turns, ["hello", "how are you", "bye"]):
        messages.append({"role": "user", "content": user})
        engine.reset()
        cold = asyncio.run(engine.generate(engine.chat_tokens(messages), 6))
        assert turn["reply"] == cold.text
        messages.append({"role": "assistant", "content": cold.text})
