"""Dispatch builders for the decode matrix-vector products (shaders/matvec.wgsl; with x in integers
matvec_int.wgsl).

Weights are raw GGUF bytes bound as `array<u32>` and decoded in the shader
(shaders/quant.wgsl, cera.gpu.quant); activations are f32. The builders hide the defines,
binding order and workgroup geometry. A matrix too big for one storage binding (the tied LM
head) is split into row tiles bound at aligned offsets: `matvec_tiled`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from cera.config import FFN_SILU
from cera.device import PACKED_DOT, Binding, Dispatch
from cera.errors import InvalidArgument, Unsupported
from cera.gpu.ops import gelu_flag, grid
from cera.gpu.quant import (UNIT_AFFINE_TYPES, UNIT_ELEMS, X_INT_ITEM_UNITS, X_INT_TYPES, byte_range, row_bytes,
                            row_tiles, units_per_row, weight_flags, weight_type)
from cera.kernels import flags

if TYPE_CHECKING:
    from cera.gpu.attention import Partials


WORKGROUP = 256          # invocations per matvec workgroup (SwiftShader's maximum)
STAGE_SCRATCH = 3 * 4 * WORKGROUP   # matvec.wgsl's reductions' workgroup memory at most: row_partial, reduce.wgsl
# x's bits in X_INT's integer dots: 24 as precise as f32 x (the default), 8 as llama.cpp's CPU
# backend quantizes its activations (Q8_K, opt-in: cera.gpu.numerics' int8); 0: f32 x
X_BITS = (0, 8, 24)
X_INT_MIN_ROWS = 1024                        # x_int_bits' default: integer x in matrices this tall or taller


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


def matvec(kernels, device, out: Binding, w: Binding, x: Binding | Partials, *, wtype: int, k: int, m: int,
           scale: float | None = None, bias: Binding | None = None, accumulate: bool = False,
           w_up: Binding | None = None, norm: Binding | None = None, eps: float | None = None,
           tpr: int | None = None, act: str = FFN_SILU, subgroups: bool | None = None,
           workgroup: int = WORKGROUP, stage: bool | None = None, x_bits: int | None = None, int8: bool = False) -> Dispatch:
    """out (m,) = scale * W (m, k) @ x (k,) [+ bias] [+ out]; with w_up, the SwiGLU
    out = scale * silu(W @ x) * (W_up @ x), or with act=FFN_GELU the GeGLU (tanh GELU).
    W and W_up: raw GGUF rows of `wtype`.
    With `norm` (k,) f32, x is replaced by rms_norm(x, eps) * norm: the RMSNorm before a
    block fused into its first matvec. x may instead be decode attention's `attention.Partials`:
    each workgroup merges them into attention's output first (the output projection with
    attention's combine folded in; not with w_up or norm), in workgroup memory.

    Tuning knobs: `tpr` overrides the threads per row (a power of two <= workgroup);
    `subgroups` picks the reduction: subgroup operations (True) or workgroup memory (False),
    None: subgroups where the device has them; `workgroup`: invocations per workgroup (a
    power of two <= 256; workgroup / tpr rows each); `stage`: each workgroup stages x
    (normalized) in workgroup memory first, None: with a norm, where it fits (`staged_x_fits`; a
    merge always stages); a staged matvec of a UNIT_AFFINE_TYPES type takes quant.wgsl's factored
    dot (unit_affine); `x_bits` 8 or 24 (X_INT_TYPES, a device with PACKED_DOT): each workgroup
    turns x (normalized or merged as it is staged) into integers of that many bits per
    256-element block, and the rows take integer dot products; 0: f32 x; None: `x_int_bits`'
    default (in 8 bits with `int8`: cera.gpu.numerics).

    Q4_K/Q5_K weights as vec4<u32> with staging and the factored Q4_K dot each made
    Qwen2.5-1.5B's decode faster (docs/PERFORMANCE.md, decisions)."""
    t = weight_type(wtype)
    if w_up is not None and bias is not None:
        raise Unsupported("matvec: GLU with a bias is not supported")
    gelu = gelu_flag(act, w_up)
    subgroups = use_subgroups(device, subgroups)
    merge = not isinstance(x, Binding)   # attention.Partials
    bits = x_int_bits(device, t, k, m, x_bits, floats=merge or norm is not None, int8=int8)
    tpr = tpr or (x_int_threads_per_row(t, k, m, bits, workgroup) if bits else threads_per_row(t, k, m, workgroup))
    if workgroup & (workgroup - 1) or not tpr <= workgroup <= WORKGROUP:
        raise InvalidArgument(f"matvec: a workgroup of {workgroup} invocations for {tpr} threads per row "
                              f"(expected a power of two from {tpr} to {WORKGROUP})")
    rows = workgroup // tpr
    defines = dict(K=k, M=m, ROWS=rows, TPR=tpr,
                   **weight_flags(t), **flags(X_VEC4=k % 4 == 0, BIAS=bias is not None, ACCUMULATE=accumulate,
                                              GLU=w_up is not None, GELU=gelu, SUBGROUPS=subgroups))
    if scale is not None and scale != 1.0:
        defines["SCALE"] = float(scale)
    sums = not bits and t in UNIT_AFFINE_TYPES   # where staged, with the sums the factored dot reads
    if stage is None:
        stage = (merge or norm is not None) and staged_x_fits(device, k, sums, x_bits=bits)
    if merge and not stage:
        raise InvalidArgument("matvec: merging attention's partials stages them (stage=True)")
    if not staged_x_fits(device, k, sums, floats=stage, x_bits=bits):
        raise Unsupported(f"matvec: x of {k} elements does not fit this device's workgroup memory "
                          f"({device.limits.max_compute_workgroup_storage_size} bytes)")
    defines.update(flags(X_STAGED=stage, UNIT_AFFINE=stage and sums, X_INT=bool(bits)))
    if bits:
        defines.update(X_PLANES=bits // 8, ITEM_UNITS=X_INT_ITEM_UNITS[t])
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
    shader = "matvec_int.wgsl" if bits else "matvec.wgsl"
    return kernels.dispatch(shader, bindings, (*grid(-(-m // rows), device.limits), 1), label,
                            reads=reads, writes=4 * m, **defines)


def matvec_tiled(kernels, device, out: Binding, w: Binding, x: Binding | Partials, *, wtype: int, k: int, m: int,
                 scale: float | None = None, bias: Binding | None = None, accumulate: bool = False,
                 w_up: Binding | None = None, norm: Binding | None = None, eps: float | None = None,
                 limits=None, act: str = FFN_SILU, subgroups: bool | None = None, tpr: int | None = None,
                 workgroup: int = WORKGROUP, stage: bool | None = None,
                 x_bits: int | None = None, int8: bool = False) -> list[Dispatch]:
    """matvec over row tiles (`row_tiles`): one dispatch per tile, W, W_up, out and bias
    bound at the tile's rows. `limits` defaults to the device's; the tuning knobs are matvec's."""
    limits = limits or device.limits
    tiles = row_tiles(wtype, k, m, limits)
    knobs = dict(act=act, subgroups=subgroups, tpr=tpr, workgroup=workgroup, stage=stage,
                 x_bits=x_bits, int8=int8)
    if len(tiles) == 1:
        return [matvec(kernels, device, out, w, x, wtype=wtype, k=k, m=m, scale=scale, bias=bias,
                       accumulate=accumulate, w_up=w_up, norm=norm, eps=eps, **knobs)]
    rb = row_bytes(wtype, k)

    def rows(b, start, n, size):
        return byte_range(b, start * size, n * size, limits)

    return [matvec(kernels, device, rows(out, start, n, 4), rows(w, start, n, rb), x, wtype=wtype, k=k, m=n,
                   scale=scale, bias=rows(bias, start, n, 4), accumulate=accumulate, w_up=rows(w_up, start, n, rb),
                   norm=norm, eps=eps, **knobs)
            for start, n in tiles]
