"""Numpy oracles for the non-matmul ops of a forward pass, as llama.cpp computes them.

Plain float32 numpy, written to be read (llama2.c style): the numpy reference forward
pass (cera.reference) is built from these, and every GPU kernel is tested against them.
Shapes are in the comments; T is the number of tokens in a step.
"""
from __future__ import annotations

import math

import numpy as np


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x * 1/sqrt(mean(x^2) + eps) * w over the last axis (ggml_rms_norm then ggml_mul).

    x (..., n), w (n,) -> (..., n). Per-head QK-norm is the same call on (T, n_heads, head_dim)
    with w (head_dim,)."""
    x = x.astype(np.float32)
    ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
    return (x * (1.0 / np.sqrt(ms + np.float32(eps)))).astype(np.float32) * w.astype(np.float32)


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """(x - mean(x)) / sqrt(var(x) + eps) * w + b over the last axis (ggml_norm, then ggml_mul
    and ggml_add: llama.cpp's LLM_NORM). x (..., n), w, b (n,) -> (..., n)."""
    x = x.astype(np.float32)
    centred = x - np.mean(x, axis=-1, keepdims=True, dtype=np.float32)
    var = np.mean(centred * centred, axis=-1, keepdims=True, dtype=np.float32)
    return (centred * (1.0 / np.sqrt(var + np.float32(eps)))).astype(np.float32) * w + b


def rope_angles(pos: np.ndarray, theta: float, n_rot: int, freq_factors: np.ndarray | None = None) -> np.ndarray:
    """Rotation angle of each pair i < n_rot/2 at each position: pos * theta^(-2i/n_rot) / ff[i].

    pos (T,) -> (T, n_rot/2). `freq_factors` is Llama-3's `rope_freqs.weight` (n_rot/2,)."""
    inv_freq = theta ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)   # (n_rot/2,)
    if freq_factors is not None:
        inv_freq = inv_freq / np.asarray(freq_factors, dtype=np.float64)
    return np.asarray(pos, dtype=np.float64)[:, None] * inv_freq[None, :]


def rope(x: np.ndarray, pos, theta: float, neox: bool, n_rot: int | None = None,
         freq_factors: np.ndarray | None = None, attn_factor: float = 1.0) -> np.ndarray:
    """Rotary position embedding (ggml_rope_ext with freq_scale 1, no YaRN).

    x (T, n_heads, head_dim), pos (T,) ints -> (T, n_heads, head_dim).
    NORM layout (llama, granite) rotates interleaved pairs (2i, 2i+1); NEOX layout (qwen2,
    qwen3, lfm2) rotates (i, i + n_rot/2). Only the first n_rot dims rotate; the rest pass.
    The rotated pairs are scaled by attn_factor (ggml's mscale: cos and sin times it; Phi-3's
    rope.scaling.attn_factor)."""
    T, n_heads, head_dim = x.shape
    n_rot = head_dim if n_rot is None else n_rot
    assert n_rot % 2 == 0 and n_rot <= head_dim, (n_rot, head_dim)
    angle = rope_angles(np.asarray(pos).reshape(T), theta, n_rot, freq_factors)   # (T, n_rot/2)
    cos = (np.cos(angle) * attn_factor).astype(np.float32)[:, None, :]   # (T, 1, n_rot/2)
    sin = (np.sin(angle) * attn_factor).astype(np.float32)[:, None, :]
    out = x.astype(np.float32).copy()
    if neox:
        x0, x1 = x[..., : n_rot // 2], x[..., n_rot // 2: n_rot]   # (T, n_heads, n_rot/2) each
        out[..., : n_rot // 2] = x0 * cos - x1 * sin
        out[..., n_rot // 2: n_rot] = x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = x0 * cos - x1 * sin
        out[..., 1:n_rot:2] = x0 * sin + x1 * cos
    return out


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(x)
    return e / np.sum(e, axis=axis, keepdims=True)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, pos, scale: float, window: int = 0,
              softcap: float = 0.0, causal: bool = True) -> np.ndarray:
    """Causal grouped-query attention of T query rows against a KV cache (not `causal`: every
    row sees every key, an encoder's).

    q (T, n_heads, hd) for tokens at positions pos (T,); k, v (S, n_kv_heads, hd) caches
    holding positions 0..S-1 (S > max(pos)). The row at position p sees keys 0..p, or with a
    sliding `window` only keys p-window+1..p (llama.cpp's LLAMA_SWA_TYPE_STANDARD mask).
    A `softcap` (gemma2) caps the scaled scores before the mask: softcap * tanh(score / softcap).
    Head h reads kv head h // (n_heads // n_kv_heads). -> (T, n_heads, hd)."""
    T, n_heads, hd = q.shape
    S, n_kv_heads, _ = k.shape
    assert n_heads % n_kv_heads == 0, (n_heads, n_kv_heads)
    group = n_heads // n_kv_heads
    pos = np.asarray(pos).reshape(T)
    assert pos.max() < S, (pos.max(), S)
    age = pos[:, None] - np.arange(S)[None, :]                        # (T, S) query pos - key pos
    hidden = (age < 0) | (age >= window) if window else age < 0       # (T, S) keys a row may not see
    if not causal:
        hidden = np.zeros_like(hidden)
    out = np.zeros((T, n_heads, hd), dtype=np.float32)
    for kh in range(n_kv_heads):
        heads = slice(kh * group, (kh + 1) * group)                   # the query heads reading kv head kh
        qh = q[:, heads, :].transpose(1, 0, 2)                        # (group, T, hd)
        scores = (qh @ k[:, kh, :].T) * np.float32(scale)             # (group, T, S)
        if softcap:
            scores = soft_cap(scores, softcap)
        att = softmax(np.where(hidden, -np.inf, scores))              # (group, T, S)
        out[:, heads, :] = (att @ v[:, kh, :]).transpose(1, 0, 2)     # (T, group, hd)
    return out


def soft_cap(x: np.ndarray, cap: float) -> np.ndarray:
    """Gemma 2's soft-capping: cap * tanh(x / cap), smooth, odd, bounded by cap."""
    return (np.float32(cap) * np.tanh(x.astype(np.float32) * np.float32(1.0 / cap))).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):   # exp(-x) overflows to inf for x < -88: silu is then -0
        return x / (1.0 + np.exp(-x))


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up (llama.cpp LLM_FFN_SILU + LLM_FFN_PAR). (..., n) each -> (..., n)."""
    return (silu(gate.astype(np.float32)) * up).astype(np.float32)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (ggml_gelu): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    x = x.astype(np.float32)
    inner = np.float32(math.sqrt(2 / math.pi)) * x * (np.float32(1) + np.float32(0.044715) * x * x)
    return np.float32(0.5) * x * (np.float32(1) + np.tanh(inner))


def geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gelu_tanh(gate) * up (llama.cpp LLM_FFN_GELU + LLM_FFN_PAR, Gemma). (..., n) each -> (..., n)."""
    return (gelu_tanh(gate) * up).astype(np.float32)


def shortconv(bcx: np.ndarray, conv_w: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """LFM2's gated short convolution for T consecutive tokens (llm_build_lfm2 shortconv block).

    bcx (T, 3*hidden): the in_proj output (`blk.N.shortconv.in_proj.weight`), split in this
        order as llama.cpp does: B = bcx[:, :hidden], C = bcx[:, hidden:2h], x = bcx[:, 2h:].
    conv_w (hidden, kernel): `blk.N.shortconv.conv.weight`, GGUF shape [kernel, hidden]
        (ggml ne order), so row ch holds channel ch's taps, oldest first.
    state (kernel-1, hidden): the previous kernel-1 rows of B*x, oldest first (zeros at start).
    Returns y (T, hidden) = C * conv, and the new state (kernel-1, hidden): the last kernel-1
    rows of concat(state, B*x). conv[t, ch] = sum_j conv_w[ch, j] * window[t + j, ch]
    (ggml_ssm_conv), window = concat(state, B*x) along time; no activation follows."""
    T, three_h = bcx.shape
    hidden = three_h // 3
    kernel = conv_w.shape[1]
    assert conv_w.shape == (hidden, kernel) and state.shape == (kernel - 1, hidden)
    b, c, x = bcx[:, :hidden], bcx[:, hidden: 2 * hidden], bcx[:, 2 * hidden:]   # (T, hidden) each
    bx = (b * x).astype(np.float32)                                               # (T, hidden)
    window = np.concatenate([state.astype(np.float32), bx], axis=0)               # (kernel-1+T, hidden)
    conv = np.zeros((T, hidden), dtype=np.float32)
    for t in range(T):
        conv[t] = np.sum(window[t: t + kernel] * conv_w.T, axis=0)               # (hidden,)
    y = (c * conv).astype(np.float32)
    new_state = window[T:].copy()                                                 # (kernel-1, hidden)
    return y, new_state


def q8_k(x: np.ndarray) -> np.ndarray:
    """x as llama.cpp's CPU backend feeds it to a k-quant dot product: quantized to 8 bits per
    256-element block (ggml's quantize_row_q8_K), returned as the floats d * q it stands for.

    Per block: d = 1 / (127 / max|x|) (llama.cpp takes the signed max and negates d and q, which
    gives the same products), q = round(x * 127 / max|x|), ties to even, at most 127; an all-zero
    block stays 0. x (..., n), n a multiple of 256."""
    blocks = x.astype(np.float32).reshape(*x.shape[:-1], -1, 256)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
        d = np.where(amax > 0, np.float32(1.0) / inv, np.float32(0.0)).astype(np.float32)
    q = np.minimum(np.rint(blocks * inv), 127)
    return (q * d).reshape(x.shape).astype(np.float32)


# The KV cache's q8_0 type (cera.gpu.numerics): llama.cpp's block_q8_0 (ggml-quants.c) laid out
# as the GPU keeps it, word-aligned: per block of Q8_0 values along a head's row, the f16 scale d
# padded to a word, then the Q8_0 int8 quants: 36 bytes a block where llama.cpp's take 34
# (shaders/q8_cache.wgsl reads and writes these bytes).
Q8_0 = 32
Q8_0_BLOCK = np.dtype([("d", "<f2"), ("pad", "<u2"), ("qs", "i1", (Q8_0,))])


def round_half_away(x: np.ndarray) -> np.ndarray:
    """C's roundf: to the nearest integer, ties away from zero (numpy's rint and round take ties
    to even)."""
    t = np.trunc(x)
    return t + np.where(np.abs(x - t) >= 0.5, np.sign(x), 0).astype(x.dtype)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """x (..., n), n a multiple of Q8_0, -> (..., n / Q8_0) Q8_0_BLOCK, as llama.cpp's
    quantize_row_q8_0_ref: per block amax = max |x|, d = amax / 127, id = 1 / d (0 where d is 0),
    q = roundf(x * id), all in f32, and d stored as f16 (rounded to nearest even)."""
    blocks = np.asarray(x, np.float32).reshape(*np.shape(x)[:-1], -1, Q8_0)    # (..., n/32, 32)
    d = np.abs(blocks).max(axis=-1) / np.float32(127)                           # (..., n/32) f32
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
        out = np.zeros(blocks.shape[:-1], Q8_0_BLOCK)
        out["d"] = d.astype(np.float16)
    out["qs"] = round_half_away(blocks * inv[..., None]).astype(np.int8)
    return out


def dequantize_q8_0(blocks: np.ndarray) -> np.ndarray:
    """(..., m) Q8_0_BLOCK -> the values (..., m * Q8_0) f32 they stand for: q * d."""
    x = blocks["qs"].astype(np.float32) * blocks["d"].astype(np.float32)[..., None]
    return x.reshape(*blocks.shape[:-1], -1)


def to_cache(x: np.ndarray, dtype) -> np.ndarray:
    """f32 rows (..., head_dim) as a KV cache of numpy type `dtype` holds them: cast (f32, f16),
    or quantized to Q8_0_BLOCK (..., head_dim / Q8_0)."""
    return quantize_q8_0(x) if np.dtype(dtype) == Q8_0_BLOCK else np.asarray(x).astype(dtype)


def from_cache(a: np.ndarray) -> np.ndarray:
    """A KV cache's rows, as to_cache holds them, back in f32 (..., head_dim)."""
    return dequantize_q8_0(a) if a.dtype == Q8_0_BLOCK else a.astype(np.float32)


def cache_shape(dtype, *shape: int) -> tuple[int, ...]:
    """The shape to_cache gives rows of `shape` (..., head_dim) in `dtype`."""
    return (*shape[:-1], shape[-1] // Q8_0) if np.dtype(dtype) == Q8_0_BLOCK else shape
