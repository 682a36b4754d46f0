"""Dispatch builders for the kernels beside the matrices and attention: norms (shaders/rms_norm,
layer_norm), RoPE and the KV cache's writes and shifts (rope, kv_shift), LFM2's short conv
(shortconv), the GLU (glu_act), the embedding lookup (embed), the logits' soft-cap and argmax
(logit_softcap, argmax) and the greedy step's end (greedy_advance).

Each builder compiles (once, through `cera.kernels.Kernels`) the variant its arguments need,
binds the buffers in the shader's order and returns a `cera.device.Dispatch` sized for the most
rows a step of the schedule carries.
Outputs come first, as in cera.gpu.matvec and matmul.
Buffer arguments are GPU buffers or `cera.device.Binding` ranges of one. All activations are
f32, row-major, one row per token of the step; `step` is the Step uniform (cera.gpu.state).
The KV caches hold K and V as `cache_types` says ((K's, V's): "f32", "f16" packed two to a
u32, or "q8_0" blocks, cera.gpu.numerics.cache_flags), each builder of a kernel that reads or writes them taking it.
Kernels that are batch-aware read `step.n_tokens` and do nothing for rows past it, so one
dispatch built for `max_tokens` rows serves every step of up to that many tokens.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from cera.config import FFN_GELU, FFN_SILU
from cera.device import Binding, Dispatch
from cera.errors import InvalidArgument, Unsupported
from cera.gpu.numerics import F32_CACHE, cache_flags, cache_row_bytes
from cera.gpu.quant import byte_range, row_bytes, row_tiles, units_per_row, weight_flags, weight_type
from cera.kernels import flags


EMBED_WORKGROUP = 64           # units per embed workgroup (WG in embed.wgsl)
SHORTCONV_WORKGROUP = 64       # channels per shortconv workgroup (WG in shortconv.wgsl)
GLU_WORKGROUP = 64             # elements per glu_act workgroup (WG in glu_act.wgsl)
SOFTCAP_WORKGROUP = 256        # logits per logit_softcap workgroup (WG in logit_softcap.wgsl)


def grid(n: int, limits) -> tuple[int, int]:
    """n workgroups as two dimensions' counts within the per-dimension limit (the kernel flattens
    them)."""
    most = limits.max_compute_workgroups_per_dimension
    if n <= most:
        return max(n, 1), 1
    outer = -(-n // most)
    return -(-n // outer), outer


def gelu_flag(act: str, w_up) -> bool:
    """Whether the GLU's gate activation is GELU (the GELU define); act applies to a GLU only."""
    if act not in (FFN_SILU, FFN_GELU):
        raise Unsupported(f"GLU activation {act!r}: expected {FFN_SILU!r} or {FFN_GELU!r}")
    if act == FFN_GELU and w_up is None:
        raise InvalidArgument("GELU is the GLU's gate activation: it needs w_up")
    return act == FFN_GELU


def check_heads(n_heads: int, n_kv_heads: int) -> None:
    if n_kv_heads <= 0 or n_heads % n_kv_heads:
        raise InvalidArgument(f"n_heads {n_heads} must be a positive multiple of n_kv_heads {n_kv_heads}")


def rms_norm(kernels, device, out, x, w, step, *, n: int, eps: float,
             rows_per_token: int = 1, max_tokens: int = 1, accumulate: bool = False,
             label: str = "rms_norm") -> Dispatch:
    """out = rms_norm(x) * w over rows of length n; with accumulate, out += rms_norm(x) * w
    (a post-norm added into the residual stream).

    x, out (tokens, rows_per_token, n); w (n,). rows_per_token = 1 normalizes hidden states
    (n = hidden); rows_per_token = n_heads with n = head_dim is per-head QK-norm."""
    wg = 64 if n <= 256 else 256
    row = 4 * n * rows_per_token * max_tokens
    return kernels.dispatch("rms_norm.wgsl", [x, w, out, step], (rows_per_token, max_tokens, 1), label,
                            reads=row * (1 + accumulate) + 4 * n, writes=row,
                            N=n, ROWS_PER_TOKEN=rows_per_token, EPS=float(eps), WG=wg, **flags(ACCUMULATE=accumulate))


def layer_norm(kernels, device, out, w, b, step, *, n: int, eps: float, max_tokens: int = 1, y=None, v=None,
               label: str = "layer_norm") -> Dispatch:
    """out = layer_norm(out [+ y] [+ v]) * w + b over rows of length n, in place (an encoder's
    post-norm of the residual stream plus a block's output y, or its embedding norm with token
    type 0's row v). out, y (tokens, n); w, b, v (n,)."""
    wg = 64 if n <= 256 else 256
    row = 4 * n * max_tokens
    extra = [t for t in (y, v) if t is not None]
    return kernels.dispatch("layer_norm.wgsl", [out, w, b, step, *extra], (1, max_tokens, 1), label,
                            reads=row * (1 + (y is not None)) + 4 * n * (2 + (v is not None)), writes=row,
                            N=n, EPS=float(eps), WG=wg, **flags(ADD=y is not None, VECTOR=v is not None))


@dataclass(frozen=True)
class Rope:
    """One layer's RoPE (rope_rotate.wgsl) and the per-head QK-norm before it, as rope.wgsl and
    the fused decode attention take them.

    neox: NEOX (split halves, qwen2/qwen3/lfm2) or NORM (interleaved pairs, llama/granite).
    n_rot: rotated dims (None: head_dim). freq_factors: Llama-3 rope_freqs.weight (n_rot/2,).
    freq_scale: linear RoPE scaling, positions times freq_scale (1 / rope.scaling.factor).
    attn_factor: the rotated pairs times it (rope.scaling.attn_factor; Phi-3's LongRoPE).
    qk_norm (2 * head_dim,): the per-head RMSNorm weights of q then of k, applied first (qwen3,
    lfm2, gemma3), with eps: one binding, so rope.wgsl stays within WebGPU's 8 storage buffers."""
    theta: float
    neox: bool
    n_rot: int | None = None
    freq_scale: float = 1.0
    freq_factors: object = None
    qk_norm: object = None
    eps: float | None = None
    attn_factor: float = 1.0

    def defines(self, head_dim: int) -> dict:
        n_rot = head_dim if self.n_rot is None else self.n_rot
        if n_rot % 2 or not 0 <= n_rot <= head_dim:   # 0: q and k pass through (bert's learned positions)
            raise InvalidArgument(f"RoPE: n_rot {n_rot} must be even and in 0..head_dim {head_dim}")
        if self.qk_norm is not None and self.eps is None:
            raise InvalidArgument("QK-norm needs eps")
        defines = dict(N_ROT=n_rot, THETA=float(self.theta), **_freq_scale(self.freq_scale),
                       **({"ATTN_FACTOR": float(self.attn_factor)} if self.attn_factor != 1.0 else {}),
                       **flags(NEOX=self.neox, FREQ_FACTORS=self.freq_factors is not None,
                               QK_NORM=self.qk_norm is not None))
        if self.qk_norm is not None:
            defines["EPS"] = float(self.eps)
        return defines

    def bindings(self) -> list:
        """[freq_factors] then [qk_norm]: what the shader binds after its own buffers."""
        return [b for b in (self.freq_factors, self.qk_norm) if b is not None]


def _freq_scale(freq_scale: float) -> dict:
    """rope_rotate.wgsl's FREQ_SCALE define for linear RoPE scaling (1: none)."""
    return {"FREQ_SCALE": float(freq_scale)} if freq_scale != 1.0 else {}


def rope_kv(kernels, device, q_out, k_cache, v_cache, q, k, v, step, *, head_dim: int, n_heads: int,
            n_kv_heads: int, rope: Rope, max_tokens: int = 1, in_stride: int | None = None,
            cache_types: tuple[str, str] = F32_CACHE, label: str = "rope_kv") -> Dispatch:
    """[QK-norm] + RoPE of q into q_out and of k into the KV cache, and v into the cache.

    q, q_out (tokens, n_heads*head_dim); k, v (tokens, n_kv_heads*head_dim): q, k, v are only
    read, so they may be ranges of one buffer (WebGPU forbids a buffer bound both read-write
    and read-only in one dispatch, so q cannot be rotated in place when they share one);
    with `in_stride`, their rows are in_stride floats apart (the rows q | k | v of a stacked
    projection). k_cache, v_cache (max_ctx, n_kv_heads, head_dim), row t written at slot
    step.pos + t."""
    check_heads(n_heads, n_kv_heads)
    stride = {} if in_stride is None else {"IN_STRIDE": in_stride}
    q_bytes, kv = 4 * n_heads * head_dim * max_tokens, n_kv_heads * head_dim * max_tokens   # kv: values of k or v
    cached = n_kv_heads * max_tokens * sum(cache_row_bytes(t, head_dim) for t in cache_types)   # k and v as cached
    return kernels.dispatch("rope.wgsl", [q, k, v, q_out, k_cache, v_cache, step, *rope.bindings()],
                            (n_heads + n_kv_heads, max_tokens, 1), label, reads=q_bytes + 8 * kv,
                            writes=q_bytes + cached, HEAD_DIM=head_dim,
                            N_HEADS=n_heads, N_KV_HEADS=n_kv_heads, **stride, **rope.defines(head_dim),
                            **cache_flags(cache_types, head_dim))


SHIFT_BYTES = 16   # struct Shift (shaders/kv_shift.wgsl)


def pack_shift(keep: int, discard: int, n: int) -> bytes:
    # struct Shift (shaders/kv_shift.wgsl) { keep: u32, dropped: u32, n: u32, _pad: u32 }
    return struct.pack("<4I", keep, discard, n, 0)


def kv_shift(kernels, device, k_out, v_out, k_cache, v_cache, shift, *, head_dim: int, n_kv_heads: int,
             rope: Rope, max_rows: int, cache_types: tuple[str, str] = F32_CACHE,
             label: str = "kv_shift") -> Dispatch:
    """Context shift, pass 1: cache rows keep+discard+j -> scratch rows j (j < shift.n), keys
    re-rotated by -discard positions (`rope` without QK-norm: the cached keys are normed). k_out,
    v_out (max_rows, n_kv_heads, head_dim), in the caches' types, are the scratch; `shift` the
    Shift uniform (pack_shift). Copying the scratch back to rows keep.. is the caller's (a Copy each)."""
    if rope.qk_norm is not None:
        raise InvalidArgument("kv_shift: the cached keys are already QK-normed; pass the RoPE without norms")
    k_row, v_row = (cache_row_bytes(t, head_dim) for t in cache_types)   # bytes of a head's row
    rows = max_rows * n_kv_heads * (k_row + v_row)
    # values move as words of any type: only the key's type is a flag (K_F16, K_Q8)
    key_flags = {name: on for name, on in cache_flags(cache_types, head_dim).items() if name.startswith("K_")}
    return kernels.dispatch("kv_shift.wgsl", [k_cache, v_cache, k_out, v_out, shift, *rope.bindings()],
                            (n_kv_heads, max_rows, 1), label, reads=rows, writes=rows,
                            HEAD_DIM=head_dim, N_KV_HEADS=n_kv_heads, K_ROW=k_row // 4, V_ROW=v_row // 4,
                            **rope.defines(head_dim), **key_flags)


def shortconv(kernels, device, out, bcx, conv_w, state, step, *, hidden: int, kernel: int = 3,
              label: str = "shortconv") -> Dispatch:
    """LFM2's gated short conv for the step's rows in order, updating `state` in place.

    bcx (tokens, 3*hidden) = in_proj output split B, C, x; conv_w (hidden, kernel) =
    blk.N.shortconv.conv.weight; state (kernel-1, hidden) f32, zeroed at sequence start;
    out (tokens, hidden). Any number of rows per step (the kernel loops over them)."""
    if kernel < 2:
        raise InvalidArgument(f"shortconv: kernel {kernel} must be at least 2")
    state_bytes = 4 * (kernel - 1) * hidden
    return kernels.dispatch("shortconv.wgsl", [bcx, conv_w, state, out, step],
                            (-(-hidden // SHORTCONV_WORKGROUP), 1, 1), label,
                            reads=4 * hidden * (3 + kernel) + state_bytes, writes=4 * hidden + state_bytes,
                            HIDDEN=hidden, KERNEL=kernel, WG=SHORTCONV_WORKGROUP)


def glu_act(kernels, device, gate, up, step, *, ff: int, act: str = FFN_SILU, max_tokens: int = 1,
            label: str = "glu_act") -> Dispatch:
    """gate = act(gate) * up, in place, for the step's rows: the GLU (act FFN_SILU or FFN_GELU)
    of an FFN whose gate and up projections ran apart. gate, up (tokens, ff). up None: gate =
    act(gate) alone (an FFN without a gate: bert's GELU)."""
    rows = 4 * ff * max_tokens
    ungated = up is None
    gelu = act == FFN_GELU if ungated else gelu_flag(act, up)
    return kernels.dispatch("glu_act.wgsl", [gate, *[up] * (not ungated), step], (-(-ff // GLU_WORKGROUP), max_tokens, 1),
                            label, reads=(1 + (not ungated)) * rows, writes=rows, FF=ff, WG=GLU_WORKGROUP,
                            **flags(GELU=gelu, UNGATED=ungated))


def logit_softcap(kernels, device, logits, step, *, n: int, softcap: float, max_tokens: int = 1,
                  label: str = "logit_softcap") -> Dispatch:
    """logits = softcap * tanh(logits / softcap), in place, for the step's rows (of max_tokens):
    gemma2's final logit soft-capping. logits (tokens, n)."""
    if softcap <= 0:
        raise InvalidArgument(f"logit soft-cap {softcap} must be positive")
    rows = 4 * n * max_tokens
    return kernels.dispatch("logit_softcap.wgsl", [logits, step], (-(-n // SOFTCAP_WORKGROUP), max_tokens, 1), label,
                            reads=rows, writes=rows, N=n, WG=SOFTCAP_WORKGROUP, SOFTCAP=float(softcap))


def greedy_advance(kernels, device, tokens: Binding, chain_tokens: Binding, step: Binding) -> Dispatch:
    """The end of a greedy step: chain_tokens[step.chain] = tokens[0], then the Step moves to the
    next position and chain index (the Step buffer bound as storage)."""
    return kernels.dispatch("greedy_advance.wgsl", [tokens, chain_tokens, step], (1, 1, 1), "greedy advance",
                            reads=4 + step.nbytes, writes=4 + step.nbytes)


def embed(kernels, device, out: Binding, w: Binding, tokens: Binding, step: Binding, *, wtype: int,
          k: int, max_rows: int, scale: float | None = None, row0: int = 0,
          n_rows: int | None = None) -> Dispatch:
    """out (n_tokens, k) = scale * E[tokens[t], :] for t < Step.n_tokens <= max_rows.

    `w` holds table rows [row0, row0 + n_rows) (a tile; n_rows None: no upper bound);
    tokens outside them are skipped, leaving their output rows to another tile."""
    t = weight_type(wtype)
    defines = {**weight_flags(t), "K": k, "WG": EMBED_WORKGROUP, "ROW0": row0,
               "N_ROWS": 0xFFFFFFFF - row0 if n_rows is None else n_rows}
    if scale is not None and scale != 1.0:
        defines["SCALE"] = float(scale)
    groups = (-(-units_per_row(t, k) // EMBED_WORKGROUP), max_rows, 1)
    return kernels.dispatch("embed.wgsl", [w, tokens, out, step], groups, f"embed {t.name} k={k}",
                            reads=max_rows * (row_bytes(t, k) + 4), writes=4 * max_rows * k, **defines)


def embed_tiled(kernels, device, out: Binding, w: Binding, tokens: Binding, step: Binding, *,
                wtype: int, k: int, rows: int, max_rows: int, scale: float | None = None) -> list[Dispatch]:
    """embed from a table of `rows` rows, one dispatch per row tile (`row_tiles`) of the device's
    storage bindings."""
    limits = device.limits
    tiles = row_tiles(wtype, k, rows, limits)
    rb = row_bytes(wtype, k)
    return [embed(kernels, device, out, byte_range(w, start * rb, n * rb, limits) if len(tiles) > 1 else w, tokens,
                  step, wtype=wtype, k=k, max_rows=max_rows, scale=scale, row0=start, n_rows=n)
            for start, n in tiles]


def argmax(kernels, device, out: Binding, logits: Binding, *, n: int) -> Dispatch:
    """out[0] (u32) = argmax(logits[0..n)), the first index on ties."""
    return kernels.dispatch("argmax.wgsl", [logits, out], (1, 1, 1), f"argmax {n}", reads=4 * n, writes=4,
                            N=n, **flags(VEC4=n % 4 == 0))
