"""GPU times through the Device interface (timestamp queries), and the per-family profile built
on them (`cera.gpu.profile`, which `scripts/profile_decode.py` prints; test_web_kernels.py runs the same
in the page)."""
import asyncio

import numpy as np
import pytest

from cera.device import MAX_QUERIES, Binding
from cera.engine import Engine
from cera.errors import Unsupported
from cera.gpu import ops, profile


def test_time_passes_times_each_group_after_the_queued_writes(gpu):
    """One span per group; the dispatches run on the bytes written just before (queued writes
    first), and more groups than one query set holds split across submissions."""
    device, kernels = gpu.device, gpu.kernels
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    logits, first, second = device.buffer(x.nbytes, "logits"), device.buffer(4, "first"), device.buffer(4, "second")
    device.write(logits, x.tobytes())
    whole = ops.argmax(kernels, device, Binding(first), Binding(logits), n=64)
    half = ops.argmax(kernels, device, Binding(second), Binding(logits, 0, 128), n=32)
    spans = asyncio.run(device.time_passes([[whole], [half, half]]))
    assert len(spans) == 2 and all(isinstance(ns, int) and ns >= 0 for ns in spans)
    got = [np.frombuffer(asyncio.run(device.read(b, 0, 4)), np.uint32)[0] for b in (first, second)]
    assert got == [np.argmax(x), np.argmax(x[:32])]
    many = MAX_QUERIES // 2 + 3
    assert len(asyncio.run(device.time_passes([[half]] * many))) == many


def test_time_passes_needs_timestamp_queries(gpu, monkeypatch):
    monkeypatch.setattr(gpu.device, "features", gpu.device.features - {"timestamp-query"})
    with pytest.raises(Unsupported, match="no timestamp-query"):
        asyncio.run(gpu.device.time_passes([[]]))


def test_profile_reports_every_family_of_the_plans(device, synth_gguf):
    """The decode report has a marginal line for each kernel family of the decode plan; the
    prefill report has the matmuls' rate and their families."""
    model = asyncio.run(Engine.load(synth_gguf("llama_q4_k"), device, ctx=64)).backend
    decode = asyncio.run(profile.decode_report(model, 5, 2500.0, top=100))
    families = {profile.family(s) for s in model.decode_plan.steps}
    marginal = decode[decode.index(next(x for x in decode if x.startswith("marginal"))) + 1:]
    assert {line.split("  ")[-1] for line in marginal if line.startswith("  ") and " MB " in line} == families
    assert decode[0].startswith("GPU time of the step in one pass")
    assert any(x.startswith("GPU time of the dispatches, each in its own pass") for x in decode)
    prefill = asyncio.run(profile.prefill_report(model, list(range(1, 9)), top=100))
    assert prefill[1].startswith("matmuls: ") and any("matmul Q4_K" in x for x in prefill[2:])
