"""The GPU memory a model takes, computed from its header (cera.gpu.footprint), against what
GpuModel allocates on the device: the weights (`weights.nbytes`) and every buffer made at load;
and a model that cannot fit is refused before any buffer is made."""
import copy
import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from cera import catalogue
from cera.config import ModelConfig
from cera.device import buffer_size
from cera.errors import TooLarge, Unsupported
from cera.gguf_file import GGUFFile
from cera.gpu.footprint import footprint
from cera.gpu.model import GpuModel
from cera.gpu.numerics import EXACT
from cera.ops import Q8_0_BLOCK
from cera.reference import Reference
from gpu_util import CACHES, MIXED_CACHES, cache_numerics
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


def check_footprint(device, allocations, g: GGUFFile, chunk: int, ctx: int = CTX, numerics=EXACT):
    cfg = ModelConfig.from_gguf(g)
    want = footprint(cfg, g, ctx, chunk, device.limits, numerics)
    model = GpuModel(cfg, g, device, ctx, chunk, numerics)
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


# Bytes a KV cache of each type holds a value in: q8_0 36 bytes a block of 32 (cera.ops.Q8_0_BLOCK)
VALUE_BYTES = {"f32": 4, "f16": 2, "q8_0": 36 / 32}


@pytest.mark.parametrize("kv", CACHES + MIXED_CACHES + [("q8_0", "f16")])
@pytest.mark.parametrize("ctx", [256, 2048])
def test_smollm2(device, allocations, ctx, kv):
    """The KV cache at each of K's and V's cache types (f32: 4 bytes a value, f16: 2, q8_0: 1.125)."""
    fp, cfg = check_footprint(device, allocations, GGUFFile.open(catalogue.fetch("smollm2-135m-instruct")), 512, ctx,
                              cache_numerics(kv))
    assert fp.kv_cache == cfg.n_layers * sum(VALUE_BYTES[t] for t in kv) * ctx * cfg.kv_dim(0)
    d = fp.to_dict()
    assert (d["cache_type_k"], d["cache_type_v"]) == kv


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


@pytest.mark.parametrize("kv", [None, ("f32", "f32"), ("f32", "f16"), ("q8_0", "q8_0")])
def test_info_cli_reports_what_the_gpu_model_allocates(device, kv):
    """By default (kv None) the f16 cache: 2 bytes a value; --cache-type-k/-v as asked."""
    path = catalogue.fetch("smollm2-135m-instruct")
    flags = ["--cache-type-k", kv[0], "--cache-type-v", kv[1]] if kv else []
    out = subprocess.run([sys.executable, "-m", "cera", "info", "-m", str(path), "--ctx", "1024", "--json", *flags],
                         capture_output=True, text=True, timeout=600, check=True)
    memory = json.loads(out.stdout)["gpu_memory"]
    g = GGUFFile.open(path)
    kv = kv or ("f16", "f16")
    model = GpuModel(ModelConfig.from_gguf(g), g, device, 1024, numerics=cache_numerics(kv))
    assert memory["weights"] == model.weights.nbytes
    assert memory["total"] == model.footprint.total and memory["fits"]
    assert memory["kv_cache"] == 30 * sum(VALUE_BYTES[t] for t in kv) * 1024 * 192 and memory["fallbacks"] == []
    assert (memory["cache_type_k"], memory["cache_type_v"]) == kv


def test_a_cache_type_cera_lacks_is_refused_by_name():
    """llama.cpp's quantized cache types are Unsupported (exit 5), naming those there are."""
    path = catalogue.fetch("smollm2-135m-instruct")
    out = subprocess.run([sys.executable, "-m", "cera", "info", "-m", str(path), "--no-gpu", "--json",
                          "--cache-type-v", "q4_0"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 5
    assert json.loads(out.stdout)["error"] == {"type": "unsupported",
                                               "message": "V cache type 'q4_0': the KV cache holds f32, f16 or q8_0"}


def test_a_q8_0_cache_needs_whole_blocks_of_a_head(device, tmp_path):
    """q8_0 blocks are 32 values of a head's row: a head_dim of 16 is refused, naming the caches
    that fit; the reference refuses it too."""
    g = GGUFFile.open(write_variant(tmp_path / "m.gguf", "llama_f32"))
    cfg = ModelConfig.from_gguf(g)
    assert cfg.head_dim == 16
    for kv in (("q8_0", "f16"), ("f16", "q8_0")):
        with pytest.raises(Unsupported, match="a q8_0 KV cache needs a head_dim that is a multiple of 32, not 16 "
                                              r"\(use the f32 or f16 cache"):
            footprint(cfg, g, CTX, 32, device.limits, cache_numerics(kv))
    with pytest.raises(Unsupported, match="multiple of 32, not 16"):
        Reference(g, CTX, (np.float16, Q8_0_BLOCK))


def q3_k_m_types(name: str, shape: tuple[int, ...], layer: int | None, n_layers: int) -> str:
    """The type llama.cpp's llama-quantize gives tensor `name` in a Q3_K_M file (its
    llama_tensor_get_type: the tied embedding Q6_K, attn_v Q5_K in the first two layers then
    Q4_K, attn_output Q4_K, ffn_down Q5_K in the first n/16 layers, Q4_K where it spends more
    bits, else Q3_K; the rest Q3_K), then its fallback for rows that are not a multiple of 256
    (Q3_K -> IQ4_NL, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0)."""
    if name == "token_embd.weight":
        t = "Q6_K"
    elif name.endswith("attn_v.weight"):
        t = "Q5_K" if layer < 2 else "Q4_K"
    elif name.endswith("attn_output.weight"):
        t = "Q4_K"
    elif name.endswith("ffn_down.weight"):
        more_bits = layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2
        t = "Q5_K" if layer < n_layers // 16 else "Q4_K" if more_bits else "Q3_K"
    else:
        t = "Q3_K"
    return t if shape[-1] % 256 == 0 else {"Q3_K": "IQ4_NL", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}[t]


def test_a_q3_k_m_smollm2_stays_quantized(device, tmp_path):
    """SmolLM2's header and shapes with the types of a Q3_K_M file (random valid blocks: the
    test is of placement, not text): no tensor falls back to F16, and the GPU holds no more than
    the file's bytes plus the KV cache, 10% over at most."""
    import gguf
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from quantdata import random_rows
    src = catalogue.fetch("smollm2-135m-instruct")
    reader, real = gguf.GGUFReader(src), GGUFFile.open(src)
    cfg = ModelConfig.from_gguf(real)
    path = tmp_path / "smollm2-q3_k_m.gguf"
    writer = gguf.GGUFWriter(path, cfg.arch)
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name != "general.architecture":
            sub = field.types[1] if len(field.types) > 1 else None
            writer.add_key_value(field.name, field.contents(), field.types[0], sub)
    rng, types = np.random.default_rng(0), {}
    for name, info in real.tensors.items():
        layer = int(name.split(".")[1]) if name.startswith("blk.") else None
        if info.type_name == "F32":
            writer.add_tensor(name, np.ones(info.shape, np.float32))
            continue
        types[name] = q3_k_m_types(name, info.shape, layer, cfg.n_layers)
        raw, _ = random_rows(T[types[name]], info.shape[0], info.shape[-1], rng, std=0.02)
        writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=T[types[name]])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert {"IQ4_NL", "Q3_K", "Q4_K", "Q5_0", "Q5_1", "Q8_0"} <= set(types.values())
    g = GGUFFile.open(path)
    model = GpuModel(ModelConfig.from_gguf(g), g, device, ctx=1024, chunk=512)
    assert model.weights.fallbacks == []
    kv = model.footprint.kv_cache
    file_bytes = path.stat().st_size
    print(f"Q3_K_M SmolLM2: file {file_bytes:,} B; weights on the GPU {model.weights.nbytes:,} B; KV {kv:,} B")
    assert model.weights.nbytes + kv <= 1.10 * (file_bytes + kv)
