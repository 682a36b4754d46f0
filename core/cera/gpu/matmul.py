"""Dispatch builders for the batched (prefill) matrix products: the register-tiled quantized matmul
(shaders/matmul.wgsl), its integer-x twin (matmul_int.wgsl, with quantize_x.wgsl) and the sum of
a split K's parts (split_sum.wgsl).

A prefill chunk is up to `max_rows` tokens: a dispatch is sized for `max_rows` and the
kernels read `Step.n_tokens`, so one dispatch serves every chunk length. Weights are raw
GGUF bytes bound as `array<u32>` (decoded by shaders/quant_units.wgsl, quant_subs_int.wgsl); activations are f32,
row-major, one row per token. Outputs come first, as in cera.gpu.matvec and ops.

Tile choice (`matmul_tiles`). Workgroup memory is budgeted at the WebGPU
default of 16 KiB (Apple and SwiftShader grant exactly that; a peer's 24 KiB shader returned
zeros on Apple) and grows only where the device's `max_compute_workgroup_storage_size`
allows; workgroups stay at 256 invocations.
  matmul: 64 weight rows x 64 tokens per workgroup (32 for K- and i-quant weights), 4x4
    outputs per invocation, K slices of 32 elements (16 KiB: 8 KiB of dequantized weights + 8
    KiB of x) or 16. Each weight is dequantized once per workgroup and used by its tokens; each
    k step reads 2 vec4 from workgroup memory for 16 FMAs. GLU stages two weight tiles (24
    KiB). Chunks of at most 32 rows use 32-token tiles. The preference is measured (the tables
    below); MIN_WORKGROUPS guards a small matrix.
  f16 (`half_tiles`): where the device has shader-f16, the staged tiles are f16 and each K
    slice's partial dots f16 FMAs, summed in f32 (shaders/matmul.wgsl HALF): the same
    tilings in the same bytes with twice the bk. Not for F32 or BF16 weights (they would
    lose their precision or range). Opt-in (cera.gpu.numerics' f16): its logits differ from the
    f32 path's by up to ~2% of the largest (1.6e-5 nMSE on a Q8_0 LFM2), beyond the tolerances
    the f32 kernels are held to against the numpy reference.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from cera.device import DEFAULT_WORKGROUP_STORAGE, PACKED_DOT, Binding, Dispatch
from cera.errors import InvalidArgument, TooLarge, Unsupported
from cera.gpu.ops import grid
from cera.gpu.quant import (INT_SUB_SCALES, INT_TILE_TYPES, WEIGHT_TYPES, aligned_rows, byte_range, row_bytes, row_tiles, weight_flags,
                            weight_type)
from cera.gpu.spec import DEFAULT, Projection, Tuning
from cera.kernels import flags


@dataclass(frozen=True)
class MatmulTiles:
    """A workgroup computes tile_t tokens x tile_m weight rows, walking K in slices of bk
    elements; each invocation holds rt tokens x rm rows of outputs in registers."""
    tile_m: int
    tile_t: int
    bk: int
    rm: int
    rt: int

    def __post_init__(self):
        if self.rm not in (4, 8) or self.rt not in (4, 8) or self.tile_m % self.rm or self.tile_t % self.rt:
            raise ValueError(f"{self}: rm and rt must be 4 or 8 and divide tile_m, tile_t")
        if self.bk % 16:
            raise ValueError(f"{self}: bk must be a multiple of 16 (a quant unit)")

    @property
    def invocations(self) -> int:
        return (self.tile_m // self.rm) * (self.tile_t // self.rt)

    def arrays(self, glu: bool) -> dict:
        """The lengths of matmul.wgsl's workgroup arrays, in vec4s of f32 (f16 with HALF): the
        weight slice (of each matrix) and the x slice."""
        return dict(WS_LEN=(2 if glu else 1) * self.bk * self.tile_m // 4, XS_LEN=self.bk * self.tile_t // 4)

    def storage(self, glu: bool, half: bool = False) -> int:
        """Workgroup memory in bytes (`arrays`), f32 or f16 (half)."""
        return (8 if half else 16) * sum(self.arrays(glu).values())

    def defines(self, glu: bool) -> dict:
        return dict(TILE_M=self.tile_m, TILE_T=self.tile_t, BK=self.bk, RM=self.rm, RT=self.rt, **self.arrays(glu))


# Preferred first; bk is a multiple of 16 (a quant unit), and the 16 KiB entries are the fallback
# every WebGPU device grants. 4x4 outputs per invocation in 64-row tiles beat the 8x8 and 4x8
# blocks of 128-token tiles (fewer registers: more workgroups resident to cover each slice's
# staging), and for the superblock types (K- and i-quants: 256-element blocks) 32-token tiles
# beat 64, where for Q4_1 they did not (docs/PERFORMANCE.md, decisions). The kernel also takes
# 8-wide blocks (tiles=).
_MATMUL_TILES = [
    MatmulTiles(tile_m=64, tile_t=64, bk=32, rm=4, rt=4),     # 16 KiB
    MatmulTiles(tile_m=64, tile_t=64, bk=16, rm=4, rt=4),     # 8 KiB
]
_SUPERBLOCK_TILES = [
    MatmulTiles(tile_m=64, tile_t=32, bk=32, rm=4, rt=4),     # 12 KiB
    MatmulTiles(tile_m=64, tile_t=32, bk=16, rm=4, rt=4),     # 6 KiB
]
_GLU_TILES = [
    MatmulTiles(tile_m=64, tile_t=64, bk=32, rm=4, rt=4),     # 2 x 8 + 8 = 24 KiB
    MatmulTiles(tile_m=64, tile_t=64, bk=16, rm=4, rt=4),     # 12 KiB
]
_SMALL_TILES = [   # chunks of at most 32 rows: less padding along tokens
    MatmulTiles(tile_m=128, tile_t=32, bk=32, rm=8, rt=4),    # 20 KiB
    MatmulTiles(tile_m=128, tile_t=32, bk=16, rm=8, rt=4),    # 10 KiB
]
_SMALL_GLU_TILES = [
    MatmulTiles(tile_m=64, tile_t=32, bk=32, rm=4, rt=4),     # 20 KiB
    MatmulTiles(tile_m=64, tile_t=32, bk=16, rm=4, rt=4),     # 10 KiB
]
MIN_WORKGROUPS = 64   # fewer leaves most of a big GPU idle: take a smaller tile instead
# Weight types whose prefill matmul may stage f16 tiles: not F32 or BF16 (f16 would drop
# their precision or their range).
HALF_TYPES = WEIGHT_TYPES - {T.F32, T.BF16}


def half_tiles(device, wtype: int) -> bool:
    """Whether the prefill matmul of `wtype` can run the f16 variant on `device`."""
    return "shader-f16" in device.features and T(wtype) in HALF_TYPES


def _halved(tilings: list[MatmulTiles]) -> list[MatmulTiles]:
    """The f16 tilings: each f32 one with twice the bk, in the same workgroup memory."""
    return [replace(t, bk=2 * t.bk) for t in tilings]


def _workgroups(tiles: MatmulTiles, m: int, max_rows: int) -> int:
    return -(-m // tiles.tile_m) * -(-max_rows // tiles.tile_t)


def matmul_tiles(limits, max_rows: int, glu: bool = False, m: int | None = None, half: bool = False,
                 wtype: int | None = None) -> MatmulTiles:
    """The first preferred tiling (f16 tiles: `half`; for weights of `wtype`) whose workgroup
    memory and invocations fit `limits`; given the output width m, the first of those that
    makes MIN_WORKGROUPS workgroups (else the one that makes the most)."""
    if max_rows <= 32:
        candidates = _SMALL_GLU_TILES if glu else _SMALL_TILES
    elif glu:
        candidates = _GLU_TILES
    else:
        superblock = wtype is not None and GGML_QUANT_SIZES[T(wtype)][0] == 256
        candidates = _SUPERBLOCK_TILES if superblock else _MATMUL_TILES
    if half:
        candidates = _halved(candidates)
    budget = max(DEFAULT_WORKGROUP_STORAGE, limits.max_compute_workgroup_storage_size)
    fitting = [t for t in candidates
               if t.storage(glu, half) <= budget and t.invocations <= limits.max_compute_invocations_per_workgroup]
    if not fitting:
        raise TooLarge("no matmul tiling fits this device's workgroup limits")
    if m is None:
        return fitting[0]
    for tiles in fitting:
        if _workgroups(tiles, m, max_rows) >= MIN_WORKGROUPS:
            return tiles
    return max(fitting, key=lambda t: _workgroups(t, m, max_rows))


def matmul(kernels, device, out, p: Projection, x, step, *, max_rows: int, out_stride: int | None = None,
           row0: int = 0, half: bool = False, split: int = 1, tune: Tuning = DEFAULT) -> Dispatch:
    """out (rows, m) = the projection `p` (cera.gpu.spec.Projection) of each row of x (rows, k) f32,
    for rows = step.n_tokens <= max_rows: x @ W^T, or the GLU's act(x @ W^T) * (x @ W_up^T). half:
    f16 tiles and slice dots (needs the device's shader-f16); the label ends in "f16" then. split
    > 1: K in `split` parts, part p's dots into rows p * max_rows + t of out (split, max_rows, m)
    (k_parts, split_sum; no bias, GLU or accumulate).

    out_stride: floats between rows of out (default m; the full width when W is a row tile).
    row0: x and out are bound from token row row0 on and this dispatch covers rows
    row0..row0+max_rows-1 of the step (a row block; see matmul_tiled). `tune.tiles` overrides
    the tiling (`matmul_tiles`)."""
    tune.check("matmul", "tiles")
    t = weight_type(p.wtype, "batched matmul")
    row_bytes(t, p.k)   # checks k against the block size
    if half and "shader-f16" not in device.features:
        raise Unsupported("matmul: f16 tiles need the device feature shader-f16")
    if tune.tiles is not None and not isinstance(tune.tiles, MatmulTiles):
        raise InvalidArgument(f"matmul: tiles {tune.tiles} are not MatmulTiles")
    tiles = tune.tiles or matmul_tiles(device.limits, max_rows, p.glu, p.m, half, t)
    return _tile_dispatch(kernels, device, "matmul.wgsl", out, p, x, step, max_rows=max_rows, tiles=tiles,
                          x_row_bytes=4 * p.k, out_stride=out_stride, row0=row0, split=split,
                          suffix=" f16" if half else "", **tiles.defines(p.glu), **flags(X_VEC4=p.k % 4 == 0, HALF=half))


# K parts (matmul_io.wgsl SPLIT) for a matmul with few workgroups and a long K: as many as keep
# every part at least SPLIT_MIN_K long and the workgroups at most SPLIT_WORKGROUPS, at most
# SPLIT_MAX. More workgroups hide each slice's staging: Qwen2.5-1.5B's 1536-row downs (K 8960)
# are faster in 4 parts than in 1 or 2, and a K of 1536 gains too little to split
# (docs/PERFORMANCE.md, decisions).
SPLIT_MAX = 4
SPLIT_MIN_K = 2048
SPLIT_WORKGROUPS = 1536


def k_parts(k: int, workgroups: int) -> int:
    """The parts to cut the K of a prefill matmul of `workgroups` workgroups into (1: none)."""
    split = 1
    while 2 * split <= SPLIT_MAX and k >= 2 * split * SPLIT_MIN_K and 2 * split * workgroups <= SPLIT_WORKGROUPS:
        split *= 2
    return split


def split_sum(kernels, out, parts, step, *, m: int, split: int, max_rows: int, accumulate: bool,
              label: str) -> Dispatch:
    """out (rows, m) (+ out, with `accumulate`) = the sum of parts (split, max_rows, m) in part
    order, for rows < step.n_tokens (shaders/split_sum.wgsl)."""
    return kernels.dispatch("split_sum.wgsl", [parts, out, step], (-(-m // 256), max_rows, 1), label,
                            reads=4 * max_rows * m * (split + accumulate), writes=4 * max_rows * m,
                            M=m, SPLIT=split, MAX_ROWS=max_rows, **flags(ACCUMULATE=accumulate))


def _tile_dispatch(kernels, device, shader, out, p: Projection, x, step, *, max_rows, tiles, x_row_bytes,
                   out_stride, row0, tag="", suffix="", split=1, **defines) -> Dispatch:
    """A dispatch of a prefill matmul kernel (matmul.wgsl, matmul_int.wgsl; shaders/matmul_io.wgsl
    their shared bindings and output): what `matmul` and `matmul_int` share, given the kernel's own
    `defines` (its tiling's among them), x's bytes a row, `tag` / `suffix` for the label (after the shape, at the end) and
    the parts of K (`split`: as many times the workgroups along x)."""
    t, k, m = T(p.wtype), p.k, p.m
    if split > 1:
        if p.accumulate or p.bias is not None or p.glu or row0:
            raise Unsupported("matmul: a split K takes no bias, GLU, accumulation or row block")
        defines.update(SPLIT=split, MAX_ROWS=max_rows)
        suffix += f" /{split}"
    stride = m if out_stride is None else out_stride
    defines.update(K=k, M=m, OUT_STRIDE=stride, **weight_flags(t),
                   **flags(BIAS=p.bias is not None, ACCUMULATE=p.accumulate, GLU=p.glu, GELU=p.gelu,
                           OUT_VEC4=m % 4 == 0 and stride % 4 == 0))
    if row0:
        defines["ROW0"] = row0
    if p.scale is not None and p.scale != 1.0:
        defines["SCALE"] = float(p.scale)
    bindings = [p.w] + ([p.w_up] if p.glu else []) + [x, out] + ([p.bias] if p.bias is not None else []) + [step]
    y, z = grid(-(-m // tiles.tile_m), device.limits)
    label = f"matmul {t.name} {m}x{k}{tag}" + p.tags() + suffix
    reads = p.weight_bytes + max_rows * (x_row_bytes + 4 * m * p.accumulate) + 4 * m * (p.bias is not None)
    return kernels.dispatch(shader, bindings, (split * -(-max_rows // tiles.tile_t), y, z), label, reads=reads,
                            writes=4 * split * max_rows * m, **defines)


def x_int_stride(k: int, planes: int = 1, group: int = 32) -> int:
    """u32 words of a row of x in integers of `planes` bytes with a sum every `group` elements
    (shaders/x_int_record.wgsl; 16: flag SUMS16), a multiple of 4."""
    return -(-(planes * k // 4 + k // group + k // 256) // 4) * 4


def x_record_defines(k: int, planes: int, group: int) -> dict:
    """The defines of x_int_record.wgsl for a writer of rows of k elements in integers of
    `planes` bytes with a sum every `group` elements (quantize_x, rms_norm_x_int, attention's
    combine)."""
    return dict(K=k, X_PLANES=planes, X_STRIDE=x_int_stride(k, planes, group), **flags(SUMS16=group == 16))


def int_tile(device, wtype: int, k: int) -> bool:
    """Whether the prefill matmul of `wtype` rows of k can take x in integers on `device`."""
    return T(wtype) in INT_TILE_TYPES and k % 256 == 0 and PACKED_DOT in device.features


@dataclass(frozen=True)
class IntTiles:
    """matmul_int.wgsl's tile: tile_t tokens x tile_m rows, K in slices of bk (4x4 outputs an
    invocation)."""
    tile_m: int
    tile_t: int
    bk: int

    def __post_init__(self):
        if self.tile_m % 4 or self.tile_t % 4 or self.bk not in (32, 64, 128, 256):
            raise ValueError(f"{self}: tile_m, tile_t must be multiples of 4 and bk 32, 64, 128 or 256")

    @property
    def invocations(self) -> int:
        return self.tile_m * self.tile_t // 16

    def arrays(self, glu: bool, sub_scales: int) -> dict:
        """The lengths of matmul_int.wgsl's workgroup arrays, in vec4s, for a type of `sub_scales`
        scales a 32-element sub-block (INT_SUB_SCALES): per matrix the quants (a byte each), the
        scales, the sub-blocks' mins and d | dmin of its rows; x's integers, sub-block sums and
        steps."""
        mats, subs, m4, t4 = 2 if glu else 1, self.bk // 32, self.tile_m // 4, self.tile_t // 4
        return dict(WS_LEN=mats * self.bk // 4 * m4, WSC_LEN=mats * subs * sub_scales * m4, WMIN_LEN=mats * subs * m4,
                    WD_LEN=mats * m4, XS_LEN=self.bk // 4 * t4, XSUB_LEN=subs * t4, XSTEP_LEN=t4)

    def storage(self, glu: bool) -> int:
        """Workgroup memory in bytes (`arrays`), at most: for the type of the most scales a
        sub-block (Q6_K's 2; Q4_K has 1)."""
        return 16 * sum(self.arrays(glu, max(INT_SUB_SCALES.values())).values())

    def defines(self, glu: bool, sub_scales: int) -> dict:
        return dict(TILE_M=self.tile_m, TILE_T=self.tile_t, BK=self.bk, SUB_SCALES=sub_scales,
                    **self.arrays(glu, sub_scales))


# Preferred first, as _MATMUL_TILES: the GLU runs fastest in 128-element slices, the others in
# 64; 32-token and 128-row tiles are slower; a 256-row v projection prefers 32-row tiles of
# 128-element slices (docs/PERFORMANCE.md, decisions). The GLU's 64x64x128 is 31.75 KiB: within
# Chromium's 32 KiB only because d | dmin are staged as f16 pairs.
_INT_TILES = [IntTiles(64, 64, 64), IntTiles(32, 64, 128), IntTiles(64, 32, 64), IntTiles(64, 32, 32)]
_INT_GLU_TILES = [IntTiles(64, 64, 128), IntTiles(64, 64, 64), IntTiles(64, 32, 32)]


def int_tiles(limits, glu: bool, max_rows: int, m: int) -> IntTiles:
    budget = max(DEFAULT_WORKGROUP_STORAGE, limits.max_compute_workgroup_storage_size)
    fitting = [t for t in (_INT_GLU_TILES if glu else _INT_TILES)
               if t.storage(glu) <= budget and t.invocations <= limits.max_compute_invocations_per_workgroup]
    if not fitting:
        raise TooLarge("no integer matmul tiling fits this device's workgroup limits")
    for tiles in fitting:
        if _workgroups(tiles, m, max_rows) >= MIN_WORKGROUPS:
            return tiles
    return max(fitting, key=lambda t: _workgroups(t, m, max_rows))


def quantize_x(kernels, xi, x, step, *, k: int, max_rows: int, planes: int = 1, group: int = 32,
               label: str = "quantize_x") -> Dispatch:
    """xi (rows, x_int_stride(k, planes, group)) = x (rows, k) f32 in integers of `planes` bytes
    (shaders/quantize_x.wgsl; 8 bits with a sum every 32 elements for the integer prefill, 24 with
    one every 16 for the decode matvecs' X_RECORD) for rows < step.n_tokens <= max_rows; k a
    multiple of 256."""
    if k % 256:
        raise Unsupported(f"quantize_x: k {k} must be a multiple of 256")
    record = x_record_defines(k, planes, group)
    return kernels.dispatch("quantize_x.wgsl", [x, xi, step], (-(-k // 1024), max_rows, 1), f"{label} {k} x{8 * planes}",
                            reads=4 * max_rows * k, writes=4 * max_rows * record["X_STRIDE"], **record)


def rms_norm_x_int(kernels, out, xi, x, w, step, *, n: int, eps: float, max_rows: int, planes: int = 1,
                   group: int = 32, label: str = "rms_norm") -> Dispatch:
    """out (rows, n) = rms_norm(x) * w, as ops.rms_norm, and xi (rows, x_int_stride(n, planes,
    group)) the same rows in integers of `planes` bytes, as quantize_x would write them from out
    (its dispatch fused in: the norm before the integer matmuls of a block; with group 16 and
    three planes, the decode matvecs' x: cera.gpu.matvec's X_RECORD); n a multiple of 256. One
    row (decode's) is spread over a workgroup per 1024 elements, each summing its squares."""
    if n % 256:
        raise Unsupported(f"rms_norm_x_int: n {n} must be a multiple of 256")
    if group not in (16, 32):
        raise InvalidArgument(f"rms_norm_x_int: a sum every {group!r} elements (expected 16 or 32)")
    row, record = 4 * n * max_rows, x_record_defines(n, planes, group)
    split = -(-n // 1024) if max_rows == 1 else 1
    return kernels.dispatch("rms_norm.wgsl", [x, w, out, step, xi], (split, max_rows, 1), f"{label} x{8 * planes}",
                            reads=split * row + 4 * n, writes=row + 4 * max_rows * record["X_STRIDE"], N=n,
                            ROWS_PER_TOKEN=1, EPS=float(eps), WG=256, X_SPLIT=split, **flags(X_INT=True), **record)


def matmul_int(kernels, device, out, p: Projection, xi, step, *, max_rows: int, out_stride: int | None = None,
               row0: int = 0, split: int = 1, tune: Tuning = DEFAULT) -> Dispatch:
    """batched `matmul` with x in 8-bit integers: xi (rows, x_int_stride(k)) as quantize_x wrote
    it, W of INT_TILE_TYPES; the other arguments as matmul's (`tune.tiles`: IntTiles, else
    `int_tiles`), but for row0: out is bound from token row row0 on (as matmul's) and xi whole,
    its rows read from row0 on."""
    tune.check("matmul_int", "tiles")
    t, k = T(p.wtype), p.k
    if t not in INT_TILE_TYPES or k % 256:
        raise Unsupported(f"no integer matmul for {t.name} rows of {k}")
    if tune.tiles is not None and not isinstance(tune.tiles, IntTiles):
        raise InvalidArgument(f"matmul_int: tiles {tune.tiles} are not IntTiles")
    tiles = tune.tiles or int_tiles(device.limits, p.glu, max_rows, p.m)
    return _tile_dispatch(kernels, device, "matmul_int.wgsl", out, p, xi, step, max_rows=max_rows, tiles=tiles,
                          x_row_bytes=4 * x_int_stride(k), out_stride=out_stride, row0=row0, tag=" x8", split=split,
                          X_PLANES=1, X_STRIDE=x_int_stride(k), **tiles.defines(p.glu, INT_SUB_SCALES[t]))


def row_blocks(k: int, m: int, max_rows: int, limits) -> list[tuple[int, int]]:
    """Split max_rows token rows into (row0, n_rows) blocks whose x (rows, k) and out (rows, m)
    f32 ranges each fit one storage binding and start at aligned offsets."""
    most = limits.max_storage_buffer_binding_size
    if max_rows * max(k, m) * 4 <= most:
        return [(0, max_rows)]
    step = aligned_rows(limits.min_storage_buffer_offset_alignment, 4 * k, 4 * m)
    per_block = most // (4 * max(k, m)) // step * step
    if per_block == 0:
        raise TooLarge(f"matmul: {step} aligned rows of {max(k, m)} floats exceed the storage binding "
                         f"limit of {most} bytes")
    return [(r0, min(per_block, max_rows - r0)) for r0 in range(0, max_rows, per_block)]


def _k_split(limits, parts, p: Projection, *, max_rows: int, integer: bool, half: bool, tiles) -> int:
    """k_parts of the one dispatch of an (integer or f32) matmul of `p`, if its parts fit in
    `parts` (a buffer or Binding); else 1. tiles: the tiling it takes (None: the table's)."""
    tiles = tiles or (int_tiles(limits, False, max_rows, p.m) if integer
                      else matmul_tiles(limits, max_rows, False, p.m, half, p.wtype))
    split = k_parts(p.k, _workgroups(tiles, p.m, max_rows))
    room = (parts if isinstance(parts, Binding) else Binding(parts)).nbytes
    return split if 4 * split * max_rows * p.m <= room else 1


def matmul_tiled(kernels, device, out, p: Projection, x, step, *, max_rows: int, out_stride: int | None = None,
                 half: bool = False, xi=None, x_ready: bool = False, parts=None,
                 tune: Tuning = DEFAULT) -> list[Dispatch]:
    """matmul split so that every binding of the device fits (an LM head over a whole chunk, for
    scoring): W in row tiles (cera.gpu.quant.row_tiles), each writing a column block of out, and
    token rows in blocks (`row_blocks`) when x or out is bigger than a binding. out_stride:
    floats between rows of out (default m); W, W_up, x, out and bias must start at aligned
    offsets. `half`, `tune`: as in matmul. Given `xi` (room for x in integers), one that fits in
    a dispatch and takes integer x (`int_tile`) is quantize_x into xi (unless `x_ready`: an
    earlier dispatch left this x there), then matmul_int. Given `parts` (room for K's parts), one
    whose K is worth splitting (`k_parts`) is a matmul of each part into it, then split_sum into
    out."""
    limits, k, m = device.limits, p.k, p.m
    stride = m if out_stride is None else out_stride
    col_tiles = row_tiles(p.wtype, k, m, limits)
    blocks = row_blocks(k, stride, max_rows, limits)
    integer = (xi is not None and int_tile(device, p.wtype, k)   # xi is bound whole: rows of k bytes and a bit
               and 4 * max_rows * x_int_stride(k) <= limits.max_storage_buffer_binding_size)
    if len(col_tiles) == 1 and len(blocks) == 1:
        splittable = parts is not None and not p.glu and p.bias is None and stride == m
        split = _k_split(limits, parts, p, max_rows=max_rows, integer=integer, half=half,
                         tiles=tune.tiles) if splittable else 1
        kw = dict(max_rows=max_rows, out_stride=out_stride, split=split, tune=tune)
        one = replace(p, accumulate=p.accumulate and split == 1)
        target = parts if split > 1 else out
        dispatches = ([quantize_x(kernels, xi, x, step, k=k, max_rows=max_rows)] * (not x_ready)
                      + [matmul_int(kernels, device, target, one, xi, step, **kw)] if integer else
                      [matmul(kernels, device, target, one, x, step, half=half, **kw)])
        if split > 1:
            dispatches.append(split_sum(kernels, out, parts, step, m=m, split=split, max_rows=max_rows,
                                        accumulate=p.accumulate, label=f"split_sum {split}x{m}"))
        return dispatches

    def part(b, start, size):
        return byte_range(b, start, size, limits)

    # x in integers: quantized whole, each block's rows read from row r0 of it (matmul_int's row0)
    dispatches = [quantize_x(kernels, xi, x, step, k=k, max_rows=max_rows)] if integer and not x_ready else []
    for r0, rows in blocks:
        x_block = part(x, 4 * r0 * k, 4 * rows * k)
        for start, n in col_tiles:
            # columns start..start+n of rows r0..r0+rows-1: from (r0, start) to the block's last row
            out_tile = part(out, 4 * (r0 * stride + start), 4 * ((rows - 1) * stride + n))
            tile = dict(max_rows=rows, out_stride=stride, row0=r0, tune=tune)
            dispatches.append(matmul_int(kernels, device, out_tile, p.rows(start, n, limits), xi, step, **tile)
                              if integer else
                              matmul(kernels, device, out_tile, p.rows(start, n, limits), x_block, step, half=half,
                                     **tile))
    return dispatches
