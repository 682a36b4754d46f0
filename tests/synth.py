"""Deterministic tiny GGUF models of every arch cera runs, for tests and llama.cpp goldens.

    write_model(path, "qwen3", wtype="q4_0", seed=0)       # -> path
    write_lora(path, "llama_f32", targets=("blk.0.attn_*",), rank=12, alpha=24.0)   # an adapter for a variant

The same arguments give a byte-identical file (the golden JSONs record each file's
sha256 and the exact arguments). Weights are random with scales that give
non-degenerate logits; 1-D norm weights are F32 near 1; biases, rope factors and
LFM2's depthwise conv kernel stay F32 whatever `wtype` says.

`wtype`: a ggml type name for every 2-D weight (f32, f16, bf16, q8_0, q4_0, q4_1,
q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq4_nl,
iq4_xs) or the preset `q4_k_m` (Q4_K, with Q6_K for the output head and for attn_v /
ffn_down of even layers, as llama-quantize mixes it). gguf-py cannot quantize K-quants or
i-quants: those tensors are random *valid* blocks (random scales and quants, fp16
super-block scales picked for the wanted spread). Types of 256-element blocks need rows
that are multiples of 256, so such a `wtype` switches the defaults to hidden 256,
head_dim 64 (qwen3, gemma2, gemma3: key_length 128), ff 512.

Overrides (keyword arguments, all optional): n_layers, hidden, n_heads, n_kv_heads,
head_dim, ff, context, rms_eps, rope_base, tied (no output.weight), rope_freqs
(Llama-3 frequency factors), qkv_bias, write_vocab_size, embedding_scale,
residual_scale, attention_scale, logit_scale (granite), layer_types
("conv"/"attn" per layer) and l_cache (lfm2), sliding_window and swa_pattern
(gemma2, gemma3: local layers attend to the last sliding_window positions; gemma3: every
swa_pattern-th layer is global; gemma2: the odd layers), attn_softcap and final_softcap
(gemma2's attn_logit_softcapping and final_logit_softcapping), tensor_types ({glob: type
name} applied after wtype, e.g. {"token_embd.weight": "q8_0"}).

phi3 writes q, k, v as one attn_qkv.weight and gate, up as one ffn_up.weight (2*ff rows, gate
first), as llama.cpp's converter does, with LongRoPE's rope_factors_long / _short.weight;
overrides rope_original_context (rope.scaling.original_context_length: llama.cpp uses the long
factors where its padded n_ctx exceeds it), rope_attn_factor (rope.scaling.attn_factor) and
n_rot (rope.dimension_count, 0: head_dim; Phi-4-mini rotates 3/4 of each head).

gemma2 / gemma3 norms are written as the GGUF stores them (llama.cpp's converter has already added
Gemma's +1), near 1 like every other arch's.
"""
from __future__ import annotations

import fnmatch
import os
import zlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

from cera.catalogue import sha256_file  # noqa: F401  (re-exported for the tests)

ARCHS = ("llama", "qwen2", "qwen3", "granite", "lfm2", "gemma2", "gemma3", "phi3")
ARCHS += ("nomic-bert", "bert")   # encoders (ENCODER_VARIANTS): a WordPiece vocabulary, no LM head
GEMMA = ("gemma2", "gemma3")   # post-norms, GeGLU, embeddings times sqrt(hidden)
SUPER_BLOCK_WTYPES = {"q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q4_k_m", "iq2_xxs", "iq2_xs", "iq2_s",
                      "iq3_xxs", "iq3_s", "iq4_xs"}   # 256-element blocks
FILE_TYPES = {  # wtype -> general.file_type (llama_ftype)
    "f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_k": 10,
    "q3_k": 11, "q4_k": 14, "q4_k_m": 15, "q5_k": 16, "q6_k": 18, "iq2_xxs": 19, "iq2_xs": 20,
    "iq3_xxs": 23, "iq4_nl": 25, "iq3_s": 26, "iq2_s": 28, "iq4_xs": 30, "bf16": 32,
}
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class SynthConfig:
    arch: str
    wtype: str = "f32"
    seed: int = 0
    n_layers: int = 2
    hidden: int = 64
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16            # written as attention.key_length/value_length when != hidden/n_heads
    ff: int = 128
    context: int = 256
    rms_eps: float = 1e-5
    rope_base: float = 10000.0
    tied: bool = True             # no output.weight: the LM head is token_embd
    rope_freqs: bool = False      # Llama-3 rope_freqs.weight
    qkv_bias: bool = False
    qk_norm: bool = False
    write_vocab_size: bool = True
    chat_template: str = CHATML_TEMPLATE
    embedding_scale: float = 0.0  # granite scalars (0 = not written)
    residual_scale: float = 0.0
    attention_scale: float = 0.0
    logit_scale: float = 0.0
    layer_types: tuple = ()       # lfm2: "conv" / "attn" per layer
    l_cache: int = 3              # lfm2 conv kernel width (state keeps l_cache-1 rows)
    sliding_window: int = 0       # gemma2, gemma3: the local layers' window (0 = not written)
    swa_pattern: int = 0          # gemma3: every swa_pattern-th layer is global (0 = not written)
    attn_softcap: float = 0.0     # gemma2: attn_logit_softcapping (0 = not written)
    final_softcap: float = 0.0    # gemma2: final_logit_softcapping (0 = not written)
    rope_original_context: int = 0    # phi3: rope.scaling.original_context_length (0 = not written)
    rope_attn_factor: float = 0.0     # phi3: rope.scaling.attn_factor (0 = not written)
    n_rot: int = 0                    # rope.dimension_count (0: head_dim)
    tensor_types: dict = field(default_factory=dict)

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim


ARCH_DEFAULTS = {
    "llama": dict(ff=160, tied=False),
    "qwen2": dict(ff=128, tied=False, qkv_bias=True, rms_eps=1e-6),
    "qwen3": dict(ff=160, head_dim=32, qk_norm=True, rms_eps=1e-6),
    "granite": dict(ff=128, tied=False, embedding_scale=12.0, residual_scale=0.22,
                    attention_scale=0.15, logit_scale=3.0),
    "lfm2": dict(n_layers=4, ff=160, layer_types=("conv", "attn", "conv", "attn"),
                 rope_base=1000000.0, qk_norm=True),
    # layers 0 and 2 local with a window of 6 (shorter than the golden sequences), 1 and 3
    # global; one KV head and head_dim != hidden/n_heads, as in Gemma-3-270M
    # layers 0 and 2 local with a window of 6, 1 and 3 global, on one RoPE base (not 10000, so
    # that a local layer on gemma3's local base would show); soft-caps far below Gemma 2's 50 and
    # 30, as the synthetic scores (~N(0, 1)) and logits (~N(0, 3)) are far smaller: both bite
    "gemma2": dict(n_layers=4, ff=128, head_dim=32, rms_eps=1e-6, rope_base=1000000.0, sliding_window=6,
                   attn_softcap=1.5, final_softcap=5.0),
    "gemma3": dict(n_layers=4, ff=128, n_kv_heads=1, head_dim=32, qk_norm=True, rms_eps=1e-6,
                   rope_base=1000000.0, sliding_window=6, swa_pattern=2),
    # Phi-3.5-mini's shape in small: untied, fused q|k|v and gate|up, LongRoPE factors that differ
    # from 1 (the long ones chosen: llama.cpp's padded n_ctx of 256 exceeds the original 128) and
    # its attention factor; a sliding window of 6 that llama.cpp reads and switches off
    "phi3": dict(ff=160, tied=False, rope_original_context=128, rope_attn_factor=1.19, sliding_window=6),
}
# encoders: every head its own KV head, LayerNorm eps as the real ones; nomic-bert: fused QKV,
# SwiGLU, NEOX RoPE, no biases, mean pooling; bert: learned positions, biases, GELU, CLS pooling
ARCH_DEFAULTS.update({
    "nomic-bert": dict(n_kv_heads=4, rms_eps=1e-12, rope_base=1000.0),
    "bert": dict(n_kv_heads=4, rms_eps=1e-12, context=64),
})
ENCODERS = ("nomic-bert", "bert")
SUPER_BLOCK_DEFAULTS = dict(hidden=256, head_dim=64, ff=512)
OUT_GAIN = 4.0  # std of projections back into the residual, times 1/sqrt(fan_in)


def config_for(arch: str, *, wtype: str = "f32", seed: int = 0, **overrides) -> SynthConfig:
    """The full configuration write_model uses for these arguments."""
    if arch not in ARCHS:
        raise ValueError(f"unknown synthetic arch {arch!r} (have {', '.join(ARCHS)})")
    wtype = wtype.lower()
    if wtype not in FILE_TYPES:
        raise ValueError(f"unknown wtype {wtype!r} (have {', '.join(FILE_TYPES)})")
    unknown = set(overrides) - (set(SynthConfig.__dataclass_fields__) - {"arch", "wtype", "seed"})
    if unknown:
        raise ValueError(f"unknown override(s) {sorted(unknown)}")
    params = dict(ARCH_DEFAULTS[arch])
    if wtype in SUPER_BLOCK_WTYPES:
        params.update(SUPER_BLOCK_DEFAULTS)
        if arch in ("qwen3", "gemma2", "gemma3"):
            params["head_dim"] = 128
    params.update(overrides)
    if "layer_types" in params:
        params["layer_types"] = tuple(params["layer_types"])
        if arch == "lfm2" and "n_layers" not in overrides:
            params["n_layers"] = len(params["layer_types"])
    cfg = SynthConfig(arch=arch, wtype=wtype, seed=seed, **params)
    if arch == "lfm2" and len(cfg.layer_types) != cfg.n_layers:
        raise ValueError(f"lfm2 layer_types has {len(cfg.layer_types)} entries for {cfg.n_layers} layers")
    if cfg.n_heads % cfg.n_kv_heads:
        raise ValueError(f"n_heads {cfg.n_heads} is not a multiple of n_kv_heads {cfg.n_kv_heads}")
    return cfg


# ---- tokenizer: GPT-2 byte-level BPE, tiny ----

def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> symbol table, in GPT-2's vocabulary order (printable bytes first)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


# (left, right) in rank order; every part is a byte symbol or an earlier merge
MERGES = [
    ("Ġ", "t"), ("h", "e"), ("Ġ", "a"), ("i", "n"), ("Ġt", "he"), ("e", "r"), ("o", "n"),
    ("r", "e"), ("Ġ", "s"), ("a", "t"), ("e", "n"), ("Ġ", "o"), ("Ġ", "w"), ("o", "r"),
    ("i", "s"), ("e", "s"), ("a", "n"), ("Ġ", "c"), ("i", "t"), ("Ġ", "b"), ("a", "r"),
    ("Ġ", "f"), ("Ġ", "p"), ("n", "d"), ("in", "g"), ("Ġa", "nd"), ("Ġo", "f"), ("Ġ", "i"),
    ("Ġ", "in"), ("Ġt", "o"), ("e", "d"), ("Ġ", "m"), ("o", "u"), ("Ġ", "d"), ("l", "e"),
    ("Ġi", "s"), ("Ġ", "Ġ"), ("ĠĠ", "ĠĠ"), ("Ċ", "Ċ"), ("d", "e"), ("de", "f"), ("(", ")"),
    ("Ġ", "1"), ("0", "0"), ("Ġ", "T"), ("ĠT", "he"), ("Ġ", "l"), ("l", "l"),
]
SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]


def tokenizer_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token_types, merges) of the synthetic vocabulary (gguf token types)."""
    tokens = _bytes_to_unicode()
    for left, right in MERGES:
        assert left in tokens and right in tokens, (left, right)
        assert left + right not in tokens, left + right
        tokens.append(left + right)
    types = [int(gguf.TokenType.NORMAL)] * len(tokens) + [int(gguf.TokenType.CONTROL)] * len(SPECIAL_TOKENS)
    tokens += SPECIAL_TOKENS
    return tokens, types, [f"{a} {b}" for a, b in MERGES]


VOCAB_SIZE = 256 + len(MERGES) + len(SPECIAL_TOKENS)
BOS_ID = 256 + len(MERGES)
EOS_ID = BOS_ID + 1
PAD_ID = BOS_ID + 2


# ---- random weights ----

def _rng(cfg: SynthConfig, name: str) -> np.random.Generator:
    """One generator per tensor, so adding a tensor never changes another's values."""
    return np.random.default_rng([cfg.seed, zlib.crc32(name.encode())])


def _normal(cfg, name, shape, std) -> np.ndarray:
    return (_rng(cfg, name).standard_normal(shape) * std).astype(np.float32)


def _near_one(cfg, name, n) -> np.ndarray:
    return (1.0 + _rng(cfg, name).standard_normal(n) * 0.1).astype(np.float32)


# std of one dequantized value for unit super-block scale d (dmin as set below), sc, m, q
# uniform: Q2_K/Q4_K/Q5_K: d*sc*q - dmin*m; Q3_K: d*(sc-32)*q, q in [-4, 4); Q6_K:
# d*sc*(q-32), sc in [-64, 64); IQ2_*: d*(0.5+sc)/4*p, IQ3_XXS: d*(0.5+sc)/2*p, IQ3_S:
# d*(1+2sc)*p with p a value of a grid point; IQ4_NL: d*level; IQ4_XS: d*(sc-32)*level
_SPREAD = {T.Q2_K: 13.87, T.Q3_K: 43.34, T.Q4_K: 257.2, T.Q5_K: 524.5, T.Q6_K: 682.8,
           T.IQ2_XXS: 53.36, T.IQ2_XS: 55.9, T.IQ2_S: 56.39, T.IQ3_XXS: 142.41, T.IQ3_S: 140.24,
           T.IQ4_NL: 67.44, T.IQ4_XS: 1246.3}
_DMIN = {T.Q2_K: 1.5, T.Q4_K: 7.5, T.Q5_K: 15.5}   # dmin/d that centres the values near zero
_D_BYTE = {T.Q2_K: 80, T.Q3_K: 108, T.Q6_K: 208}   # where the f16 d (then dmin) sits; else byte 0


def random_blocks(rng: np.random.Generator, rows: int, cols: int, qtype: T, std: float) -> np.ndarray:
    """Random valid blocks of a K-quant or i-quant, (rows, cols/block*type_size) uint8, values
    spread about `std`. Every byte but the super-block scales is random: any bit pattern is
    a valid quant or sub-block scale, except Q6_K's int8 scales, kept in [-64, 64)."""
    block, size = GGML_QUANT_SIZES[qtype]
    nb = rows * cols // block
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    d = np.full(nb, std / _SPREAD[qtype], np.float32) * rng.uniform(0.75, 1.25, nb).astype(np.float32)
    if qtype == T.Q6_K:   # ql[128] qh[64] scales[16] (int8) d
        raw[:, 192:208] = rng.integers(-64, 64, size=(nb, 16)).astype(np.int8).view(np.uint8)
    at = _D_BYTE.get(qtype, 0)
    raw[:, at:at + 2] = d.astype(np.float16).view(np.uint8).reshape(nb, 2)
    if qtype in _DMIN:
        raw[:, at + 2:at + 4] = (d * _DMIN[qtype]).astype(np.float16).view(np.uint8).reshape(nb, 2)
    return raw.reshape(rows, cols // block * size)


def _tensor_type(cfg: SynthConfig, name: str, layer: int | None) -> str:
    t = cfg.wtype
    if t == "q4_k_m":
        six = name == "output.weight" or (layer is not None and layer % 2 == 0
                                          and name.endswith(("attn_v.weight", "ffn_down.weight")))
        t = "q6_k" if six else "q4_k"
    for pattern, override in cfg.tensor_types.items():
        if fnmatch.fnmatchcase(name, pattern):
            t = override.lower()
    return t


def _encode(cfg: SynthConfig, name: str, w: np.ndarray, layer: int | None):
    """(array, raw_dtype) for GGUFWriter.add_tensor: w (rows, cols) stored as this tensor's type."""
    tname = _tensor_type(cfg, name, layer)
    qtype = T[tname.upper()]
    block = GGML_QUANT_SIZES[qtype][0]
    if w.shape[-1] % block:
        raise ValueError(f"{name}: row length {w.shape[-1]} is not a multiple of {qtype.name}'s "
                         f"block size {block}")
    if qtype == T.F32:
        return w, None
    if qtype == T.F16:
        return w.astype(np.float16), None
    if qtype in _SPREAD:
        std = float(w.std())
        return random_blocks(_rng(cfg, name + "#kq"), w.shape[0], w.shape[1], qtype, std), qtype
    return gguf.quants.quantize(w, qtype), qtype


# ---- the model ----

def _tensors(cfg: SynthConfig):
    """Yield (name, float32 array in numpy order, layer or None, quantizable)."""
    if cfg.arch in ENCODERS:
        yield from _encoder_tensors(cfg)
        return
    h, ff = cfg.hidden, cfg.ff
    # logits ~ N(0, 3): head rows of std 3/sqrt(h) against a unit-rms normed state. Projections
    # back into the residual (attn_output, ffn_down, out_proj) are 2x "unit" so that the layers,
    # not the token's own embedding, dominate the residual stream (else a tied head mostly
    # predicts its input token). Granite's embedding_scale and gemma's sqrt(hidden) multiply the
    # embeddings: undo it, and give a tied head's final norm that gain back.
    scale = _embedding_scale(cfg)
    embd_std = 3 / h ** 0.5 / scale
    yield "token_embd.weight", _normal(cfg, "token_embd.weight", (VOCAB_SIZE, h), embd_std), None, True
    if cfg.rope_freqs:
        yield "rope_freqs.weight", _llama3_rope_factors(cfg), None, False
    if cfg.arch == "phi3":
        for name in ("rope_factors_long.weight", "rope_factors_short.weight"):
            yield name, _longrope_factors(cfg, name), None, False
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        kind = cfg.layer_types[i] if cfg.layer_types else "attn"
        yield p + "attn_norm.weight", _near_one(cfg, p + "attn_norm.weight", h), i, False
        if kind == "conv":
            # ggml_ssm_conv kernel: ne {l_cache, hidden}; column l_cache-1 weighs the current token
            yield p + "shortconv.conv.weight", _normal(cfg, p + "shortconv.conv.weight",
                                                       (h, cfg.l_cache), 0.5), i, False
            yield p + "shortconv.in_proj.weight", _normal(cfg, p + "shortconv.in_proj.weight",
                                                          (3 * h, h), h ** -0.5), i, True
            yield p + "shortconv.out_proj.weight", _normal(cfg, p + "shortconv.out_proj.weight",
                                                           (h, h), OUT_GAIN * h ** -0.5), i, True
        else:
            qkv = [(p + proj + ".weight", _normal(cfg, p + proj + ".weight", (rows, h), h ** -0.5))
                   for proj, rows in (("attn_q", cfg.q_dim), ("attn_k", cfg.kv_dim), ("attn_v", cfg.kv_dim))]
            if cfg.arch == "phi3":
                yield p + "attn_qkv.weight", np.concatenate([w for _, w in qkv]), i, True
            for (name, w), rows in zip(qkv if cfg.arch != "phi3" else (), (cfg.q_dim, cfg.kv_dim, cfg.kv_dim)):
                yield name, w, i, True
                if cfg.qkv_bias:
                    bias = name.replace(".weight", ".bias")
                    yield bias, _normal(cfg, bias, rows, 0.2), i, False
            if cfg.qk_norm:
                yield p + "attn_q_norm.weight", _near_one(cfg, p + "attn_q_norm.weight", cfg.head_dim), i, False
                yield p + "attn_k_norm.weight", _near_one(cfg, p + "attn_k_norm.weight", cfg.head_dim), i, False
            yield p + "attn_output.weight", _normal(cfg, p + "attn_output.weight",
                                                    (h, cfg.q_dim), OUT_GAIN * cfg.q_dim ** -0.5), i, True
            if cfg.arch in GEMMA:
                yield p + "post_attention_norm.weight", _near_one(cfg, p + "post_attention_norm.weight", h), i, False
        yield p + "ffn_norm.weight", _near_one(cfg, p + "ffn_norm.weight", h), i, False
        gate = _normal(cfg, p + "ffn_gate.weight", (ff, h), h ** -0.5)
        up = _normal(cfg, p + "ffn_up.weight", (ff, h), h ** -0.5)
        if cfg.arch == "phi3":   # one matrix, gate rows first
            yield p + "ffn_up.weight", np.concatenate([gate, up]), i, True
        else:
            yield p + "ffn_gate.weight", gate, i, True
            yield p + "ffn_up.weight", up, i, True
        yield p + "ffn_down.weight", _normal(cfg, p + "ffn_down.weight", (h, ff), OUT_GAIN * ff ** -0.5), i, True
        if cfg.arch in GEMMA:
            yield p + "post_ffw_norm.weight", _near_one(cfg, p + "post_ffw_norm.weight", h), i, False
    # llama.cpp names LFM2's final norm token_embd_norm (LLM_TENSOR_OUTPUT_NORM_LFM2), though it is
    # applied after the last layer
    norm = "token_embd_norm.weight" if cfg.arch == "lfm2" else "output_norm.weight"
    norm_w = _near_one(cfg, norm, h)
    yield norm, norm_w * np.float32(scale) if cfg.tied and scale != 1.0 else norm_w, None, False
    if not cfg.tied:
        yield "output.weight", _normal(cfg, "output.weight", (VOCAB_SIZE, h), 3 / h ** 0.5), None, True


def _embedding_scale(cfg: SynthConfig) -> float:
    """What the model multiplies the embeddings by: granite's embedding_scale, gemma's sqrt(hidden)."""
    return cfg.hidden ** 0.5 if cfg.arch in GEMMA else (cfg.embedding_scale or 1.0)


def _llama3_rope_factors(cfg: SynthConfig) -> np.ndarray:
    """Llama-3 rope_freqs (factor 8, low/high frequency factors 1 and 4), with the original
    context set to the model's tiny one so that the pairs span all three regimes
    (factor 1, smoothly interpolated, factor 8)."""
    factor, low, high, old_ctx = 8.0, 1.0, 4.0, cfg.context
    dim = cfg.head_dim
    freqs = cfg.rope_base ** -(np.arange(0, dim, 2, dtype=np.float64) / dim)
    out = []
    for f in freqs:
        wavelen = 2 * np.pi / f
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def _longrope_factors(cfg: SynthConfig, name: str) -> np.ndarray:
    """LongRoPE's per-pair frequency divisors (n_rot/2,), rising from 1 towards the low
    frequencies as Phi-3's do: the long ones to 8, the short ones to 1.5, with some noise."""
    n = (cfg.n_rot or cfg.head_dim) // 2
    top = 8.0 if "long" in name else 1.5
    ramp = 1.0 + (top - 1.0) * (np.arange(n) / max(n - 1, 1)) ** 2
    return (ramp * (1.0 + 0.05 * _rng(cfg, name).standard_normal(n))).astype(np.float32)


def _write_metadata(w: gguf.GGUFWriter, cfg: SynthConfig) -> None:
    a = cfg.arch
    if a in ENCODERS:
        _write_encoder_metadata(w, cfg)
        return
    _write_shape(w, cfg)
    if a == "lfm2":   # per-layer: 0 marks a conv layer (llama.cpp: is_recurrent(il) = n_head_kv(il) == 0)
        w.add_head_count_kv([cfg.n_kv_heads if t == "attn" else 0 for t in cfg.layer_types])
    else:
        w.add_head_count_kv(cfg.n_kv_heads)
    if cfg.head_dim != cfg.hidden // cfg.n_heads:
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.n_rot or cfg.head_dim)
    if cfg.rope_original_context:
        w.add_rope_scaling_orig_ctx_len(cfg.rope_original_context)
    if cfg.rope_attn_factor:
        w.add_rope_scaling_attn_factors(cfg.rope_attn_factor)
    w.add_rope_freq_base(cfg.rope_base)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    if cfg.write_vocab_size:
        w.add_vocab_size(VOCAB_SIZE)
    if a == "granite":
        w.add_embedding_scale(cfg.embedding_scale)
        w.add_residual_scale(cfg.residual_scale)
        w.add_attention_scale(cfg.attention_scale)
        w.add_logit_scale(cfg.logit_scale)
    if a == "lfm2":
        w.add_shortconv_l_cache(cfg.l_cache)
    if cfg.sliding_window:
        w.add_sliding_window(cfg.sliding_window)
    if cfg.swa_pattern:
        w.add_sliding_window_pattern(cfg.swa_pattern)
    if cfg.attn_softcap:
        w.add_attn_logit_softcapping(cfg.attn_softcap)
    if cfg.final_softcap:
        w.add_final_logit_softcapping(cfg.final_softcap)
    tokens, types, merges = tokenizer_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_pad_token_id(PAD_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(cfg.chat_template)


def write_model(path: str | os.PathLike, arch: str, *, wtype: str = "f32", seed: int = 0,
                split_max_tensors: int = 0, **overrides) -> Path:
    """Write a tiny deterministic GGUF of `arch` to `path`; returns the path. split_max_tensors > 0
    splits it as llama.cpp's gguf-split does, that many tensors a part, into STEM-00001-of-0000N.gguf
    and on next to `path` (which is then not written); returns the first part's path."""
    cfg = config_for(arch, wtype=wtype, seed=seed, **overrides)
    path = Path(path)
    w = gguf.GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
    _write_metadata(w, cfg)
    for name, arr, layer, quantizable in _tensors(cfg):
        if quantizable:
            data, raw_dtype = _encode(cfg, name, arr, layer)
            w.add_tensor(name, data, raw_dtype=raw_dtype)
        else:
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return w.format_shard_names(path)[0]


# The variants goldens exist for: name -> write_model keyword arguments (besides the path).
VARIANTS: dict[str, dict] = {
    "llama_f32": dict(arch="llama"),
    "llama_f32_tied": dict(arch="llama", tied=True),
    "llama_f32_ropefreqs": dict(arch="llama", rope_freqs=True),
    "llama_f16": dict(arch="llama", wtype="f16"),
    "llama_bf16": dict(arch="llama", wtype="bf16"),
    "llama_q8_0": dict(arch="llama", wtype="q8_0"),
    "llama_q4_0": dict(arch="llama", wtype="q4_0"),
    # SmolLM2-like: tied head, Q4_1 layers, Q8_0 embedding
    "llama_q4_1_tied": dict(arch="llama", wtype="q4_1", tied=True,
                            tensor_types={"token_embd.weight": "q8_0"}),
    "llama_q5_0": dict(arch="llama", wtype="q5_0"),
    "llama_q5_1": dict(arch="llama", wtype="q5_1"),
    "llama_q4_k": dict(arch="llama", wtype="q4_k"),
    "llama_q5_k": dict(arch="llama", wtype="q5_k"),
    "llama_q6_k": dict(arch="llama", wtype="q6_k"),
    "llama_q2_k": dict(arch="llama", wtype="q2_k"),
    "llama_q3_k": dict(arch="llama", wtype="q3_k"),
    "llama_iq2_xxs": dict(arch="llama", wtype="iq2_xxs"),
    "llama_iq2_xs": dict(arch="llama", wtype="iq2_xs"),
    "llama_iq2_s": dict(arch="llama", wtype="iq2_s"),
    "llama_iq3_xxs": dict(arch="llama", wtype="iq3_xxs", seed=1),   # seed 0 greedy: a 0.1 near-tie
    "llama_iq3_s": dict(arch="llama", wtype="iq3_s"),
    "llama_iq4_nl": dict(arch="llama", wtype="iq4_nl"),
    "llama_iq4_xs": dict(arch="llama", wtype="iq4_xs"),
    "qwen2_f32": dict(arch="qwen2"),
    "qwen2_q8_0": dict(arch="qwen2", wtype="q8_0"),
    "qwen2_q4_k_m": dict(arch="qwen2", wtype="q4_k_m"),
    "qwen3_f32": dict(arch="qwen3"),
    "qwen3_f16": dict(arch="qwen3", wtype="f16"),
    "qwen3_q4_0": dict(arch="qwen3", wtype="q4_0"),
    "granite_f32": dict(arch="granite"),
    "granite_q5_1": dict(arch="granite", wtype="q5_1"),
    "lfm2_f32": dict(arch="lfm2"),
    "lfm2_q8_0": dict(arch="lfm2", wtype="q8_0"),
    "lfm2_q4_k": dict(arch="lfm2", wtype="q4_k"),
    "gemma2_f32": dict(arch="gemma2"),
    # llama-quantize's Q4_K_M of a tied model: Q6_K embedding (the head), Q4_K / Q6_K the rest
    "gemma2_q4_k_m": dict(arch="gemma2", wtype="q4_k_m", tensor_types={"token_embd.weight": "q6_k"}),
    "gemma3_f32": dict(arch="gemma3"),
    # Gemma-3-270M Q4_K_M's mix: Q8_0 embedding and attn_v, Q5_0 q/k/gate/up, Q4_K / Q6_K the rest
    "gemma3_q4_k_m": dict(arch="gemma3", wtype="q4_k_m",
                          tensor_types={"token_embd.weight": "q8_0", "*.attn_v.weight": "q8_0",
                                        "*.attn_[qk].weight": "q5_0", "*.ffn_gate.weight": "q5_0",
                                        "*.ffn_up.weight": "q5_0"}),
    "phi3_f32": dict(arch="phi3"),
    # the short factors (original context 256: llama.cpp's padded n_ctx does not exceed it), a
    # quantized fused q|k|v and gate|up
    "phi3_q4_k_m": dict(arch="phi3", wtype="q4_k_m", rope_original_context=256),
    # Phi-4-mini's partial rotation: the attention factor scales the rotated 3/4 of each head only
    "phi3_q8_0_partial": dict(arch="phi3", wtype="q8_0", head_dim=32, n_heads=2, n_kv_heads=1, n_rot=24),
}


def write_variant(path: str | os.PathLike, name: str) -> Path:
    kwargs = dict(VARIANTS[name] if name in VARIANTS else ENCODER_VARIANTS[name])
    return write_model(path, kwargs.pop("arch"), **kwargs)


# ---- LoRA adapters (llama.cpp's GGUF form, cera.lora) ----

LORA_DELTA = 0.5   # std of a delta's output over the base projection's (at user scale 1)


def write_lora(path: str | os.PathLike, base: str, *, targets: tuple[str, ...], rank: int, alpha: float | None,
               seed: int = 1, tensor_types: dict | None = None) -> Path:
    """Write a LoRA adapter for the VARIANTS model `base`: a random lora_a (rank, in) and lora_b
    (out, rank) for every 2-D weight matching a glob in `targets`; `adapter.lora.alpha` = alpha
    (None: not written, so the scale is the user's alone). tensor_types ({glob: type name},
    default f32) as in write_model. B is scaled so that the delta is about LORA_DELTA of what the
    base projection outputs."""
    kwargs = dict(VARIANTS[base])
    cfg = config_for(kwargs.pop("arch"), **kwargs)
    lora = replace(cfg, wtype="f32", seed=seed, tensor_types=tensor_types or {})
    matrices = {name: w for name, w, _, quantizable in _tensors(cfg)
                if quantizable and any(fnmatch.fnmatchcase(name, t) for t in targets)}
    if not matrices:
        raise ValueError(f"no weight of {base} matches {targets}")
    s = alpha / rank if alpha else 1.0
    tensors = {}
    for name, weight in matrices.items():
        rows, cols = weight.shape
        out_std = float(weight.std()) * cols ** 0.5                     # of W x for a unit-rms x
        a = _normal(lora, name + ".lora_a", (rank, cols), cols ** -0.5)
        b = _normal(lora, name + ".lora_b", (rows, rank), LORA_DELTA * out_std / (s * rank ** 0.5))
        for half, arr in ((".lora_a", a), (".lora_b", b)):
            tensors[name + half] = _encode(lora, name + half, arr, None)
    return write_adapter(path, cfg.arch, tensors, alpha, f"cera-synth-lora-{base}")


def write_adapter(path: str | os.PathLike, arch: str, tensors: dict, alpha: float | None = None,
                  name: str = "cera-synth-lora") -> Path:
    """An adapter file of `arch` holding exactly `tensors`: name -> an array, or (array, raw_dtype)
    as GGUFWriter.add_tensor takes them."""
    w = gguf.GGUFWriter(path, arch)
    w.add_name(name)
    w.add_type("adapter")
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    if alpha is not None:
        w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    for tensor, value in tensors.items():
        data, raw_dtype = value if isinstance(value, tuple) else (value, None)
        w.add_tensor(tensor, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


# The adapters goldens exist for: name -> base variant, write_lora keyword arguments, and the
# user scale llama.cpp applied.
LORA_VARIANTS: dict[str, dict] = {
    # attention and FFN of layer 0 (its GLU runs apart), v and down only in layer 1 (fused GLU)
    "llama_f32_attn_ffn": dict(base="llama_f32", scale=0.75, rank=12, alpha=24.0, targets=(
        "blk.0.attn_*.weight", "blk.0.ffn_*.weight", "blk.1.attn_v.weight", "blk.1.ffn_down.weight")),
    # no alpha (the scale alone), an odd rank, Q8_0 A and F16 B
    "llama_f32_q_up": dict(base="llama_f32", scale=1.0, rank=5, alpha=None,
                           targets=("blk.*.attn_q.weight", "blk.1.ffn_up.weight"),
                           tensor_types={"*.lora_a": "q8_0", "*.lora_b": "f16"}),
    "qwen2_f32_qkv": dict(base="qwen2_f32", scale=1.0, rank=12, alpha=6.0, targets=("blk.*.attn_[qkv].weight",)),
    "granite_f32_out_down": dict(base="granite_f32", scale=2.0, rank=12, alpha=12.0,
                                 targets=("blk.*.attn_output.weight", "blk.*.ffn_down.weight")),
    # gemma2: a local layer's attention (q soft-capped scores), a global layer's GLU apart (gate) and
    # its post-normed down projection
    "gemma2_f32_attn_ffn": dict(base="gemma2_f32", scale=1.0, rank=8, alpha=16.0, targets=(
        "blk.0.attn_[qo]*.weight", "blk.1.ffn_gate.weight", "blk.1.ffn_down.weight")),
    "lfm2_q8_0_conv": dict(base="lfm2_q8_0", scale=1.0, rank=12, alpha=16.0, targets=(
        "blk.*.shortconv.*_proj.weight", "blk.1.attn_q.weight", "blk.1.attn_output.weight", "blk.3.ffn_gate.weight")),
    # phi3's fused matrices: q|k|v in both layers, gate|up in layer 0 (its GLU runs apart)
    "phi3_f32_qkv_up": dict(base="phi3_f32", scale=1.0, rank=8, alpha=16.0,
                            targets=("blk.*.attn_qkv.weight", "blk.0.ffn_up.weight", "blk.1.attn_output.weight")),
}


def write_lora_variant(path: str | os.PathLike, name: str) -> Path:
    kwargs = dict(LORA_VARIANTS[name])
    del kwargs["scale"]
    return write_lora(path, kwargs.pop("base"), **kwargs)


def describe(cfg: SynthConfig) -> dict:
    """The configuration as plain JSON-able data."""
    d = asdict(cfg)
    d["layer_types"] = list(cfg.layer_types)
    return d


# ---- encoders (nomic-bert, bert): WordPiece vocabulary, LayerNorm blocks, no LM head ----

# The encoders' goldens (embeddings, not logits): name -> write_model keyword arguments.
ENCODER_VARIANTS: dict[str, dict] = {
    "nomic_bert_f32": dict(arch="nomic-bert"),
    "nomic_bert_q8_0": dict(arch="nomic-bert", wtype="q8_0"),
    "bert_f32": dict(arch="bert"),
    "bert_q8_0": dict(arch="bert", wtype="q8_0"),
}
WPM_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WPM_PAD_ID, WPM_UNK_ID, WPM_CLS_ID, WPM_SEP_ID, WPM_MASK_ID = range(5)
WPM_WORDS = ("the cat sat on mat dog ran in park an is was not first time it would be last "
             "and of to quick brown fox jumps over lazy sun sky blue green tree house").split()


def wordpiece_vocab() -> tuple[list[str], list[int]]:
    """(tokens, token_types) of the encoders' WordPiece vocabulary, in llama.cpp's converted
    form: "▁" starts a word; every letter and digit both starts and continues one."""
    chars = list("abcdefghijklmnopqrstuvwxyz0123456789")
    tokens = WPM_SPECIAL + ["\u2581" + w for w in WPM_WORDS] + ["\u2581" + c for c in chars + list(".,!?'-")]
    tokens += chars + ["ing", "ed", "er"]
    types = [int(gguf.TokenType.CONTROL)] * len(WPM_SPECIAL) + [int(gguf.TokenType.NORMAL)] * (len(tokens) - 5)
    types[WPM_UNK_ID] = int(gguf.TokenType.UNKNOWN)
    return tokens, types


WPM_VOCAB_SIZE = len(wordpiece_vocab()[0])
N_TOKEN_TYPES = 2


def _layer_norm(cfg: SynthConfig, name: str, n: int):
    """A LayerNorm's weight (near 1) and bias (near 0), never quantized."""
    yield name + ".weight", _near_one(cfg, name + ".weight", n), None, False
    yield name + ".bias", _normal(cfg, name + ".bias", n, 0.1), None, False


def _encoder_tensors(cfg: SynthConfig):
    """An encoder's tensors as llama.cpp's bert / nomic-bert loader names them."""
    h, ff, bert = cfg.hidden, cfg.ff, cfg.arch == "bert"
    yield "token_embd.weight", _normal(cfg, "token_embd.weight", (WPM_VOCAB_SIZE, h), 1.0), None, True
    yield "token_types.weight", _normal(cfg, "token_types.weight", (N_TOKEN_TYPES, h), 0.5), None, False
    if bert:
        yield "position_embd.weight", _normal(cfg, "position_embd.weight", (cfg.context, h), 0.5), None, False
    yield from _layer_norm(cfg, "token_embd_norm", h)

    def matrix(name, rows, cols, gain=1.0, bias=bert):
        yield name + ".weight", _normal(cfg, name + ".weight", (rows, cols), gain * cols ** -0.5), i, True
        if bias:
            yield name + ".bias", _normal(cfg, name + ".bias", rows, 0.2), i, False

    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        if bert:
            for x in "qkv":
                yield from matrix(p + f"attn_{x}", h, h)
        else:
            yield from matrix(p + "attn_qkv", 3 * h, h)
        yield from matrix(p + "attn_output", h, h, OUT_GAIN / 2)
        yield from _layer_norm(cfg, p + "attn_output_norm", h)
        yield from matrix(p + "ffn_up", ff, h)
        if not bert:
            yield from matrix(p + "ffn_gate", ff, h)
        yield from matrix(p + "ffn_down", h, ff, OUT_GAIN / 2)
        yield from _layer_norm(cfg, p + "layer_output_norm", h)


def _write_shape(w: gguf.GGUFWriter, cfg: SynthConfig) -> None:
    """Every arch's first keys: name, file type, context, widths, layers, heads."""
    # llama.cpp marks the special tokens of a model whose general.name contains "phi3" (it then
    # needs "</s>" in the vocabulary): the synthetic vocabulary has none, so the name avoids it
    w.add_name(f"cera-synth-{cfg.arch.replace('phi3', 'phi_3')}-{cfg.wtype}")
    w.add_file_type(FILE_TYPES[cfg.wtype])
    if cfg.wtype not in ("f32", "f16", "bf16"):
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(cfg.context)
    w.add_embedding_length(cfg.hidden)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.ff)
    w.add_head_count(cfg.n_heads)


def _write_encoder_metadata(w: gguf.GGUFWriter, cfg: SynthConfig) -> None:
    _write_shape(w, cfg)
    w.add_layer_norm_eps(cfg.rms_eps)
    w.add_causal_attention(False)
    if cfg.arch == "nomic-bert":
        w.add_rope_freq_base(cfg.rope_base)
        w.add_pooling_type(gguf.PoolingType.MEAN)
    else:
        w.add_pooling_type(gguf.PoolingType.CLS)
    tokens, types = wordpiece_vocab()
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_type_count(N_TOKEN_TYPES)
    w.add_bos_token_id(WPM_CLS_ID)
    w.add_eos_token_id(WPM_SEP_ID)
    w.add_unk_token_id(WPM_UNK_ID)
    w.add_sep_token_id(WPM_SEP_ID)
    w.add_pad_token_id(WPM_PAD_ID)
    w.add_mask_token_id(WPM_MASK_ID)
