"""The plan as data: SmolLM2's decode plan reads every weight once per token plus the KV cache,
and `python -m cera plan --json` prints it."""
import json
import subprocess
import sys

import pytest

from cera import catalogue
from cera.config import ModelConfig
from cera.device import Copy, Flush, Pass, passes
from cera.gguf_file import GGUFFile
from cera.gpu.model import GpuModel
from cera.gpu.numerics import cache_row_bytes
from cera.gpu.plan import FLUSH_LAYERS
from cera.sampling import Sampler
from gpu_util import CACHES, cache_numerics


@pytest.fixture(scope="module")
def smollm2(device):
    g = GGUFFile.open(catalogue.fetch("smollm2-135m-instruct"))
    cfg = ModelConfig.from_gguf(g)
    return g, cfg, GpuModel(cfg, g, device, ctx=1024)


@pytest.mark.parametrize("kv", CACHES)
def test_decode_plan_reads_the_weights_and_the_kv_cache(smollm2, device, kv):
    """The KV rows attention reads at their cache types' bytes (f16: half of f32's)."""
    g, cfg, _ = smollm2
    model = GpuModel(cfg, g, device, ctx=1024, numerics=cache_numerics(kv))
    plan, positions = model.plan(1), 512
    # per layer: the stacked qkv matvec, attention (RoPE and the cache write fused in), the
    # output projection (merging attention's splits), gate/up GLU, down; then embed, head, argmax
    assert plan.dispatches == 5 * cfg.n_layers + 3
    assert [s.label.split(" ")[0] for s in plan.steps[1:6]] == ["matvec", "blk.0.attention", "matvec", "matvec",
                                                                "matvec"]
    assert "merge" in plan.steps[3].label.split() and plan.steps[3].bindings[1].buffer.label == "attention_scratch"
    embedding = g.tensors["token_embd.weight"]
    weights = sum(t.nbytes for t in g.tensors.values() if t.name != "token_embd.weight")
    weights += embedding.nbytes + embedding.nbytes // embedding.shape[0]   # the tied head, one embedded row
    kv = cfg.n_layers * positions * cfg.n_kv_heads[0] * sum(cache_row_bytes(t, cfg.head_dim) for t in kv)   # K and V rows attention reads
    totals = plan.totals(positions)
    activations = totals["bytes_read"] - weights - kv
    print(f"read {totals['bytes_read']:,} = weights {weights:,} + KV {kv:,} + activations {activations:,}")
    assert 0 < activations < 0.01 * totals["bytes_read"]
    assert totals["bytes_written"] < 0.01 * totals["bytes_read"]


def test_greedy_plan_chains_decode_steps_through_the_step_uniform(smollm2):
    """A greedy batch of 3: the decode step, then greedy_advance (its argmax appended to the
    batch's tokens, the Step moved on); nothing else, no copies: one compute pass."""
    _, _, model = smollm2
    decode, plan = model.plan(1), model.chain_plan(3)
    assert plan.dispatches == 3 * (decode.dispatches + 1) and len(plan.steps) == 3 * (len(decode.steps) + 1)
    assert not any(isinstance(s, Copy) for s in plan.steps)
    labels = [s.label for s in plan.steps]
    assert labels == 3 * ([s.label for s in decode.steps] + ["greedy advance"])
    advance = plan.steps[len(decode.steps)]
    assert [b.buffer.label for b in advance.bindings] == ["tokens", "greedy.tokens", "step"]


def test_sampled_plan_ends_each_step_with_the_sampler(smollm2):
    """A sampled batch of 2: the decode step's layers and head, then the sampler's dispatches in
    place of the argmax and greedy_advance: adjust (only with a penalty, bias or mask), sample
    (the 24 slices of SmolLM2's vocabulary select their best, then one workgroup draws; for
    top-k 0, a last one that walks the vocabulary when the slices leave the kept set unsettled),
    sample advance (with the penalty window's buffers only when it penalizes)."""
    _, cfg, model = smollm2
    decode = model.plan(1)
    body = [s.label for s in decode.steps][:-1]   # without the argmax
    plain = model.chain_plan(2, sampler=Sampler(temperature=0.7, top_k=0, seed=1))
    assert [s.label for s in plain.steps] == 2 * (body + ["sample select 49152", "sample 24x256",
                                                          f"sample {cfg.vocab_size}", "sample advance"])
    assert plain.name == "sampled 2"
    full = model.chain_plan(1, sampler=Sampler(temperature=0.7, top_k=40, repeat_penalty=1.1, seed=1))
    assert [s.label for s in full.steps][len(body):] == ["sample adjust", "sample select 49152", "sample 24x256",
                                                         "sample advance"]
    assert [s.groups for s in full.steps[len(body) + 1: len(body) + 3]] == [(24, 1, 1), (1, 1, 1)]
    advance = full.steps[-1]
    assert [b.buffer.label for b in advance.bindings] == ["sampler.result", "tokens", "greedy.tokens", "step",
                                                          "sampling", "sampler.counts", "sampler.ring"]


def test_prefill_submission_is_flushed_after_its_first_layers(smollm2, device):
    """A prefill chunk's schedule is submitted in parts (plan.FLUSH_LAYERS): a flush after the
    last step of each of those layers, none in decode; `passes` ends a compute pass at each."""
    g, cfg, model = smollm2
    assert not any(isinstance(s, Flush) for s in model.plan(1).steps)
    chunked = GpuModel(cfg, g, device, ctx=1024, chunk=64)
    steps = chunked.plan(64).steps
    flushes = [i for i, s in enumerate(steps) if isinstance(s, Flush)]
    assert len(flushes) == len(FLUSH_LAYERS)
    assert all(steps[i - 1].label.startswith("matmul Q4_1 576x1536") for i in flushes)   # the layer's down
    segments = passes(steps)
    assert [type(s) for s in segments[:2]] == [Pass, Flush] and segments.count(Flush()) == len(FLUSH_LAYERS)
    assert sum(len(s.dispatches) for s in segments if isinstance(s, Pass)) == chunked.plan(64).dispatches
    assert passes([Flush(), *steps[:2], Flush(), Flush()])[-1] == Flush() and passes([Flush()]) == []


def test_prefill_plan_differs_only_by_row_count(smollm2, device):
    g, cfg, _ = smollm2
    chunked = GpuModel(cfg, g, device, ctx=1024, chunk=64)
    labels = [s.label for s in chunked.plan(64).steps if hasattr(s, "label")]
    assert sum(label.startswith("matmul Q4_1") for label in labels) == 4 * cfg.n_layers   # q|k|v, o, glu, down
    qkv = cfg.q_dim + 2 * cfg.kv_dim(0)
    assert labels[2] == f"matmul Q4_1 {qkv}x{cfg.hidden}"   # after embed and norm: q|k|v stacked, as in decode
    assert sum(label.endswith("prefill_attention") for label in labels) == cfg.n_layers


def test_plan_cli_json():
    out = subprocess.run([sys.executable, "-m", "cera", "plan", "--json", "--positions", "100"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["totals"]["dispatches"] == len(plan["steps"]) == 5 * 30 + 3
    assert plan["totals"]["bytes_read"] == sum(s["bytes_read"] for s in plan["steps"])
    assert plan["steps"][-1]["kernel"].startswith("argmax") and "logits" in plan["steps"][-1]["bindings"]
