"""Host-chunked batched prefill against the per-token path (chunk 1) on the same model:
identical greedy continuations and matching logits, across chunk boundaries, every arch
(gemma3's local layers with chunks shorter and longer than their window of 6)."""
import asyncio

import numpy as np
import pytest

from cera.engine import Engine
from cera.gguf_file import GGUFFile
from synth import write_variant

CHUNKS = (7, 128, 512)
VARIANTS = ("llama_f32", "llama_q4_1_tied", "qwen2_q4_k_m", "qwen3_q4_0", "granite_q5_1", "lfm2_q4_k", "lfm2_f32",
            "gemma3_f32", "gemma3_q4_k_m")
CASES = [(name, chunk) for name in VARIANTS for chunk in CHUNKS] + [("gemma3_f32", 5)]   # 5 < window < 7
PROMPT = np.random.default_rng(1).integers(0, 300, 150).tolist()   # ids below every synth vocab (309)
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def runs(device, tmp_path_factory):
    """(variant, chunk) -> (logits of the prompt, greedy tokens after it)."""
    cache = {}

    def get(name, chunk):
        if (name, chunk) not in cache:
            g = GGUFFile.open(write_variant(tmp_path_factory.mktemp(name) / f"{name}.gguf", name))
            engine = asyncio.run(Engine.load(g, device, ctx=256, prefill_chunk=chunk))
            logits = asyncio.run(engine.logits(PROMPT))
            tokens = asyncio.run(engine.generate(PROMPT, NEW_TOKENS, stop_at_eos=False)).tokens
            cache[name, chunk] = logits, tokens, engine.backend.submits_per_prefill
        return cache[name, chunk]
    return get


@pytest.mark.parametrize("name,chunk", CASES)
def test_chunked_prefill_matches_per_token(runs, name, chunk):
    logits_1, tokens_1, submits_1 = runs(name, 1)
    logits, tokens, submits = runs(name, chunk)
    err = float(np.max(np.abs(logits - logits_1)) / np.max(np.abs(logits_1)))
    print(f"{name} chunk {chunk}: max |logit diff| / max |logit| = {err:.2e}, {submits} submits vs {submits_1}")
    assert err < 1e-4
    assert tokens == tokens_1
    assert submits == -(-len(PROMPT) // min(chunk, 256)) and submits_1 == len(PROMPT)
