"""LoRA adapters (cera.lora) on synthetic models: the GPU's logits and greedy tokens with an
adapter against llama.cpp's with the same file (tests/data/golden/lora_*.json, made by
tests/data/golden/make_golden.py --lora) and against the numpy reference, in decode (prefill chunk 1)
and batched prefill; adapters switched per request; adapted and base state kept apart; bad
adapters refused with the tensor named."""
import asyncio
import json
import subprocess
import sys

import numpy as np
import pytest

from cera.engine import Engine
from cera.errors import BadFile, InvalidArgument, Unsupported
from cera.gguf_file import GGUFFile
from cera.gpu.numerics import Numerics
from cera.prefix import PrefixCache
from golden import EXACT_TYPES, GOLDEN, GOLDEN_NUMERICS, NMSE_EXACT, NMSE_QUANT, TIE_SIGMAS, first_divergence, nmse
from gpu_util import F16_CACHE, NMSE_F16_CACHE, NMSE_Q8_CACHE, Q8_CACHE, cache_numerics
from synth import LORA_VARIANTS, VARIANTS, sha256_file, write_adapter, write_lora, write_lora_variant, write_variant

EXACT_ADAPTER_TYPES = ("F32", "F16")


def golden(name: str) -> dict:
    return json.loads((GOLDEN / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """name (a base variant or an adapter) -> its GGUF, checked against its golden's sha256."""
    folder, made = tmp_path_factory.mktemp("lora"), {}

    def get(name):
        if name not in made:
            if name in LORA_VARIANTS:
                path, want = write_lora_variant(folder / f"{name}.gguf", name), golden(f"lora_{name}")["sha256"]
            else:
                path, want = write_variant(folder / f"{name}.gguf", name), golden(f"synth_{name}")["sha256"]
            assert sha256_file(path) == want, f"synth.py no longer writes the file the golden of {name} was made from"
            made[name] = path
        return made[name]
    return get


def engine(files, device, base: str, *adapters: str, chunk: int = 512, cache=None,
           numerics: Numerics = GOLDEN_NUMERICS) -> Engine:
    """An engine on `device` (None: the reference) for `base` with `adapters` loaded at their
    scales; its KV cache f32 (as the goldens') unless `numerics` says otherwise."""
    e = asyncio.run(Engine.load(GGUFFile.open(files(base)), device, ctx=64, prefill_chunk=chunk, prefix_cache=cache,
                                numerics=numerics))
    for name in adapters:
        asyncio.run(e.load_lora(GGUFFile.open(files(name)), name, LORA_VARIANTS[name]["scale"]))
    return e


def tolerance(gold: dict) -> float:
    base = VARIANTS[gold["base"]].get("wtype", "f32")
    exact = base in EXACT_TYPES and set(gold["tensor_types"].values()) <= set(EXACT_ADAPTER_TYPES)
    return NMSE_EXACT if exact else NMSE_QUANT


def check_greedy(tokens: list[int], seq: dict, logits: np.ndarray) -> None:
    """Greedy tokens as llama.cpp's, except after a near-tie (test_gpu_model's rule); logits:
    ours at the golden's positions, for the tie threshold."""
    want = np.array(seq["logits"], np.float32)
    tie = TIE_SIGMAS * float(np.sqrt(np.mean((logits - want) ** 2)))
    agree, margin = first_divergence(tokens, seq["greedy"], seq["greedy_top2"])
    assert margin is None or margin < tie, f"greedy token {agree} parts from llama.cpp's (its margin {margin:.3f})"


def test_every_adapter_has_a_golden():
    assert {p.stem.removeprefix("lora_") for p in GOLDEN.glob("lora_*.json")} == set(LORA_VARIANTS)


@pytest.mark.parametrize("chunk", [1, 512], ids=["decode", "prefill"])
@pytest.mark.parametrize("name", sorted(LORA_VARIANTS))
def test_logits_match_llama_cpp_and_reference(files, device, name, chunk):
    gold = golden(f"lora_{name}")
    gpu, ref = engine(files, device, gold["base"], name, chunk=chunk), engine(files, None, gold["base"], name)
    for seq in gold["sequences"]:
        got = asyncio.run(gpu.logits(seq["tokens"], adapters=[name]))          # (T, vocab)
        ref_logits = asyncio.run(ref.logits(seq["tokens"], adapters=[name]))
        at = got[seq["logits_positions"]]
        err_cpp, err_ref = nmse(at, np.array(seq["logits"], np.float32)), nmse(got, ref_logits)
        print(f"{name} chunk {chunk}: nMSE vs llama.cpp {err_cpp:.2e}, vs reference {err_ref:.2e}")
        assert err_ref < 1e-8, f"GPU vs numpy reference nMSE {err_ref:.2e}"
        assert err_cpp < tolerance(gold), f"GPU vs llama.cpp nMSE {err_cpp:.2e}"
        assert list(got.argmax(-1)) == list(ref_logits.argmax(-1))
        result = asyncio.run(gpu.generate(seq["tokens"], len(seq["greedy"]), stop_at_eos=False, adapters=[name]))
        check_greedy(result.tokens, seq, at)


@pytest.mark.parametrize("cache", [F16_CACHE, Q8_CACHE], ids=["f16", "q8_0"])
@pytest.mark.parametrize("chunk", [1, 512], ids=["decode", "prefill"])
def test_cache_with_an_adapter_matches_the_reference(files, device, chunk, cache):
    """An adapter over cera's default cache, f16, and over llama.cpp's q8_0: the logits of the
    numpy reference with the same cache within NMSE_F16_CACHE or NMSE_Q8_CACHE (gpu_util says
    why), the same greedy tokens. (Its base, gemma2_f32, has heads of 32: whole q8_0 blocks.)"""
    name = sorted(LORA_VARIANTS)[0]
    gold = golden(f"lora_{name}")
    numerics = cache_numerics(cache)
    gpu, ref = (engine(files, d, gold["base"], name, chunk=chunk, numerics=numerics) for d in (device, None))
    for seq in gold["sequences"]:
        got, want = (asyncio.run(e.logits(seq["tokens"], adapters=[name])) for e in (gpu, ref))
        assert nmse(got, want) < (NMSE_Q8_CACHE if cache == Q8_CACHE else NMSE_F16_CACHE)
        runs = [asyncio.run(e.generate(seq["tokens"], len(seq["greedy"]), stop_at_eos=False, adapters=[name])).tokens
                for e in (gpu, ref)]
        assert runs[0] == runs[1]


def test_two_adapters_switch_per_request_and_never_share_state(files, device):
    """Two adapters loaded on one model, picked per request, each equal to llama.cpp with it
    alone; state run under one adapter set (the live sequence, the prefix cache) is never
    resumed under another, so the base model's logits after an adapted request are its own."""
    a, b = "llama_f32_attn_ffn", "llama_f32_q_up"
    gold = {(): golden("synth_llama_f32"), (0,): golden(f"lora_{a}"), (1,): golden(f"lora_{b}")}
    e = engine(files, device, "llama_f32", a, b, cache=PrefixCache(64 << 20))

    def run(tokens, adapters, reused):
        r = asyncio.run(e.generate(tokens, 1, stop_at_eos=False, keep_logits=True, adapters=adapters))
        assert r.reused == reused, f"{adapters}: {r.reused} prompt tokens reused, {reused} expected"
        seq = gold[e.lora_set(adapters)]["sequences"][2]
        want = np.array(seq["logits"][seq["logits_positions"].index(len(tokens) - 1)], np.float32)
        assert nmse(r.logits, want) < NMSE_QUANT, f"{adapters}: logits differ from llama.cpp's"
        return r

    seq = gold[()]["sequences"][2]["tokens"]                      # 40 tokens; logits at 13, 26, 39
    run(seq[:27], [a], 0)
    run(seq, [], 0)                 # extends the live sequence and a cached prefix, both made with a
    run(seq, [a], 27)               # a's prefix, from the prefix cache
    run(seq, [1], 0)                # b (by index): the live rows and the cache are a's
    run(seq, [b], 39)               # now live under b
    run(seq[:14], [], 0)            # the base model's own state again
    assert e.lora_set([b, a]) == (0, 1)
    both = asyncio.run(e.logits(seq, adapters=[a, b]))
    ref = engine(files, None, "llama_f32", a, b)
    assert nmse(both, asyncio.run(ref.logits(seq, adapters=[a, b]))) < 1e-8


def test_adapter_costs_two_dispatches_per_projection(files, device):
    """Per adapted projection: A x and B t. A layer whose gate or up is adapted runs its GLU
    apart: one more matvec and glu_act."""
    e = engine(files, device, "llama_f32", "llama_f32_q_up")
    base = e.backend.dispatches_per_token
    e.backend.use_loras((0,))
    assert e.backend.dispatches_per_token == base + 2 * 3 + 2      # q of both layers, up of layer 1
    assert len(e.backend.plan(24).steps) > 0
    with pytest.raises(InvalidArgument, match="not loaded"):
        e.lora_set(["nope"])
    with pytest.raises(InvalidArgument, match="already loaded"):
        asyncio.run(e.load_lora(GGUFFile.open(files("llama_f32_q_up")), "llama_f32_q_up"))


def cera(*args, status=0) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "cera", *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == status, proc.stderr
    return proc


def test_cli_lora_flag(files, device):
    """generate --lora FILE:SCALE gives the engine's tokens with that adapter; plan --lora counts
    the adapter's dispatches; a bad SCALE or a missing file is an error with its status."""
    name = "llama_f32_attn_ffn"
    model, lora = str(files("llama_f32")), f"{files(name)}:{LORA_VARIANTS[name]['scale']}"
    out = json.loads(cera("generate", "-m", model, "--lora", lora, "-p", "The cat", "-n", "8", "--ctx", "64",
                          "--json").stdout)
    e = engine(files, device, "llama_f32", name, numerics=Numerics())   # the CLI's default: the f16 cache
    assert out["tokens"] == asyncio.run(e.generate("The cat", 8, adapters=[name])).tokens
    assert out["loras"] == [files(name).name]
    plain = json.loads(cera("plan", "-m", model, "--ctx", "64", "--json").stdout)["totals"]["dispatches"]
    adapted = json.loads(cera("plan", "-m", model, "--ctx", "64", "--lora", lora, "--json").stdout)
    e.backend.use_loras((0,))
    assert adapted["totals"]["dispatches"] == e.backend.dispatches_per_token == plain + 20
    assert "SCALE" in cera("generate", "-m", model, "-p", "x", "--lora", f"{lora}x", status=2).stderr
    assert "no such LoRA adapter" in cera("generate", "-m", model, "-p", "x", "--lora", "nope.gguf", status=3).stderr


A, B = "blk.0.attn_q.weight.lora_a", "blk.0.attn_q.weight.lora_b"
Z = np.zeros


@pytest.mark.parametrize("base,adapter,error,words", [
    ("llama_q4_k", dict(base="llama_f32", targets=("blk.0.attn_q.weight",)), BadFile,
     r"tensor 'blk.0.attn_q.weight' has incorrect shape"),
    ("qwen2_f32", dict(base="llama_f32", targets=("blk.0.attn_q.weight",)), BadFile, "arch mismatch"),
    ("llama_f32", dict(base="llama_f32", targets=("output.weight",)), Unsupported, "'output.weight'"),
    ("llama_f32", "the model itself", BadFile, "general.type to be 'adapter'"),
    ("llama_f32", {A: Z((8, 64), np.float32)}, BadFile, "pair for 'blk.0.attn_q.weight' is missing one component"),
    ("llama_f32", {A: Z((8, 64), np.float32), B: Z((64, 4), np.float32)}, BadFile,
     "'blk.0.attn_q.weight': lora_a tensor is not transposed"),
    ("llama_f32", {A + "x": Z((8, 64), np.float32)}, BadFile, "'blk.0.attn_q.weight.lora_ax' has unexpected suffix"),
], ids=["shape", "arch", "target", "not-an-adapter", "half-a-pair", "ranks", "suffix"])
def test_bad_adapters_are_refused_naming_the_tensor(files, device, tmp_path, base, adapter, error, words):
    if adapter == "the model itself":
        path = files("llama_f32")
    elif "targets" in adapter:
        path = write_lora(tmp_path / "a.gguf", rank=8, alpha=8.0, **adapter)
    else:
        path = write_adapter(tmp_path / "a.gguf", "llama", adapter)
    e = engine(files, device, base)
    with pytest.raises(error, match=words):
        asyncio.run(e.load_lora(GGUFFile.open(path), "a"))
    assert e.loras == [] and e.backend.loras == []
