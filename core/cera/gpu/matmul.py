"""Dispatch builders for the decode weight kernels: matrix-vector products, embedding
lookups and the greedy argmax (shaders/matvec.wgsl, embed.wgsl, argmax.wgsl).

Weights are raw GGUF bytes bound as `array<u32>` and decoded in the shader
(shaders/quant.wgsl); activations are f32. The builders hide the defines, binding
order and workgroup geometry. A matrix too big for one storage binding (the tied LM
head) is split into row tiles bound at aligned offsets: `row_tiles`, `matvec_tiled`,
`embed_tiled`.
"""
from __future__ import annotations

from math import gcd
from typing import TYPE_CHECKING

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from cera.config import FFN_GELU, FFN_SILU
from cera.device import PACKED_DOT, Binding, Dispatch
from cera.errors import InvalidArgument, TooLarge, Unsupported
from cera.kernels import flags

if TYPE_CHECKING:
    from cera.gpu.layers import Partials   # layers imports this module

MATVEC_TYPES = frozenset({T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
                          T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S,
                          T.IQ3_XXS, T.IQ3_S, T.IQ4_NL, T.IQ4_XS})

WORKGROUP = 256          # invocations per matvec workgroup (SwiftShader's maximum)
EMBED_WORKGROUP = 64     # shaders/embed.wgsl WG
UNIT_ELEMS = 16          # elements per work item (a "unit" in shaders/quant.wgsl)
STAGE_SCRATCH = 3 * 4 * WORKGROUP   # matvec.wgsl's reductions' workgroup memory at most: row_partial, reduce.wgsl


QUAD_TYPES = frozenset({T.Q4_K, T.Q5_K})   # blocks of a multiple of 16 bytes: bound as vec4<u32>
# Types whose quant.wgsl section splits a unit's loads from its arithmetic (unit_words, unit_decode)
UNIT_WORDS_TYPES = frozenset({T.Q4_0, T.Q4_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K})
# Types quant.wgsl also gives as affine maps of exact floats (unit_affine): a staged matvec's
# dot then needs no conversion per element (matvec.wgsl UNIT_AFFINE)
UNIT_AFFINE_TYPES = frozenset({T.Q4_K})
# Types quant.wgsl also dots with x in integers per 256 elements (item_dot_int: integer products,
# dot4I8Packed; matvec.wgsl X_INT), and x's bits: 24 as precise as f32 x (the default), 8 as
# llama.cpp's CPU backend quantizes its activations (Q8_K, opt-in: cera.gpu.numerics' int8)
X_INT_TYPES = frozenset({T.Q4_K, T.Q6_K})
X_INT_ITEM_UNITS = {T.Q4_K: 2, T.Q6_K: 4}   # quant.wgsl's ITEM_UNITS
X_BITS = (0, 8, 24)                          # f32 x, or X_INT's planes of a byte
X_INT_MIN_ROWS = 1024                        # x_int_bits' default: integer x in matrices this tall or taller


def weight_flags(t: T) -> dict:
    """The defines naming a weight type for shaders/quant.wgsl: its flag, and WEIGHT_QUADS where
    its blocks are whole 16-byte words (the weights are then bound as array<vec4<u32>> and a
    block's fields arrive in 16-byte loads: fewer storage accesses, each bounds-checked in a
    browser), and UNIT_WORDS where quant.wgsl splits its unit_values into unit_words and
    unit_decode."""
    return flags(**{t.name: True, "WEIGHT_QUADS": t in QUAD_TYPES, "UNIT_WORDS": t in UNIT_WORDS_TYPES})


def _type(wtype: int) -> T:
    t = T(wtype)
    if t not in MATVEC_TYPES:
        raise Unsupported(f"no matvec kernel for weight type {t.name}")
    return t


def row_bytes(wtype: int, k: int) -> int:
    """Bytes of one row of k elements of type `wtype` (k a multiple of the block size)."""
    block, size = GGML_QUANT_SIZES[T(wtype)]
    if k % block:
        raise Unsupported(f"row length {k} is not a multiple of {T(wtype).name}'s block of {block}")
    return k // block * size


def units_per_row(wtype: int, k: int) -> int:
    """Work items per row in shaders/quant.wgsl: 16 elements each (the last one of a
    float row may be partial)."""
    _type(wtype)
    return -(-k // UNIT_ELEMS)


def staged_x_fits(device, k: int, sums: bool = False, floats: bool = True, x_bits: int = 0) -> bool:
    """Whether matvec.wgsl can stage a k-element x in workgroup memory beside its reductions'
    own (at most STAGE_SCRATCH bytes): as floats (X_STAGED: 16 a unit, 2 more with the sums
    UNIT_AFFINE reads) and/or in integers (X_INT: x_bits / 8 bytes an element, a sum and a max
    per 16, a float per 256)."""
    units = -(-k // UNIT_ELEMS)
    size = 4 * (UNIT_ELEMS + (2 if sums else 0)) * units if floats else 0
    if x_bits:
        size += k * x_bits // 8 + 8 * units + 4 * -(-k // 256)
    return size + STAGE_SCRATCH <= device.limits.max_compute_workgroup_storage_size


def x_int_bits(device, wtype: int, k: int, m: int, wanted: int | None, floats: bool, int8: bool = False) -> int:
    """The bits of x's integers in a matvec's dot products (X_INT), or 0 for f32 x: `wanted`, or
    (None) 24 bits, 8 with `int8`, where x is staged as floats anyway (`floats`: a fused norm or
    a merge), the matrix has X_INT_MIN_ROWS rows or more, and the type, the device's compiler and
    its workgroup memory allow.

    24 bits (the default) keep f32 x's precision: x in steps of 1/8355711 of its block's largest
    |x| (f32's own rounding of that element is 1/16777216 of it), and each of the three bytes
    dotted in integers, so the results stay within the f32 path's tolerances of the reference.
    8 bits (Numerics.int8, opt-in) are llama.cpp's integer dot products of 8-bit activations:
    decode then no longer equals prefill or the reference to f32 precision (Qwen2.5-1.5B's greedy
    tokens still agree with llama.cpp's, 16 of 16 on the golden prompts).

    Integer dots are faster than f32 x where x is staged; the 256-row v projections are faster
    with f32 x (every workgroup converts all of x, for few rows), hence X_INT_MIN_ROWS; the down
    projections, whose x is not staged, are slower with integer x, so they keep f32 x
    (docs/PERFORMANCE.md, decisions)."""
    t = T(wtype)
    if wanted is None:
        bits = 8 if int8 else 24
        fits = floats and m >= X_INT_MIN_ROWS and t in X_INT_TYPES and PACKED_DOT in device.features \
            and staged_x_fits(device, k, x_bits=bits)
        return bits if fits else 0
    if wanted not in X_BITS:
        raise InvalidArgument(f"matvec: x_bits {wanted!r}: expected one of {', '.join(map(str, X_BITS))}")
    if not wanted:
        return 0
    if t not in X_INT_TYPES:
        raise Unsupported(f"matvec: no integer x dot product for {t.name} (only "
                          f"{', '.join(sorted(x.name for x in X_INT_TYPES))})")
    if PACKED_DOT not in device.features:
        raise Unsupported(f"matvec: integer x needs WGSL's {PACKED_DOT}, which this device's compiler lacks")
    return wanted


def threads_per_row(wtype: int, k: int, m: int, workgroup: int = WORKGROUP) -> int:
    """Threads per row, a power of two up to `workgroup` (workgroup / tpr rows per
    workgroup): about 2^19 threads in all, no more than the row has units, and at
    least 4 (quantized rows) or 16 (float rows, whose strided units coalesce across threads).

    Tall matrices (an LM head) run best with few threads per row and many rows per workgroup,
    short ones (576-1536 rows) with 64-256 per row; 2^19 rather than 2^18 threads gives an
    8960-row GLU 32 per row, not 16, which is faster (docs/PERFORMANCE.md, decisions).
    `scripts/bench_kernels.py --only matvec --sweep` times the alternatives."""
    units = units_per_row(wtype, k)
    tpr = 16 if GGML_QUANT_SIZES[T(wtype)][0] == 1 else 4
    while tpr < workgroup and tpr * 2 * m <= 1 << 19 and tpr * 2 <= units:
        tpr *= 2
    return tpr


def x_int_threads_per_row(wtype: int, k: int, m: int, bits: int, workgroup: int = WORKGROUP) -> int:
    """Threads per row of an X_INT matvec of `bits`-bit x (items of quant.wgsl's ITEM_UNITS
    units): at least two items a thread and at most 2^18 threads in all for 8 bits, a third of
    that for 24 (three bytes of x to convert for every element), where threads_per_row takes one
    item a thread and 2^19; but never under 2^13 threads (a short matrix keeps its workgroups).
    Every workgroup converts all of x first, so fewer, fatter workgroups pay for it less often.

    With 8 bits, 16 threads a row beat 32 for the GLU and the merging output projection, and a
    256-row v projection is slower with fewer threads, hence the floor; with 24 bits the GLU runs
    best with 8, the other projections with 16; the LM head (151936 rows of 24 Q6_K items) runs
    best with 2, the least this starts from (docs/PERFORMANCE.md, decisions)."""
    items = units_per_row(wtype, k) // X_INT_ITEM_UNITS[T(wtype)]
    most = (1 << 18) * 8 // bits
    tpr = 2
    while tpr < workgroup and tpr * 2 * m <= most and tpr * 4 <= items:
        tpr *= 2
    while tpr < workgroup and tpr * m < 1 << 13 and tpr * 2 <= items:
        tpr *= 2
    return tpr


def use_subgroups(device, wanted: bool | None) -> bool:
    """Whether a kernel reduces with subgroup operations: `wanted`, or (None) where the device
    has the `subgroups` feature."""
    has = "subgroups" in device.features
    if wanted and not has:
        raise Unsupported("this device has no subgroups")
    return has if wanted is None else wanted


def _groups(n: int, limits) -> tuple[int, int, int]:
    """n workgroups as (x, y, 1) within the per-dimension limit (the kernel flattens them)."""
    most = limits.max_compute_workgroups_per_dimension
    if n <= most:
        return (max(n, 1), 1, 1)
    y = -(-n // most)
    return (-(-n // y), y, 1)


def matvec(kernels, device, out: Binding, w: Binding, x: Binding | Partials, *, wtype: int, k: int, m: int,
           scale: float | None = None, bias: Binding | None = None, accumulate: bool = False,
           w_up: Binding | None = None, norm: Binding | None = None, eps: float | None = None,
           tpr: int | None = None, act: str = FFN_SILU, subgroups: bool | None = None,
           workgroup: int = WORKGROUP, two_units: bool = False, stage: bool | None = None,
           affine: bool = True, x_bits: int | None = None, int8: bool = False) -> Dispatch:
    """out (m,) = scale * W (m, k) @ x (k,) [+ bias] [+ out]; with w_up, the SwiGLU
    out = scale * silu(W @ x) * (W_up @ x), or with act=FFN_GELU the GeGLU (tanh GELU).
    W and W_up: raw GGUF rows of `wtype`.
    With `norm` (k,) f32, x is replaced by rms_norm(x, eps) * norm: the RMSNorm before a
    block fused into its first matvec. x may instead be decode attention's `layers.Partials`:
    each workgroup merges them into attention's output first (the output projection with
    attention's combine folded in; not with w_up or norm), in workgroup memory.

    Tuning knobs: `tpr` overrides the threads per row (a power of two <= workgroup);
    `subgroups` picks the reduction: subgroup operations (True) or workgroup memory (False),
    None: subgroups where the device has them; `workgroup`: invocations per workgroup (a
    power of two <= 256; workgroup / tpr rows each); `two_units`: each thread decodes two
    units per loop iteration; `stage`: each workgroup stages x (normalized) in workgroup memory
    first, None: with a norm, where it fits (`staged_x_fits`; a merge always stages); `affine`:
    a staged matvec of a UNIT_AFFINE_TYPES type takes quant.wgsl's factored dot (unit_affine);
    `x_bits` 8 or 24 (X_INT_TYPES, a device with PACKED_DOT): each workgroup turns x (normalized
    or merged as it is staged) into integers of that many bits per 256-element block, and the
    rows take integer dot products (not with two_units); 0: f32 x; None: `x_int_bits`' default
    (in 8 bits with `int8`: cera.gpu.numerics).

    Q4_K/Q5_K weights as vec4<u32> with staging and the factored Q4_K dot (affine) each made
    Qwen2.5-1.5B's decode faster (docs/PERFORMANCE.md, decisions)."""
    t = _type(wtype)
    if w_up is not None and bias is not None:
        raise Unsupported("matvec: GLU with a bias is not supported")
    gelu = gelu_flag(act, w_up)
    subgroups = use_subgroups(device, subgroups)
    merge = not isinstance(x, Binding)   # layers.Partials
    bits = x_int_bits(device, t, k, m, x_bits, floats=merge or norm is not None, int8=int8)
    if bits and two_units:
        raise InvalidArgument("matvec: two_units applies to f32 x, not integer x")
    tpr = tpr or (x_int_threads_per_row(t, k, m, bits, workgroup) if bits else threads_per_row(t, k, m, workgroup))
    if workgroup & (workgroup - 1) or not tpr <= workgroup <= WORKGROUP:
        raise InvalidArgument(f"matvec: a workgroup of {workgroup} invocations for {tpr} threads per row "
                              f"(expected a power of two from {tpr} to {WORKGROUP})")
    rows = workgroup // tpr
    defines = dict(K=k, M=m, ROWS=rows, TPR=tpr,
                   **weight_flags(t), **flags(X_VEC4=k % 4 == 0, BIAS=bias is not None, ACCUMULATE=accumulate,
                                              GLU=w_up is not None, GELU=gelu, SUBGROUPS=subgroups,
                                              TWO_UNITS=two_units))
    if scale is not None and scale != 1.0:
        defines["SCALE"] = float(scale)
    sums = affine and not bits and t in UNIT_AFFINE_TYPES   # where staged, with the sums the factored dot reads
    if stage is None:
        stage = (merge or norm is not None) and staged_x_fits(device, k, sums, x_bits=bits)
    if merge and not stage:
        raise InvalidArgument("matvec: merging attention's partials stages them (stage=True)")
    if not staged_x_fits(device, k, sums, floats=stage, x_bits=bits):
        raise Unsupported(f"matvec: x of {k} elements does not fit this device's workgroup memory "
                          f"({device.limits.max_compute_workgroup_storage_size} bytes)")
    defines.update(flags(X_STAGED=stage, UNIT_AFFINE=stage and sums, X_INT=bool(bits)))
    if bits:
        defines["X_PLANES"] = bits // 8
    if merge:
        if w_up is not None or norm is not None or k != x.n_heads * x.head_dim or x.head_dim % 4:
            raise Unsupported(f"matvec: merging attention's partials ({x.n_heads} heads of {x.head_dim}) "
                              f"into a {m}x{k} matvec" + (" with a GLU or a norm" if w_up or norm else ""))
        defines.update(MERGE=True, **x.defines())
    bindings = [w] + ([w_up] if w_up is not None else []) + [x.scratch if merge else x, out] \
        + ([bias] if bias is not None else [])
    if merge:
        defines["STEP_BINDING"] = len(bindings)
        bindings.append(x.step)
    if norm is not None:
        if eps is None:
            raise Unsupported("matvec: a fused RMSNorm needs eps")
        defines.update(NORM=True, EPS=float(eps), NORM_BINDING=len(bindings))
        bindings.append(norm)
    label = f"matvec {t.name} {m}x{k}" + (" glu" if w_up is not None else "") + (" gelu" if gelu else "") \
        + (" +=" if accumulate else "") + (" xs" if stage and not merge else "") + (" sg" if subgroups else "") \
        + (" merge" if merge else "") + (f" x{bits}" if bits else "")
    weight_bytes = m * row_bytes(t, k) * (2 if w_up is not None else 1)
    x_bytes = 0 if merge else 4 * k * (2 if norm is not None else 1)   # partials: as pass 1 leaves them, uncounted
    reads = weight_bytes + x_bytes + 4 * m * ((bias is not None) + accumulate)
    return kernels.dispatch("matvec.wgsl", bindings, _groups(-(-m // rows), device.limits), label,
                            reads=reads, writes=4 * m, **defines)


def gelu_flag(act: str, w_up) -> bool:
    """Whether the GLU's gate activation is GELU (the GELU define); act applies to a GLU only."""
    if act not in (FFN_SILU, FFN_GELU):
        raise Unsupported(f"GLU activation {act!r}: expected {FFN_SILU!r} or {FFN_GELU!r}")
    if act == FFN_GELU and w_up is None:
        raise InvalidArgument("GELU is the GLU's gate activation: it needs w_up")
    return act == FFN_GELU


def row_tiles(wtype: int, k: int, m: int, limits) -> list[tuple[int, int]]:
    """Split m rows into (row_start, n_rows) tiles whose weight bytes fit one storage
    binding and whose starts are aligned for both the weights (row_start * row_bytes) and
    an f32 output bound at the same row (row_start * 4)."""
    rb = row_bytes(wtype, k)
    most = limits.max_storage_buffer_binding_size
    if m * rb <= most and m * 4 <= most:
        return [(0, m)]
    align = limits.min_storage_buffer_offset_alignment
    step_w = align // gcd(align, rb)     # rows per aligned weight offset
    step_o = align // gcd(align, 4)      # rows per aligned f32 offset
    step = step_w * step_o // gcd(step_w, step_o)
    per_tile = min(most // rb, most // 4) // step * step
    if per_tile == 0:
        raise TooLarge(f"{T(wtype).name} rows of {rb} bytes: {step} aligned rows exceed the "
                         f"storage binding limit of {most} bytes")
    return [(start, min(per_tile, m - start)) for start in range(0, m, per_tile)]


def _rows(b: Binding | None, start: int, size: int) -> Binding | None:
    """Bytes [start, start+size) of the range bound by b, the size rounded up to 4."""
    if b is None:
        return None
    return Binding(b.buffer, b.offset + start, (size + 3) // 4 * 4)


def _check_aligned(what: str, b: Binding, limits) -> None:
    if b.offset % limits.min_storage_buffer_offset_alignment:
        raise TooLarge(f"{what} starts at byte {b.offset}, not a multiple of "
                         f"{limits.min_storage_buffer_offset_alignment}: it cannot be tiled")


def matvec_tiled(kernels, device, out: Binding, w: Binding, x: Binding | Partials, *, wtype: int, k: int, m: int,
                 scale: float | None = None, bias: Binding | None = None, accumulate: bool = False,
                 w_up: Binding | None = None, norm: Binding | None = None, eps: float | None = None,
                 limits=None, act: str = FFN_SILU, subgroups: bool | None = None, tpr: int | None = None,
                 workgroup: int = WORKGROUP, two_units: bool = False, stage: bool | None = None,
                 x_bits: int | None = None, int8: bool = False) -> list[Dispatch]:
    """matvec over row tiles (`row_tiles`): one dispatch per tile, W, W_up, out and bias
    bound at the tile's rows. `limits` defaults to the device's; the tuning knobs are matvec's."""
    limits = limits or device.limits
    tiles = row_tiles(wtype, k, m, limits)
    knobs = dict(act=act, subgroups=subgroups, tpr=tpr, workgroup=workgroup, two_units=two_units, stage=stage,
                 x_bits=x_bits, int8=int8)
    if len(tiles) == 1:
        return [matvec(kernels, device, out, w, x, wtype=wtype, k=k, m=m, scale=scale, bias=bias,
                       accumulate=accumulate, w_up=w_up, norm=norm, eps=eps, **knobs)]
    for what, b in (("w", w), ("w_up", w_up), ("out", out), ("bias", bias)):
        if b is not None:
            _check_aligned(what, b, limits)
    rb = row_bytes(wtype, k)
    return [matvec(kernels, device, _rows(out, start * 4, n * 4), _rows(w, start * rb, n * rb), x,
                   wtype=wtype, k=k, m=n, scale=scale, bias=_rows(bias, start * 4, n * 4),
                   accumulate=accumulate, w_up=_rows(w_up, start * rb, n * rb), norm=norm, eps=eps, **knobs)
            for start, n in tiles]


def embed(kernels, device, out: Binding, w: Binding, tokens: Binding, step: Binding, *, wtype: int,
          k: int, max_rows: int, scale: float | None = None, row0: int = 0,
          n_rows: int | None = None) -> Dispatch:
    """out (n_tokens, k) = scale * E[tokens[t], :] for t < Step.n_tokens <= max_rows.

    `w` holds table rows [row0, row0 + n_rows) (a tile; n_rows None: no upper bound);
    tokens outside them are skipped, leaving their output rows to another tile."""
    t = _type(wtype)
    defines = {**weight_flags(t), "K": k, "WG": EMBED_WORKGROUP, "ROW0": row0,
               "N_ROWS": 0xFFFFFFFF - row0 if n_rows is None else n_rows}
    if scale is not None and scale != 1.0:
        defines["SCALE"] = float(scale)
    groups = (-(-units_per_row(t, k) // EMBED_WORKGROUP), max_rows, 1)
    return kernels.dispatch("embed.wgsl", [w, tokens, out, step], groups, f"embed {t.name} k={k}",
                            reads=max_rows * (row_bytes(t, k) + 4), writes=4 * max_rows * k, **defines)


def embed_tiled(kernels, device, out: Binding, w: Binding, tokens: Binding, step: Binding, *,
                wtype: int, k: int, rows: int, max_rows: int, scale: float | None = None,
                limits=None) -> list[Dispatch]:
    """embed from a table of `rows` rows, one dispatch per row tile (`row_tiles`)."""
    limits = limits or device.limits
    tiles = row_tiles(wtype, k, rows, limits)
    if len(tiles) > 1:
        _check_aligned("w", w, limits)
    rb = row_bytes(wtype, k)
    return [embed(kernels, device, out, _rows(w, start * rb, n * rb) if len(tiles) > 1 else w, tokens, step,
                  wtype=wtype, k=k, max_rows=max_rows, scale=scale, row0=start, n_rows=n)
            for start, n in tiles]


def argmax(kernels, device, out: Binding, logits: Binding, *, n: int) -> Dispatch:
    """out[0] (u32) = argmax(logits[0..n)), the first index on ties."""
    return kernels.dispatch("argmax.wgsl", [logits, out], (1, 1, 1), f"argmax {n}", reads=4 * n, writes=4,
                            N=n, **flags(VEC4=n % 4 == 0))
