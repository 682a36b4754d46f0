"""Dispatch builders for the decode matrix-vector products (shaders/matvec.wgsl; with x in integers
matvec_int.wgsl).

Weights are raw GGUF bytes bound as `array<u32>` and decoded in the shader
(shaders/quant_units.wgsl, quant_items_int.wgsl; cera.gpu.quant); activations are f32. The builders hide the defines,
binding order and workgroup geometry. A matrix too big for one storage binding (the tied LM
head) is split into row tiles bound at aligned offsets: `matvec_tiled`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from cera.device import PACKED_DOT, Binding, Dispatch
from cera.errors import InvalidArgument, Unsupported
from cera.gpu.matmul import x_int_stride
from cera.gpu.ops import grid
from cera.gpu.quant import (UNIT_AFFINE_TYPES, UNIT_ELEMS, X_INT_ITEM_UNITS, X_INT_TYPES, byte_range, row_tiles,
                            units_per_row, weight_flags, weight_type)
from cera.gpu.spec import DEFAULT, Projection, Tuning
from cera.kernels import flags

if TYPE_CHECKING:
    from cera.gpu.attention import Partials


WORKGROUP = 256          # invocations per matvec workgroup (SwiftShader's maximum)
STAGE_SCRATCH = 3 * 4 * WORKGROUP   # matvec.wgsl's reductions' workgroup memory at most: row_partial, reduce.wgsl
# x's bits in matvec_int.wgsl's integer dots: 24 as precise as f32 x (the default), 8 as llama.cpp's CPU
# backend quantizes its activations (Q8_K, opt-in: cera.gpu.numerics' int8); 0: f32 x
X_BITS = (0, 8, 24)
X_INT_MIN_ROWS = 1024                        # x_int_bits' default: integer x in matrices this tall or taller
RPT_MIN_ROWS = 2048                          # rows_per_thread: two rows a thread in integer-x matrices this tall
RPT_MIN_K = 3584                             # and this wide
RECORD_MIN_K = 3584                          # uses_record: a normed x this wide has its integers made once
RECORD_THREADS = 1 << 19                     # record_threads_per_row: about this many threads a matvec


@dataclass(frozen=True)
class XStaging:
    """The workgroup arrays a matvec stages its x in (shaders/matvec_io.wgsl, matvec_int.wgsl), in
    elements; the shaders declare them of these lengths (`defines`)."""
    xs: int = 0      # vec4<f32>: x as the dot products see it (X_STAGED), 4 a 16-element unit
    xsums: int = 0   # vec2<f32>: the sums of xs's vec4s, two to a vec2 (UNIT_AFFINE)
    xq: int = 0      # vec4<u32>: x in integers (matvec_int.wgsl), X_PLANES bytes an element
    xsum: int = 0    # i32: each 16-element group's sum of its integers
    xd: int = 0      # f32: each 256-element block's step
    gmax: int = 0    # vec4<f32>: each 16-element group's max |x|, four to a vec4

    @property
    def nbytes(self) -> int:
        return 16 * self.xs + 8 * self.xsums + 16 * self.xq + 4 * (self.xsum + self.xd) + 16 * self.gmax

    def defines(self) -> dict:
        """The lengths of the arrays staged, as the shaders' XS_LEN, XSUMS_LEN, ... defines."""
        return {f"{name.upper()}_LEN": n for name, n in vars(self).items() if n}


def x_staging(k: int, sums: bool = False, floats: bool = True, x_bits: int = 0) -> XStaging:
    """What a matvec stages of a k-element x: as floats (X_STAGED), with the sums UNIT_AFFINE
    reads, and/or in x_bits-bit integers (matvec_int.wgsl) with their sums, steps and group maxima."""
    units = -(-k // UNIT_ELEMS)
    staged = XStaging(xs=4 * units, xsums=2 * units if sums else 0) if floats else XStaging()
    if not x_bits:
        return staged
    return replace(staged, xq=x_bits // 8 * units, xsum=units, xd=-(-k // 256), gmax=-(-k // 64))


def staged_x_fits(device, k: int, sums: bool = False, floats: bool = True, x_bits: int = 0) -> bool:
    """Whether matvec.wgsl can stage a k-element x (`x_staging`) in workgroup memory beside its
    reductions' own (at most STAGE_SCRATCH bytes)."""
    return x_staging(k, sums, floats, x_bits).nbytes + STAGE_SCRATCH <= device.limits.max_compute_workgroup_storage_size


def x_int_bits(device, wtype: int, k: int, m: int, wanted: int | None, floats: bool, int8: bool = False,
               record: bool = False) -> int:
    """The bits of x's integers in a matvec's dot products (matvec_int.wgsl), or 0 for f32 x: `wanted`, or
    (None) 24 bits, 8 with `int8`, where x is staged as floats anyway (`floats`: a fused norm or
    a merge) or its integers are in a record (`record`, nothing staged), the matrix has
    X_INT_MIN_ROWS rows or more, and the type, the device's compiler and (staged) its workgroup
    memory allow.

    24 bits (the default) keep f32 x's precision: x in steps of 1/8355711 of its block's largest
    |x| (f32's own rounding of that element is 1/16777216 of it), and each of the three bytes
    dotted in integers, so the results stay within the f32 path's tolerances of the reference.
    8 bits (Numerics.int8, opt-in) are llama.cpp's integer dot products of 8-bit activations:
    decode then no longer equals prefill or the reference to f32 precision (Qwen2.5-1.5B's greedy
    tokens still agree with llama.cpp's, 16 of 16 on the golden prompts).

    Integer dots are faster than f32 x where x is staged; the 256-row v projections are faster
    with f32 x (every workgroup converts all of x, for few rows), hence X_INT_MIN_ROWS; the down
    projections, whose x is not staged, are slower with integer x converted in every workgroup,
    so they keep f32 x unless its integers come in a record (docs/PERFORMANCE.md, decisions)."""
    t = T(wtype)
    if wanted is None:
        bits = int_bits(int8)
        fits = (floats or record) and m >= X_INT_MIN_ROWS and t in X_INT_TYPES and PACKED_DOT in device.features \
            and (record or staged_x_fits(device, k, x_bits=bits))
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
    """Threads per row of an integer-x matvec of `bits`-bit x (items of ITEM_UNITS units,
    quant_items_int.wgsl): at least two items a thread and at most 2^18 threads in all for 8 bits, a third of
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


def record_threads_per_row(wtype: int, k: int, m: int, rpt: int, workgroup: int = WORKGROUP) -> int:
    """Threads per row of a matvec reading x's record of integers (X_RECORD): about
    RECORD_THREADS in all, a thread's `rpt` rows counted once, and no more than the row has items.
    Its workgroups prepare nothing, so many small ones cost little and even out the GPU's
    multiprocessors, where x_int_threads_per_row keeps few fat ones: on an H100, four times
    x_int_threads_per_row's took the Llama-3.1-8B shape's step from 4.263 to 3.780 ms and
    Qwen2.5-7B's from 3.623 to 3.514 (their GLUs 448 -> 1792 and 592 -> 2368 workgroups);
    eight times, no further (docs/PERFORMANCE.md, decisions)."""
    items = units_per_row(wtype, k) // X_INT_ITEM_UNITS[T(wtype)]
    tpr = 2
    while tpr < workgroup and tpr * 2 * -(-m // rpt) <= RECORD_THREADS and tpr * 2 <= items:
        tpr *= 2
    return tpr


def int_bits(int8: bool = False) -> int:
    """x's bits where a matvec takes integer x by default: 24, or 8 with `int8` (`x_int_bits`)."""
    return 8 if int8 else 24


def record_layout(bits: int) -> dict:
    """The shape of x's record of `bits`-bit integers as the matvecs read it (X_RECORD), as
    cera.gpu.matmul's x_int_stride, quantize_x and rms_norm_x_int take it: the integer prefill's
    record with a sum every 16 elements (the matvecs' groups; flag SUMS16)."""
    return dict(planes=bits // 8, group=16)


def record_words(k: int, bits: int) -> int:
    """u32 words of x's record of `bits`-bit integers (`record_layout`)."""
    return x_int_stride(k, **record_layout(bits))


def uses_record(device, k: int) -> bool:
    """Whether the decode matvecs of a k-element x read its integers from a record made once for
    all of them (`matvec`'s x_ints): by its norm (cera.gpu.matmul.rms_norm_x_int) rather than each
    workgroup normalizing x and turning it into integers itself, or by quantize_x (or attention's
    combine) for an x that is not normed (the down projections', attention's output; cera.gpu.plan
    takes these only in models whose normed x has records) rather than the matvec reading f32 x: for x of
    RECORD_MIN_K or more elements in whole 256-element blocks, where the device has packed dot
    products. On an H100, the Llama-3.1-8B shape's step 4.497 -> 3.594 ms with all of them;
    Qwen2.5-1.5B's 8960-wide downs gained nothing (1.545 vs 1.544 ms) for 28 more dispatches a
    token (docs/PERFORMANCE.md, decisions)."""
    return k >= RECORD_MIN_K and k % 256 == 0 and PACKED_DOT in device.features


def record_bits(device, p: Projection, int8: bool = False) -> int:
    """The bits of x's integers where a matvec of `p` reads them from a record (`uses_record`), 0
    where it reads x."""
    return tuned(device, p, record=True, int8=int8).x_bits if uses_record(device, p.k) else 0


def workgroups(m: int, tpr: int, rpt: int, workgroup: int = WORKGROUP) -> int:
    """The workgroups of an m-row matvec of `tpr` threads a row and `rpt` rows a thread."""
    return -(-m // (workgroup // tpr * rpt))


def rows_per_thread(bits: int, k: int, m: int) -> int:
    """Rows a thread sums: two in integer-x matvecs of at least RPT_MIN_ROWS rows of RPT_MIN_K
    elements, one otherwise. Each x word a thread reads serves both rows, and two rows' weights
    are in flight; where every workgroup turns all of x into integers first, it pays that once for
    twice the rows. That wins for a 4096- or 3584-wide x, staged or read from a record, and loses
    for a 1536-wide one, whose conversion is cheap and whose matvecs then have half the
    workgroups; a 1024-row matrix does not gain (docs/PERFORMANCE.md, decisions)."""
    return 2 if bits and m >= RPT_MIN_ROWS and k >= RPT_MIN_K else 1


def use_subgroups(device, wanted: bool | None) -> bool:
    """Whether a kernel reduces with subgroup operations: `wanted`, or (None) where the device
    has the `subgroups` feature."""
    has = "subgroups" in device.features
    if wanted and not has:
        raise Unsupported("this device has no subgroups")
    return has if wanted is None else wanted


def tuned(device, p: Projection, tune: Tuning = DEFAULT, *, floats: bool = False, record: bool = False,
          int8: bool = False) -> Tuning:
    """`tune` with every knob a matvec of `p` reads resolved, as `matvec` resolves them: the
    reduction (`use_subgroups`), x's bits (`x_int_bits`; floats: x is staged as floats, normed or
    merged, or `record`: its integers are in a record), the workgroup size (WORKGROUP), the
    threads per row (`threads_per_row`, `x_int_threads_per_row`, with a record
    `record_threads_per_row`) and the rows per thread (`rows_per_thread`)."""
    tune.check("matvec", "tpr", "rpt", "workgroup", "subgroups", "x_bits")
    t, k, m = weight_type(p.wtype), p.k, p.m
    subgroups = use_subgroups(device, tune.subgroups)
    bits = x_int_bits(device, t, k, m, tune.x_bits, floats=floats, int8=int8, record=record)
    workgroup = tune.workgroup or WORKGROUP
    rpt = tune.rpt or rows_per_thread(bits, k, m)
    if rpt not in (1, 2):
        raise InvalidArgument(f"matvec: {rpt!r} rows per thread (expected 1 or 2)")
    tpr = tune.tpr or (record_threads_per_row(t, k, m, rpt, workgroup) if bits and record
                       else x_int_threads_per_row(t, k, m, bits, workgroup) if bits else threads_per_row(t, k, m, workgroup))
    if workgroup & (workgroup - 1) or not tpr <= workgroup <= WORKGROUP:
        raise InvalidArgument(f"matvec: a workgroup of {workgroup} invocations for {tpr} threads per row "
                              f"(expected a power of two from {tpr} to {WORKGROUP})")
    return Tuning(tpr=tpr, rpt=rpt, workgroup=workgroup, subgroups=subgroups, x_bits=bits)


def matvec(kernels, device, out: Binding, p: Projection, x: Binding | Partials, *, norm: Binding | None = None,
           eps: float | None = None, x_ints: Binding | None = None, int8: bool = False,
           tune: Tuning = DEFAULT) -> Dispatch:
    """out (m,) = the projection `p` of x (k,) (cera.gpu.spec.Projection: W and W_up raw GGUF rows).
    With `norm` (k,) f32, x is replaced by rms_norm(x, eps) * norm: the RMSNorm before a
    block fused into its first matvec. x may instead be decode attention's `attention.Partials`:
    each workgroup merges them into attention's output first (the output projection with
    attention's combine folded in; not with w_up or norm), in workgroup memory.

    A normed or merged x is staged: each workgroup first writes it (normalized or merged) into
    workgroup memory, where it fits (`staged_x_fits`; a merge must); a staged matvec of a
    UNIT_AFFINE_TYPES type takes quant_units.wgsl's factored dot (unit_affine). With x in integers
    (`x_int_bits`: 24 bits by default where it pays, 8 with `int8`: cera.gpu.numerics) each
    workgroup turns x (normalized or merged as it is staged) into integers per 256-element
    block, and the rows take integer dot products. `x_ints` is x's record of integers made once
    for every matvec of it (`uses_record`): a matvec that takes integer x reads it from there and
    prepares nothing (X_RECORD), the others read x. `tune` overrides the threads per row, the rows
    per thread, the workgroup size, the reduction and x's bits (cera.gpu.spec.Tuning).

    Q4_K/Q5_K weights as vec4<u32> with staging and the factored Q4_K dot each made
    Qwen2.5-1.5B's decode faster (docs/PERFORMANCE.md, decisions)."""
    t, k, m = weight_type(p.wtype), p.k, p.m
    merge = not isinstance(x, Binding)   # attention.Partials
    floats = merge or norm is not None    # x staged as floats, where it fits: merged or normalized
    knobs = tuned(device, p, tune, floats=floats, record=x_ints is not None, int8=int8)
    subgroups, bits, tpr, rpt = knobs.subgroups, knobs.x_bits, knobs.tpr, knobs.rpt
    record = bits and x_ints is not None
    if record and (norm is not None or merge):
        raise InvalidArgument("matvec: x's record of integers is x normed already: no norm or merge with it")
    rows = knobs.workgroup // tpr
    defines = dict(K=k, M=m, ROWS=rows, TPR=tpr, RPT=rpt,
                   **weight_flags(t), **flags(X_VEC4=k % 4 == 0, BIAS=p.bias is not None, ACCUMULATE=p.accumulate,
                                              GLU=p.glu, GELU=p.gelu, SUBGROUPS=subgroups))
    if p.scale is not None and p.scale != 1.0:
        defines["SCALE"] = float(p.scale)
    sums = not bits and t in UNIT_AFFINE_TYPES   # where staged, with the sums the factored dot reads
    stage = floats and staged_x_fits(device, k, sums, x_bits=bits)
    staged = x_staging(k, stage and sums, floats=stage, x_bits=0 if record else bits)
    if (merge and not stage) or staged.nbytes + STAGE_SCRATCH > device.limits.max_compute_workgroup_storage_size:
        raise Unsupported(f"matvec: x of {k} elements does not fit this device's workgroup memory "
                          f"({device.limits.max_compute_workgroup_storage_size} bytes)")
    defines.update(flags(X_STAGED=stage, UNIT_AFFINE=stage and sums), **staged.defines())
    if bits:
        defines.update(X_PLANES=bits // 8, ITEM_UNITS=X_INT_ITEM_UNITS[t], **flags(X_RECORD=record, SUMS16=record))
    if merge:
        if p.glu or norm is not None or k != x.n_heads * x.head_dim or x.head_dim % 4:
            raise Unsupported(f"matvec: merging attention's partials ({x.n_heads} heads of {x.head_dim}) "
                              f"into a {m}x{k} matvec" + (" with a GLU or a norm" if p.glu or norm else ""))
        defines.update(MERGE=True, **x.defines())
    bindings = [p.w] + ([p.w_up] if p.glu else []) + [x.scratch if merge else x_ints if record else x, out] \
        + ([p.bias] if p.bias is not None else [])
    if merge:
        defines["STEP_BINDING"] = len(bindings)
        bindings.append(x.step)
    if norm is not None:
        if eps is None:
            raise Unsupported("matvec: a fused RMSNorm needs eps")
        defines.update(NORM=True, EPS=float(eps), NORM_BINDING=len(bindings))
        bindings.append(norm)
    label = f"matvec {t.name} {m}x{k}" + p.tags() + (" xs" if stage and not merge else "") \
        + (" sg" if subgroups else "") + (" merge" if merge else "") + (f" x{bits}" if bits else "") \
        + (f" rpt{rpt}" if rpt > 1 else "") + (" rec" if record else "")
    x_bytes = 0 if merge else 4 * record_words(k, bits) if record else 4 * k * (2 if norm is not None else 1)
    # partials: as pass 1 leaves them, uncounted
    reads = p.weight_bytes + x_bytes + 4 * m * ((p.bias is not None) + p.accumulate)
    shader = "matvec_int.wgsl" if bits else "matvec.wgsl"
    return kernels.dispatch(shader, bindings, (*grid(workgroups(m, tpr, rpt, knobs.workgroup), device.limits), 1), label,
                            reads=reads, writes=4 * m, **defines)


def matvec_tiled(kernels, device, out: Binding, p: Projection, x: Binding | Partials, *,
                 norm: Binding | None = None, eps: float | None = None, x_ints: Binding | None = None,
                 int8: bool = False, tune: Tuning = DEFAULT) -> list[Dispatch]:
    """matvec over row tiles (`row_tiles`) of the device's storage bindings: one dispatch per
    tile, W, W_up, out and bias bound at the tile's rows."""
    tiles = row_tiles(p.wtype, p.k, p.m, device.limits)
    knobs = dict(norm=norm, eps=eps, x_ints=x_ints, int8=int8, tune=tune)
    if len(tiles) == 1:
        return [matvec(kernels, device, out, p, x, **knobs)]
    return [matvec(kernels, device, byte_range(out, 4 * start, 4 * n, device.limits), p.rows(start, n, device.limits),
                   x, **knobs)
            for start, n in tiles]
