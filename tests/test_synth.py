"""The synthetic models: synth.py still writes, byte for byte, the files the llama.cpp goldens
were made from, and cera's GGUF reader sees in them what each arch needs."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants

from cera.gguf_file import GGUFFile
from synth import (BOS_ID, EOS_ID, VARIANTS, VOCAB_SIZE, config_for, random_blocks, sha256_file,
                   tokenizer_vocab, write_model, write_variant)

GOLDEN = Path(__file__).parent / "data" / "golden"


def golden(name: str) -> dict:
    return json.loads((GOLDEN / f"synth_{name}.json").read_text(encoding="utf-8"))


def test_every_variant_has_a_golden():
    have = {p.stem.removeprefix("synth_") for p in GOLDEN.glob("synth_*.json")}
    assert have == set(VARIANTS)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_matches_golden(name, tmp_path):
    g = golden(name)
    args = g["write_model"]
    path = write_model(tmp_path / f"{name}.gguf", args["arch"], wtype=args["wtype"], seed=args["seed"],
                       **args["overrides"])
    assert sha256_file(path) == g["sha256"], f"synth.py no longer writes the file synth_{name}.json was made from"
    assert path.stat().st_size == g["file_size"]

    f = GGUFFile.open(path)
    cfg = config_for(args["arch"], wtype=args["wtype"], seed=args["seed"], **args["overrides"])
    a, md = cfg.arch, f.metadata
    assert f.arch == a
    assert md[f"{a}.block_count"] == cfg.n_layers
    assert md[f"{a}.embedding_length"] == cfg.hidden
    assert md[f"{a}.attention.head_count"] == cfg.n_heads
    assert md[f"{a}.vocab_size"] == VOCAB_SIZE == len(md["tokenizer.ggml.tokens"])
    assert md["tokenizer.ggml.bos_token_id"] == BOS_ID and md["tokenizer.ggml.eos_token_id"] == EOS_ID
    assert md["tokenizer.ggml.add_bos_token"] is True
    assert {t.name: t.type_name for t in f.tensors.values()} == g["tensor_types"]

    # shapes in numpy order (rows, cols)
    assert f.tensors["token_embd.weight"].shape == (VOCAB_SIZE, cfg.hidden)
    assert ("output.weight" in f.tensors) == (not cfg.tied)
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        if a == "lfm2" and cfg.layer_types[i] == "conv":
            assert f.tensors[p + "shortconv.conv.weight"].shape == (cfg.hidden, cfg.l_cache)
            assert f.tensors[p + "shortconv.in_proj.weight"].shape == (3 * cfg.hidden, cfg.hidden)
            assert f.tensors[p + "shortconv.out_proj.weight"].shape == (cfg.hidden, cfg.hidden)
            assert p + "attn_q.weight" not in f.tensors
            continue
        assert f.tensors[p + "attn_q.weight"].shape == (cfg.n_heads * cfg.head_dim, cfg.hidden)
        assert f.tensors[p + "attn_k.weight"].shape == (cfg.n_kv_heads * cfg.head_dim, cfg.hidden)
        assert f.tensors[p + "attn_output.weight"].shape == (cfg.hidden, cfg.n_heads * cfg.head_dim)
        assert (p + "attn_q.bias" in f.tensors) == (a == "qwen2")
        assert (p + "attn_q_norm.weight" in f.tensors) == (a in ("qwen3", "lfm2", "gemma3"))
        assert (p + "post_attention_norm.weight" in f.tensors) == (p + "post_ffw_norm.weight" in f.tensors) \
            == (a in ("gemma2", "gemma3"))
        assert f.tensors[p + "ffn_down.weight"].shape == (cfg.hidden, cfg.ff)

    if a in ("qwen3", "gemma2", "gemma3"):   # head_dim decoupled from hidden / n_heads
        assert md[f"{a}.attention.key_length"] == cfg.head_dim != cfg.hidden // cfg.n_heads
    if a in ("qwen3", "gemma3"):
        assert f.tensors["blk.0.attn_q_norm.weight"].shape == (cfg.head_dim,)
    if a == "granite":
        for key in ("embedding_scale", "residual_scale", "attention.scale", "logit_scale"):
            assert md[f"granite.{key}"] not in (0.0, 1.0)
    if a == "lfm2":
        assert md["lfm2.attention.head_count_kv"] == [cfg.n_kv_heads if t == "attn" else 0
                                                      for t in cfg.layer_types]
        assert md["lfm2.shortconv.l_cache"] == cfg.l_cache
        assert "token_embd_norm.weight" in f.tensors and "output_norm.weight" not in f.tensors
    if a == "gemma3":   # local layers with a window shorter than the golden sequences
        assert md["gemma3.attention.sliding_window"] == cfg.sliding_window < 8
        assert md["gemma3.attention.sliding_window_pattern"] == cfg.swa_pattern < cfg.n_layers
    if a == "gemma2":   # a window shorter than the golden sequences; soft-caps that bite (not 50, 30)
        assert md["gemma2.attention.sliding_window"] == cfg.sliding_window < 8
        assert "gemma2.attention.sliding_window_pattern" not in md
        assert md["gemma2.attn_logit_softcapping"] == cfg.attn_softcap < 50
        assert md["gemma2.final_logit_softcapping"] == cfg.final_softcap < 30
    if cfg.rope_freqs:
        factors = np.frombuffer(f.read("rope_freqs.weight"), np.float32)
        assert factors.shape == (cfg.head_dim // 2,) and factors.min() == 1.0 and factors.max() == 8.0


def test_write_is_deterministic_and_seed_matters(tmp_path):
    a = write_variant(tmp_path / "a.gguf", "lfm2_q8_0")
    b = write_variant(tmp_path / "b.gguf", "lfm2_q8_0")
    c = write_model(tmp_path / "c.gguf", "lfm2", wtype="q8_0", seed=1)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown synthetic arch"):
        write_model(tmp_path / "x.gguf", "gpt2")
    with pytest.raises(ValueError, match="unknown override"):
        write_model(tmp_path / "x.gguf", "llama", hiden=64)
    with pytest.raises(ValueError, match="block size"):
        write_model(tmp_path / "x.gguf", "llama", wtype="q4_k", hidden=64)


def test_tokenizer_vocab_is_gpt2_byte_level():
    tokens, types, merges = tokenizer_vocab()
    assert len(tokens) == len(types) == VOCAB_SIZE and len(set(tokens)) == VOCAB_SIZE
    assert tokens[:3] == ["!", '"', "#"] and tokens[188] == "Ā"   # GPT-2's first ids; byte 0 -> id 188
    for m in merges:
        left, right = m.split(" ")
        assert left + right in tokens


@pytest.mark.parametrize("qtype", [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S,
                                   T.IQ3_XXS, T.IQ3_S, T.IQ4_NL, T.IQ4_XS])
def test_random_blocks_have_the_asked_spread(qtype):
    raw = random_blocks(np.random.default_rng(0), 32, 512, qtype, std=0.1)
    values = quants.dequantize(raw, qtype)
    assert values.shape == (32, 512) and np.isfinite(values).all()
    assert 0.08 < values.std() < 0.12 and abs(values.mean()) < 0.02
