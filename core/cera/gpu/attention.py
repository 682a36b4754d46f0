"""Dispatch builders for attention: decode's split-KV attention over the cache
(shaders/attention.wgsl, attention_combine.wgsl; attention_merge.wgsl the merge a matvec can
fold in) and prefill's flash-style causal attention over a chunk of rows
(shaders/attention_prefill.wgsl).

The KV caches hold K and V as `cache_types` says (cera.gpu.numerics.cache_flags). Prefill tiles
(`attention_tiles`): block_q query rows ((token, head) pairs of one KV head, so a GQA group
shares every K/V tile) x block_kv keys, 256 invocations, the first of _ATTENTION_BLOCKS that
fits (and leaves each invocation at most 16 output columns): head_dim 64 -> 16 x 32 in 32 KiB,
16 x 16 in 16 KiB; 128 -> 16 x 16 / 8 x 8; 256 -> 8 x 8 / 4 x 4.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from cera.config import MAX_HEAD_DIM
from cera.device import DEFAULT_WORKGROUP_STORAGE, Binding, Dispatch
from cera.errors import InvalidArgument, Unsupported
from cera.gpu.matmul import x_record_defines
from cera.gpu.matvec import staged_x_fits, use_subgroups
from cera.gpu.numerics import F32_CACHE, cache_flags, cache_row_bytes
from cera.gpu.ops import Rope, check_heads
from cera.gpu.spec import DEFAULT, Tuning
from cera.kernels import flags


ATTENTION_SPLIT = 64           # keys per split of decode attention (a workgroup's share of a row)
ATTENTION_STORAGE = DEFAULT_WORKGROUP_STORAGE   # attention.wgsl's workgroup memory budget
# The fewest workgroups a split of decode attention is given when a workgroup takes several query
# heads of a GQA group: the Llama-3.1-8B shape (32 heads, 4 a workgroup) gained at depth 4096,
# Qwen2.5-1.5B (12 heads, 3) and SmolLM2 (9, 3) lost at 512, Qwen2.5-7B (28, 7) at 4096
# (docs/PERFORMANCE.md, decisions).
ATTENTION_SPLIT_WORKGROUPS = 8
# Invocations that score one key in attention.wgsl (each a stripe of its vec4 columns, so that a
# key's bytes are loaded side by side, not a cache slot apart; docs/PERFORMANCE.md, decisions).
ATTENTION_SCORE_LANES = 4
WORKGROUP = 256                # invocations of the attention and combine workgroups (WG in the shaders)
# The widest attention output (n_heads * head_dim) whose output projection merges the partials
# itself: every one of its workgroups merges all of them, so the repeated reads grow with the
# output's width times the projection's height, and past this a combine dispatch is faster
# (docs/PERFORMANCE.md, decisions).
MERGE_IN_PROJECTION_MAX = 1024


def attention_splits(max_ctx: int, split: int = ATTENTION_SPLIT) -> int:
    """Key splits of decode attention for a cache of max_ctx slots."""
    return -(-max_ctx // split)


def attention_scratch_bytes(*, head_dim: int, n_heads: int, max_ctx: int, max_tokens: int = 1,
                            split: int = ATTENTION_SPLIT) -> int:
    """Bytes of the scratch decode attention keeps its per-split partials in: (max_tokens,
    splits, n_heads, 1 + ceil(head_dim/4)) vec4, a record of (m, l, 0, 0) then o."""
    return 16 * max_tokens * attention_splits(max_ctx, split) * n_heads * (1 + -(-head_dim // 4))


def _attention_storage(head_dim: int, hpw: int, split: int, rope: bool) -> int:
    """Bytes of workgroup memory of an attention.wgsl workgroup of hpw heads (rope: the fused
    RoPE's rows too)."""
    d4 = -(-head_dim // 4)
    parts = WORKGROUP // d4
    storage = 16 * hpw * d4 + 4 * hpw * (1 + split * (2 + min(d4, ATTENTION_SCORE_LANES))) + 16 * parts * d4 + 4 * parts * hpw
    return storage + (4 * (hpw + 1) * (head_dim + 1) if rope else 0)


def heads_per_workgroup(head_dim: int, n_heads: int, group: int, split: int, rope: bool = False,
                        wanted: int | None = None, storage: int = ATTENTION_STORAGE) -> int:
    """Query heads of a GQA group one workgroup of attention.wgsl takes (each load of a key or
    value serves them all): `wanted` (within the device's `storage` bytes of workgroup memory), or
    (None) the most that leave a split ATTENTION_SPLIT_WORKGROUPS workgroups or more and whose
    workgroup memory fits ATTENTION_STORAGE. rope: the fused RoPE's rows too."""
    if wanted is not None:
        if wanted < 1 or group % wanted:
            raise InvalidArgument(f"attention: {wanted!r} heads a workgroup (expected a divisor of the GQA "
                                  f"group, {group})")
        need = _attention_storage(head_dim, wanted, split, rope)
        if need > storage:
            raise Unsupported(f"attention: {wanted} heads of {head_dim} with split {split} need {need} bytes "
                              f"of workgroup memory (the device has {storage})")
        return wanted
    for hpw in range(group, 0, -1):
        if group % hpw == 0 and (hpw == 1 or n_heads // hpw >= ATTENTION_SPLIT_WORKGROUPS) \
                and _attention_storage(head_dim, hpw, split, rope) <= ATTENTION_STORAGE:
            return hpw
    raise Unsupported(f"attention: no workgroup fits head_dim {head_dim} with split {split}")


def merge_in_projection(device, head_dim: int, q_dim: int) -> bool:
    """Whether decode's output projection merges attention's partials itself (matvec's MERGE)
    rather than read a combine dispatch's output: for an output of at most
    MERGE_IN_PROJECTION_MAX floats, of whole vec4 heads, that fits the projection's workgroup
    memory (matvec.staged_x_fits, with any type's sums)."""
    return q_dim <= MERGE_IN_PROJECTION_MAX and not head_dim % 4 and staged_x_fits(device, q_dim, sums=True)


@dataclass(frozen=True)
class Partials:
    """Decode attention's per-split partials (attention.wgsl's scratch) of one row, as a kernel
    merging them binds and defines them (attention_merge.wgsl): attention_combine.wgsl, or a
    matvec reading attention's output straight from them (matvec.matvec's x)."""
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
                       cache_types: tuple[str, str] = F32_CACHE, softcap: float = 0.0,
                       tune: Tuning = DEFAULT) -> tuple[Dispatch, Partials]:
    """Pass 1 of `attention`: its dispatch, and the partials it leaves for a merge. `tune` may
    set the query heads a workgroup takes and whether a key's score lanes add up their sums with
    subgroup shuffles (cera.gpu.spec.Tuning's heads and subgroups; shuffles need a power of two
    lanes, and are taken where the device has subgroups)."""
    tune.check("attention", "heads", "subgroups")
    if head_dim > MAX_HEAD_DIM:
        raise Unsupported(f"attention: head_dim {head_dim} is above the kernel's maximum {MAX_HEAD_DIM}")
    if split < 1 or split & (split - 1) or split > WORKGROUP:
        raise InvalidArgument(f"attention: split {split} must be a power of two up to {WORKGROUP}")
    check_heads(n_heads, n_kv_heads)
    if rope is not None and max_tokens != 1:
        raise InvalidArgument(f"attention: RoPE is fused for one row (decode), not {max_tokens}")
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    n_splits = attention_splits(max_ctx, split)
    lanes = min(-(-head_dim // 4), ATTENTION_SCORE_LANES)   # LANES of attention.wgsl
    shuffles = not lanes & (lanes - 1)                       # a power of two: a butterfly adds them
    if tune.subgroups and not shuffles:
        raise Unsupported(f"attention: subgroups need a power of two lanes a key, not {lanes} (head_dim {head_dim})")
    subgroups = use_subgroups(device, tune.subgroups) and shuffles
    hpw = heads_per_workgroup(head_dim, n_heads, n_heads // n_kv_heads, split, rope is not None, tune.heads,
                              device.limits.max_compute_workgroup_storage_size)
    scratch_bytes = attention_scratch_bytes(head_dim=head_dim, n_heads=n_heads, max_ctx=max_ctx,
                                            max_tokens=max_tokens, split=split)
    if scratch is None:
        scratch = Binding(device.buffer(scratch_bytes, f"{label}.scratch"))
    elif isinstance(scratch, Binding) and scratch.size is not None and scratch.size < scratch_bytes:
        raise InvalidArgument(f"attention: scratch of {scratch.size} bytes, {scratch_bytes} needed")
    partials = Partials(scratch, step, head_dim, n_heads, split, n_splits, window)
    q_bytes, kv = 4 * n_heads * head_dim * max_tokens, n_kv_heads * head_dim   # kv: values of a slot's k or v
    slot_bytes = n_kv_heads * sum(cache_row_bytes(t, head_dim) for t in cache_types)   # a slot's k and v as cached
    bindings, fused, reads, writes = [q, k_cache, v_cache, scratch, step], {}, q_bytes, 0
    if rope is not None:
        bindings += rope.bindings()
        fused = dict(ROPE=True, K_OFF=kv_offsets[0], V_OFF=kv_offsets[1], ROPE_BINDING=5, **rope.defines(head_dim))
        reads, writes = q_bytes + 8 * kv, slot_bytes
    return kernels.dispatch("attention.wgsl", bindings, (n_heads // hpw, n_splits, max_tokens),
                            label + (" rope" if rope is not None else "") + (f" hpw{hpw}" if hpw > 1 else "")
                            + (" sg" if subgroups else ""),
                            reads=reads, writes=writes,
                            reads_per_position=slot_bytes * max_tokens, N_KV_HEADS=n_kv_heads,
                            SCALE=float(scale), HPW=hpw, SCORE_LANES=ATTENTION_SCORE_LANES,
                            **partials.attention_defines(), **fused, **softcap_define(softcap),
                            **cache_flags(cache_types, head_dim), **flags(SUBGROUPS=subgroups)), partials


def attention(kernels, device, out, q, k_cache, v_cache, step, *, head_dim: int, n_heads: int,
              max_tokens: int = 1, label: str = "attention", xi: Binding | None = None, planes: int = 3,
              group: int = 16, **kw) -> list[Dispatch]:
    """out = causal GQA attention of q over cache slots 0..step.pos + t for row t, split-KV;
    with a sliding `window` (a local layer), over slots p - window + 1 .. p for position p
    (splits wholly before the window are skipped by both passes).

    q, out (tokens, n_heads*head_dim); k_cache, v_cache (max_ctx, n_kv_heads, head_dim), as
    written by rope_kv, in `cache_types`. scale defaults to 1/sqrt(head_dim) (Granite passes attention.scale);
    a `softcap` (gemma2) caps the scaled scores, softcap * tanh(score / softcap).
    With `rope` (decode: one row), q is instead the row's raw q | k | v, k and v at
    `kv_offsets` floats from q, and the first dispatch does rope_kv's work itself: [QK-norm,]
    RoPE of q and of the key, the key and value written to slot step.pos.
    With `xi`, the combine also writes out in integers there, as cera.gpu.matmul.quantize_x
    would of `planes` bytes with a sum every `group` elements (`record_fits`).

    Two dispatches: attention.wgsl scores and sums each split of `split` keys (a power of two)
    in its own workgroups, ceil(max_ctx / split) splits x (n_heads / heads per workgroup) x
    max_tokens, splits past a row's position exiting at once; attention_combine.wgsl merges
    the live splits, n_heads x max_tokens workgroups (with xi a 256-element block of out each).
    `scratch` holds the partials between them (attention_scratch_bytes); layers run in
    sequence, so a plan can share one scratch across its layers. Without one the builder
    allocates its own. (Decode skips the second dispatch: its output projection merges the
    partials itself, attention_partials.)"""
    q_dim = n_heads * head_dim
    if xi is not None and not record_fits(head_dim, q_dim):
        raise Unsupported(f"attention: no integer record of {n_heads} heads of {head_dim} (a head must divide 256, "
                          f"and the heads make whole 256-element blocks)")
    first, p = attention_partials(kernels, device, q, k_cache, v_cache, step, head_dim=head_dim, n_heads=n_heads,
                                  max_tokens=max_tokens, label=label, **kw)
    writes = 4 * q_dim * max_tokens
    if xi is None:
        combine = kernels.dispatch("attention_combine.wgsl", [p.scratch, out, step], (n_heads, max_tokens, 1),
                                   f"{label}.combine", writes=writes, **p.attention_defines())
    else:
        record = x_record_defines(q_dim, planes, group)
        combine = kernels.dispatch("attention_combine.wgsl", [p.scratch, out, step, xi], (q_dim // 256, max_tokens, 1),
                                   f"{label}.combine x{8 * planes}", writes=writes + 4 * max_tokens * record["X_STRIDE"],
                                   **p.attention_defines(), **record, **flags(X_RECORD=True))
    return [first, combine]


def record_fits(head_dim: int, q_dim: int) -> bool:
    """Whether attention_combine.wgsl can write its output's integers (X_RECORD): heads that
    tile 256-element blocks."""
    return 256 % head_dim == 0 and head_dim % 4 == 0 and q_dim % 256 == 0


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


@dataclass(frozen=True)
class AttentionTiles:
    """A workgroup holds block_q query rows ((token, head) pairs of one KV head) and walks the
    keys in tiles of block_kv; threads_per_row invocations share a query row's output."""
    block_q: int
    block_kv: int
    threads_per_row: int

    @property
    def invocations(self) -> int:
        return self.block_q * self.threads_per_row

    @staticmethod
    def storage(block_q: int, block_kv: int, head_dim: int) -> int:
        """Bytes: scaled Q tile, K and V tiles (rows padded by a vec4), the tile's scores."""
        d4 = -(-head_dim // 4)
        return 16 * block_q * d4 + 2 * 16 * block_kv * (d4 + 1) + 4 * block_q * block_kv


# (block_q, block_kv), preferred first. 16 query rows a workgroup beat 32 and 64 (more
# workgroups), 8 and 8 x 8; 32 keys a tile beat 16 for head_dim 64, and for 128 do not fit
# 32 KiB (docs/PERFORMANCE.md, decisions).
_ATTENTION_BLOCKS = [(16, 32), (16, 16), (16, 8), (8, 8), (8, 4), (4, 4)]


def attention_tiles(limits, head_dim: int) -> AttentionTiles:
    budget = max(DEFAULT_WORKGROUP_STORAGE, limits.max_compute_workgroup_storage_size)
    wg = min(WORKGROUP, limits.max_compute_invocations_per_workgroup)
    d4 = -(-head_dim // 4)
    for bq, bkv in _ATTENTION_BLOCKS:
        tpq = wg // bq
        # an invocation holds at most 4 vec4 of a query row's output (o0..o3 in the shader)
        if AttentionTiles.storage(bq, bkv, head_dim) <= budget and bq <= wg and 4 * tpq >= d4:
            return AttentionTiles(bq, bkv, tpq)
    raise Unsupported(f"no prefill attention tiling fits head_dim {head_dim} in {budget} bytes")


def prefill_attention(kernels, device, out, q, k_cache, v_cache, step, *, head_dim: int, n_heads: int,
                      n_kv_heads: int, scale: float | None = None, max_rows: int,
                      tiles: AttentionTiles | None = None, label: str = "prefill_attention",
                      window: int = 0, cache_types: tuple[str, str] = F32_CACHE, softcap: float = 0.0,
                      bidirectional: bool = False) -> Dispatch:
    """out = causal GQA attention of q over cache slots 0..step.pos + t for row t < step.n_tokens;
    with a sliding `window` (a local layer), over slots p - window + 1 .. p for position p; with a
    `softcap` (gemma2), the scaled scores soft-capped (softcap * tanh(score / softcap));
    `bidirectional` (an encoder's), every row over slots 0..step.pos + step.n_tokens - 1.

    Bindings: q, out (rows, n_heads*head_dim); k_cache,
    v_cache (max_ctx, n_kv_heads, head_dim) in `cache_types` (cera.gpu.numerics), rows of this step
    already written by rope_kv. scale defaults to 1/sqrt(head_dim)."""
    if head_dim > MAX_HEAD_DIM:
        raise Unsupported(f"prefill attention: head_dim {head_dim} is above the kernel's maximum {MAX_HEAD_DIM}")
    check_heads(n_heads, n_kv_heads)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    tiles = tiles or attention_tiles(device.limits, head_dim)
    if 4 * tiles.threads_per_row < -(-head_dim // 4):
        raise Unsupported(f"{tiles}: head_dim {head_dim} needs at least {-(-head_dim // 16)} threads per row")
    group = n_heads // n_kv_heads
    defines = dict(HEAD_DIM=head_dim, N_HEADS=n_heads, N_KV_HEADS=n_kv_heads, SCALE=float(scale),
                   BQ=tiles.block_q, BKV=tiles.block_kv, TPQ=tiles.threads_per_row,
                   **flags(VEC4=head_dim % 4 == 0, BIDIRECTIONAL=bidirectional), **window_define(window),
                   **softcap_define(softcap),
                   **cache_flags(cache_types, head_dim))
    groups = (n_kv_heads, -(-max_rows * group // tiles.block_q), 1)
    q_bytes = 4 * max_rows * n_heads * head_dim
    return kernels.dispatch("attention_prefill.wgsl", [q, k_cache, v_cache, out, step], groups, label,
                            reads=q_bytes, writes=q_bytes,
                            reads_per_position=n_kv_heads * sum(cache_row_bytes(t, head_dim) for t in cache_types),
                            **defines)
