"""The numpy reference forward pass: the oracle every GPU kernel and whole model is tested against.

Written to be read top to bottom (llama2.c style): `Reference._layer` walks one layer in
order, a comment per step; activations are named x (residual), xb (normed / block output),
q k v, att, hb (FFN hidden), logits; the KV cache is key_cache / value_cache and LFM2's
short-conv blocks keep a rolling conv_state. Every array carries its shape in a comment;
T is the number of tokens in a step, S the cached positions, H / KVH the query / KV heads,
hd the head size.

One code path covers every supported arch; the differences are read from ModelConfig:
Granite's four scalars, Qwen2's QKV bias, Qwen3 / LFM2 / Gemma3 per-head QK-norm, NORM / NEOX
RoPE with Llama-3 or LongRoPE (Phi-3) frequency factors, tied or untied LM head, LFM2's conv
blocks, Gemma's post-norms, GeGLU, sqrt(hidden) embedding scale and per-layer sliding window (and
Gemma3's per-layer RoPE base), and Gemma2's soft-capped attention scores and logits.
Weights are dequantized once (float32) and cached, so prefill runs as batched matmuls.
LoRA adapters (cera.lora) join every matmul of a matrix they adapt: W x + s * B (A x).
"""
from __future__ import annotations

import copy

import numpy as np

from . import ops, weights
from .config import CONV, FFN_GELU, ModelConfig
from .gguf_file import GGUFFile
from .lora import LoraAdapter
from cera.errors import ContextFull, InvalidArgument, Unsupported


class Reference:
    """A model in numpy: `forward(tokens, pos0) -> logits (T, vocab)`, with a persistent KV cache
    (and LFM2 conv state) that `reset()` clears; `embed(tokens)` -> the hidden states after the
    final norm, on caches of their own.

    kv_dtype: the precision K and V are stored in (np.float16 mimics llama.cpp's default F16
    cache; ops.Q8_0_BLOCK its q8_0, quantized on write and dequantized on read), or a pair (K's,
    V's); computation is float32 throughout."""

    def __init__(self, gguf_file: GGUFFile, ctx: int | None = None, kv_dtype=np.float32):
        self.gguf = gguf_file
        self.cfg = cfg = ModelConfig.from_gguf(gguf_file)
        self.ctx = cfg.context(ctx)
        self._weights: dict[str, np.ndarray] = {}   # tensor name -> float32, dequantized once
        factors = cfg.rope_factors(self.ctx)   # Llama 3's, or LongRoPE's long or short ones for this context
        self.freq_factors = self.w(factors) if factors else None   # (n_rot/2,)
        self.k_dtype, self.v_dtype = kv_dtype if isinstance(kv_dtype, tuple) else (kv_dtype, kv_dtype)
        self._allocate_caches()

    def _allocate_caches(self) -> None:
        """Empty caches for self.ctx positions, allocated once."""
        cfg = self.cfg
        shape = lambda il, dtype: ops.cache_shape(dtype, self.ctx, cfg.n_kv_heads[il], cfg.head_dim)
        cached = () if cfg.encoder else cfg.attention_layers    # an encoder keeps nothing between calls
        if ops.Q8_0_BLOCK in map(np.dtype, (self.k_dtype, self.v_dtype)) and cached and cfg.head_dim % ops.Q8_0:
            raise Unsupported(f"a q8_0 KV cache needs a head_dim that is a multiple of {ops.Q8_0}, "
                              f"not {cfg.head_dim} (use the f32 or f16 cache)")
        # layer -> (ctx, KVH, hd), or (ctx, KVH, hd/32) blocks of a q8_0 cache
        self.key_cache = {il: np.zeros(shape(il, self.k_dtype), self.k_dtype) for il in cached}
        self.value_cache = {il: np.zeros(shape(il, self.v_dtype), self.v_dtype) for il in cached}
        self.conv_state = {il: np.zeros((cfg.conv_kernel - 1, cfg.hidden), np.float32)
                           for il in cfg.conv_layers}       # layer -> (kernel-1, hidden), oldest first
        self.n_past = 0   # positions 0..n_past-1 are in the caches
        self.loras: list[LoraAdapter] = []     # loaded adapters
        self.active: list[LoraAdapter] = []    # the ones applied (use_loras)

    def w(self, name: str) -> np.ndarray:
        """Tensor `name` as float32 in numpy shape, dequantized on first use and kept."""
        if name not in self._weights:
            self._weights[name] = weights.tensor(self.gguf, name)
        return self._weights[name]

    def use_loras(self, key: tuple[int, ...]) -> None:
        """Apply the adapters loras[i] for i in `key`, in that order (() is the base model)."""
        self.active = [self.loras[i] for i in key]

    def matmul(self, x: np.ndarray, name: str) -> np.ndarray:
        """x (T, n) @ W.T for the weight matrix `name`, W (d, n) -> (T, d), plus the active
        adapters' s * (x @ A.T) @ B.T."""
        w = self.w(name)
        # one token: a gemv (BLAS is slow at 1-row gemm with W.T)
        out = (w @ x[0])[None] if x.shape[0] == 1 else x @ w.T
        for lora in self.active:
            if name in lora.pairs:
                a, b = lora.arrays(name)                             # (rank, n), (d, rank)
                out = out + np.float32(lora.pairs[name].scale) * ((x @ a.T) @ b.T)
        return out

    def reset(self) -> None:
        """Forget every cached position (KV cache and conv state)."""
        for cache in (*self.key_cache.values(), *self.value_cache.values(), *self.conv_state.values()):
            cache.fill(0)
        self.n_past = 0

    def shift(self, keep: int, discard: int) -> None:
        """Context shift: drop cached positions keep..keep+discard-1, moving the later ones down
        by `discard`, keys re-rotated by -discard positions (RoPE composes: R(p - d) = R(-d) R(p);
        the attn_factor scaling stays as the keys were written with it).
        The conv state carries no position and stays."""
        cfg, n = self.cfg, self.n_past - keep - discard
        if keep < 0 or discard < 1 or n < 0:
            raise InvalidArgument(f"shift of {discard} positions after {keep} of {self.n_past}: out of range")
        for il in cfg.attention_layers:   # each layer with its own RoPE base and scale (gemma3)
            delta = np.full(n, -discard * cfg.layer_rope_freq_scale[il])
            k, v = self.key_cache[il], self.value_cache[il]   # (ctx, KVH, hd)
            k[keep: keep + n] = ops.to_cache(ops.rope(ops.from_cache(k[keep + discard: self.n_past]), delta,
                                                      cfg.layer_rope_theta[il], cfg.rope_neox, cfg.n_rot,
                                                      self.freq_factors), k.dtype)   # q8_0: requantized
            v[keep: keep + n] = v[keep + discard: self.n_past]
        self.n_past -= discard

    # --- the forward pass ----------------------------------------------------------------
    def forward(self, tokens, pos0: int) -> np.ndarray:
        """Run tokens at positions pos0, pos0+1, ... -> logits (T, vocab_size) float32.

        Positions 0..pos0-1 must already be in the caches (pos0 <= n_past); a model with
        conv blocks can only continue where it stopped (pos0 == n_past) or restart at 0."""
        cfg = self.cfg
        if cfg.encoder:
            raise Unsupported(f"{cfg.arch} is an encoder: it has no LM head to give logits (embed with it)")
        x = self.hidden(tokens, pos0)                               # (T, hidden)
        logits = self.matmul(x, cfg.lm_head)[:, : cfg.vocab_size]   # (T, vocab)
        if cfg.logit_scale != 1.0:
            logits = logits * np.float32(1.0 / cfg.logit_scale)
        if cfg.final_softcap:
            logits = ops.soft_cap(logits, cfg.final_softcap)          # (T, vocab) gemma2
        return logits.astype(np.float32, copy=False)

    def embed(self, tokens) -> np.ndarray:
        """The hidden states after the final norm (T, hidden) of tokens run from position 0, on
        caches of their own: the sequence cached here stays as it was."""
        scratch = copy.copy(self)       # the same dequantized weights
        scratch.ctx = len(tokens)
        scratch._allocate_caches()
        return scratch.hidden(tokens, 0)

    def hidden(self, tokens, pos0: int) -> np.ndarray:
        """Run tokens at positions pos0, pos0+1, ... (as forward) -> the hidden states after the
        final norm (T, hidden) float32, what the LM head reads."""
        cfg, T = self.cfg, len(tokens)
        cfg.check_tokens(tokens)
        if T == 0:
            raise InvalidArgument("forward needs at least one token")
        if not 0 <= pos0 <= self.n_past:
            raise InvalidArgument(f"pos0 {pos0} skips positions: {self.n_past} are cached (start at <= {self.n_past})")
        if pos0 + T > self.ctx:
            raise ContextFull(f"positions {pos0}..{pos0 + T - 1} exceed the context of {self.ctx}")
        if cfg.conv_layers and pos0 not in (0, self.n_past):
            raise InvalidArgument(f"pos0 {pos0}: a short-conv state cannot rewind (continue at {self.n_past} or restart at 0)")
        if pos0 == 0:
            for state in self.conv_state.values():
                state.fill(0)
        pos = np.arange(pos0, pos0 + T)                         # (T,)
        if cfg.encoder:
            if pos0:
                raise InvalidArgument(f"pos0 {pos0}: an encoder runs a whole text from position 0")
            return self._encode(tokens, pos)

        x = self._embed(tokens) * np.float32(cfg.embedding_scale)   # (T, hidden)
        for il in range(cfg.n_layers):
            x = self._layer(il, x, pos)
        self.n_past = pos0 + T
        return ops.rms_norm(x, self.w(cfg.final_norm), cfg.eps).astype(np.float32, copy=False)   # (T, hidden)

    def _embed(self, tokens) -> np.ndarray:
        """Token embedding rows (T, hidden). An untied embedding is read row by row, never whole."""
        if self.cfg.tied_embeddings or "token_embd.weight" in self._weights:
            return self.w("token_embd.weight")[np.asarray(tokens)]
        return weights.rows(self.gguf, "token_embd.weight", tokens)

    def _layer(self, il: int, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """One layer: x (T, hidden) at positions pos (T,) -> x (T, hidden)."""
        cfg, b = self.cfg, f"blk.{il}."
        w = lambda name: self.w(b + name)
        matmul = lambda a, name: self.matmul(a, b + name)
        residual_scale = np.float32(cfg.residual_scale)

        # mixer: attention, or LFM2's gated short convolution
        xb = ops.rms_norm(x, w("attn_norm.weight"), cfg.eps)            # (T, hidden)
        if cfg.block_kinds[il] == CONV:
            xb = self._shortconv(il, xb)                                 # (T, hidden)
        else:
            xb = self._attention(il, xb, pos)                            # (T, hidden)
        if cfg.post_norms:
            xb = ops.rms_norm(xb, w("post_attention_norm.weight"), cfg.eps)   # (T, hidden) gemma
        x = x + xb * residual_scale                                      # residual (granite scales it)

        # feed-forward: SwiGLU, or GeGLU (gemma)
        xb = ops.rms_norm(x, w("ffn_norm.weight"), cfg.eps)             # (T, hidden)
        hb = self.glu(matmul(xb, "ffn_gate.weight"), matmul(xb, "ffn_up.weight"))     # (T, ff)
        xb = matmul(hb, "ffn_down.weight")                               # (T, hidden)
        if cfg.post_norms:
            xb = ops.rms_norm(xb, w("post_ffw_norm.weight"), cfg.eps)   # (T, hidden) gemma
        return x + xb * residual_scale

    def glu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """The FFN's gated activation: act(gate) * up, (T, ff) each -> (T, ff)."""
        return ops.geglu(gate, up) if self.cfg.ffn_act == FFN_GELU else ops.swiglu(gate, up)

    def _attention(self, il: int, xb: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Causal GQA self-attention of xb (T, hidden), normed, -> (T, hidden)."""
        cfg, b = self.cfg, f"blk.{il}."
        w = lambda name: self.w(b + name)
        matmul = lambda a, name: self.matmul(a, b + name)
        T, H, KVH, hd = len(pos), cfg.n_heads, cfg.n_kv_heads[il], cfg.head_dim

        # projections (+ Qwen2's biases)
        q = matmul(xb, "attn_q.weight")                                  # (T, H*hd)
        k = matmul(xb, "attn_k.weight")                                  # (T, KVH*hd)
        v = matmul(xb, "attn_v.weight")                                  # (T, KVH*hd)
        if cfg.qkv_bias:
            q, k, v = q + w("attn_q.bias"), k + w("attn_k.bias"), v + w("attn_v.bias")
        q, k, v = q.reshape(T, H, hd), k.reshape(T, KVH, hd), v.reshape(T, KVH, hd)

        # per-head QK-norm (Qwen3, LFM2), before RoPE
        if cfg.qk_norm:
            q = ops.rms_norm(q, w("attn_q_norm.weight"), cfg.eps)       # (T, H, hd)
            k = ops.rms_norm(k, w("attn_k_norm.weight"), cfg.eps)       # (T, KVH, hd)

        # RoPE on q and k, with this layer's base (linear scaling stretches positions by 1/freq_scale)
        theta, freq_scale = cfg.layer_rope_theta[il], cfg.layer_rope_freq_scale[il]
        rope_pos = pos * freq_scale if freq_scale != 1.0 else pos
        q = ops.rope(q, rope_pos, theta, cfg.rope_neox, cfg.n_rot, self.freq_factors, cfg.rope_attn_factor)
        k = ops.rope(k, rope_pos, theta, cfg.rope_neox, cfg.n_rot, self.freq_factors, cfg.rope_attn_factor)

        # write k, v into the cache at their positions, then attend over positions 0..pos[-1]
        # (a local layer only over the last layer_window of them; gemma2 soft-caps the scores)
        key_cache, value_cache = self.key_cache[il], self.value_cache[il]   # (ctx, KVH, hd)
        key_cache[pos], value_cache[pos] = ops.to_cache(k, key_cache.dtype), ops.to_cache(v, value_cache.dtype)
        S = int(pos[-1]) + 1
        att = ops.attention(q, ops.from_cache(key_cache[:S]), ops.from_cache(value_cache[:S]),
                            pos, cfg.attention_scale, cfg.layer_window[il], cfg.attn_softcap)   # (T, H, hd)

        # output projection
        return matmul(att.reshape(T, H * hd), "attn_output.weight")     # (T, hidden)

    # --- encoders (nomic-bert, bert: llama.cpp's llm_build_bert) ---------------------------
    def linear(self, x: np.ndarray, name: str) -> np.ndarray:
        """x (T, n) through the weight `name`.weight, plus `name`.bias where the file has it."""
        out = self.matmul(x, name + ".weight")
        return out + self.w(name + ".bias") if name.rsplit(".", 1)[1] in self.cfg.biases else out

    def _encode(self, tokens, pos: np.ndarray) -> np.ndarray:
        """An encoder's output rows (T, hidden) for tokens at positions pos = 0..T-1."""
        cfg, w = self.cfg, self.w
        x = self._embed(tokens)                                          # (T, hidden)
        if cfg.token_types:
            x = x + w("token_types.weight")[0]                           # every token is type 0
        if cfg.position_embeddings:
            x = x + w("position_embd.weight")[pos]                       # bert's learned positions
        x = ops.layer_norm(x, w("token_embd_norm.weight"), w("token_embd_norm.bias"), cfg.eps)
        for il in range(cfg.n_layers):
            x = self._encoder_layer(il, x, pos)
        self.n_past = 0      # nothing is cached: the next text starts again at 0
        return x.astype(np.float32, copy=False)                         # (T, hidden)

    def _encoder_layer(self, il: int, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """One post-norm encoder layer: x (T, hidden) -> x (T, hidden)."""
        cfg, b = self.cfg, f"blk.{il}."
        w, linear = (lambda name: self.w(b + name)), (lambda a, name: self.linear(a, b + name))
        T, H, hd = len(pos), cfg.n_heads, cfg.head_dim

        # projections: fused QKV (nomic-bert) or apart (bert), with the biases the file has
        if cfg.qkv_fused:
            q, k, v = np.split(linear(x, "attn_qkv"), 3, axis=1)        # (T, hidden) each
        else:
            q, k, v = linear(x, "attn_q"), linear(x, "attn_k"), linear(x, "attn_v")
        q, k, v = q.reshape(T, H, hd), k.reshape(T, H, hd), v.reshape(T, H, hd)

        # RoPE (nomic-bert), then attention of every token to every token
        if cfg.n_rot:
            q = ops.rope(q, pos, cfg.rope_theta, cfg.rope_neox, cfg.n_rot)
            k = ops.rope(k, pos, cfg.rope_theta, cfg.rope_neox, cfg.n_rot)
        att = ops.attention(q, k, v, pos, cfg.attention_scale, causal=False)   # (T, H, hd)
        xb = linear(att.reshape(T, H * hd), "attn_output")               # (T, hidden)

        # residual, then the post-attention LayerNorm
        x = ops.layer_norm(x + xb, w("attn_output_norm.weight"), w("attn_output_norm.bias"), cfg.eps)

        # feed-forward: SwiGLU (nomic-bert) or GELU (bert), residual, then the output LayerNorm
        if cfg.ffn_gated:
            hb = self.glu(linear(x, "ffn_gate"), linear(x, "ffn_up"))   # (T, ff)
        else:
            hb = ops.gelu_tanh(linear(x, "ffn_up"))                      # (T, ff)
        xb = linear(hb, "ffn_down")                                      # (T, hidden)
        return ops.layer_norm(x + xb, w("layer_output_norm.weight"), w("layer_output_norm.bias"), cfg.eps)

    def _shortconv(self, il: int, xb: np.ndarray) -> np.ndarray:
        """LFM2's gated short convolution of xb (T, hidden), normed, -> (T, hidden)."""
        b = f"blk.{il}."
        bcx = self.matmul(xb, b + "shortconv.in_proj.weight")           # (T, 3*hidden): B, C, x
        y, new_state = ops.shortconv(bcx, self.w(b + "shortconv.conv.weight"),
                                     self.conv_state[il])               # (T, hidden), (kernel-1, hidden)
        self.conv_state[il][...] = new_state                             # roll the state forward
        return self.matmul(y, b + "shortconv.out_proj.weight")          # (T, hidden)
