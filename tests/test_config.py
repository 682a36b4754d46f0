"""ModelConfig from tiny GGUFs of every arch, and each load-time check's message."""
from __future__ import annotations

import math

import gguf
import numpy as np
import pytest

from cera.config import ATTENTION, CONV, FFN_GELU, FFN_SILU, MAX_HEAD_DIM, ROPE_NEOX, ROPE_NORM, ModelConfig
from cera.errors import Unsupported
from cera import weights
from cera.gguf_file import GGUFFile

HIDDEN, FF, HEADS, KV_HEADS, LAYERS, VOCAB = 64, 96, 4, 2, 3, 50


def tiny_model(arch: str, *, head_dim: int | None = None, n_heads=HEADS, n_kv=KV_HEADS,
               meta: dict | None = None, drop=(), extra: dict | None = None, vocab_key=True,
               embd_rows=VOCAB, head_shape=None, conv_layers=(1,), n_layers=LAYERS):
    """(metadata, tensors) of a small model of `arch`; weights are zeros (only shapes matter here).

    meta overrides/extends the `{arch}.` keys (None deletes one); drop removes tensors."""
    hd = head_dim or HIDDEN // n_heads
    md = {"block_count": n_layers, "context_length": 128, "embedding_length": HIDDEN,
          "feed_forward_length": FF, "attention.head_count": n_heads,
          "attention.head_count_kv": n_kv, "rope.freq_base": 10000.0,
          "attention.layer_norm_rms_epsilon": 1e-5}
    if vocab_key:
        md["vocab_size"] = VOCAB
    if head_dim:
        md["attention.key_length"] = md["attention.value_length"] = head_dim
    if arch == "granite":
        md.update({"embedding_scale": 12.0, "residual_scale": 0.22, "attention.scale": 0.0078125,
                   "logit_scale": 8.0})
    is_conv = (lambda i: arch == "lfm2" and i in conv_layers)
    if arch == "lfm2":
        md["shortconv.l_cache"] = 3
        md["attention.head_count_kv"] = [0 if is_conv(i) else n_kv for i in range(n_layers)]
    md.update(meta or {})
    md = {k: v for k, v in md.items() if v is not None}

    z = lambda *shape: np.zeros(shape, np.float32)
    t = {"token_embd.weight": z(embd_rows, HIDDEN),
         ("token_embd_norm.weight" if arch == "lfm2" else "output_norm.weight"): z(HIDDEN)}
    if arch in ("qwen2", "granite"):
        t["output.weight"] = z(*(head_shape or (VOCAB, HIDDEN)))
    for i in range(n_layers):
        b = f"blk.{i}."
        t.update({b + "attn_norm.weight": z(HIDDEN), b + "ffn_norm.weight": z(HIDDEN),
                  b + "ffn_gate.weight": z(FF, HIDDEN), b + "ffn_up.weight": z(FF, HIDDEN),
                  b + "ffn_down.weight": z(HIDDEN, FF)})
        if is_conv(i):
            t.update({b + "shortconv.in_proj.weight": z(3 * HIDDEN, HIDDEN),
                      b + "shortconv.conv.weight": z(HIDDEN, 3),
                      b + "shortconv.out_proj.weight": z(HIDDEN, HIDDEN)})
            continue
        t.update({b + "attn_q.weight": z(n_heads * hd, HIDDEN), b + "attn_k.weight": z(n_kv * hd, HIDDEN),
                  b + "attn_v.weight": z(n_kv * hd, HIDDEN), b + "attn_output.weight": z(HIDDEN, n_heads * hd)})
        if arch == "qwen2":
            t.update({b + "attn_q.bias": z(n_heads * hd), b + "attn_k.bias": z(n_kv * hd),
                      b + "attn_v.bias": z(n_kv * hd)})
        if arch in ("qwen3", "lfm2", "gemma3"):
            t.update({b + "attn_q_norm.weight": z(hd), b + "attn_k_norm.weight": z(hd)})
        if arch in ("gemma2", "gemma3"):
            t.update({b + "post_attention_norm.weight": z(HIDDEN), b + "post_ffw_norm.weight": z(HIDDEN)})
    t.update(extra or {})
    for name in drop:
        del t[name]
    return md, t


def write(path, arch, md, tensors):
    w = gguf.GGUFWriter(str(path), arch)
    for k, v in md.items():
        k = f"{arch}.{k}"
        if isinstance(v, list):
            w.add_array(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        else:
            w.add_uint32(k, v)
    for name, a in tensors.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return GGUFFile.open(path)


def load(tmp_path, arch="llama", **kw):
    md, t = tiny_model(arch, **kw)
    return ModelConfig.from_gguf(write(tmp_path / f"{arch}.gguf", arch, md, t))


def test_llama(tmp_path):
    cfg = load(tmp_path, "llama")
    assert (cfg.arch, cfg.n_layers, cfg.hidden, cfg.ff, cfg.n_heads) == ("llama", LAYERS, HIDDEN, FF, HEADS)
    assert cfg.n_kv_heads == (KV_HEADS,) * LAYERS and cfg.kv_dim(0) == KV_HEADS * 16
    assert cfg.head_dim == 16 and cfg.n_rot == 16 and cfg.q_dim == HIDDEN
    assert cfg.rope_layout == ROPE_NORM and not cfg.rope_neox and cfg.rope_theta == 10000.0
    assert cfg.tied_embeddings and cfg.lm_head == "token_embd.weight" and cfg.final_norm == "output_norm.weight"
    assert not (cfg.qkv_bias or cfg.qk_norm or cfg.rope_freq_factors)
    assert cfg.block_kinds == (ATTENTION,) * LAYERS and cfg.conv_layers == () and cfg.conv_kernel == 0
    assert math.isclose(cfg.attention_scale, 0.25)
    assert (cfg.embedding_scale, cfg.residual_scale, cfg.logit_scale) == (1.0, 1.0, 1.0)
    assert cfg.ffn_act == FFN_SILU and not cfg.post_norms
    assert cfg.sliding_window == 0 and cfg.layer_window == (0,) * LAYERS and cfg.local_layers == ()
    assert cfg.layer_rope_theta == (10000.0,) * LAYERS and cfg.layer_rope_freq_scale == (1.0,) * LAYERS
    assert cfg.vocab_size == VOCAB and cfg.context_length == 128 and math.isclose(cfg.eps, 1e-5, rel_tol=1e-6)


def test_llama3_freq_factors(tmp_path):
    cfg = load(tmp_path, "llama", extra={"rope_freqs.weight": np.ones(8, np.float32)})
    assert cfg.rope_freq_factors


def test_qwen2(tmp_path):
    cfg = load(tmp_path, "qwen2")
    assert cfg.rope_layout == ROPE_NEOX and cfg.qkv_bias and not cfg.qk_norm
    assert not cfg.tied_embeddings and cfg.lm_head == "output.weight"


def test_qwen3_key_length(tmp_path):
    cfg = load(tmp_path, "qwen3", head_dim=32)
    assert cfg.head_dim == 32 and cfg.n_rot == 32 and cfg.q_dim == HEADS * 32
    assert cfg.rope_neox and cfg.qk_norm and not cfg.qkv_bias
    assert math.isclose(cfg.attention_scale, 1 / math.sqrt(32))


def test_granite_scalars(tmp_path):
    cfg = load(tmp_path, "granite")
    assert cfg.rope_layout == ROPE_NORM
    assert (cfg.embedding_scale, cfg.logit_scale) == (12.0, 8.0)
    assert math.isclose(cfg.residual_scale, 0.22, rel_tol=1e-6)
    assert cfg.attention_scale == 0.0078125


def test_lfm2_hybrid(tmp_path):
    cfg = load(tmp_path, "lfm2")
    assert cfg.block_kinds == (ATTENTION, CONV, ATTENTION)
    assert cfg.n_kv_heads == (KV_HEADS, 0, KV_HEADS) and cfg.kv_dim(1) == 0
    assert cfg.attention_layers == (0, 2) and cfg.conv_layers == (1,) and cfg.conv_kernel == 3
    assert cfg.rope_neox and cfg.qk_norm and cfg.tied_embeddings
    assert cfg.final_norm == "token_embd_norm.weight"


GEMMA3 = {"attention.sliding_window": 8, "rope.freq_base": 1e6}


def test_gemma3(tmp_path):
    """Fixed by arch as llama.cpp's gemma3 loader does: GeGLU, post-norms, QK-norm, NEOX RoPE,
    embeddings times sqrt(hidden), attention scale 1/sqrt(key_length); local layers are all but
    every sliding_window_pattern-th (default 6) and use RoPE base 10000."""
    cfg = load(tmp_path, "gemma3", head_dim=32, meta={**GEMMA3, "attention.scale": 0.5})
    assert cfg.ffn_act == FFN_GELU and cfg.post_norms and cfg.qk_norm and cfg.rope_neox
    assert cfg.embedding_scale == math.sqrt(HIDDEN) and cfg.attention_scale == 1 / math.sqrt(32)
    assert cfg.sliding_window == 8 and cfg.layer_window == (8, 8, 8)         # 3 layers < pattern 6
    assert cfg.layer_rope_theta == (10000.0,) * 3 and cfg.rope_theta == 1e6
    assert "blk.2.post_ffw_norm.weight" in cfg.all_tensors()


@pytest.mark.parametrize("pattern,local", [(2, (0, 2)), (3, (0, 1)), (0, (0, 1, 2)),
                                           ([False, True, True], (1, 2))])
def test_gemma3_layer_pattern(tmp_path, pattern, local):
    cfg = load(tmp_path, "gemma3", meta={**GEMMA3, "attention.sliding_window_pattern": pattern,
                                         "rope.freq_base_swa": 5000.0,
                                         "rope.scaling.type": "linear", "rope.scaling.factor": 4.0})
    assert cfg.local_layers == local
    assert cfg.layer_window == tuple(8 if i in local else 0 for i in range(LAYERS))
    assert cfg.layer_rope_theta == tuple(5000.0 if i in local else 1e6 for i in range(LAYERS))
    # linear scaling stretches the global layers' positions only
    assert cfg.layer_rope_freq_scale == tuple(1.0 if i in local else 0.25 for i in range(LAYERS))


def test_gemma3_without_sliding_window_is_all_global(tmp_path):
    cfg = load(tmp_path, "gemma3", meta={"rope.freq_base": 1e6, "attention.sliding_window_pattern": 2})
    assert cfg.layer_window == (0,) * LAYERS and cfg.layer_rope_theta == (1e6,) * LAYERS


def test_gemma3_refusals(tmp_path):
    with pytest.raises(ValueError, match="tensor blk.0.post_attention_norm.weight missing"):
        load(tmp_path, "gemma3", meta=GEMMA3, drop=["blk.0.post_attention_norm.weight"])
    with pytest.raises(ValueError, match="sliding_window_pattern has 2 entries for 3 layers"):
        load(tmp_path, "gemma3", meta={**GEMMA3, "attention.sliding_window_pattern": [True, False]})
    with pytest.raises(Unsupported, match="final_logit_softcapping"):
        load(tmp_path, "gemma3", meta={**GEMMA3, "final_logit_softcapping": 30.0})


GEMMA2 = {"attention.sliding_window": 8, "attn_logit_softcapping": 20.0, "final_logit_softcapping": 15.0}


def test_gemma2(tmp_path):
    """Fixed by arch as llama.cpp's gemma2 loader does: GeGLU, post-norms, no QK-norm, NEOX RoPE,
    embeddings times sqrt(hidden), attention scale 1/sqrt(key_length) (attention.scale not read);
    even layers local, odd global (the pattern key is not read), every layer on the one RoPE base
    and linear scaling; the soft-caps as the file says."""
    cfg = load(tmp_path, "gemma2", head_dim=32, meta={**GEMMA2, "attention.scale": 0.5, "rope.freq_base_swa": 5000.0,
                                                       "attention.sliding_window_pattern": 3,
                                                       "rope.scaling.type": "linear", "rope.scaling.factor": 4.0})
    assert cfg.ffn_act == FFN_GELU and cfg.post_norms and not cfg.qk_norm and cfg.rope_neox and cfg.tied_embeddings
    assert cfg.embedding_scale == math.sqrt(HIDDEN) and cfg.attention_scale == 1 / math.sqrt(32)
    assert cfg.sliding_window == 8 and cfg.layer_window == (8, 0, 8) and cfg.local_layers == (0, 2)
    assert cfg.layer_rope_theta == (10000.0,) * 3 and cfg.layer_rope_freq_scale == (0.25,) * 3
    assert (cfg.attn_softcap, cfg.final_softcap) == (20.0, 15.0)
    assert "blk.2.post_ffw_norm.weight" in cfg.all_tensors() and "blk.0.attn_q_norm.weight" not in cfg.all_tensors()


def test_gemma2_defaults(tmp_path):
    """Without the keys, llama.cpp's gemma2 defaults: window 4096 (llama-model.cpp), soft-caps 50
    and 30 (llama_hparams); no arch but gemma2 soft-caps."""
    cfg = load(tmp_path, "gemma2")
    assert cfg.layer_window == (4096, 0, 4096) and (cfg.attn_softcap, cfg.final_softcap) == (50.0, 30.0)
    assert load(tmp_path, "gemma3", meta=GEMMA3).attn_softcap == 0.0 == load(tmp_path, "llama").final_softcap


@pytest.mark.parametrize("arch,n_layers", [("gemma2", 46), ("gemma3", 62)])
def test_gemma_27b_scales_queries_by_hidden_per_head(tmp_path, arch, n_layers):
    """gemma_pytorch's query_pre_attn_scalar, as llama.cpp reads it: hidden/n_heads for the 27B
    models (by their layer count), not key_length."""
    cfg = load(tmp_path, arch, head_dim=32, n_layers=n_layers, meta=GEMMA2 if arch == "gemma2" else GEMMA3)
    assert cfg.attention_scale == 1 / math.sqrt(HIDDEN // HEADS)


def test_gemma2_refusals(tmp_path):
    with pytest.raises(ValueError, match="tensor blk.1.post_ffw_norm.weight missing"):
        load(tmp_path, "gemma2", meta=GEMMA2, drop=["blk.1.post_ffw_norm.weight"])
    with pytest.raises(ValueError, match="a soft-cap must be positive"):
        load(tmp_path, "gemma2", meta={**GEMMA2, "final_logit_softcapping": 0.0})
    with pytest.raises(ValueError, match="attention.sliding_window is 0: must be at least 1"):
        load(tmp_path, "gemma2", meta={**GEMMA2, "attention.sliding_window": 0})


def test_vocab_falls_back_to_embedding_rows(tmp_path):
    assert load(tmp_path, "llama", vocab_key=False, embd_rows=70).vocab_size == 70


def test_context_caps_request(tmp_path):
    cfg = load(tmp_path)
    assert cfg.context(64) == 64 and cfg.context(4096) == 128 and cfg.context() == 128
    with pytest.raises(ValueError, match="must be positive"):
        cfg.context(0)


def test_token_ids_checked(tmp_path):
    cfg = load(tmp_path)
    cfg.check_tokens([0, VOCAB - 1])
    with pytest.raises(ValueError, match=f"token id {VOCAB} out of range: vocab_size is {VOCAB}"):
        cfg.check_tokens([1, VOCAB])


def test_unknown_arch(tmp_path):
    md, t = tiny_model("llama")
    g = write(tmp_path / "gpt2.gguf", "gpt2", md, t)
    with pytest.raises(ValueError, match=r"unsupported architecture 'gpt2': cera runs llama, qwen2, qwen3, granite, lfm2, gemma2, gemma3"):
        ModelConfig.from_gguf(g)


@pytest.mark.parametrize("n_kv", [3, 0])
def test_heads_not_multiple_of_kv_heads(tmp_path, n_kv):
    with pytest.raises(ValueError, match=f"head_count {HEADS} is not a positive multiple of head_count_kv {n_kv}"):
        load(tmp_path, n_kv=n_kv)


def test_lm_head_k_mismatch(tmp_path):
    with pytest.raises(ValueError, match=f"LM head output.weight has k = 32, expected hidden_size {HIDDEN}"):
        load(tmp_path, "qwen2", head_shape=(VOCAB, 32))


def test_lm_head_too_few_rows(tmp_path):
    with pytest.raises(ValueError, match=f"LM head output.weight has 40 rows, fewer than vocab_size {VOCAB}"):
        load(tmp_path, "granite", head_shape=(40, HIDDEN))


def test_head_dim_over_kernel_max(tmp_path):
    with pytest.raises(ValueError, match=f"head_dim 512 exceeds the attention kernels' maximum {MAX_HEAD_DIM}"):
        load(tmp_path, "qwen3", head_dim=512)


@pytest.mark.parametrize("arch,name", [("llama", "blk.2.ffn_up.weight"), ("llama", "output_norm.weight"),
                                       ("qwen2", "blk.1.attn_k.bias"), ("qwen3", "blk.0.attn_k_norm.weight"),
                                       ("lfm2", "blk.1.shortconv.conv.weight"), ("llama", "blk.1.attn_q.weight")])
def test_missing_tensor_named(tmp_path, arch, name):
    with pytest.raises(ValueError, match=f"tensor {name} missing"):
        load(tmp_path, arch, drop=[name])


def test_wrong_tensor_shape_named(tmp_path):
    with pytest.raises(ValueError, match=r"tensor blk.1.ffn_down.weight has shape \(64, 32\), expected \(64, 96\)"):
        load(tmp_path, extra={"blk.1.ffn_down.weight": np.zeros((HIDDEN, 32), np.float32)})


def test_missing_key_named(tmp_path):
    with pytest.raises(ValueError, match="GGUF metadata key llama.attention.layer_norm_rms_epsilon missing"):
        load(tmp_path, meta={"attention.layer_norm_rms_epsilon": None})


def test_lfm2_kv_heads_must_match_block_kind(tmp_path):
    with pytest.raises(ValueError, match="layer 1 is a short-conv block but head_count_kv is 2"):
        load(tmp_path, "lfm2", meta={"attention.head_count_kv": [KV_HEADS] * LAYERS})


def test_unsupported_rope_scaling(tmp_path):
    md, t = tiny_model("llama")
    w = gguf.GGUFWriter(str(tmp_path / "yarn.gguf"), "llama")
    for k, v in md.items():
        (w.add_float32 if isinstance(v, float) else w.add_uint32)(f"llama.{k}", v)
    w.add_string("llama.rope.scaling.type", "yarn")
    w.add_float32("llama.rope.scaling.factor", 4.0)
    for name, a in t.items():
        w.add_tensor(name, a)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(ValueError, match="rope scaling 'yarn' \\(factor 4.0\\) is not supported"):
        ModelConfig.from_gguf(GGUFFile.open(tmp_path / "yarn.gguf"))


def phi3_model(meta: dict | None = None, qkv_rows: int | None = None, up_rows: int = 2 * FF):
    """(metadata, tensors) of a small phi3: q, k, v fused into attn_qkv and gate, up into ffn_up as
    llama.cpp's converter writes them, with distinct values (so a misplaced view shows), and
    LongRoPE's long and short factors."""
    md, t = tiny_model("phi3", meta={"attention.sliding_window": 8, "rope.scaling.original_context_length": 256,
                                     "rope.scaling.attn_factor": 1.19, **(meta or {})})
    t["output.weight"] = np.zeros((VOCAB, HIDDEN), np.float32)
    rng = np.random.default_rng(0)
    for i in range(LAYERS):
        b = f"blk.{i}."
        qkv = np.concatenate([t.pop(b + f"attn_{p}.weight") for p in "qkv"])
        t[b + "attn_qkv.weight"] = rng.standard_normal((qkv_rows or qkv.shape[0], HIDDEN)).astype(np.float32)
        del t[b + "ffn_gate.weight"]
        t[b + "ffn_up.weight"] = rng.standard_normal((up_rows, HIDDEN)).astype(np.float32)
    t["rope_factors_long.weight"] = np.full(8, 4.0, np.float32)
    t["rope_factors_short.weight"] = np.full(8, 1.5, np.float32)
    return md, t


def test_phi3(tmp_path):
    """llama.cpp's phi3: NEOX RoPE, an untied head; attn_qkv read as q, k, v (rows q_dim, kv_dim,
    kv_dim: build_qkv's views) and ffn_up's 2*ff rows as gate then up (ggml_swiglu's halves), views
    of the file's bytes; the sliding window switched off (load_arch_hparams); LongRoPE's long
    factors where llama.cpp's n_ctx, padded to a multiple of 256, exceeds the original context."""
    md, t = phi3_model()
    g = write(tmp_path / "phi3.gguf", "phi3", md, t)
    cfg = ModelConfig.from_gguf(g)
    assert cfg.rope_neox and not cfg.tied_embeddings and cfg.q_dim == HIDDEN and cfg.kv_dim(0) == KV_HEADS * 16
    assert cfg.layer_window == (0,) * LAYERS and cfg.ffn_act == FFN_SILU and not cfg.qkv_bias
    assert math.isclose(cfg.rope_attn_factor, 1.19, rel_tol=1e-6) and cfg.rope_original_context == 256
    assert "blk.0.attn_qkv.weight" not in g.tensors and g.fused["blk.1.attn_qkv.weight"] == tuple(
        f"blk.1.attn_{p}.weight" for p in "qkv")
    qkv, up = t["blk.1.attn_qkv.weight"], t["blk.1.ffn_up.weight"]
    q, kv = HIDDEN, KV_HEADS * 16
    parts = {"attn_q": qkv[:q], "attn_k": qkv[q:q + kv], "attn_v": qkv[q + kv:], "ffn_gate": up[:FF], "ffn_up": up[FF:]}
    for name, want in parts.items():
        assert np.array_equal(weights.tensor(g, f"blk.1.{name}.weight"), want), name
    assert [cfg.rope_factors(n) for n in (64, 256, 257, 4096)] == [
        "rope_factors_short.weight", "rope_factors_short.weight", "rope_factors_long.weight", "rope_factors_long.weight"]
    padded = ModelConfig.from_gguf(write(tmp_path / "p.gguf", "phi3", *phi3_model({
        "rope.scaling.original_context_length": 300})))
    assert padded.rope_factors(290) == "rope_factors_long.weight"   # llama.cpp pads 290 to 512 > 300


def test_phi3_without_attn_factor_or_original_context(tmp_path):
    """rope.scaling.attn_factor defaults to 1, the original context to context_length (llama.cpp's
    n_ctx_orig_yarn = n_ctx_train)."""
    md, t = phi3_model({"rope.scaling.attn_factor": None, "rope.scaling.original_context_length": None})
    cfg = ModelConfig.from_gguf(write(tmp_path / "phi3.gguf", "phi3", md, t))
    assert cfg.rope_attn_factor == 1.0 and cfg.rope_original_context == 128
    assert cfg.rope_factors(128) == "rope_factors_long.weight"   # padded to 256 > 128


def test_phi3_refusals(tmp_path):
    with pytest.raises(ValueError, match=r"tensor blk.0.attn_qkv.weight has shape \(100, 64\): its rows are not q, k, v"):
        ModelConfig.from_gguf(write(tmp_path / "a.gguf", "phi3", *phi3_model(qkv_rows=100)))
    with pytest.raises(ValueError, match=r"tensor blk.0.ffn_up.weight has shape \(96, 64\): phi3 fuses gate and up"):
        ModelConfig.from_gguf(write(tmp_path / "b.gguf", "phi3", *phi3_model(up_rows=FF)))
