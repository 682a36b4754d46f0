"""The batched (prefill) kernels against numpy, on the native device (lavapipe here).

matmul: every weight type against gguf.quants.dequantize of the same raw bytes, for chunks of
1, 7, 33 and 128 rows (fewer than the rows the dispatch is sized for), weight row counts and
row lengths that are not multiples of the tiles (one block, several, float rows of odd
length), the GLU / BIAS / ACCUMULATE / SCALE variants, every tiling the builder may pick,
and row tiles of a matrix bigger than a binding; each both as f32 and with f16 tiles (HALF).
prefill attention: cera.ops.attention for a
first chunk at position 0 and a second chunk attending to the first one's cached keys."""
from __future__ import annotations

import dataclasses
import math
import types

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from cera import ops
from cera.config import FFN_GELU, FFN_SILU
from cera.gpu import attention, matmul, ops as gpu_ops, quant
from cera.gpu.spec import Projection, Tuning
from cera.gpu.state import STEP_BYTES, pack_step
from gpu_util import (CACHES, F32_CACHE, MIXED_CACHES, Q8_MIXED_CACHES, as_cached, assert_close, cache_tolerance, glu_act,
                      read_cache, run, step_buffer, submit, upload, upload_cache, write_cache, zeros)
from quantdata import random_rows

TYPES = sorted(quant.WEIGHT_TYPES, key=lambda t: t.name)
IDS = [t.name for t in TYPES]


# --- matmul ------------------------------------------------------------------------------------

def block_of(t):
    return GGML_QUANT_SIZES[t][0]


def lengths(t):
    """Row lengths k: one block, a few blocks (a partial last K slice), more."""
    return {1: [13, 100, 260], 32: [32, 96, 320], 256: [256, 768, 512]}[block_of(t)]


# (m, k index, n_tokens, max_rows): rows 1, 7, 33, 128, m not a multiple of any tile
CHUNKS = [(67, 0, 7, 9), (300, 1, 33, 40), (67, 2, 128, 128), (5, 1, 1, 4)]


def expected(gpu, rng, t, w, xs, out0, kw, *, glu, act, scale, bias, accumulate):
    """(want, sum |x w| scaled like want) of a matmul of w (m, k) with xs (n_tokens, k) in float64
    and its variants; the GLU's up matrix and the bias are drawn and put into kw as uploads."""
    m, k = w.shape
    want = xs @ w.T.astype(np.float64)                          # (n_tokens, m)
    mag = np.abs(xs) @ np.abs(w.T)                              # sum |x w|: bounds the f32 error
    if glu:
        raw_up, w_up = random_rows(t, m, k, rng)
        kw["w_up"] = upload(gpu, raw_up, "w_up")
        up = xs @ w_up.T.astype(np.float64)
        mag = mag * (np.abs(xs) @ np.abs(w_up.T)) + mag * np.abs(up)
        want = glu_act(want, act) * up
    if scale is not None:
        want, mag = want * scale, mag * abs(scale)
    if bias:
        b = rng.standard_normal(m).astype(np.float32)
        kw["bias"] = upload(gpu, b, "bias")
        want = want + b
    if accumulate:
        want = want + out0
    return want, mag


def need_f16(gpu, half):
    """f16 tiles need shader-f16 (the run at WebGPU's baseline has none: the f32 cases stand)."""
    if half and "shader-f16" not in gpu.device.features:
        pytest.skip("no shader-f16 on this device")


def matmul_case(gpu, t, m, k, n_tokens, max_rows, rng, *, scale=None, bias=False, accumulate=False,
                glu=False, tiles=None, device=None, act=FFN_SILU, half=False):
    """Run one batched matmul; return (got (n_tokens, m), want, sum |x w| (scaled like want),
    the K slice of f16 tiles (0: f32)). act: the GLU's gate activation."""
    need_f16(gpu, half)
    raw, w = random_rows(t, m, k, rng)
    x = rng.standard_normal((max_rows, k)).astype(np.float32)
    out0 = rng.standard_normal((max_rows, m)).astype(np.float32)
    out = upload(gpu, out0, "out")
    kw = dict(wtype=t, k=k, m=m, scale=scale, accumulate=accumulate, act=act)
    want, mag = expected(gpu, rng, t, w, x[:n_tokens].astype(np.float64), out0[:n_tokens], kw, glu=glu, act=act,
                         scale=scale, bias=bias, accumulate=accumulate)
    step = step_buffer(gpu, 3, n_tokens)
    dispatch = matmul.matmul(gpu.kernels, device or gpu.device, out, Projection(upload(gpu, raw, "w"), **kw),
                              upload(gpu, x, "x"), step, max_rows=max_rows, half=half, tune=Tuning(tiles=tiles))
    got = run(gpu, [dispatch], out, (max_rows, m))
    assert_close(got[n_tokens:], out0[n_tokens:], 0, 0, "rows past step.n_tokens must stay untouched")
    assert dispatch.label.endswith(" f16") == half
    bk = (tiles or matmul.matmul_tiles(gpu.device.limits, max_rows, glu, m, half, kw["wtype"])).bk
    return got[:n_tokens], want, mag, bk if half else 0


U16 = 2.0 ** -11   # f16 unit roundoff


def check_matmul(got, want, mag, what, half_bk=0):
    """f32: a few f32 roundings of sum |x w|. f16 tiles (K slices of half_bk): each weight and
    x element rounds to f16 (|err| <= 2u |x w|), and a slice's sum of half_bk f16 FMAs errs by
    at most gamma(half_bk) = half_bk u / (1 - half_bk u) of its sum |x w| (Higham, recursive
    summation), so |err| <= (2u + gamma) sum |x w|, u = 2^-11; plus f16 subnormals (spacing
    2^-24) in the products. That worst case is loose (3% of sum |x w| at bk 64), so the RMS
    error must also stay near the typical rounding, 8u of the RMS output: a lost slice, row
    or lane is far above both."""
    if not half_bk:
        assert_close(got, want, atol=2e-6 * mag + 1e-6, rtol=1e-5, what=what)
        return
    gamma = half_bk * U16 / (1 - half_bk * U16)
    assert_close(got, want, atol=(2 * U16 + gamma + 1e-5) * mag + 1e-5, rtol=1e-5, what=what + " f16")
    rms_err, rms = np.sqrt(np.mean((got - want) ** 2)), np.sqrt(np.mean(want ** 2))
    assert rms_err <= 8 * U16 * rms, f"{what} f16: RMS error {rms_err:.3g} is {rms_err / rms:.2e} of the RMS output"


HALF = [False, True]
HALF_IDS = ["f32", "f16"]


@pytest.mark.parametrize("half", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("t", TYPES, ids=IDS)
def test_matmul_types(gpu, t, half):
    rng = np.random.default_rng(int(t))
    for m, ki, n_tokens, max_rows in CHUNKS:
        k = lengths(t)[ki]
        got, want, mag, bk = matmul_case(gpu, t, m, k, n_tokens, max_rows, rng, half=half)
        check_matmul(got, want, mag, f"{t.name} m={m} k={k} rows={n_tokens}/{max_rows}", bk)


VARIANTS = [  # type, flags
    (T.Q4_K, dict(glu=True)),
    (T.Q8_0, dict(glu=True, scale=2.0, accumulate=True)),
    (T.Q5_0, dict(glu=True, act=FFN_GELU)),                                # GeGLU (Gemma)
    (T.Q4_K, dict(glu=True, act=FFN_GELU, scale=2.0, accumulate=True)),
    (T.F16, dict(glu=True)),
    (T.Q6_K, dict(bias=True, scale=0.375, accumulate=True)),
    (T.Q4_0, dict(bias=True)),
    (T.Q5_1, dict(accumulate=True)),
    (T.BF16, dict(scale=0.5)),
    (T.Q3_K, dict(glu=True)),                       # 110-byte blocks: both matrices read at 2 mod 4
    (T.IQ4_NL, dict(bias=True, accumulate=True)),
]


@pytest.mark.parametrize("half", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("t,flags", VARIANTS, ids=[f"{t.name}-{'+'.join(f)}" for t, f in VARIANTS])
def test_matmul_variants(gpu, t, flags, half):
    rng = np.random.default_rng(50 + int(t))
    k = lengths(t)[1]
    for m, n_tokens, max_rows in [(67, 33, 40), (300, 7, 8)]:   # 33 rows: the large tiles
        got, want, mag, bk = matmul_case(gpu, t, m, k, n_tokens, max_rows, rng, half=half, **flags)
        check_matmul(got, want, mag, f"{t.name} {flags} m={m} rows={n_tokens}", bk)


# 8-wide register blocks: no table picks them, a caller's tiles= may
WIDE_BLOCKS = [matmul.MatmulTiles(tile_m=128, tile_t=128, bk=16, rm=8, rt=8),
               matmul.MatmulTiles(tile_m=64, tile_t=128, bk=16, rm=4, rt=8)]


def _pool(glu, half):
    pool = (matmul._GLU_TILES + matmul._SMALL_GLU_TILES if glu
            else matmul._MATMUL_TILES + matmul._SUPERBLOCK_TILES + matmul._SMALL_TILES) + WIDE_BLOCKS
    return matmul._halved(pool) if half else pool


ALL_TILES = sorted({(tiles, glu, half) for glu in (False, True) for half in HALF for tiles in _pool(glu, half)},
                   key=lambda tgh: (tgh[2], tgh[1], tgh[0].storage(tgh[1], tgh[2]), tgh[0].bk))


@pytest.mark.parametrize("tiles,glu,half", ALL_TILES,
                         ids=[f"{'f16' if h else 'f32'}-{'glu-' if g else ''}{t.tile_m}x{t.tile_t}x{t.bk}-{t.rm}x{t.rt}"
                              for t, g, h in ALL_TILES])
def test_matmul_tilings(gpu, tiles, glu, half):
    """Every tiling the builder may pick, whatever this device grants."""
    assert tiles.invocations <= attention.WORKGROUP
    assert tiles.storage(glu, half) <= 32768
    if tiles.storage(glu, half) > gpu.device.limits.max_compute_workgroup_storage_size:
        pytest.skip("more workgroup memory than this device has")
    rng = np.random.default_rng(tiles.tile_m + tiles.bk)
    for t, m, k in [(T.Q5_K, 150, 512), (T.Q5_0, 131, 160)]:
        got, want, mag, bk = matmul_case(gpu, t, m, k, 130, 140, rng, glu=glu, tiles=tiles, half=half)
        check_matmul(got, want, mag, f"{t.name} {tiles}", bk)


def test_matmul_tile_choice(gpu):
    lim = gpu.device.limits
    for storage in (16384, 32768, 65536):
        limits = dataclasses.replace(lim, max_compute_workgroup_storage_size=storage,
                                     max_compute_invocations_per_workgroup=256)
        for rows in (1, 32, 512):
            for glu in (False, True):
                tiles = matmul.matmul_tiles(limits, rows, glu)
                assert tiles.storage(glu) <= max(storage, 16384) and tiles.invocations <= 256
    default = dataclasses.replace(lim, max_compute_workgroup_storage_size=16384)
    assert matmul.matmul_tiles(default, 512).storage(False) == 16384
    big = dataclasses.replace(lim, max_compute_workgroup_storage_size=32768, max_compute_invocations_per_workgroup=256)
    assert matmul.matmul_tiles(big, 512, m=1536, wtype=T.Q4_K).tile_t == 32   # superblocks: 32 tokens
    assert matmul.matmul_tiles(big, 512, m=1536, wtype=T.Q4_1).tile_t == 64
    assert matmul.matmul_tiles(big, 512, m=192) == matmul.matmul_tiles(big, 512, m=64)   # the most
    for glu in (False, True):   # f16 tiles: the same tilings and bytes, twice the bk
        f32, f16 = matmul.matmul_tiles(big, 512, glu, 8960), matmul.matmul_tiles(big, 512, glu, 8960, half=True)
        assert f16 == dataclasses.replace(f32, bk=2 * f32.bk) and f16.storage(glu, True) == f32.storage(glu)


def test_matmul_half_choice(gpu):
    """f16 tiles can run where the device has shader-f16, not for F32 or BF16 weights; the
    matmul takes them only when asked (Numerics.f16 asks), and a device without it refuses."""
    dev = gpu.device
    plain = types.SimpleNamespace(bind=dev.bind, limits=dev.limits, features=frozenset())
    f16 = types.SimpleNamespace(features=frozenset({"shader-f16"}))
    assert matmul.half_tiles(f16, T.Q4_K) and matmul.half_tiles(f16, T.F16)
    assert not matmul.half_tiles(f16, T.F32) and not matmul.half_tiles(f16, T.BF16)
    assert not matmul.half_tiles(plain, T.Q4_K)
    buf, step = dev.buffer(4096, "x"), step_buffer(gpu, 0, 4)
    d = matmul.matmul(gpu.kernels, plain, buf, Projection(buf, T.Q8_0, 32, 4), buf, step, max_rows=4)
    assert "f16" not in d.label
    with pytest.raises(ValueError, match="shader-f16"):
        matmul.matmul(gpu.kernels, plain, buf, Projection(buf, T.Q8_0, 32, 4), buf, buf, max_rows=4, half=True)


def test_matmul_2d_dispatch(gpu):
    """More M tiles than one dimension allows: they spread over (y, z), flattened in the kernel."""
    limits = dataclasses.replace(gpu.device.limits, max_compute_workgroups_per_dimension=2)
    small = types.SimpleNamespace(bind=gpu.device.bind, limits=limits, features=gpu.device.features)
    tiles = matmul.MatmulTiles(tile_m=64, tile_t=64, bk=32, rm=4, rt=4)
    rng = np.random.default_rng(9)
    got, want, mag, bk = matmul_case(gpu, T.Q8_0, 300, 64, 7, 8, rng, tiles=tiles, device=small)   # 5 M tiles
    check_matmul(got, want, mag, "2-D", bk)
    assert gpu_ops.grid(5, limits) == (2, 3)


@pytest.mark.parametrize("half", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("glu,act", [(False, FFN_SILU), (True, FFN_SILU), (True, FFN_GELU)],
                         ids=["bias", "glu", "geglu"])
def test_matmul_tiled(gpu, glu, act, half):
    """An LM head over a chunk, bigger than a (forced small) binding: W row tiles write column
    blocks of out, and token rows go in blocks whose x and out fit a binding."""
    need_f16(gpu, half)
    t, m, k, n_tokens, max_rows = T.Q4_0, 320, 64, 7, 8     # 36-byte rows: tiles of 64 rows
    limits = dataclasses.replace(gpu.device.limits, max_storage_buffer_binding_size=4096,
                                 min_storage_buffer_offset_alignment=256)
    small = types.SimpleNamespace(limits=limits, features=gpu.device.features)
    assert matmul.row_blocks(k, m, max_rows, limits) == [(0, 3), (3, 3), (6, 2)]   # 1280-byte out rows
    rng = np.random.default_rng(11)
    raw, w = random_rows(t, m, k, rng)
    x = rng.standard_normal((max_rows, k)).astype(np.float32)
    want = x[:n_tokens].astype(np.float64) @ w.T
    mag = np.abs(x[:n_tokens]) @ np.abs(w.T)
    kw = {}
    if glu:
        raw_up, w_up = random_rows(t, m, k, rng)
        kw.update(w_up=upload(gpu, raw_up), act=act)
        up = x[:n_tokens].astype(np.float64) @ w_up.T
        mag = mag * (np.abs(x[:n_tokens]) @ np.abs(w_up.T)) + mag * np.abs(up)
        want = glu_act(want, act) * up
    else:
        b = rng.standard_normal(m).astype(np.float32)
        kw["bias"] = upload(gpu, b)
        want = want + b
    out = upload(gpu, np.zeros((max_rows, m), np.float32))
    dispatches = matmul.matmul_tiled(gpu.kernels, small, out, Projection(upload(gpu, raw), t, k, m, **kw), upload(gpu, x),
                                      step_buffer(gpu, 0, n_tokens), max_rows=max_rows, half=half)
    assert len(dispatches) == 3 * 5
    got = run(gpu, dispatches, out, (max_rows, m))
    bk = matmul.matmul_tiles(limits, 3, glu, 64, half).bk    # every block: at most 3 rows, 64 columns
    check_matmul(got[:n_tokens], want, mag, "tiled", bk if half else 0)
    assert not got[n_tokens:].any()


SPLIT_CASES = [(T.Q4_K, 768, 3, 128, True, False), (T.Q6_K, 512, 2, 128, False, False),
               (T.Q4_0, 320, 4, 32, True, False), (T.F32, 100, 3, 16, False, False),
               (T.Q4_K, 768, 3, 128, True, True), (T.Q4_0, 320, 4, 32, False, True)]


@pytest.mark.parametrize("t,k,split,max_rows,accumulate,half", SPLIT_CASES,
                         ids=[f"{c[0].name}-k{c[1]}-split{c[2]}{'-f16' * c[5]}" for c in SPLIT_CASES])
def test_matmul_split(gpu, t, k, split, max_rows, accumulate, half):
    """K in parts (matmul split=, then split_sum): the same products as one matmul, added into out
    or stored, parts of unequal length (the last short, or empty: F32's 3 parts of 4 slices), rows
    past step.n_tokens untouched; f32 and f16 tiles."""
    need_f16(gpu, half)
    rng = np.random.default_rng(k + split)
    m, n_tokens, scale = 67, max_rows - 3, 0.5
    raw, w = random_rows(t, m, k, rng)
    x = rng.standard_normal((max_rows, k)).astype(np.float32)
    out0 = rng.standard_normal((max_rows, m)).astype(np.float32)
    out, parts = upload(gpu, out0, "out"), zeros(gpu, (split, max_rows, m), "parts")
    step = step_buffer(gpu, 0, n_tokens)
    mm = matmul.matmul(gpu.kernels, gpu.device, parts, Projection(upload(gpu, raw, "w"), t, k, m, scale=scale),
                        upload(gpu, x, "x"), step, max_rows=max_rows, half=half, split=split)
    total = matmul.split_sum(gpu.kernels, out, parts, step, m=m, split=split, max_rows=max_rows,
                              accumulate=accumulate, label="split_sum")
    assert mm.groups[0] == split * -(-max_rows // matmul.matmul_tiles(gpu.device.limits, max_rows, False, m, half, t).tile_t)
    got = run(gpu, [mm, total], out, (max_rows, m))
    xs = x[:n_tokens].astype(np.float64)
    want = scale * (xs @ w.T) + (out0[:n_tokens] if accumulate else 0)
    bk = matmul.matmul_tiles(gpu.device.limits, max_rows, False, m, half, t).bk
    check_matmul(got[:n_tokens], want, scale * (np.abs(xs) @ np.abs(w.T)), f"split {split}", bk if half else 0)
    assert_close(got[n_tokens:], out0[n_tokens:], 0, 0, "rows past step.n_tokens must stay untouched")


@pytest.mark.parametrize("integer", [False, True], ids=["f32", "x8"])
def test_matmul_tiled_splits_long_k(gpu, monkeypatch, integer):
    """matmul_tiled with room for parts splits a long K into k_parts' parts (and only then):
    a matmul (f32 tiles, or on x in 8-bit integers) into the parts and their sum added into out,
    equal to the unsplit matmul."""
    monkeypatch.setattr(matmul, "SPLIT_MIN_K", 256)
    t, m, k, max_rows = T.Q4_K, 64, 1024, 16
    assert matmul.k_parts(k, 1) == 4 and matmul.k_parts(256, 1) == 1
    assert matmul.k_parts(k, matmul.SPLIT_WORKGROUPS // 2) == 2 and matmul.k_parts(k, matmul.SPLIT_WORKGROUPS) == 1
    rng = np.random.default_rng(5)
    raw, w = random_rows(t, m, k, rng)
    x = rng.standard_normal((max_rows, k)).astype(np.float32)
    out0 = rng.standard_normal((max_rows, m)).astype(np.float32)
    bufs = dict(w=upload(gpu, raw, "w"), x=upload(gpu, x, "x"), step=step_buffer(gpu, 0, max_rows))
    xi = zeros(gpu, (max_rows, matmul.x_int_stride(k)), "xi") if integer else None
    tag = " x8" if integer else ""
    got = {}
    for parts in (None, zeros(gpu, (matmul.SPLIT_MAX, max_rows, m), "parts")):
        out = upload(gpu, out0, "out")
        ds = matmul.matmul_tiled(gpu.kernels, gpu.device, out, Projection(bufs["w"], t, k, m, accumulate=True),
                                  bufs["x"], bufs["step"], max_rows=max_rows, parts=parts, xi=xi)
        assert [d.label for d in ds if not d.label.startswith("quantize_x")] == (
            [f"matmul Q4_K {m}x{k}{tag} +="] if parts is None else
            [f"matmul Q4_K {m}x{k}{tag} /4", f"split_sum 4x{m}"])
        got[parts is None] = run(gpu, ds, out, (max_rows, m))
    xs = (ops.q8_k(x) if integer else x).astype(np.float64)
    want = xs @ w.T + out0
    check_matmul(got[False], want, np.abs(xs) @ np.abs(w.T), "split by matmul_tiled")
    assert_close(got[False], got[True], atol=1e-5 * np.abs(got[True]).max(), rtol=0, what="split against unsplit")


def test_row_blocks(gpu):
    lim = gpu.device.limits
    big = dataclasses.replace(lim, max_storage_buffer_binding_size=1 << 30)
    assert matmul.row_blocks(576, 49152, 512, big) == [(0, 512)]
    small = dataclasses.replace(lim, max_storage_buffer_binding_size=128 << 20, min_storage_buffer_offset_alignment=256)
    blocks = matmul.row_blocks(1536, 151936, 512, small)     # Qwen2.5's LM head over a 512-row chunk
    assert sum(n for _, n in blocks) == 512 and len(blocks) == 3
    for r0, n in blocks:
        assert r0 * 151936 * 4 % 256 == 0 and n * 151936 * 4 <= 128 << 20


def test_matmul_errors(gpu):
    buf = gpu.device.buffer(4096, "x")
    with pytest.raises(ValueError, match="no batched matmul kernel"):
        matmul.matmul(gpu.kernels, gpu.device, buf, Projection(buf, T.TQ1_0, 256, 4), buf, buf, max_rows=4)
    with pytest.raises(ValueError, match="GLU with a bias"):
        matmul.matmul(gpu.kernels, gpu.device, buf, Projection(buf, T.Q8_0, 32, 4, bias=buf, w_up=buf), buf, buf,
                      max_rows=4)
    with pytest.raises(ValueError, match="multiple"):
        matmul.matmul(gpu.kernels, gpu.device, buf, Projection(buf, T.Q4_K, 100, 4), buf, buf, max_rows=4)
    with pytest.raises(ValueError, match="matmul: no tuning knob tpr"):
        matmul.matmul(gpu.kernels, gpu.device, buf, Projection(buf, T.Q8_0, 32, 4), buf, buf, max_rows=4,
                      tune=Tuning(tpr=4))
    with pytest.raises(ValueError, match="not MatmulTiles"):
        matmul.matmul(gpu.kernels, gpu.device, buf, Projection(buf, T.Q8_0, 32, 4), buf, buf, max_rows=4,
                      tune=Tuning(tiles=matmul.IntTiles(64, 64, 64)))


# --- matmul with x in integers ----------------------------------------------------------------

INT_TYPES = sorted(quant.INT_TILE_TYPES, key=lambda t: t.name)
INT_IDS = [t.name for t in INT_TYPES]


def x_int_rows(gpu, x, step):
    """quantize_x of x (max_rows, k): (the buffer, its words (max_rows, x_int_stride(k)))."""
    max_rows, k = x.shape
    shape = (max_rows, matmul.x_int_stride(k))
    xi = zeros(gpu, shape, "xi")
    d = matmul.quantize_x(gpu.kernels, xi, upload(gpu, x, "x"), step, k=k, max_rows=max_rows)
    return xi, run(gpu, [d], xi, shape, np.uint32)


def test_quantize_x(gpu):
    """quantize_x's record (x_int_record.wgsl) against ops.q8_k: every integer, each sub-block's
    sum of them and each block's step (blocks of magnitudes 1e-3 .. 1e3, one all zero); rows
    past n_tokens untouched."""
    rng = np.random.default_rng(0)
    k, max_rows, n_tokens = 768, 9, 7
    x = rng.standard_normal((max_rows, k)) * np.exp(rng.uniform(-7, 7, (max_rows, k // 256))).repeat(256, 1)
    x = x.astype(np.float32)
    x[1, 256:512] = 0
    _, words = x_int_rows(gpu, x, step_buffer(gpu, 0, n_tokens))
    q = words[:, : k // 4].view(np.int8).astype(np.int64)
    sums = words[:, k // 4: k // 4 + k // 32].view(np.int32)
    steps = words[:, k // 4 + k // 32: k // 4 + k // 32 + k // 256].view(np.float32)
    assert_close(q[:n_tokens] * steps[:n_tokens].repeat(256, 1), ops.q8_k(x[:n_tokens]), 0, 1e-6, "d * q")
    assert (sums[:n_tokens] == q[:n_tokens].reshape(n_tokens, -1, 32).sum(-1)).all()
    assert np.abs(q).max() == 127 and steps[1, 1] == 0 and not q[1, 256:512].any()
    assert not words[n_tokens:].any(), "rows past step.n_tokens must stay untouched"


@pytest.mark.parametrize("k", [256, 1536, 1280])
def test_rms_norm_x_int_is_the_norm_then_quantize_x(gpu, k):
    """The RMSNorm with quantize_x fused in (rms_norm.wgsl X_INT, prefill's norm before integer
    matmuls): its rows are gpu_ops.rms_norm's, bit for bit, and its record is quantize_x's of those
    rows, word for word (whole rounds of four blocks, and a partial one: 1280); rows past
    n_tokens untouched."""
    rng = np.random.default_rng(k)
    max_rows, n_tokens, eps = 6, 5, 1e-6
    x = (rng.standard_normal((max_rows, k)) * 3).astype(np.float32)
    w = rng.uniform(0.5, 1.5, k).astype(np.float32)
    step, xb, wb = step_buffer(gpu, 0, n_tokens), upload(gpu, x, "x"), upload(gpu, w, "w")
    shape = (max_rows, matmul.x_int_stride(k))
    out, xi, plain = zeros(gpu, x.shape, "out"), zeros(gpu, shape, "xi"), zeros(gpu, x.shape, "plain")
    fused = matmul.rms_norm_x_int(gpu.kernels, out, xi, xb, wb, step, n=k, eps=eps, max_rows=max_rows)
    normed = run(gpu, [fused], out, x.shape)
    words = run(gpu, [], xi, shape, np.uint32)
    want = run(gpu, [gpu_ops.rms_norm(gpu.kernels, gpu.device, plain, xb, wb, step, n=k, eps=eps,
                                     max_tokens=max_rows)], plain, x.shape)
    assert np.array_equal(normed, want) and not normed[n_tokens:].any()
    np.testing.assert_array_equal(words, x_int_rows(gpu, want, step)[1])
    assert words[:n_tokens].any() and not words[n_tokens:].any()
    with pytest.raises(ValueError, match="multiple of 256"):
        matmul.rms_norm_x_int(gpu.kernels, out, xi, xb, wb, step, n=100, eps=eps, max_rows=max_rows)


def matmul_int_case(gpu, t, m, k, n_tokens, max_rows, rng, *, glu=False, bias=False, accumulate=False,
                    scale=None, tiles=None, act=FFN_SILU):
    """One integer matmul against float64 numpy of W @ ops.q8_k(x): (got, want, sum |x w|)."""
    raw, w = random_rows(t, m, k, rng)
    x = rng.standard_normal((max_rows, k)).astype(np.float32)
    step = step_buffer(gpu, 3, n_tokens)
    xi, _ = x_int_rows(gpu, x, step)
    out0 = rng.standard_normal((max_rows, m)).astype(np.float32)
    out = upload(gpu, out0, "out")
    kw = dict(wtype=t, k=k, m=m, scale=scale, accumulate=accumulate, act=act)
    want, mag = expected(gpu, rng, t, w, ops.q8_k(x[:n_tokens]).astype(np.float64), out0[:n_tokens], kw, glu=glu,
                         act=act, scale=scale, bias=bias, accumulate=accumulate)
    got = run(gpu, [matmul.matmul_int(gpu.kernels, gpu.device, out, Projection(upload(gpu, raw, "w"), **kw), xi, step,
                                      max_rows=max_rows, tune=Tuning(tiles=tiles))],
              out, (max_rows, m))
    assert_close(got[n_tokens:], out0[n_tokens:], 0, 0, "rows past step.n_tokens must stay untouched")
    return got[:n_tokens], want, mag


# (m, k, n_tokens, max_rows): one block, several; rows and tokens not multiples of a tile
INT_CHUNKS = [(67, 256, 7, 9), (300, 768, 33, 40), (67, 512, 128, 128), (5, 256, 1, 4)]


@pytest.mark.parametrize("t", INT_TYPES, ids=INT_IDS)
def test_matmul_int(gpu, t):
    """The integer matmul against W @ q8_k(x) in float64: the products of quants are exact, so
    only f32 roundings of the scaling remain (check_matmul's f32 bound)."""
    rng = np.random.default_rng(int(t))
    for m, k, n_tokens, max_rows in INT_CHUNKS:
        got, want, mag = matmul_int_case(gpu, t, m, k, n_tokens, max_rows, rng)
        check_matmul(got, want, mag, f"{t.name} m={m} k={k} rows={n_tokens}/{max_rows}")


INT_TILINGS = sorted(set(matmul._INT_TILES + matmul._INT_GLU_TILES) | {matmul.IntTiles(64, 64, 256)},
                     key=lambda t: (t.tile_m, t.tile_t, t.bk))


@pytest.mark.parametrize("tiles", INT_TILINGS, ids=lambda t: f"{t.tile_m}x{t.tile_t}x{t.bk}")
@pytest.mark.parametrize("t,flags", [(T.Q4_K, dict(glu=True)), (T.Q6_K, dict(glu=True, act=FFN_GELU)),
                                     (T.Q4_K, dict(bias=True, scale=0.5)), (T.Q6_K, dict(accumulate=True))],
                         ids=["Q4_K-glu", "Q6_K-gelu", "Q4_K-bias+scale", "Q6_K-accumulate"])
def test_matmul_int_variants(gpu, t, flags, tiles):
    """Every integer tiling the builder may pick (and whole-block slices), with the GLU, bias,
    scale and accumulate variants."""
    got, want, mag = matmul_int_case(gpu, t, 70, 512, 37, 40, np.random.default_rng(int(t)), tiles=tiles, **flags)
    check_matmul(got, want, mag, f"{t.name} {flags}")


@pytest.mark.parametrize("t,m,max_rows,binding", [(T.Q4_K, 96, 24, 9300), (T.Q6_K, 320, 64, 30000)],
                         ids=["Q4_K", "Q6_K"])
def test_matmul_tiled_int(gpu, t, m, max_rows, binding):
    """matmul_tiled with x in integers (an LM head over a chunk, scoring): x quantized whole once,
    then W row tiles and token row blocks as with f32 x, each block's records read from its row
    (Q4_K: W tiles of 64 rows, token blocks of 8; Q6_K: of 128 and 29)."""
    k, n_tokens = 256, max_rows - 5
    limits = dataclasses.replace(gpu.device.limits, max_storage_buffer_binding_size=binding,
                                 min_storage_buffer_offset_alignment=256)
    small = types.SimpleNamespace(limits=limits, features=gpu.device.features)
    rng = np.random.default_rng(12)
    raw, w = random_rows(t, m, k, rng)
    x = rng.standard_normal((max_rows, k)).astype(np.float32)
    out0 = np.zeros((max_rows, m), np.float32)
    kw = dict(wtype=t, k=k, m=m)
    want, mag = expected(gpu, rng, t, w, ops.q8_k(x[:n_tokens]).astype(np.float64), out0[:n_tokens], kw, glu=False,
                         act=FFN_SILU, scale=None, bias=True, accumulate=False)
    out, xi = upload(gpu, out0), zeros(gpu, (max_rows, matmul.x_int_stride(k)), "xi")
    dispatches = matmul.matmul_tiled(gpu.kernels, small, out, Projection(upload(gpu, raw), **kw), upload(gpu, x),
                                      step_buffer(gpu, 0, n_tokens), max_rows=max_rows, xi=xi)
    blocks, tiles = matmul.row_blocks(k, m, max_rows, limits), quant.row_tiles(t, k, m, limits)
    assert len(blocks) > 1 and len(tiles) > 1
    assert [d.label.split()[0] for d in dispatches] == ["quantize_x"] + ["matmul"] * len(blocks) * len(tiles)
    got = run(gpu, dispatches, out, (max_rows, m))
    check_matmul(got[:n_tokens], want, mag, "tiled, integer x")
    assert not got[n_tokens:].any()


def test_int_tile_choice(gpu):
    """Integer x for its types and K only, and only given room for it (xi: Numerics.int8 gives
    it); the GLU's tiling fits Chromium's 32 KiB of workgroup memory."""
    buf, step = gpu.device.buffer(1 << 16, "x"), step_buffer(gpu, 0, 4)
    p = Projection(buf, T.Q4_K, 256, 4)
    exact = matmul.matmul_tiled(gpu.kernels, gpu.device, buf, p, buf, step, max_rows=4)
    integer = matmul.matmul_tiled(gpu.kernels, gpu.device, buf, p, buf, step, max_rows=4, xi=buf)
    assert [d.label.split()[0] for d in exact] == ["matmul"] and " x8" not in exact[0].label
    assert [d.label.split()[0] for d in integer] == ["quantize_x", "matmul"] and " x8" in integer[1].label
    assert matmul.int_tile(gpu.device, T.Q4_K, 1536) and matmul.int_tile(gpu.device, T.Q6_K, 256)
    assert not matmul.int_tile(gpu.device, T.Q4_0, 1536) and not matmul.int_tile(gpu.device, T.Q4_K, 100)
    assert matmul._INT_GLU_TILES[0].storage(True) <= 32768
    small = dataclasses.replace(gpu.device.limits, max_compute_workgroup_storage_size=16384)
    assert matmul.int_tiles(small, True, 512, 8960).storage(True) <= 16384


def test_matmul_int_errors(gpu):
    buf = gpu.device.buffer(4096, "x")
    with pytest.raises(ValueError, match="no integer matmul"):
        matmul.matmul_int(gpu.kernels, gpu.device, buf, Projection(buf, T.Q4_0, 256, 4), buf, buf, max_rows=4)
    with pytest.raises(ValueError, match="no integer matmul"):
        matmul.matmul_int(gpu.kernels, gpu.device, buf, Projection(buf, T.Q4_K, 100, 4), buf, buf, max_rows=4)
    with pytest.raises(ValueError, match="multiple of 256"):
        matmul.quantize_x(gpu.kernels, buf, buf, buf, k=100, max_rows=4)


# --- prefill attention -------------------------------------------------------------------------

ATTENTION_SHAPES = [(64, 9, 3), (128, 12, 2), (80, 4, 4), (256, 4, 2), (18, 4, 2)]   # head_dim, heads, kv heads


def with_caches(shapes, caches):
    """Each shape (head_dim first) with each (K's, V's) cache type it can hold: q8_0 only whole
    blocks of 32 values of a head."""
    return [(*shape, cache) for shape in shapes for cache in caches if "q8_0" not in cache or shape[0] % 32 == 0]


def attention_chunks(gpu, head_dim, n_heads, n_kv_heads, chunks, max_rows, tiles=None, seed=0, window=0,
                     cache=F32_CACHE, softcap=0.0, bidirectional=False):
    """Run prefill attention over consecutive chunks [(n_tokens, scale)] of one sequence whose
    cache (of (K's, V's) cache type `cache`) is already filled; compare each with
    cera.ops.attention over the values as cached. With a sliding window, the slots before the
    chunk's first row's window hold NaN: they must never be read. softcap: gemma2's."""
    rng = np.random.default_rng(seed)
    max_ctx = sum(n for n, _ in chunks) + 3
    k_cache = as_cached(rng.standard_normal((max_ctx, n_kv_heads, head_dim)), cache[0])
    v_cache = as_cached(rng.standard_normal((max_ctx, n_kv_heads, head_dim)), cache[1])
    kc, vc = upload_cache(gpu, k_cache, cache[0]), upload_cache(gpu, v_cache, cache[1])
    q_buf, out = upload(gpu, np.zeros((max_rows, n_heads, head_dim), np.float32)), None
    step = gpu.device.buffer(STEP_BYTES, "step", uniform=True)
    pos = 0
    for n_tokens, scale in chunks:
        q = (rng.standard_normal((max_rows, n_heads, head_dim)) * 2).astype(np.float32)
        gpu.device.write(q_buf, q.tobytes())
        out = upload(gpu, np.full((max_rows, n_heads, head_dim), 5.0, np.float32))
        gpu.device.write(step, pack_step(pos, n_tokens))
        if window:
            lo = max(0, pos - window + 1)
            for buf, values, t in ((kc, k_cache, cache[0]), (vc, v_cache, cache[1])):
                write_cache(gpu, buf, np.concatenate([np.full_like(values[:lo], np.nan), values[lo:]]), t)
        d = attention.prefill_attention(gpu.kernels, gpu.device, out, q_buf, kc, vc, step, head_dim=head_dim,
                                      n_heads=n_heads, n_kv_heads=n_kv_heads, scale=scale, max_rows=max_rows,
                                      tiles=tiles, window=window, cache_types=cache, softcap=softcap,
                                      bidirectional=bidirectional)
        got = run(gpu, [d], out, (max_rows, n_heads, head_dim))
        want = ops.attention(q[:n_tokens], k_cache[: pos + n_tokens], v_cache[: pos + n_tokens],
                             np.arange(pos, pos + n_tokens), 1 / math.sqrt(head_dim) if scale is None else scale,
                             window, softcap, causal=not bidirectional)
        assert_close(got[:n_tokens], want, 2e-5, 1e-4, f"chunk of {n_tokens} at pos {pos}")
        assert (got[n_tokens:] == 5.0).all(), "rows past step.n_tokens must stay untouched"
        pos += n_tokens


@pytest.mark.parametrize("head_dim,n_heads,n_kv_heads,cache",
                         with_caches(ATTENTION_SHAPES, CACHES + MIXED_CACHES + Q8_MIXED_CACHES))
def test_prefill_attention(gpu, head_dim, n_heads, n_kv_heads, cache):
    # A full first chunk at pos 0, then a shorter chunk over the first chunk's keys (crossing
    # key tiles), then a one-row chunk; a Granite-like scale on the last.
    attention_chunks(gpu, head_dim, n_heads, n_kv_heads, [(37, None), (30, None), (1, 0.0078125)], max_rows=37,
                     cache=cache)


@pytest.mark.parametrize("head_dim,n_heads,n_kv_heads,window,cache", with_caches([
    (256, 4, 1, 20),    # Gemma-3-270M's heads
    (64, 9, 3, 5),      # a window shorter than a key tile
    (18, 4, 2, 33),     # the scalar path; a window longer than a chunk
], CACHES))
def test_prefill_attention_window(gpu, head_dim, n_heads, n_kv_heads, window, cache):
    """A sliding window (a local layer): each row sees only the last `window` keys, within and
    across chunks and key tiles; the 16 KiB tilings too."""
    attention_chunks(gpu, head_dim, n_heads, n_kv_heads, [(37, None), (30, None), (1, 0.0625)], max_rows=37,
                     window=window, cache=cache)
    limits = dataclasses.replace(gpu.device.limits, max_compute_workgroup_storage_size=16384)
    attention_chunks(gpu, head_dim, n_heads, n_kv_heads, [(20, None), (45, None)], max_rows=50,
                     tiles=attention.attention_tiles(limits, head_dim), seed=head_dim, window=window, cache=cache)


@pytest.mark.parametrize("head_dim,n_heads,n_kv_heads,window,softcap,cache", with_caches([
    (256, 8, 4, 0, 2.0),     # Gemma-2-2B's heads (its cap, 50, never bites these scores: std ~2)
    (64, 9, 3, 5, 1.0),      # a window shorter than a key tile
    (18, 4, 2, 33, 1.5),     # the scalar path
], CACHES))
def test_prefill_attention_softcap(gpu, head_dim, n_heads, n_kv_heads, window, softcap, cache):
    """gemma2's soft-capped scores, softcap * tanh(score / softcap) before the softmax."""
    attention_chunks(gpu, head_dim, n_heads, n_kv_heads, [(37, None), (30, None), (1, 0.0625)], max_rows=37,
                     window=window, cache=cache, softcap=softcap)


@pytest.mark.parametrize("head_dim,n_heads,n_kv_heads,cache", with_caches([(64, 12, 12), (18, 4, 2), (128, 4, 1)], CACHES))
def test_prefill_attention_bidirectional(gpu, head_dim, n_heads, n_kv_heads, cache):
    """An encoder's attention: every row sees every key of the step (slots up to the step's
    last, none after it), across key tiles and chunks."""
    attention_chunks(gpu, head_dim, n_heads, n_kv_heads, [(37, None), (30, None), (1, 0.0625)], max_rows=37,
                     cache=cache, bidirectional=True)


def test_prefill_attention_small_tiles(gpu):
    """The 16 KiB tilings (what Apple and SwiftShader grant), whatever this device has."""
    limits = dataclasses.replace(gpu.device.limits, max_compute_workgroup_storage_size=16384)
    for head_dim, n_heads, n_kv_heads in [(64, 9, 3), (128, 12, 2), (80, 4, 4), (256, 4, 2)]:
        tiles = attention.attention_tiles(limits, head_dim)
        assert attention.AttentionTiles.storage(tiles.block_q, tiles.block_kv, head_dim) <= 16384
        attention_chunks(gpu, head_dim, n_heads, n_kv_heads, [(20, None), (45, None)], max_rows=50,
                         tiles=tiles, seed=head_dim)


@pytest.mark.parametrize("cache", CACHES)
def test_rope_then_prefill_attention(gpu, cache):
    """Two chunks through rope_kv (QK-norm, NEOX) + prefill attention, then a decode step through
    the per-token attention kernel, against the oracles: the keys within an ulp of numpy's
    rounding to the cache type, the attention over what the cache holds."""
    d = gpu.device
    head_dim, n_heads, n_kv_heads, theta, eps, max_ctx, max_rows = 64, 6, 2, 1e6, 1e-6, 80, 40
    rng = np.random.default_rng(5)
    qn, kn = rng.standard_normal(head_dim).astype(np.float32), rng.standard_normal(head_dim).astype(np.float32)
    zeros = lambda *shape: upload(gpu, np.zeros(shape, np.float32))   # noqa: E731
    qb = zeros(max_rows, n_heads, head_dim)
    kb, vb = zeros(max_rows, n_kv_heads, head_dim), zeros(max_rows, n_kv_heads, head_dim)
    cache_shape = (max_ctx, n_kv_heads, head_dim)
    kc, vc = (upload_cache(gpu, np.zeros(cache_shape), t) for t in cache)
    q_rot, out = zeros(max_rows, n_heads, head_dim), zeros(max_rows, n_heads, head_dim)
    step = d.buffer(STEP_BYTES, "step", uniform=True)
    shape = dict(head_dim=head_dim, n_heads=n_heads, n_kv_heads=n_kv_heads, cache_types=cache)
    rope = gpu_ops.rope_kv(gpu.kernels, d, q_rot, kc, vc, qb, kb, vb, step, max_tokens=max_rows, **shape,
                          rope=gpu_ops.Rope(theta, True, qk_norm=upload(gpu, np.concatenate([qn, kn])), eps=eps))
    prefill = d.schedule([rope, attention.prefill_attention(gpu.kernels, d, out, q_rot, kc, vc, step,
                                                          max_rows=max_rows, **shape)])
    decode = d.schedule([rope, *attention.attention(gpu.kernels, d, out, q_rot, kc, vc, step, max_tokens=max_rows,
                                                 max_ctx=max_ctx, **shape)])
    k_all = v_all = np.zeros((0, n_kv_heads, head_dim), np.float32)
    pos = 0
    for n_tokens, schedule in [(40, prefill), (23, prefill), (1, decode)]:
        q = rng.standard_normal((n_tokens, n_heads, head_dim)).astype(np.float32)
        k = rng.standard_normal((n_tokens, n_kv_heads, head_dim)).astype(np.float32)
        v = rng.standard_normal((n_tokens, n_kv_heads, head_dim)).astype(np.float32)
        for buf, a in ((qb, q), (kb, k), (vb, v)):
            d.write(buf, a.tobytes())
        d.write(step, pack_step(pos, n_tokens))
        submit(gpu, schedule)
        positions = np.arange(pos, pos + n_tokens)
        q_ref = ops.rope(ops.rms_norm(q, qn, eps), positions, theta, True)
        k_all = np.concatenate([k_all, ops.rope(ops.rms_norm(k, kn, eps), positions, theta, True)])
        v_all = np.concatenate([v_all, v])
        k_got, v_got = (read_cache(gpu, b, cache_shape, t)[:pos + n_tokens] for b, t in zip((kc, vc), cache))
        assert_close(k_got, as_cached(k_all, cache[0]), *cache_tolerance(cache[0]), f"keys after {n_tokens} rows")
        assert_close(v_got, as_cached(v_all, cache[1]), 0, 0, f"values after {n_tokens} rows")
        want = ops.attention(q_ref, k_got, v_got, positions, 1.0 / np.sqrt(head_dim))
        got = run(gpu, [], out, (max_rows, n_heads, head_dim))[:n_tokens]
        assert_close(got, want, 2e-5, 1e-4, f"attention of {n_tokens} rows at pos {pos}")
        pos += n_tokens


def test_prefill_attention_errors(gpu):
    buf = gpu.device.buffer(4096, "x")
    with pytest.raises(ValueError, match="head_dim 320 is above"):
        attention.prefill_attention(gpu.kernels, gpu.device, buf, buf, buf, buf, buf, head_dim=320, n_heads=4,
                                  n_kv_heads=2, max_rows=8)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        attention.prefill_attention(gpu.kernels, gpu.device, buf, buf, buf, buf, buf, head_dim=64, n_heads=6,
                                  n_kv_heads=4, max_rows=8)
