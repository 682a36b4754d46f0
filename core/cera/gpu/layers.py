"""Dispatch builders for the non-matmul kernels of a layer (shaders/rms_norm, rope, attention,
shortconv, glu_act, greedy_advance) and of the logits (logit_softcap).

Each builder compiles (once, through `cera.kernels.Kernels`) the variant its arguments need,
binds the buffers in the shader's order and returns a `cera.device.Dispatch` (attention: a
list of two, split-KV then combine) sized for the most rows a step of the schedule carries.
Outputs come first, like `matmul(out, x, w, ...)`.
Buffer arguments are GPU buffers or `cera.device.Binding` ranges of one. All activations are
f32, row-major, one row per token of the step; `step` is the Step uniform (cera.gpu.state).
The KV caches hold K and V as `cache_types` says ((K's, V's): "f32", or "f16" packed two to a
u32, cera.gpu.numerics), each builder of a kernel that reads or writes them taking it.
Kernels that are batch-aware read `step.n_tokens` and do nothing for rows past it, so one
dispatch built for `max_tokens` rows serves every step of up to that many tokens.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass


from cera.config import FFN_GELU, FFN_SILU, MAX_HEAD_DIM
from cera.device import DEFAULT_WORKGROUP_STORAGE, Binding, Dispatch
from cera.errors import InvalidArgument, Unsupported
from cera.gpu.matmul import gelu_flag
from cera.gpu.numerics import value_bytes
from cera.kernels import flags

ATTENTION_SPLIT = 64           # keys per split of decode attention (a workgroup's share of a row)
ATTENTION_STORAGE = DEFAULT_WORKGROUP_STORAGE   # attention.wgsl's workgroup memory budget
# Most keys one invocation walks in attention.wgsl's value pass: more (two heads a workgroup)
# was slower on an H200 (docs/PERFORMANCE.md, decisions).
ATTENTION_SERIAL_KEYS = 8
# Invocations that score one key in attention.wgsl (each a stripe of its vec4 columns, so that a
# key's bytes are loaded side by side, not a cache slot apart; docs/PERFORMANCE.md, decisions).
ATTENTION_SCORE_LANES = 4
WORKGROUP = 256                # invocations of the attention and combine workgroups (WG in the shaders)
SHORTCONV_WORKGROUP = 64       # channels per shortconv workgroup (WG in shortconv.wgsl)
GLU_WORKGROUP = 64             # elements per glu_act workgroup (WG in glu_act.wgsl)
SOFTCAP_WORKGROUP = 256        # logits per logit_softcap workgroup (WG in logit_softcap.wgsl)
F32_CACHE = ("f32", "f32")     # the builders' default cache types: K and V in f32


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
    _check_heads(n_heads, n_kv_heads)
    stride = {} if in_stride is None else {"IN_STRIDE": in_stride}
    q_bytes, kv = 4 * n_heads * head_dim * max_tokens, n_kv_heads * head_dim * max_tokens   # kv: values of k or v
    return kernels.dispatch("rope.wgsl", [q, k, v, q_out, k_cache, v_cache, step, *rope.bindings()],
                            (n_heads + n_kv_heads, max_tokens, 1), label, reads=q_bytes + 8 * kv,
                            writes=q_bytes + kv * sum(map(value_bytes, cache_types)), HEAD_DIM=head_dim,
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
    rows = max_rows * n_kv_heads * head_dim * sum(map(value_bytes, cache_types))
    return kernels.dispatch("kv_shift.wgsl", [k_cache, v_cache, k_out, v_out, shift, *rope.bindings()],
                            (n_kv_heads, max_rows, 1), label, reads=rows, writes=rows,
                            HEAD_DIM=head_dim, N_KV_HEADS=n_kv_heads, **rope.defines(head_dim),
                            **cache_flags(cache_types, head_dim))


def _freq_scale(freq_scale: float) -> dict:
    """rope_rotate.wgsl's FREQ_SCALE define for linear RoPE scaling (1: none)."""
    return {"FREQ_SCALE": float(freq_scale)} if freq_scale != 1.0 else {}


def attention_splits(max_ctx: int, split: int = ATTENTION_SPLIT) -> int:
    """Key splits of decode attention for a cache of max_ctx slots."""
    return -(-max_ctx // split)


def attention_scratch_bytes(*, head_dim: int, n_heads: int, max_ctx: int, max_tokens: int = 1,
                            split: int = ATTENTION_SPLIT) -> int:
    """Bytes of the scratch decode attention keeps its per-split partials in: (max_tokens,
    splits, n_heads, 1 + ceil(head_dim/4)) vec4, a record of (m, l, 0, 0) then o."""
    return 16 * max_tokens * attention_splits(max_ctx, split) * n_heads * (1 + -(-head_dim // 4))


def _attention_heads_per_workgroup(head_dim: int, group: int, split: int, rope: bool = False) -> int:
    """The most query heads of a GQA group that one pass-1 workgroup of attention.wgsl can take
    while its workgroup memory fits ATTENTION_STORAGE and no invocation walks more than
    ATTENTION_SERIAL_KEYS keys of the value pass (more heads share more K/V loads; fewer leave
    more invocations per output column, a shorter serial chain). rope: the fused RoPE's rows too."""
    d4 = -(-head_dim // 4)
    for hpw in sorted((n for n in range(1, group + 1) if group % n == 0), reverse=True):
        parts = max(1, WORKGROUP // (hpw * d4))
        storage = 16 * hpw * d4 + 4 * hpw * split * (2 + min(d4, ATTENTION_SCORE_LANES)) \
            + (20 * WORKGROUP if parts > 1 else 20)
        storage += 4 * (hpw + 1) * (head_dim + 1) if rope else 0
        if storage <= ATTENTION_STORAGE and (-(-split // parts) <= ATTENTION_SERIAL_KEYS or hpw == 1):
            return hpw
    raise Unsupported(f"attention: no workgroup fits head_dim {head_dim} with split {split}")


@dataclass(frozen=True)
class Partials:
    """Decode attention's per-split partials (attention.wgsl's scratch) of one row, as a kernel
    merging them binds and defines them (attention_merge.wgsl): attention_combine.wgsl, or a
    matvec reading attention's output straight from them (matmul.matvec's x)."""
    scratch: Binding
    step: Binding
    head_dim: int
    n_heads: int
    split: int
    n_splits: int
    window: int = 0

    def defines(self) -> dict:
        return dict(HEAD_DIM=self.head_dim, N_HEADS=self.n_heads, SPLIT=self.split, N_SPLITS=self.n_splits,
                    **window_define(self.window))

    def attention_defines(self) -> dict:
        """What attention.wgsl and attention_combine.wgsl share: these defines, their workgroup
        size, and VEC4 where rows move as vec4."""
        return dict(MAX_WG=WORKGROUP, **self.defines(), **flags(VEC4=self.head_dim % 4 == 0))


def attention_partials(kernels, device, q, k_cache, v_cache, step, *, head_dim: int, n_heads: int,
                       n_kv_heads: int, max_ctx: int, scale: float | None = None, max_tokens: int = 1,
                       split: int = ATTENTION_SPLIT, scratch=None, label: str = "attention",
                       window: int = 0, rope: Rope | None = None, kv_offsets: tuple[int, int] = (0, 0),
                       cache_types: tuple[str, str] = F32_CACHE, softcap: float = 0.0) -> tuple[Dispatch, Partials]:
    """Pass 1 of `attention`: its dispatch, and the partials it leaves for a merge."""
    if head_dim > MAX_HEAD_DIM:
        raise Unsupported(f"attention: head_dim {head_dim} is above the kernel's maximum {MAX_HEAD_DIM}")
    if split < 1 or split & (split - 1) or split > WORKGROUP:
        raise InvalidArgument(f"attention: split {split} must be a power of two up to {WORKGROUP}")
    _check_heads(n_heads, n_kv_heads)
    if rope is not None and max_tokens != 1:
        raise InvalidArgument(f"attention: RoPE is fused for one row (decode), not {max_tokens}")
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    n_splits = attention_splits(max_ctx, split)
    hpw = _attention_heads_per_workgroup(head_dim, n_heads // n_kv_heads, split, rope is not None)
    scratch_bytes = attention_scratch_bytes(head_dim=head_dim, n_heads=n_heads, max_ctx=max_ctx,
                                            max_tokens=max_tokens, split=split)
    if scratch is None:
        scratch = Binding(device.buffer(scratch_bytes, f"{label}.scratch"))
    elif isinstance(scratch, Binding) and scratch.size is not None and scratch.size < scratch_bytes:
        raise InvalidArgument(f"attention: scratch of {scratch.size} bytes, {scratch_bytes} needed")
    partials = Partials(scratch, step, head_dim, n_heads, split, n_splits, window)
    q_bytes, kv = 4 * n_heads * head_dim * max_tokens, n_kv_heads * head_dim   # kv: values of a slot's k or v
    slot_bytes = kv * sum(map(value_bytes, cache_types))                         # a slot's k and v as cached
    bindings, fused, reads, writes = [q, k_cache, v_cache, scratch, step], {}, q_bytes, 0
    if rope is not None:
        bindings += rope.bindings()
        fused = dict(ROPE=True, K_OFF=kv_offsets[0], V_OFF=kv_offsets[1], ROPE_BINDING=5, **rope.defines(head_dim))
        reads, writes = q_bytes + 8 * kv, slot_bytes
    return kernels.dispatch("attention.wgsl", bindings, (n_heads // hpw, n_splits, max_tokens),
                            label + (" rope" if rope is not None else ""), reads=reads, writes=writes,
                            reads_per_position=slot_bytes * max_tokens, N_KV_HEADS=n_kv_heads,
                            SCALE=float(scale), HPW=hpw, SCORE_LANES=ATTENTION_SCORE_LANES,
                            **partials.attention_defines(), **fused, **softcap_define(softcap),
                            **cache_flags(cache_types, head_dim)), partials


def attention(kernels, device, out, q, k_cache, v_cache, step, *, max_tokens: int = 1,
              label: str = "attention", **kw) -> list[Dispatch]:
    """out = causal GQA attention of q over cache slots 0..step.pos + t for row t, split-KV;
    with a sliding `window` (a local layer), over slots p - window + 1 .. p for position p
    (splits wholly before the window are skipped by both passes).

    q, out (tokens, n_heads*head_dim); k_cache, v_cache (max_ctx, n_kv_heads, head_dim), as
    written by rope_kv, in `cache_types`. scale defaults to 1/sqrt(head_dim) (Granite passes attention.scale);
    a `softcap` (gemma2) caps the scaled scores, softcap * tanh(score / softcap).
    With `rope` (decode: one row), q is instead the row's raw q | k | v, k and v at
    `kv_offsets` floats from q, and the first dispatch does rope_kv's work itself: [QK-norm,]
    RoPE of q and of the key, the key and value written to slot step.pos.

    Two dispatches: attention.wgsl scores and sums each split of `split` keys (a power of two)
    in its own workgroups, ceil(max_ctx / split) splits x (n_heads / heads per workgroup) x
    max_tokens, splits past a row's position exiting at once; attention_combine.wgsl merges
    the live splits, n_heads x max_tokens workgroups. `scratch` holds the partials between
    them (attention_scratch_bytes); layers run in sequence, so a plan can share one scratch
    across its layers. Without one the builder allocates its own. (Decode skips the second
    dispatch: its output projection merges the partials itself, attention_partials.)"""
    first, p = attention_partials(kernels, device, q, k_cache, v_cache, step, max_tokens=max_tokens,
                                  label=label, **kw)
    combine = kernels.dispatch("attention_combine.wgsl", [p.scratch, out, step], (p.n_heads, max_tokens, 1),
                               f"{label}.combine", writes=4 * p.n_heads * p.head_dim * max_tokens,
                               **p.attention_defines())
    return [first, combine]


def window_define(window: int) -> dict:
    """The attention kernels' WINDOW define for a sliding window (0: causal, none)."""
    if window < 0:
        raise InvalidArgument(f"attention: window {window} must be >= 0 (0: no sliding window)")
    return {"WINDOW": window} if window else {}


def softcap_define(softcap: float) -> dict:
    """The SOFTCAP define of soft_cap.wgsl's users for a soft-cap (0: none)."""
    if softcap < 0:
        raise InvalidArgument(f"soft-cap {softcap} must be >= 0 (0: none)")
    return {"SOFTCAP": float(softcap)} if softcap else {}


def cache_flags(cache_types: tuple[str, str], head_dim: int) -> dict:
    """The cache kernels' K_F16 / V_F16 flags for (K's, V's) cache type: that cache holds f16
    halves two to a u32 (shaders/half.wgsl), so a head's row must be whole words."""
    if "f16" in cache_types and head_dim % 2:
        raise Unsupported(f"an f16 KV cache needs an even head_dim, not {head_dim} (use the f32 cache)")
    return flags(K_F16=cache_types[0] == "f16", V_F16=cache_types[1] == "f16")


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


def _check_heads(n_heads: int, n_kv_heads: int) -> None:
    if n_kv_heads <= 0 or n_heads % n_kv_heads:
        raise InvalidArgument(f"n_heads {n_heads} must be a positive multiple of n_kv_heads {n_kv_heads}")
