"""Whole synthetic models of every arch and weight type on the GPU (lavapipe here) against
llama.cpp's logits and greedy tokens (tests/data/golden, made by tests/data/golden/make_golden.py)
and against the numpy reference."""
import asyncio
import json
from dataclasses import replace

import numpy as np
import pytest

from cera.engine import Engine
from cera.gguf_file import GGUFFile
from cera.gpu import attention, matvec
from cera.gpu.model import greedy_batches
from cera.gpu.numerics import CACHE_TYPES, Numerics
from cera.gpu.state import GREEDY_BATCH
from gpu_util import F16_CACHE, NMSE_F16_CACHE, NMSE_Q8_CACHE, Q8_CACHE, cache_numerics
from golden import EXACT_TYPES, GOLDEN, GOLDEN_NUMERICS, NMSE_EXACT, NMSE_QUANT, TIE_SIGMAS, nmse
from synth import VARIANTS, sha256_file, write_variant


def exact(golden) -> bool:
    return golden["write_model"].get("wtype", "f32") in EXACT_TYPES


@pytest.fixture(scope="module")
def engines(device, tmp_path_factory):
    """variant -> (GPU engine, reference engine, golden), built once per variant, their caches
    f32 as llama.cpp's for the goldens."""
    cache = {}

    def get(name):
        if name not in cache:
            golden = json.loads((GOLDEN / f"synth_{name}.json").read_text())
            path = write_variant(tmp_path_factory.mktemp(name) / f"{name}.gguf", name)
            assert sha256_file(path) == golden["sha256"], "synth.py no longer writes the golden's file"
            g = GGUFFile.open(path)
            cache[name] = (*(asyncio.run(Engine.load(g, d, ctx=64, numerics=GOLDEN_NUMERICS)) for d in (device, None)),
                           golden)
        return cache[name]
    return get


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_logits_match_llama_cpp_and_reference(engines, name):
    gpu, ref, golden = engines(name)
    for seq in golden["sequences"]:
        got = asyncio.run(gpu.logits(seq["tokens"]))                 # (T, vocab)
        want = np.array(seq["logits"], np.float32)[:, : got.shape[1]]
        ref_logits = asyncio.run(ref.logits(seq["tokens"]))
        err_cpp, err_ref = nmse(got[seq["logits_positions"]], want), nmse(got, ref_logits)
        print(f"{name}: nMSE vs llama.cpp {err_cpp:.2e}, vs reference {err_ref:.2e}")
        assert err_ref < 1e-8, f"GPU vs numpy reference nMSE {err_ref:.2e}"
        assert err_cpp < (NMSE_EXACT if exact(golden) else NMSE_QUANT), f"GPU vs llama.cpp nMSE {err_cpp:.2e}"
        assert list(got.argmax(-1)) == list(ref_logits.argmax(-1))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_greedy_matches_llama_cpp(engines, name):
    """Identical greedy tokens, except that the paths may part after a step where llama.cpp's
    own top two logits are closer than the engines' measured logit difference (a near-tie its
    activation rounding decides)."""
    gpu, _, golden = engines(name)
    check_greedy(gpu, golden, name)


@pytest.mark.parametrize("record", [False, True], ids=["staged", "record"])
@pytest.mark.parametrize("bits", [24, 8])
@pytest.mark.parametrize("name", ["qwen2_q4_k_m", "gemma2_q4_k_m", "gemma3_q4_k_m", "phi3_q4_k_m"])
def test_integer_x_decode_matches_llama_cpp(device, synth_gguf, monkeypatch, name, bits, record):
    """x's bits in decode (24 by default, 8 with Numerics(int8=True)): the Q4_K and Q6_K
    matvecs whose x is staged (a fused norm, attention's merge) take x in integers, the others
    f32 x (X_INT_MIN_ROWS lowered: these models' matrices are shorter than the real ones); with
    `record` (RECORD_MIN_K lowered too) each norm runs apart and writes x's integers once, which
    the matvecs of its x read, the downs' x is quantized once, and attention's combine writes its
    output's integers for the output projection. Greedy decoding agrees with llama.cpp as the f32
    path must, and with 24 bits the per-token logits are the numpy reference's to the tolerance
    decode holds prefill to (tests/test_prefill.py)."""
    monkeypatch.setattr(matvec, "X_INT_MIN_ROWS", 0)
    if record:   # attention made wide too: its output, not normed, reaches the projection in a record
        monkeypatch.setattr(matvec, "RECORD_MIN_K", 0)
        monkeypatch.setattr(attention, "MERGE_IN_PROJECTION_MAX", 0)
    golden = json.loads((GOLDEN / f"synth_{name}.json").read_text())
    g = synth_gguf(name)
    gpu = asyncio.run(Engine.load(g, device, ctx=64, prefill_chunk=1, numerics=replace(GOLDEN_NUMERICS, int8=bits == 8)))
    labels = [s.label for s in gpu.backend.decode_plan.steps]
    matvecs = [label for label in labels if label.startswith("matvec")]
    integer = [label for label in matvecs if f" x{bits}" in label]
    kind = " rec" if record else " xs"
    assert integer and all(label.split()[1] in ("Q4_K", "Q6_K") and (kind in label or "merge" in label)
                           for label in integer)
    norms = [label for label in labels if label.endswith(f"norm.weight x{bits}")]
    assert len(norms) == (2 * gpu.backend.cfg.n_layers + 1 if record else 0), norms
    quantized = [i for i, label in enumerate(labels) if ".weight x " in label]   # an x that is not normed, in a record
    assert bool(quantized) == record and all(labels[i + 1] in integer for i in quantized)   # the downs
    combines = [label for label in labels if ".combine" in label]   # a wide attention's: its output's record too
    assert (combines and all(label.endswith(f".combine x{bits}") for label in combines)) if record else not combines
    assert all(" x8" not in label and " x24" not in label for label in matvecs if label not in integer)
    assert all(label.split()[1] not in ("Q4_K", "Q6_K") for label in matvecs
               if label not in integer and (" xs" in label or "merge" in label))
    check_greedy(gpu, golden, name)
    if bits == 24:
        tokens = golden["sequences"][0]["tokens"]
        reference = asyncio.run(Engine.load(g, None, ctx=64, numerics=GOLDEN_NUMERICS))
        got, want = (asyncio.run(e.logits(tokens)) for e in (gpu, reference))
        assert float(np.max(np.abs(got - want)) / np.max(np.abs(want))) < 1e-4


@pytest.mark.parametrize("name", ["llama_q4_0", "qwen2_q4_k_m", "gemma2_f32", "phi3_f32"])
def test_wide_attention_combines_before_the_projection(device, synth_gguf, monkeypatch, name):
    """Decode's output projection merges attention's partials in a narrow model, and reads a
    combine dispatch's output in a wide one (attention.merge_in_projection; here every model
    made wide by lowering MERGE_IN_PROJECTION_MAX): both give the reference's per-token logits
    to the tolerance decode holds prefill to, and llama.cpp's greedy tokens."""
    golden = json.loads((GOLDEN / f"synth_{name}.json").read_text())
    g = synth_gguf(name)
    tokens = golden["sequences"][0]["tokens"]
    reference = asyncio.run(Engine.load(g, None, ctx=64, numerics=GOLDEN_NUMERICS))
    want = asyncio.run(reference.logits(tokens))
    for wide in (False, True):
        if wide:
            monkeypatch.setattr(attention, "MERGE_IN_PROJECTION_MAX", 0)
        gpu = asyncio.run(Engine.load(g, device, ctx=64, prefill_chunk=1, numerics=GOLDEN_NUMERICS))
        labels = [s.label for s in gpu.backend.decode_plan.steps]
        combines = [label for label in labels if label.endswith("attention.combine")]
        merges = [label for label in labels if label.startswith("matvec") and "merge" in label]
        assert (combines and not merges) if wide else (merges and not combines)
        got = asyncio.run(gpu.logits(tokens))
        assert float(np.max(np.abs(got - want)) / np.max(np.abs(want))) < 1e-4
        check_greedy(gpu, golden, name)


@pytest.mark.parametrize("name", ["qwen2_q4_k_m", "lfm2_q4_k"])
def test_int8_prefill_matches_llama_cpp(device, synth_gguf, name):
    """Numerics(int8=True) in prefill: the matmuls of Q4_K and Q6_K weights
    take x in 8 bits per 256 elements (quantize_x, then matmul_int), as llama.cpp's CPU backend
    quantizes it, so on these models (all their matrices Q4_K or Q6_K) the prompt's logits come
    out as llama.cpp's own: at least 10x closer to them than the f32 tiles' (measured ~1e-12
    NMSE on two of the three sequences, where the f32 tiles' is 2e-4 .. 5e-4)."""
    golden = json.loads((GOLDEN / f"synth_{name}.json").read_text())

    def errors(int8):
        gpu = asyncio.run(Engine.load(synth_gguf(name), device, ctx=64, prefill_chunk=16,
                                      numerics=replace(GOLDEN_NUMERICS, int8=int8)))
        labels = [s.label for s in gpu.backend.plan(16).steps if hasattr(s, "label")]
        integer = [label for label in labels if label.startswith("matmul") and " x8" in label]
        assert bool(integer) == int8 and all(label.split()[1] in ("Q4_K", "Q6_K") for label in integer)
        quantized = [i for i, label in enumerate(labels) if label.startswith("quantize_x")]
        assert all(" x8" in labels[i + 1] for i in quantized)
        norms = [label for label in labels if label.endswith("norm.weight x8")]   # quantize_x fused in
        assert len(norms) == 2 * gpu.cfg.n_layers * int8   # attention's and the FFN's: q|k and v share theirs
        if int8 and name == "qwen2_q4_k_m":   # the other layer inputs: attention's output, the GLU's
            assert len(quantized) == 2 * gpu.cfg.n_layers < len(integer)
        return [nmse(asyncio.run(gpu.logits(seq["tokens"]))[seq["logits_positions"]], np.array(seq["logits"], np.float32))
                for seq in golden["sequences"]]

    f32, int8 = errors(False), errors(True)
    print(f"{name}: NMSE against llama.cpp, f32 tiles {f32}, 8-bit x {int8}")
    assert all(e8 < 0.1 * e32 for e8, e32 in zip(int8, f32))


# Variants whose head_dim is whole q8_0 blocks, each arch's path: NORM and NEOX RoPE, QK-norm,
# gemma's window and soft-cap, LFM2's conv blocks, a partial rotation; with (K's, V's) cache types
Q8_VARIANTS = [("llama_q4_k", Q8_CACHE), ("qwen2_q4_k_m", Q8_CACHE), ("qwen3_f32", Q8_CACHE),
               ("gemma2_f32", Q8_CACHE), ("gemma3_f32", Q8_CACHE), ("lfm2_q4_k", Q8_CACHE),
               ("phi3_q8_0_partial", Q8_CACHE), ("qwen3_f32", ("q8_0", "f16")), ("llama_q4_k", ("f32", "q8_0"))]


@pytest.mark.parametrize("name,cache", [(name, F16_CACHE) for name in sorted(VARIANTS)] + Q8_VARIANTS)
def test_cache_matches_the_reference(device, synth_gguf, name, cache):
    """cera's default cache, f16 (packed two to a u32, rounded as numpy casts), on every variant,
    and llama.cpp's q8_0 for K, V or both (cera.ops.quantize_q8_0 on write, dequantized on read),
    against the numpy reference with the same cache (kv_dtype float16, Q8_0_BLOCK): after each
    golden sequence, the same greedy tokens, and logits within NMSE_F16_CACHE or NMSE_Q8_CACHE
    (gpu_util says why)."""
    g, numerics = synth_gguf(name), cache_numerics(cache)
    assert cache != F16_CACHE or numerics == Numerics()   # the default
    gpu, ref = (asyncio.run(Engine.load(g, d, ctx=64, numerics=numerics)) for d in (device, None))
    layer, model = ref.cfg.attention_layers[0], ref.backend.model
    assert (model.key_cache[layer].dtype, model.value_cache[layer].dtype) == tuple(CACHE_TYPES[t] for t in cache)
    bound = NMSE_Q8_CACHE if "q8_0" in cache else NMSE_F16_CACHE
    golden = json.loads((GOLDEN / f"synth_{name}.json").read_text())
    for seq in golden["sequences"]:
        got, want = (asyncio.run(e.logits(seq["tokens"])) for e in (gpu, ref))
        print(f"{name}: {numerics.cache} cache, NMSE vs reference {nmse(got, want):.2e}")
        assert nmse(got, want) < bound
        runs = [asyncio.run(e.generate(seq["tokens"], len(seq["greedy"]), stop_at_eos=False)).tokens for e in (gpu, ref)]
        assert runs[0] == runs[1]


def check_greedy(gpu, golden, name):
    for seq in golden["sequences"]:
        got_logits = asyncio.run(gpu.logits(seq["tokens"]))[seq["logits_positions"]]
        want_logits = np.array(seq["logits"], np.float32)[:, : got_logits.shape[1]]
        tie = TIE_SIGMAS * float(np.sqrt(np.mean((got_logits - want_logits) ** 2)))
        result = asyncio.run(gpu.generate(seq["tokens"], max_tokens=len(seq["greedy"]), stop_at_eos=False))
        for i, (got, want) in enumerate(zip(result.tokens, seq["greedy"])):
            if got != want:
                (_, first), (_, second) = seq["greedy_top2"][i]
                print(f"{name}: parts from llama.cpp at step {i}: its top-2 margin {first - second:.3f}, "
                      f"tie threshold {tie:.3f}")
                assert first - second < tie, \
                    f"greedy token {i}: {got} != llama.cpp's {want} (its margin {first - second:.3f})"
                break


@pytest.mark.parametrize("name", ["llama_q4_0", "lfm2_q4_k", "gemma2_f32", "gemma3_f32", "phi3_f32"])
def test_batched_greedy_equals_a_step_per_submission_and_the_reference(device, synth_gguf, name):
    """Greedy decode chains GREEDY_BATCH steps per submission (the remainder in powers of two);
    its tokens are those of one forward step per submission (keep_logits) and the reference's,
    for lengths below, at and past a batch, and not a multiple of it."""
    g = synth_gguf(name)
    gpu, ref = (asyncio.run(Engine.load(g, d, ctx=64)) for d in (device, None))
    submissions, run = [], gpu.backend.device.run
    gpu.backend.device.run = lambda schedule, read=None: submissions.append(read) or run(schedule, read)
    prompt = [1, 17, 4, 99, 23]
    for n in (2, 8, 9, 22):   # greedy runs n - 1 steps: 1, 7 = 4 + 2 + 1, 8, 21 = 8 + 8 + 4 + 1
        submissions.clear()
        batched = asyncio.run(gpu.generate(prompt, n, stop_at_eos=False)).tokens
        greedy_reads = [r.nbytes // 4 for r in submissions if r is not None and r.buffer.label == "greedy.tokens"]
        assert greedy_reads == greedy_batches(n - 1, GREEDY_BATCH)
        stepped = asyncio.run(gpu.generate(prompt, n, stop_at_eos=False, keep_logits=True)).tokens
        want = asyncio.run(ref.generate(prompt, n, stop_at_eos=False)).tokens
        assert batched == stepped == want, f"{n} tokens"
    assert greedy_batches(21, 8) == [8, 8, 4, 1] and greedy_batches(8, 8) == [8] and greedy_batches(0, 8) == []


def _with_limits(device, **limits):
    """The same device, reporting smaller limits (a smaller GPU)."""
    import copy
    import dataclasses
    small = copy.copy(device)
    small.limits = dataclasses.replace(device.limits, **limits)
    return small


def test_matrices_beyond_the_binding_limit_are_tiled(device, engines, tmp_path):
    """With a 16 KiB storage binding limit every weight, the LM head and the embedding are bound
    in row tiles; the logits stay those of the untiled model."""
    if device.limits.min_storage_buffer_offset_alignment > 64:
        pytest.skip("tiles start at aligned f32 rows: at this alignment a 16 KiB binding holds none of this model's")
    gpu, _, golden = engines("llama_f32")
    path = write_variant(tmp_path / "m.gguf", "llama_f32")
    small = asyncio.run(Engine.load(GGUFFile.open(path), _with_limits(device, max_storage_buffer_binding_size=16384),
                                    ctx=64, numerics=GOLDEN_NUMERICS))
    tokens = golden["sequences"][1]["tokens"]
    np.testing.assert_allclose(asyncio.run(small.logits(tokens)), asyncio.run(gpu.logits(tokens)), rtol=1e-5, atol=1e-5)
    assert small.backend.dispatches_per_token > gpu.backend.dispatches_per_token


def test_too_small_a_binding_names_the_tensor(device, tmp_path):
    path = write_variant(tmp_path / "m.gguf", "llama_f32")
    with pytest.raises(ValueError, match=r"tensor .*weight.*storage binding limit"):
        asyncio.run(Engine.load(GGUFFile.open(path), _with_limits(device, max_storage_buffer_binding_size=256), ctx=64))
