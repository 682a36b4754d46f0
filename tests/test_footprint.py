"""The GPU memory a model takes, computed from its header (cera.gpu.footprint), against what
GpuModel allocates on the device: the weights (`weights.nbytes`) and every buffer made at load;
and a model that cannot fit is refused before any buffer is made."""
import copy
import dataclasses
import json
import subprocess
import sys

import pytest

from cera import catalogue
from cera.config import ModelConfig
from cera.device import buffer_size
from cera.errors import TooLarge
from cera.gguf_file import GGUFFile
from cera.gpu.footprint import footprint
from cera.gpu.model import GpuModel
from synth import VARIANTS, write_model, write_variant

CTX = 64


@pytest.fixture
def allocations(device, monkeypatch):
    """label -> bytes of every buffer the device makes while the test runs."""
    made, make = {}, device.buffer

    def buffer(size, label, uniform=False):
        made[label] = made.get(label, 0) + buffer_size(size)
        return make(size, label, uniform)
    monkeypatch.setattr(device, "buffer", buffer)
    return made


def check_footprint(device, allocations, g: GGUFFile, chunk: int, ctx: int = CTX):
    cfg = ModelConfig.from_gguf(g)
    want = footprint(cfg, g, ctx, chunk, device.limits)
    model = GpuModel(cfg, g, device, ctx, chunk)
    assert sum(want.weights.values()) == model.weights.nbytes
    assert [f.tensor for f in want.fallbacks] == model.weights.fallbacks
    assert allocations == want.buffers
    return want, cfg


@pytest.mark.parametrize("chunk", [1, 32])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_synthetic_models(device, allocations, tmp_path, name, chunk):
    """Every arch and weight type; chunk 1 reads q/k/v only stacked, 32 also one by one."""
    check_footprint(device, allocations, GGUFFile.open(write_variant(tmp_path / "m.gguf", name)), chunk)


def test_a_type_without_a_kernel_is_listed_at_its_f16_cost(device, allocations, tmp_path):
    path = write_model(tmp_path / "m.gguf", arch="llama", wtype="q4_k", tensor_types={"*.ffn_down.weight": "tq2_0"})
    fp, _ = check_footprint(device, allocations, GGUFFile.open(path), 8)
    assert [(f.tensor, f.type_name) for f in fp.fallbacks] == [("blk.0.ffn_down.weight", "TQ2_0"),
                                                               ("blk.1.ffn_down.weight", "TQ2_0")]
    assert all(f.gpu_bytes == 2 * 256 * 512 > f.file_bytes for f in fp.fallbacks)


@pytest.mark.parametrize("ctx", [256, 2048])
def test_smollm2(device, allocations, ctx):
    fp, cfg = check_footprint(device, allocations, GGUFFile.open(catalogue.fetch("smollm2-135m-instruct")), 512, ctx)
    assert fp.kv_cache == cfg.n_layers * 2 * 4 * ctx * cfg.kv_dim(0)


def test_too_large_is_refused_before_any_buffer(device, allocations, tmp_path):
    g = GGUFFile.open(write_variant(tmp_path / "m.gguf", "llama_f32"))
    cfg = ModelConfig.from_gguf(g)
    small = dataclasses.replace(device.limits, max_buffer_size=4096)
    fp = footprint(cfg, g, CTX, 32, small)
    name, n = max(fp.buffers.items(), key=lambda item: item[1])
    with pytest.raises(TooLarge, match=rf"{name} needs {n} bytes; this GPU's largest buffer is 4096 bytes"):
        fp.check(small)
    narrow = copy.copy(device)
    narrow.limits = small
    with pytest.raises(TooLarge):
        GpuModel(cfg, g, narrow, CTX, 32)
    assert not allocations


def test_info_cli_reports_what_the_gpu_model_allocates(device):
    path = catalogue.fetch("smollm2-135m-instruct")
    out = subprocess.run([sys.executable, "-m", "cera", "info", "-m", str(path), "--ctx", "1024", "--json"],
                         capture_output=True, text=True, timeout=600, check=True)
    memory = json.loads(out.stdout)["gpu_memory"]
    g = GGUFFile.open(path)
    model = GpuModel(ModelConfig.from_gguf(g), g, device, 1024)
    assert memory["weights"] == model.weights.nbytes
    assert memory["total"] == model.footprint.total and memory["fits"]
    assert memory["kv_cache"] == 30 * 2 * 4 * 1024 * 192 and memory["fallbacks"] == []
