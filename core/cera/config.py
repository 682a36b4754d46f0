"""Model configuration per architecture, read from a GGUF header and checked at load.

`ModelConfig.from_gguf(gguf_file)` reads the hyperparameters under their GGUF key names
(`{arch}.attention.head_count_kv`, ...), derives what the forward pass needs (head_dim,
RoPE layout, attention scale, per-layer block kinds) and gates every per-arch difference on
metadata and tensor presence, on one code path. Anything the engine cannot run correctly
raises a ValueError that names what is wrong, never a silent default.

Gemma 3 adds per-layer attention: most layers are local (sliding-window attention with their
own RoPE base), every n-th is global, as llama.cpp's `load_swa_pattern` lays them out; the
per-layer tuples `layer_window`, `layer_rope_theta` and `layer_rope_freq_scale` hold the
result for every arch (uniform for the others). Gemma 2 alternates local and global layers
on one RoPE base and soft-caps the attention scores and the final logits (cap * tanh(x / cap)).

Phi-3 (`phi3`) stores q, k, v as one matrix (attn_qkv) and the FFN's gate and up as one
(ffn_up, 2*ff rows, gate first); `unfused` presents them as the separate tensors every other
arch has, row ranges of the same bytes, so the file's q | k | v still loads as one stacked
matrix. Its LongRoPE divides each pair's frequency by rope_factors_long or rope_factors_short,
long where the context exceeds rope.scaling.original_context_length (`ModelConfig.rope_factors`),
and scales the rotated pairs by rope.scaling.attn_factor.
"""
from __future__ import annotations

import math
import reprlib
from dataclasses import dataclass, replace

from cera.errors import BadFile, InvalidArgument, Unsupported

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "granite", "lfm2", "gemma2", "gemma3", "phi3")
SUPPORTED_ARCHS += ("nomic-bert", "bert")

# RoPE layout per arch, as llama.cpp's llama_model_rope_type assigns it:
# NORM rotates interleaved pairs (2i, 2i+1); NEOX rotates split halves (i, i + n_rot/2).
# NONE: no RoPE (bert adds learned position embeddings instead).
ROPE_NORM, ROPE_NEOX, ROPE_NONE = "norm", "neox", "none"
ROPE_LAYOUT = {"llama": ROPE_NORM, "granite": ROPE_NORM,
               "qwen2": ROPE_NEOX, "qwen3": ROPE_NEOX, "lfm2": ROPE_NEOX,
               "gemma2": ROPE_NEOX, "gemma3": ROPE_NEOX, "phi3": ROPE_NEOX}
ROPE_LAYOUT.update({"nomic-bert": ROPE_NEOX, "bert": ROPE_NONE})

MAX_HEAD_DIM = 256   # the attention kernels' maximum head size

ATTENTION, CONV = "attention", "conv"   # per-layer block kinds (lfm2 mixes them)

# The GLU's activation on the gate: SwiGLU silu(gate) * up, or GeGLU gelu(gate) * up with
# the tanh-approximated GELU (llama.cpp's LLM_FFN_GELU; Gemma).
FFN_SILU, FFN_GELU = "silu", "gelu_tanh"

# What llama.cpp's gemma2 and gemma3 loaders fix by arch rather than reading from the GGUF:
# GeGLU; the embedding scaled by sqrt(hidden); post-attention / post-FFN norms (required
# tensors); the attention scale 1/sqrt(query_pre_attn_scalar), hidden/n_heads for the 27B
# models (GEMMA_27B_LAYERS), head_dim for the others (attention.scale is not read).
GEMMA = ("gemma2", "gemma3")
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}
# gemma3: QK-norm (required tensors); local layers every layer but each n-th
# (`sliding_window_pattern` defaults to 6: layers 5, 11, 17, ... are global); local layers'
# RoPE base 10000 unless `rope.freq_base_swa` says otherwise (llama_hparams::rope_freq_base_train_swa).
SWA_PATTERN_DEFAULT = 6
LOCAL_ROPE_THETA_DEFAULT = 10000.0
# gemma2: even layers local, odd global (set_swa_pattern(2); the pattern key is not read), the
# window 4096 unless `attention.sliding_window` says otherwise, every layer on the one RoPE base
# and scale; attention scores and final logits soft-capped, by `attn_logit_softcapping` and
# `final_logit_softcapping` or llama_hparams' defaults 50 and 30.
GEMMA2_WINDOW_DEFAULT = 4096
GEMMA2_SOFTCAPS_DEFAULT = (50.0, 30.0)

# Phi-3: the archs whose GGUF fuses q, k, v into attn_qkv and gate, up into ffn_up (`unfused`).
# Its attention.sliding_window is read by llama.cpp and then switched off (llama_model_phi3::
# load_arch_hparams: "Phi SWA is currently disabled"), so every phi3 layer attends to all
# positions here too. LongRoPE's long factors apply where the context, rounded up to a multiple of
# LLAMA_CTX_PAD as llama.cpp pads n_ctx, exceeds rope.scaling.original_context_length
# (llama_model::get_rope_factors); Llama 3's rope_freqs.weight, where present, wins over both.
FUSED_ARCHS = ("phi3",)
LLAMA_CTX_PAD = 256
ROPE_FACTORS, ROPE_LONG, ROPE_SHORT = "rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"

# Encoders (llama.cpp's llm_build_bert): every token attends to every token, post-LayerNorm
# blocks, no LM head; the header's `{arch}.pooling_type` (llama_pooling_type) says how the
# rows become one embedding. The forward pass reads the tensors named here.
ENCODERS = ("nomic-bert", "bert")
POOLING_TYPES = {0: "none", 1: "mean", 2: "cls", 3: "last"}   # 4 (rank) needs a classifier head


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layers: int
    hidden: int                      # embedding_length
    ff: int                          # feed_forward_length
    n_heads: int
    n_kv_heads: tuple[int, ...]      # per layer; 0 for a layer without attention (lfm2 conv)
    head_dim: int
    n_rot: int                       # rotated dims per head (rope.dimension_count)
    rope_theta: float                # rope.freq_base
    rope_layout: str                 # ROPE_NORM or ROPE_NEOX
    rope_freq_scale: float           # 1 / rope.scaling.factor for linear scaling, else 1
    eps: float                       # RMSNorm epsilon
    vocab_size: int
    embedding_rows: int              # rows of token_embd.weight (>= vocab_size)
    context_length: int
    block_kinds: tuple[str, ...]     # per layer: ATTENTION or CONV
    conv_kernel: int                 # shortconv.l_cache (lfm2), else 0
    tied_embeddings: bool            # no output.weight: the LM head is token_embd.weight
    qkv_bias: bool                   # blk.N.attn_{q,k,v}.bias (qwen2)
    qk_norm: bool                    # blk.N.attn_{q,k}_norm.weight (qwen3, lfm2, gemma3)
    rope_freq_factors: bool          # rope_freqs.weight (Llama 3)
    rope_long_short: tuple[bool, bool]   # rope_factors_long / _short.weight present (Phi-3 LongRoPE)
    rope_original_context: int       # rope.scaling.original_context_length (LongRoPE's switch)
    rope_attn_factor: float          # rope.scaling.attn_factor: the rotated pairs are scaled by it
    attention_scale: float           # attention.scale, else 1/sqrt(head_dim)
    embedding_scale: float           # granite; 1 elsewhere
    residual_scale: float            # granite; 1 elsewhere
    logit_scale: float               # granite: logits are divided by it; 1 elsewhere
    final_norm: str                  # tensor name of the norm before the LM head
    lm_head: str                     # tensor name of the LM head
    ffn_act: str                     # FFN_SILU (SwiGLU) or FFN_GELU (GeGLU, tanh GELU; gemma)
    post_norms: bool                 # RMSNorm of the attention output (post_attention_norm) and
                                     # of the FFN output (post_ffw_norm) before each residual add
    sliding_window: int              # attention.sliding_window of the local layers; 0 = none
    layer_window: tuple[int, ...]    # per layer: a row at pos sees keys pos-window+1..pos; 0 = all
    layer_rope_theta: tuple[float, ...]       # per layer RoPE base (local layers: freq_base_swa)
    layer_rope_freq_scale: tuple[float, ...]  # per layer (gemma3: linear scaling applies to global layers)
    attn_softcap: float = 0.0        # gemma2: attention scores -> cap * tanh(score / cap); 0 = none
    final_softcap: float = 0.0       # gemma2: logits -> cap * tanh(logit / cap); 0 = none
    # encoders (ENCODERS); the defaults are every decoder's
    encoder: bool = False            # non-causal, post-LayerNorm blocks, no LM head (llm_build_bert)
    pooling: str = "none"            # the header's pooling (POOLING_TYPES)
    qkv_fused: bool = False          # blk.N.attn_qkv.weight (3*hidden, hidden) (nomic-bert)
    ffn_gated: bool = True           # act(gate) * up; False: act(up) (bert's GELU FFN)
    position_embeddings: bool = False   # position_embd.weight added to the input (bert)
    token_types: bool = False        # token_types.weight: type 0's row added to the input
    n_token_types: int = 0           # its rows
    biases: tuple[str, ...] = ()     # the bias tensors the file has, beside their weights

    # --- derived -------------------------------------------------------------------------
    @property
    def rope_neox(self) -> bool:
        return self.rope_layout == ROPE_NEOX

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    def kv_dim(self, layer: int) -> int:
        return self.n_kv_heads[layer] * self.head_dim

    @property
    def local_layers(self) -> tuple[int, ...]:
        """The sliding-window (local) attention layers."""
        return tuple(i for i, w in enumerate(self.layer_window) if w)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.block_kinds) if k == ATTENTION)

    @property
    def conv_layers(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.block_kinds) if k == CONV)

    def rope_factors(self, ctx: int) -> str | None:
        """The frequency factors' tensor for a context of ctx positions: Llama 3's, else
        LongRoPE's long ones if the padded context exceeds the original one, else its short ones."""
        if self.rope_freq_factors:
            return ROPE_FACTORS
        long = -(-ctx // LLAMA_CTX_PAD) * LLAMA_CTX_PAD > self.rope_original_context
        if self.rope_long_short[0 if long else 1]:
            return ROPE_LONG if long else ROPE_SHORT
        return None

    def context(self, requested: int | None = None) -> int:
        """The context to allocate: the requested one capped at the model's context_length."""
        if requested is None:
            return self.context_length
        if requested <= 0:
            raise InvalidArgument(f"requested context {requested} must be positive")
        return min(requested, self.context_length)

    def check_tokens(self, tokens) -> None:
        for t in tokens:
            if not 0 <= int(t) < self.vocab_size:
                raise InvalidArgument(f"token id {int(t)} out of range: vocab_size is {self.vocab_size}")

    def layer_tensors(self, layer: int) -> dict[str, tuple[int, ...]]:
        """Every tensor layer `layer` needs -> its numpy shape."""
        if self.encoder:
            return self._encoder_layer_tensors(layer)
        b, h, hd = f"blk.{layer}.", self.hidden, self.head_dim
        t = {b + "attn_norm.weight": (h,), b + "ffn_norm.weight": (h,),
             b + "ffn_gate.weight": (self.ff, h), b + "ffn_up.weight": (self.ff, h),
             b + "ffn_down.weight": (h, self.ff)}
        if self.block_kinds[layer] == CONV:
            t[b + "shortconv.in_proj.weight"] = (3 * h, h)
            t[b + "shortconv.conv.weight"] = (h, self.conv_kernel)
            t[b + "shortconv.out_proj.weight"] = (h, h)
            return t
        kv = self.kv_dim(layer)
        t[b + "attn_q.weight"] = (self.q_dim, h)
        t[b + "attn_k.weight"] = (kv, h)
        t[b + "attn_v.weight"] = (kv, h)
        t[b + "attn_output.weight"] = (h, self.q_dim)
        if self.qkv_bias:
            t.update({b + "attn_q.bias": (self.q_dim,), b + "attn_k.bias": (kv,), b + "attn_v.bias": (kv,)})
        if self.qk_norm:
            t.update({b + "attn_q_norm.weight": (hd,), b + "attn_k_norm.weight": (hd,)})
        if self.post_norms:
            t.update({b + "post_attention_norm.weight": (h,), b + "post_ffw_norm.weight": (h,)})
        return t

    def _encoder_layer_tensors(self, layer: int) -> dict[str, tuple[int, ...]]:
        """An encoder layer's tensors (llm_build_bert): QKV (fused or not), the output
        projection, post-attention and post-FFN LayerNorms (weight and bias), the FFN (gated
        or not), and the biases the file has."""
        b, h = f"blk.{layer}.", self.hidden
        t = {b + "attn_output.weight": (h, h), b + "ffn_up.weight": (self.ff, h),
             b + "ffn_down.weight": (h, self.ff)}
        if self.qkv_fused:
            t[b + "attn_qkv.weight"] = (3 * h, h)
        else:
            t.update({b + f"attn_{x}.weight": (h, h) for x in "qkv"})
        if self.ffn_gated:
            t[b + "ffn_gate.weight"] = (self.ff, h)
        for norm in ("attn_output_norm", "layer_output_norm"):
            t.update({b + norm + ".weight": (h,), b + norm + ".bias": (h,)})
        t.update({b + name + ".bias": (t[b + name + ".weight"][0],) for name in self.biases})
        return t

    def all_tensors(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the model needs -> its numpy shape (the LM head's rows are checked apart)."""
        if self.encoder:
            t = {"token_embd.weight": (self.embedding_rows, self.hidden),
                 "token_embd_norm.weight": (self.hidden,), "token_embd_norm.bias": (self.hidden,)}
            if self.token_types:
                t["token_types.weight"] = (self.n_token_types, self.hidden)
            if self.position_embeddings:
                t["position_embd.weight"] = (self.context_length, self.hidden)
            for i in range(self.n_layers):
                t.update(self.layer_tensors(i))
            return t
        t = {"token_embd.weight": (self.embedding_rows, self.hidden), self.final_norm: (self.hidden,)}
        present = (self.rope_freq_factors, *self.rope_long_short)
        t.update({name: (self.n_rot // 2,) for name, here in zip((ROPE_FACTORS, ROPE_LONG, ROPE_SHORT), present) if here})
        for i in range(self.n_layers):
            t.update(self.layer_tensors(i))
        return t

    # --- loading -------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, gguf_file) -> "ModelConfig":
        md, tensors = gguf_file.metadata, gguf_file.tensors
        arch = md.get("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise Unsupported(f"unsupported architecture {reprlib.repr(arch)}: cera runs {', '.join(SUPPORTED_ARCHS)}")
        if arch not in ROPE_LAYOUT:
            raise Unsupported(f"architecture {reprlib.repr(arch)} has no RoPE layout mapping")

        def key(name, default=None, required=False):
            k = f"{arch}.{name}"
            if k in md:
                return md[k]
            if required:
                raise BadFile(f"GGUF metadata key {k} missing")
            return default

        def integer(name, default=None, required=False, least=None):
            """A key that must be an integer (a GGUF int of any width), and at least `least`."""
            value = key(name, default, required)
            if type(value) is not int:
                raise BadFile(f"GGUF metadata key {arch}.{name} is {_shown(value)}, not an integer")
            if least is not None and value < least:
                raise BadFile(f"GGUF metadata key {arch}.{name} is {value}: must be at least {least}")
            return value

        def number(name, default=None, required=False):
            """A key that must be a finite number (a float or an int)."""
            value = key(name, default, required)
            if type(value) not in (int, float, bool) or not math.isfinite(value):
                raise BadFile(f"GGUF metadata key {arch}.{name} is {_shown(value)}, not a finite number")
            return float(value)

        def need(name):
            if name not in tensors:
                raise BadFile(f"tensor {name} missing")
            return tensors[name]

        n_layers = integer("block_count", required=True, least=1)
        if n_layers > len(tensors):   # every layer has tensors: a bound before anything is made per layer
            raise BadFile(f"{arch}.block_count is {n_layers}, more than the file's {len(tensors)} tensors")
        hidden = integer("embedding_length", required=True, least=1)
        ff = integer("feed_forward_length", required=True, least=1)
        n_heads = _uniform(key("attention.head_count", required=True), f"{arch}.attention.head_count")
        if n_heads <= 0:
            raise BadFile(f"{arch}.attention.head_count is {n_heads}: must be positive")
        if arch in ENCODERS:
            return _encoder(cls, arch, md, tensors, key, integer, number, need, n_layers, hidden, ff, n_heads)
        kv_raw = key("attention.head_count_kv", n_heads)
        n_kv = tuple(_ints(kv_raw, f"{arch}.attention.head_count_kv")) if isinstance(kv_raw, list) else (
            (integer("attention.head_count_kv", n_heads),) * n_layers)
        if len(n_kv) != n_layers:
            raise BadFile(f"{arch}.attention.head_count_kv has {len(n_kv)} entries for {n_layers} layers")

        # block kind per layer from tensor presence; head_count_kv 0 must agree (llama.cpp's test)
        kinds = []
        for i in range(n_layers):
            has_attn = f"blk.{i}.attn_q.weight" in tensors
            has_conv = f"blk.{i}.shortconv.in_proj.weight" in tensors
            if not has_attn and f"blk.{i}.attn_qkv.weight" in tensors:   # left fused: `unfused` could not split it
                raise BadFile(f"tensor blk.{i}.attn_qkv.weight has shape {tensors[f'blk.{i}.attn_qkv.weight'].shape}: "
                              "its rows are not q, k, v of the header's head counts and head size")
            if arch in FUSED_ARCHS and f"blk.{i}.ffn_gate.weight" not in tensors and f"blk.{i}.ffn_up.weight" in tensors:
                raise BadFile(f"tensor blk.{i}.ffn_up.weight has shape {tensors[f'blk.{i}.ffn_up.weight'].shape}: "
                              f"{arch} fuses gate and up, 2 * feed_forward_length rows")
            if has_conv and arch != "lfm2":
                raise BadFile(f"layer {i} has short-conv tensors, which {arch} does not use")
            if has_attn == has_conv:
                raise BadFile(f"tensor blk.{i}.attn_q.weight missing" if not has_attn else
                                 f"layer {i} has both attention and short-conv tensors")
            kinds.append(ATTENTION if has_attn else CONV)
            if has_attn and (n_kv[i] <= 0 or n_heads % n_kv[i]):
                raise BadFile(f"layer {i}: head_count {n_heads} is not a positive multiple of "
                                 f"head_count_kv {n_kv[i]}")
            if has_conv and n_kv[i] != 0:
                raise BadFile(f"layer {i} is a short-conv block but head_count_kv is {n_kv[i]} (expected 0)")

        head_dim = integer("attention.key_length", 0, least=0) or hidden // n_heads
        if not key("attention.key_length") and hidden % n_heads or hidden < n_heads:
            raise BadFile(f"embedding_length {hidden} is not a multiple of head_count {n_heads}")
        v_len = key("attention.value_length")
        if v_len is not None and integer("attention.value_length") != head_dim:
            raise Unsupported(f"attention.value_length {v_len} != key_length {head_dim}: unsupported")
        if head_dim > MAX_HEAD_DIM:
            raise Unsupported(f"head_dim {head_dim} exceeds the attention kernels' maximum {MAX_HEAD_DIM}")
        n_rot = integer("rope.dimension_count", head_dim)
        if n_rot % 2 or not 0 <= n_rot <= head_dim:
            raise BadFile(f"rope.dimension_count {n_rot} must be even and <= head_dim {head_dim}")

        scaling = key("rope.scaling.type", "none")
        factor = number("rope.scaling.factor", 1.0) or 1.0
        if scaling == "linear":
            freq_scale = 1.0 / factor
        elif scaling == "none" or factor == 1.0:
            freq_scale = 1.0
        else:
            raise Unsupported(f"rope scaling {reprlib.repr(scaling)} (factor {factor}) is not supported")

        embd, vocab_size = _embeddings(need, integer, hidden)

        tied = "output.weight" not in tensors
        lm_head = "token_embd.weight" if tied else "output.weight"
        head = tensors[lm_head]
        if len(head.shape) != 2 or head.shape[1] != hidden:
            raise BadFile(f"LM head {lm_head} has k = {head.shape[-1]}, expected hidden_size {hidden}")
        if head.shape[0] < vocab_size:
            raise BadFile(f"LM head {lm_head} has {head.shape[0]} rows, fewer than vocab_size {vocab_size}")

        # lfm2 names its final norm token_embd_norm (gguf-py's mapping of model.embedding_norm)
        final_norm = "output_norm.weight"
        if final_norm not in tensors and arch == "lfm2" and "token_embd_norm.weight" in tensors:
            final_norm = "token_embd_norm.weight"

        first_attn = next((i for i, k in enumerate(kinds) if k == ATTENTION), None)
        has = (lambda suffix: first_attn is not None and f"blk.{first_attn}.{suffix}" in tensors)
        conv_kernel = integer("shortconv.l_cache", 0) if CONV in kinds else 0
        if CONV in kinds and conv_kernel < 2:
            raise BadFile(f"{arch}.shortconv.l_cache is {conv_kernel}: a short-conv model needs >= 2")
        attn_scale = number("attention.scale", 0.0) or 1.0 / math.sqrt(head_dim)
        if arch in GEMMA:
            # llama.cpp (after gemma_pytorch): query_pre_attn_scalar is hidden/n_heads for the
            # 27B models, head_dim for every other size; attention.scale is not read
            attn_scale = 1.0 / math.sqrt(hidden // n_heads if n_layers == GEMMA_27B_LAYERS[arch] else head_dim)
        if arch == "gemma3" and number("final_logit_softcapping", 0.0):
            raise Unsupported(f"{arch}.final_logit_softcapping is set: llama.cpp's gemma3 does not soft-cap logits")
        softcaps = (0.0, 0.0)
        if arch == "gemma2":
            softcaps = tuple(number(name, default) for name, default in
                             zip(("attn_logit_softcapping", "final_logit_softcapping"), GEMMA2_SOFTCAPS_DEFAULT))
            if min(softcaps) <= 0:
                raise BadFile(f"{arch}.attn_logit_softcapping / final_logit_softcapping are {softcaps}: "
                              f"a soft-cap must be positive")
        rope_theta = number("rope.freq_base", 10000.0)
        context_length = integer("context_length", required=True, least=1)
        window, local = _sliding_window(key, integer, arch, n_layers)
        local_theta, local_scale = ((rope_theta, freq_scale) if arch == "gemma2" else
                                    (number("rope.freq_base_swa", LOCAL_ROPE_THETA_DEFAULT), 1.0))

        cfg = cls(
            arch=arch, n_layers=n_layers, hidden=hidden, ff=ff, n_heads=n_heads, n_kv_heads=n_kv,
            head_dim=head_dim, n_rot=n_rot, rope_theta=rope_theta,
            rope_layout=ROPE_LAYOUT[arch], rope_freq_scale=freq_scale,
            eps=number("attention.layer_norm_rms_epsilon", required=True),
            vocab_size=vocab_size, embedding_rows=embd.shape[0],
            context_length=context_length,
            block_kinds=tuple(kinds), conv_kernel=conv_kernel, tied_embeddings=tied,
            qkv_bias=has("attn_q.bias"), qk_norm=has("attn_q_norm.weight") or arch == "gemma3",
            rope_freq_factors=ROPE_FACTORS in tensors, rope_long_short=(ROPE_LONG in tensors, ROPE_SHORT in tensors),
            rope_original_context=integer("rope.scaling.original_context_length", context_length, least=1),
            rope_attn_factor=number("rope.scaling.attn_factor", 1.0), attention_scale=attn_scale,
            embedding_scale=math.sqrt(hidden) if arch in GEMMA else number("embedding_scale", 1.0) or 1.0,
            residual_scale=number("residual_scale", 1.0) or 1.0,
            logit_scale=number("logit_scale", 1.0) or 1.0,
            final_norm=final_norm, lm_head=lm_head,
            ffn_act=FFN_GELU if arch in GEMMA else FFN_SILU, post_norms=arch in GEMMA,
            sliding_window=window, layer_window=tuple(window if loc else 0 for loc in local),
            layer_rope_theta=tuple(local_theta if loc else rope_theta for loc in local),
            layer_rope_freq_scale=tuple(local_scale if loc else freq_scale for loc in local),
            attn_softcap=softcaps[0], final_softcap=softcaps[1])
        for name, shape in cfg.all_tensors().items():
            if need(name).shape != shape:
                raise BadFile(f"tensor {name} has shape {tensors[name].shape}, expected {shape}")
        return cfg


def _embeddings(need, integer, hidden: int):
    """token_embd.weight and the vocabulary size (its rows, unless the header names fewer)."""
    embd = need("token_embd.weight")
    if len(embd.shape) != 2 or embd.shape[1] != hidden:
        raise BadFile(f"tensor token_embd.weight has shape {embd.shape}, expected (n_vocab, {hidden})")
    vocab_size = integer("vocab_size", 0, least=0) or embd.shape[0]
    if embd.shape[0] < vocab_size:
        raise BadFile(f"token_embd.weight has {embd.shape[0]} rows, fewer than vocab_size {vocab_size}")
    return embd, vocab_size


def _encoder(cls, arch, md, tensors, key, integer, number, need, n_layers, hidden, ff, n_heads) -> ModelConfig:
    """An encoder's config (ENCODERS), as llama.cpp's bert / nomic-bert loader reads it."""
    if hidden % n_heads:
        raise BadFile(f"embedding_length {hidden} is not a multiple of head_count {n_heads}")
    head_dim = hidden // n_heads
    if head_dim > MAX_HEAD_DIM:
        raise Unsupported(f"head_dim {head_dim} exceeds the attention kernels' maximum {MAX_HEAD_DIM}")
    if integer("attention.head_count_kv", n_heads) != n_heads:
        raise Unsupported(f"{arch}.attention.head_count_kv differs from head_count: unsupported for encoders")
    if key("attention.causal", False):
        raise Unsupported(f"{arch}.attention.causal is true: cera runs {arch} as a bidirectional encoder only")
    pooling_type = integer("pooling_type", 0)
    if pooling_type not in POOLING_TYPES:
        raise Unsupported(f"{arch}.pooling_type {pooling_type} is not supported (cera pools: "
                          f"{', '.join(f'{k} ({v})' for k, v in POOLING_TYPES.items())})")
    rope = ROPE_LAYOUT[arch]
    n_rot = integer("rope.dimension_count", head_dim) if rope != ROPE_NONE else 0
    if n_rot % 2 or not 0 <= n_rot <= head_dim:
        raise BadFile(f"rope.dimension_count {n_rot} must be even and <= head_dim {head_dim}")
    if key("rope.scaling.type", "none") not in ("none", None) and number("rope.scaling.factor", 1.0) not in (0.0, 1.0):
        raise Unsupported(f"{arch}: rope scaling is not supported")

    embd, vocab_size = _embeddings(need, integer, hidden)
    types = tensors.get("token_types.weight")
    n_types = types.shape[0] if types is not None and len(types.shape) == 2 else 0
    if types is not None and n_types < 1:
        raise BadFile(f"tensor token_types.weight has shape {types.shape}, expected (n_types, {hidden})")
    for i in range(n_layers):
        if f"blk.{i}.attn_qkv.weight" not in tensors and f"blk.{i}.attn_q.weight" not in tensors:
            raise BadFile(f"tensor blk.{i}.attn_qkv.weight missing (nor blk.{i}.attn_q.weight)")
    fused = "blk.0.attn_qkv.weight" in tensors
    gated = arch == "nomic-bert"
    weights = ("attn_qkv",) if fused else ("attn_q", "attn_k", "attn_v")
    weights += ("attn_output", "ffn_up", "ffn_down") + (("ffn_gate",) if gated else ())
    context = integer("context_length", required=True, least=1)
    theta = number("rope.freq_base", 10000.0)
    cfg = cls(
        arch=arch, n_layers=n_layers, hidden=hidden, ff=ff, n_heads=n_heads, n_kv_heads=(n_heads,) * n_layers,
        head_dim=head_dim, n_rot=n_rot, rope_theta=theta, rope_layout=rope, rope_freq_scale=1.0,
        eps=number("attention.layer_norm_epsilon", required=True), vocab_size=vocab_size,
        embedding_rows=embd.shape[0], context_length=context, block_kinds=(ATTENTION,) * n_layers,
        conv_kernel=0, tied_embeddings=False, qkv_bias=False, qk_norm=False, rope_freq_factors=False,
        rope_long_short=(False, False), rope_original_context=context, rope_attn_factor=1.0,
        attention_scale=1.0 / math.sqrt(head_dim), embedding_scale=1.0, residual_scale=1.0, logit_scale=1.0,
        final_norm="", lm_head="", ffn_act=FFN_SILU if gated else FFN_GELU, post_norms=False,
        sliding_window=0, layer_window=(0,) * n_layers, layer_rope_theta=(theta,) * n_layers,
        layer_rope_freq_scale=(1.0,) * n_layers,
        encoder=True, pooling=POOLING_TYPES[pooling_type], qkv_fused=fused, ffn_gated=gated,
        position_embeddings=arch == "bert", token_types=types is not None, n_token_types=n_types,
        biases=tuple(w for w in weights if f"blk.0.{w}.bias" in tensors))
    for name, shape in cfg.all_tensors().items():
        if need(name).shape != shape:
            raise BadFile(f"tensor {name} has shape {tensors[name].shape}, expected {shape}")
    return cfg

def unfused(metadata: dict, tensors: dict) -> tuple[dict, dict[str, tuple[str, ...]]]:
    """For a FUSED_ARCHS model, its tensors with each blk.N.attn_qkv.weight read as attn_q, attn_k,
    attn_v.weight (rows q_dim, kv_dim, kv_dim, as llama.cpp's build_qkv views them) and each
    ffn_up.weight of 2*ff rows as ffn_gate.weight then ffn_up.weight (the halves ggml_swiglu
    takes: silu of the first times the second): row ranges of the same bytes, no copy. Also
    the fused names -> their parts' names (cera.lora splits an adapter's pairs by them). Where
    the header does not say how to split (a missing or odd key, rows that do not add up), the
    tensors stay as they are and ModelConfig.from_gguf names what is missing."""
    arch = metadata.get("general.architecture")
    if arch not in FUSED_ARCHS:
        return tensors, {}
    get = lambda name: metadata.get(f"{arch}.{name}")
    hidden, n_heads, ff = get("embedding_length"), get("attention.head_count"), get("feed_forward_length")
    n_kv, head_dim = get("attention.head_count_kv") or n_heads, get("attention.key_length")
    if not all(type(v) is int and v > 0 for v in (hidden, n_heads, ff, n_kv)):
        return tensors, {}
    head_dim = head_dim if type(head_dim) is int and head_dim > 0 else hidden // n_heads
    out, fused = dict(tensors), {}
    for name, info in tensors.items():
        if name.endswith(".attn_qkv.weight"):
            parts = dict(q=n_heads * head_dim, k=n_kv * head_dim, v=n_kv * head_dim)
            parts = {name.replace("attn_qkv", f"attn_{p}"): rows for p, rows in parts.items()}
        elif name.endswith(".ffn_up.weight") and name.replace("ffn_up", "ffn_gate") not in tensors:
            parts = {name.replace("ffn_up", "ffn_gate"): ff, name: ff}
        else:
            continue
        if len(info.ne) != 2 or info.ne[1] != sum(parts.values()) or any(p in tensors for p in parts if p != name):
            continue
        row_bytes, offset = info.nbytes // info.ne[1], info.offset
        del out[name]
        for part, rows in parts.items():
            out[part] = replace(info, name=part, ne=(info.ne[0], rows), offset=offset, nbytes=rows * row_bytes)
            offset += rows * row_bytes
        fused[name] = tuple(parts)
    return out, fused


def unfused_adapter(tensors: dict, fused: dict[str, tuple[str, ...]], model_tensors: dict) -> dict:
    """A LoRA adapter's tensors with each pair on a fused matrix of the model (`unfused`'s record)
    read as a pair per part: lora_a (rank, in) the same for every part, lora_b's rows split as the
    fused matrix's are (W x + s B (A x) taken a row range at a time). Pairs whose lora_b does not
    have the fused matrix's rows stay, and cera.lora names them."""
    out = dict(tensors)
    for name, parts in fused.items():
        a, b = tensors.get(f"{name}.lora_a"), tensors.get(f"{name}.lora_b")
        rows = [model_tensors[p].shape[0] for p in parts]
        if a is None or b is None or len(b.ne) != 2 or b.ne[1] != sum(rows):
            continue
        del out[f"{name}.lora_a"], out[f"{name}.lora_b"]
        row_bytes, offset = b.nbytes // b.ne[1], b.offset
        for part, n in zip(parts, rows):
            out[f"{part}.lora_a"] = replace(a, name=f"{part}.lora_a")
            out[f"{part}.lora_b"] = replace(b, name=f"{part}.lora_b", ne=(b.ne[0], n), offset=offset,
                                            nbytes=n * row_bytes)
            offset += n * row_bytes
    return out


def _sliding_window(key, integer, arch: str, n_layers: int) -> tuple[int, tuple[bool, ...]]:
    """(window, local per layer) as llama.cpp's gemma loaders read them. gemma2: even layers
    local, attention.sliding_window (default 4096) their window. gemma3: only with a positive
    attention.sliding_window; attention.sliding_window_pattern is a bool per layer, or n:
    layer i is local unless i % n == n - 1 (n = 0: every layer local)."""
    if arch == "gemma2":
        window = integer("attention.sliding_window", GEMMA2_WINDOW_DEFAULT, least=1)
        return window, tuple(i % 2 == 0 for i in range(n_layers))
    window = integer("attention.sliding_window", 0) if arch in GEMMA else 0
    if window <= 0:
        return 0, (False,) * n_layers
    pattern = key("attention.sliding_window_pattern", SWA_PATTERN_DEFAULT)
    if isinstance(pattern, list):
        if len(pattern) != n_layers:
            raise BadFile(f"{arch}.attention.sliding_window_pattern has {len(pattern)} entries "
                             f"for {n_layers} layers")
        return window, tuple(bool(p) for p in pattern)
    n = integer("attention.sliding_window_pattern", SWA_PATTERN_DEFAULT)
    return window, tuple(n == 0 or i % n < n - 1 for i in range(n_layers))


def _uniform(value, key: str) -> int:
    """A per-layer array whose entries must all be equal, or a scalar."""
    if isinstance(value, list):
        values = set(_ints(value, key))
        if len(values) != 1:
            raise Unsupported(f"{key} varies per layer ({reprlib.repr(value)}): unsupported")
        return values.pop()
    return next(_ints([value], key))


def _ints(values: list, key: str):
    """The entries of a GGUF array that must hold integers."""
    for v in values:
        if type(v) is not int:
            raise BadFile(f"GGUF metadata key {key} holds {_shown(v)}, not an integer")
        yield v


def _shown(value) -> str:
    """A metadata value in a message: its type, and the value itself if short."""
    return f"a {type(value).__name__} ({reprlib.repr(value)})"
