"""Decode weight kernels (matvec, embed, argmax) against numpy, on the native device.

The references are gguf.quants.dequantize of the same raw bytes (bit-exact with ggml).
Shapes include row counts that are not multiples of the rows per workgroup, float rows
of odd length (f16 rows at 2-byte offsets, a ragged last unit), and long rows that take
a whole workgroup. The matvec tests run both reductions (`reduction`): workgroup memory
("wg") and subgroup operations ("sg", where the device has them)."""
from __future__ import annotations

import dataclasses
import types

import numpy as np

from cera import ops
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from cera.config import FFN_GELU, FFN_SILU
from cera.device import Binding
from cera.gpu import matmul, matvec, ops as gpu_ops, quant
from cera.gpu.spec import Projection, Tuning
from cera.gpu.state import pack_step
from gpu_util import assert_close, glu_act, run, upload
from quantdata import random_rows

from script_module import load

iq_grids = load("iq_grids")

TYPES = sorted(quant.WEIGHT_TYPES, key=lambda t: t.name)
IDS = [t.name for t in TYPES]


def block_of(t):
    return GGML_QUANT_SIZES[t][0]


@pytest.fixture(params=[False, True], ids=["wg", "sg"])
def subgroups(request, gpu):
    """The matvec's reduction: workgroup memory (False) or subgroup operations (True)."""
    if request.param and "subgroups" not in gpu.device.features:
        pytest.skip("this device has no subgroups")
    return request.param


def shapes(t):
    """(m, k) cases for a type: one block, a few, many (a whole workgroup per row)."""
    block = block_of(t)
    if block == 1:       # float rows: odd lengths too (ragged last unit, f16 rows at 2 mod 4)
        return [(1, 1), (7, 13), (67, 100), (300, 64), (3, 4100)]
    if block == 32:
        return [(1, 32), (7, 96), (67, 320), (300, 64), (3, 4096)]
    return [(1, 256), (7, 768), (67, 512), (300, 256), (3, 8192)]


def matvec_case(gpu, t, m, k, rng, *, scale=None, bias=False, accumulate=False, glu=False, norm=False,
                tpr=None, device=None, act=FFN_SILU, subgroups=None, workgroup=None, x_bits=None, rpt=None):
    """Run one matvec on the GPU; return (got, want). norm: fuse an RMSNorm of x; act: the GLU's
    gate activation; x_bits: matvec's knob (None: its default); with 8, want takes x quantized to
    8 bits as the kernel stages it (ops.q8_k of x, normed but for the 1 / rms factor the kernel
    applies to the row sums), with 24 (as precise as f32 x) and 0 the exact x."""
    raw, w = random_rows(t, m, k, rng)
    x = rng.standard_normal(k).astype(np.float32) * 3
    out0 = rng.standard_normal(m).astype(np.float32)
    out_buf = upload(gpu, out0, "out")
    spec, kw = dict(wtype=t, k=k, m=m, scale=scale, accumulate=accumulate, act=act), {}
    x_gpu = x
    if norm:
        norm_w = (1 + 0.5 * rng.standard_normal(k)).astype(np.float32)
        kw.update(norm=Binding(upload(gpu, norm_w, "norm_w")), eps=1e-5)
        if x_bits == 8:
            x = ops.q8_k(x * norm_w) / np.sqrt(np.mean(x * x) + 1e-5)
        else:
            x = ops.rms_norm(x, norm_w, 1e-5)
    elif x_bits == 8:
        x = ops.q8_k(x)
    want = w.astype(np.float64) @ x
    if glu:
        raw_up, w_up = random_rows(t, m, k, rng)
        spec["w_up"] = Binding(upload(gpu, raw_up, "w_up"))
        want = glu_act(want, act) * (w_up.astype(np.float64) @ x)
    if scale is not None:
        want = want * scale
    if bias:
        b = rng.standard_normal(m).astype(np.float32)
        spec["bias"] = Binding(upload(gpu, b, "bias"))
        want = want + b
    if accumulate:
        want = want + out0
    device = device or gpu.device
    dispatch = matvec.matvec(gpu.kernels, device, Binding(out_buf), Projection(Binding(upload(gpu, raw, "w")), **spec),
                             Binding(upload(gpu, x_gpu, "x")), **kw,
                             tune=Tuning(tpr=tpr, rpt=rpt, workgroup=workgroup, subgroups=subgroups, x_bits=x_bits))
    if subgroups is not None:
        assert ("sg" in dispatch.label.split(" ")) == subgroups
    default_int = norm and t in quant.X_INT_TYPES and m >= matvec.X_INT_MIN_ROWS \
        and matvec.staged_x_fits(device, k, x_bits=24)
    bits = x_bits if x_bits is not None else 24 if default_int else 0
    sums = not bits and t in quant.UNIT_AFFINE_TYPES
    staged = norm and matvec.staged_x_fits(device, k, sums, x_bits=bits)
    assert (f"x{bits}" in dispatch.label.split()) == bool(bits), dispatch.label
    assert ("rpt2" in dispatch.label.split()) == (rpt == 2 or rpt is None and matvec.rows_per_thread(bits, k, m) == 2)
    assert (" xs" in dispatch.label) == staged
    return run(gpu, [dispatch], out_buf, m), want, np.abs(w) @ np.abs(x)


def check_matvec(got, want, magnitude, what):
    # f32 accumulation in another order: error grows with sum |w x|
    assert_close(got, want, atol=1e-6 * magnitude.max() + 1e-6, rtol=1e-5, what=what)


@pytest.mark.parametrize("t", TYPES, ids=IDS)
def test_matvec_shapes(gpu, t, subgroups):
    rng = np.random.default_rng(int(t))
    for m, k in shapes(t):
        got, want, mag = matvec_case(gpu, t, m, k, rng, subgroups=subgroups)
        check_matvec(got, want, mag, f"{t.name} m={m} k={k}")


@pytest.mark.parametrize("t", TYPES, ids=IDS)
def test_matvec_variants(gpu, t, subgroups):
    rng = np.random.default_rng(100 + int(t))
    m, k = shapes(t)[2]
    got, want, mag = matvec_case(gpu, t, m, k, rng, subgroups=subgroups, scale=0.375, bias=True, accumulate=True)
    check_matvec(got, want, mag, f"{t.name} scale+bias+accumulate")
    got, want, mag = matvec_case(gpu, t, m, k, rng, subgroups=subgroups, glu=True)
    check_matvec(got, want, mag * mag, f"{t.name} glu")
    got, want, mag = matvec_case(gpu, t, m, k, rng, subgroups=subgroups, glu=True, scale=2.0, accumulate=True)
    check_matvec(got, want, mag * mag, f"{t.name} glu+scale+accumulate")
    got, want, mag = matvec_case(gpu, t, m, k, rng, subgroups=subgroups, norm=True, bias=True)
    check_matvec(got, want, mag, f"{t.name} norm+bias")
    got, want, mag = matvec_case(gpu, t, m, k, rng, subgroups=subgroups, norm=True, glu=True)
    check_matvec(got, want, mag * mag, f"{t.name} norm+glu")
    # GeGLU (Gemma); gates of |x| up to tens, where GELU saturates to x and -0
    got, want, mag = matvec_case(gpu, t, m, k, rng, subgroups=subgroups, glu=True, act=FFN_GELU)
    check_matvec(got, want, mag * mag, f"{t.name} geglu")
    got, want, mag = matvec_case(gpu, t, m, k, rng, subgroups=subgroups, norm=True, glu=True, act=FFN_GELU, scale=2.0, accumulate=True)
    check_matvec(got, want, mag * mag, f"{t.name} norm+geglu+scale+accumulate")


def test_glu_activation_checked(gpu):
    buf = Binding(gpu.device.buffer(4096, "x"))
    with pytest.raises(ValueError, match="GELU is the GLU's gate activation: it needs w_up"):
        matvec.matvec(gpu.kernels, gpu.device, buf, Projection(buf, T.Q8_0, k=32, m=4, act=FFN_GELU), buf)
    with pytest.raises(ValueError, match="GLU activation 'relu'"):
        matvec.matvec(gpu.kernels, gpu.device, buf, Projection(buf, T.Q8_0, k=32, m=4, w_up=buf, act="relu"), buf)


@pytest.mark.parametrize("variant", ["bias", "accumulate", "scale"])
def test_matvec_single_flags(gpu, variant):
    rng = np.random.default_rng(7)
    got, want, mag = matvec_case(gpu, T.Q4_0, 33, 160, rng, **{variant: 0.5 if variant == "scale" else True})
    check_matvec(got, want, mag, variant)


@pytest.mark.parametrize("tpr", [4, 8, 16, 32, 64, 128, 256])
def test_matvec_threads_per_row(gpu, tpr, subgroups):
    """Rows narrower than a subgroup (several per subgroup, which must not mix), as wide as one,
    and spanning several; with the fused norm's workgroup sum and a GLU's pair of sums."""
    rng = np.random.default_rng(tpr)
    got, want, mag = matvec_case(gpu, T.Q6_K, 70, 768, rng, tpr=tpr, subgroups=subgroups)
    check_matvec(got, want, mag, f"tpr={tpr}")
    got, want, mag = matvec_case(gpu, T.Q4_0, 70, 4096, rng, tpr=tpr, subgroups=subgroups, norm=True, glu=True)
    check_matvec(got, want, mag * mag, f"tpr={tpr} norm+glu")


@pytest.mark.parametrize("workgroup,tpr", [(4, 4), (32, 8), (64, 64), (128, 4)])
def test_matvec_workgroup_size(gpu, workgroup, tpr, subgroups):
    """Workgroups smaller than 256 (and than a subgroup), one row or many each; the fused norm."""
    rng = np.random.default_rng(workgroup)
    got, want, mag = matvec_case(gpu, T.Q8_0, 75, 1024, rng, tpr=tpr, workgroup=workgroup, subgroups=subgroups,
                                 norm=True)
    check_matvec(got, want, mag, f"workgroup={workgroup} tpr={tpr}")


def cramped(gpu, storage):
    """The device, as a builder sees it, with `storage` bytes of workgroup memory."""
    limits = dataclasses.replace(gpu.device.limits, max_compute_workgroup_storage_size=storage)
    return types.SimpleNamespace(limits=limits, features=gpu.device.features)


@pytest.mark.parametrize("staged", [False, True], ids=["storage", "staged"])
def test_matvec_x_staging(gpu, staged, subgroups):
    """A normed x staged per workgroup first (normalized, zero past K), or, where workgroup
    memory is too small for it, read from storage in the row loop; and a plain x (read from
    storage): a fused-norm GLU and plain matvecs, f16 rows of odd length (x bound as scalars, a
    ragged last unit) and 16-byte-block types (bound as vec4<u32>)."""
    rng = np.random.default_rng(60 + staged)
    device = gpu.device if staged else cramped(gpu, matvec.STAGE_SCRATCH)
    for t, m, k in [(T.Q4_K, 67, 1536), (T.Q5_K, 9, 512), (T.Q8_0, 75, 1024), (T.F16, 67, 1001), (T.F32, 7, 13)]:
        got, want, mag = matvec_case(gpu, t, m, k, rng, subgroups=subgroups, device=device)
        check_matvec(got, want, mag, f"{t.name} k={k}")
        got, want, mag = matvec_case(gpu, t, m, k, rng, subgroups=subgroups, device=device, norm=True, glu=True)
        check_matvec(got, want, mag * mag, f"{t.name} k={k} staged={staged} norm+glu")


def test_matvec_staging_checked(gpu, subgroups):
    """An x too big for workgroup memory: a fused norm reads storage."""
    k = gpu.device.limits.max_compute_workgroup_storage_size // 4 // 32 * 32
    assert not matvec.staged_x_fits(gpu.device, k) and matvec.staged_x_fits(gpu.device, 256)
    got, want, mag = matvec_case(gpu, T.Q8_0, 5, k, np.random.default_rng(61), subgroups=subgroups, norm=True)
    check_matvec(got, want, mag, f"k={k} norm, unstaged")


def test_matvec_knobs_checked(gpu):
    buf = Binding(gpu.device.buffer(4096, "x"))
    for workgroup, tpr in [(48, 4), (512, 4), (32, 64)]:
        with pytest.raises(ValueError, match="expected a power of two"):
            matvec.matvec(gpu.kernels, gpu.device, buf, Projection(buf, T.Q8_0, k=32, m=4), buf,
                          tune=Tuning(tpr=tpr, workgroup=workgroup))
    no_subgroups = types.SimpleNamespace(features=frozenset(), limits=gpu.device.limits)
    with pytest.raises(ValueError, match="no subgroups"):
        matvec.matvec(gpu.kernels, no_subgroups, buf, Projection(buf, T.Q8_0, k=32, m=4), buf,
                      tune=Tuning(subgroups=True))
    d = matvec.matvec(gpu.kernels, no_subgroups, buf, Projection(buf, T.Q8_0, k=32, m=4), buf)
    assert d.label == "matvec Q8_0 4x32"
    with pytest.raises(ValueError, match="matvec: no tuning knob tiles"):
        matvec.matvec(gpu.kernels, gpu.device, buf, Projection(buf, T.Q8_0, k=32, m=4), buf,
                      tune=Tuning(tiles=matmul.matmul_tiles(gpu.device.limits, 64)))


def test_matvec_2d_dispatch(gpu):
    """More workgroups than one dimension allows: the grid becomes (x, y), rows flattened."""
    limits = dataclasses.replace(gpu.device.limits, max_compute_workgroups_per_dimension=5)
    small = types.SimpleNamespace(bind=gpu.device.bind, limits=limits, features=gpu.device.features)
    rng = np.random.default_rng(3)
    got, want, mag = matvec_case(gpu, T.Q8_0, 300, 64, rng, device=small)   # 38 workgroups of 8 rows
    check_matvec(got, want, mag, "2-D")
    assert gpu_ops.grid(38, limits) == (5, 8)


def small_limits(gpu, binding_size, align=256):
    return dataclasses.replace(gpu.device.limits, max_storage_buffer_binding_size=binding_size,
                               min_storage_buffer_offset_alignment=align)


@pytest.mark.parametrize("t,k,size", [(T.Q4_0, 64, 4096), (T.F16, 13, 8192), (T.Q6_K, 256, 40000),
                                      (T.Q8_0, 96, 16384)], ids=["Q4_0", "F16", "Q6_K", "Q8_0"])
def test_row_tiles(gpu, t, k, size):
    limits = small_limits(gpu, size)
    m = 1000
    rb = quant.row_bytes(t, k)
    tiles = quant.row_tiles(t, k, m, limits)
    assert len(tiles) > 1
    assert [s for s, _ in tiles] == list(np.cumsum([0] + [n for _, n in tiles[:-1]]))
    assert sum(n for _, n in tiles) == m
    for start, n in tiles:
        assert start * rb % 256 == 0 and start * 4 % 256 == 0
        assert (n * rb + 3) // 4 * 4 <= size
    assert quant.row_tiles(t, k, m, gpu.device.limits) == [(0, m)]


def test_row_tiles_too_small(gpu):
    with pytest.raises(ValueError, match="exceed the storage binding limit"):
        quant.row_tiles(T.Q8_0, 96, 1000, small_limits(gpu, 2048))   # 128 aligned rows of 102 bytes


@pytest.mark.parametrize("glu,act", [(False, FFN_SILU), (True, FFN_SILU), (True, FFN_GELU)],
                         ids=["bias", "glu", "geglu"])
def test_matvec_tiled(gpu, glu, act, subgroups):
    """A matrix bigger than a (forced small) binding limit, bound in aligned row tiles."""
    t, m, k = T.Q4_0, 300, 64                   # 36-byte rows: tiles of 64 rows
    small = types.SimpleNamespace(limits=small_limits(gpu, 4096), features=gpu.device.features)
    rng = np.random.default_rng(11)
    raw, w = random_rows(t, m, k, rng)
    x = rng.standard_normal(k).astype(np.float32)
    want = w.astype(np.float64) @ x
    kw = {}
    if glu:
        raw_up, w_up = random_rows(t, m, k, rng)
        kw.update(w_up=Binding(upload(gpu, raw_up)), act=act)
        want = glu_act(want, act) * (w_up.astype(np.float64) @ x)
    else:
        b = rng.standard_normal(m).astype(np.float32)
        kw["bias"] = Binding(upload(gpu, b))
        want = want + b
    out = gpu.device.buffer(4 * m, "out")
    dispatches = matvec.matvec_tiled(gpu.kernels, small, Binding(out), Projection(Binding(upload(gpu, raw)), t, k, m, **kw),
                                     Binding(upload(gpu, x)), tune=Tuning(subgroups=subgroups))
    assert len(dispatches) == 5
    got = run(gpu, dispatches, out, m)
    mag = np.abs(w) @ np.abs(x)
    check_matvec(got, want, mag * (mag if glu else 1), "tiled")


def embed_case(gpu, t, k, rows, tokens, n_tokens, max_rows, scale=None, limits=None, seed=0):
    """limits: the device's as embed_tiled sees them (None: embed, one dispatch)."""
    rng = np.random.default_rng(seed)
    raw, table = random_rows(t, rows, k, rng)
    tokens_buf = upload(gpu, np.array(tokens + [0] * (max_rows - len(tokens)), np.uint32), "tokens")
    step_buf = gpu.device.buffer(16, "step", uniform=True)
    gpu.device.write(step_buf, pack_step(0, n_tokens))
    sentinel = np.full((max_rows, k), -7.0, np.float32)
    out = upload(gpu, sentinel, "out")
    device = types.SimpleNamespace(limits=limits, features=gpu.device.features) if limits else gpu.device
    args = (gpu.kernels, device, Binding(out), Binding(upload(gpu, raw, "table")), Binding(tokens_buf),
            Binding(step_buf))
    if limits is None:
        dispatches = [gpu_ops.embed(*args, wtype=t, k=k, max_rows=max_rows, scale=scale)]
    else:
        dispatches = gpu_ops.embed_tiled(*args, wtype=t, k=k, rows=rows, max_rows=max_rows, scale=scale)
    got = run(gpu, dispatches, out, max_rows * k).reshape(max_rows, k)
    want = sentinel.copy()
    want[:n_tokens] = table[tokens[:n_tokens]] * (1.0 if scale is None else scale)
    return got, want, dispatches


@pytest.mark.parametrize("t", TYPES, ids=IDS)
def test_embed(gpu, t):
    k = {1: 13, 32: 96, 256: 512}[block_of(t)]
    got, want, _ = embed_case(gpu, t, k, rows=11, tokens=[5, 0, 10, 5, 3], n_tokens=4, max_rows=6)
    assert_close(got, want, atol=1e-6, rtol=1e-6, what=f"embed {t.name}")


def test_embed_scale_and_tiles(gpu):
    got, want, _ = embed_case(gpu, T.Q8_0, 64, rows=40, tokens=[39, 1, 7], n_tokens=3, max_rows=3,
                              scale=24.0)
    assert_close(got, want, atol=1e-5, rtol=1e-6, what="embed scale")
    limits = small_limits(gpu, 8192)        # 68-byte rows: tiles of 64 rows
    got, want, dispatches = embed_case(gpu, T.Q8_0, 64, rows=300, tokens=[299, 0, 64, 63, 128, 200, 7],
                                       n_tokens=6, max_rows=8, limits=limits, seed=5)
    assert len(dispatches) == 5
    assert_close(got, want, atol=1e-6, rtol=1e-6, what="embed tiled")


@pytest.mark.parametrize("n", [1, 7, 256, 1000, 4099, 4100, 151936])
def test_argmax(gpu, n):
    rng = np.random.default_rng(n)
    out = gpu.device.buffer(4, "argmax")
    cases = [rng.standard_normal(n).astype(np.float32) * 5 - 20,        # all negative
             np.full(n, -3.0, np.float32)]                               # all tied: index 0
    tied = rng.standard_normal(n).astype(np.float32)
    tied[rng.integers(0, n, 3)] = 9.0                                    # ties: the first one
    cases.append(tied)
    if n > 300:
        late = np.zeros(n, np.float32)
        late[[300, 45]] = 1.0           # a tie where the later index sits in the lower thread
        cases.append(late)
        rounds = np.zeros(n, np.float32)
        rounds[[min(4 * (256 + 3), n - 2), 4 * 5 + 1, n - 1]] = 1.0   # a later load of a lower thread, the tail
        cases.append(rounds)
        minus_inf = np.full(n, -np.inf, np.float32)
        minus_inf[n - 1] = -1e30
        cases.append(minus_inf)
    for logits in cases:
        dispatch = gpu_ops.argmax(gpu.kernels, gpu.device, Binding(out), Binding(upload(gpu, logits)), n=n)
        got = int(run(gpu, [dispatch], out, 1, np.uint32)[0])
        assert got == int(np.argmax(logits)), (n, got, int(np.argmax(logits)))


@pytest.mark.parametrize("file", sorted(iq_grids.GRIDS))
def test_iq_grids_are_gguf_py_tables(file):
    """shaders/iq*_grid.wgsl hold what scripts/iq_grids.py writes from gguf-py's grids."""
    assert (iq_grids.SHADERS / file).read_text() == iq_grids.wgsl(file), "rerun scripts/iq_grids.py"


def test_unsupported_type(gpu):
    with pytest.raises(ValueError, match="no matvec kernel"):
        quant.units_per_row(T.TQ1_0, 256)
    with pytest.raises(ValueError, match="multiple"):
        quant.row_bytes(T.Q4_K, 100)


X_INT_CASES = [(T.Q4_K, 67, 1536), (T.Q4_K, 5, 8960), (T.Q6_K, 70, 768), (T.Q6_K, 300, 256)]


@pytest.mark.parametrize("bits", [24, 8])
@pytest.mark.parametrize("t,m,k", X_INT_CASES, ids=[f"{t.name}-{m}x{k}" for t, m, k in X_INT_CASES])
def test_matvec_integer_x(gpu, t, m, k, bits, subgroups):
    """x in integers per 256-element block and integer dot products, exact but for the float
    scales, so as tight as the f32 path: with 24 bits against W @ x, with 8 (llama.cpp's Q8_K)
    against W @ q8_k(x); plain, a fused norm (staged as floats first), a GLU, scale + bias +
    accumulate, and an 8960-element x (Qwen2.5-1.5B's down projection) too big to stage as floats
    (and, with 24 bits, as integers in a device's 32 KiB of workgroup memory: a typed error)."""
    rng = np.random.default_rng(70 + int(t) + k)
    if not matvec.staged_x_fits(gpu.device, k, floats=False, x_bits=bits):
        with pytest.raises(ValueError, match=f"x of {k} elements does not fit"):
            matvec_case(gpu, t, m, k, rng, subgroups=subgroups, x_bits=bits)
        return
    # the last: a fused norm whose x, as floats, does not fit beside its integers (read from storage)
    ints_only = cramped(gpu, matvec.STAGE_SCRATCH + matvec.x_staging(k, floats=False, x_bits=bits).nbytes)
    for kw in [{}, dict(norm=True, bias=True), dict(norm=True, glu=True), dict(glu=True),
               dict(scale=0.375, bias=True, accumulate=True), dict(norm=True, device=ints_only)]:
        got, want, mag = matvec_case(gpu, t, m, k, rng, subgroups=subgroups, x_bits=bits, **kw)
        check_matvec(got, want, mag * mag if kw.get("glu") else mag, f"{t.name} {m}x{k} x{bits} {kw}")


@pytest.mark.parametrize("tpr", [1, 2, 4, 32])
def test_matvec_integer_x_threads_per_row(gpu, tpr, subgroups):
    """Integer x with a whole row a thread (the LM head's geometry), or a few; rows of one
    Q6_K item per thread and of several, with a fused norm and a GLU."""
    rng = np.random.default_rng(90 + tpr)
    for t, m, k in [(T.Q6_K, 70, 768), (T.Q4_K, 67, 1536)]:
        for kw in [dict(norm=True), dict(norm=True, glu=True)]:
            got, want, mag = matvec_case(gpu, t, m, k, rng, subgroups=subgroups, x_bits=24, tpr=tpr, **kw)
            check_matvec(got, want, mag * mag if kw.get("glu") else mag, f"{t.name} tpr={tpr} {kw}")


@pytest.mark.parametrize("tpr", [1, 4, 64])
def test_matvec_integer_x_two_rows_a_thread(gpu, tpr, subgroups):
    """Two rows a thread (ROWS apart, one loop): a row count that leaves the last workgroup's
    second rows partly past M, rows wider than a subgroup (64 threads: two row sums through
    workgroup memory, one after the other), 24 and 8 bits, a fused norm, a GLU, scale + bias +
    accumulate; and the rule's choice for a tall matrix."""
    rng = np.random.default_rng(130 + tpr)
    for t, m, k in [(T.Q4_K, 67, 1536), (T.Q6_K, 300, 768)]:
        for bits, kw in [(24, dict(norm=True)), (8, dict(norm=True, glu=True)),
                         (24, dict(scale=0.375, bias=True, accumulate=True))]:
            got, want, mag = matvec_case(gpu, t, m, k, rng, subgroups=subgroups, x_bits=bits, tpr=tpr, rpt=2, **kw)
            check_matvec(got, want, mag * mag if kw.get("glu") else mag, f"{t.name} tpr={tpr} rpt=2 x{bits} {kw}")
    m, k = matvec.RPT_MIN_ROWS + 3, 3584
    if matvec.staged_x_fits(gpu.device, k, x_bits=24):   # (a baseline device's 16 KiB do not hold it)
        got, want, mag = matvec_case(gpu, T.Q4_K, m, k, rng, subgroups=subgroups, norm=True)
        check_matvec(got, want, mag, f"Q4_K {m}x{k}, the rule's rows per thread")


@pytest.mark.parametrize("bits", [24, 8])
def test_matvec_reads_x_record(gpu, bits, subgroups):
    """x's record of integers, written once by its norm (matmul.rms_norm_x_int for one row, spread
    over a workgroup per 1024 elements: 2560 take three, the last partly; word for word what
    quantize_x writes of the norm's rows, the record of an x that is not normed), then read from storage
    by the matvecs (X_RECORD): Q4_K and Q6_K rows, a GLU, two rows a thread, a row a thread, scale
    and bias, a device with no workgroup memory to stage x; against numpy's W @ rms_norm(x) (8
    bits: its q8_k). A matvec of f32 x (a type of no integer dot) reads the norm's rows beside it,
    which are ops.rms_norm's."""
    rng = np.random.default_rng(150 + bits)
    k, eps = 2560, 1e-5
    x = (rng.standard_normal(k) * 3).astype(np.float32)
    norm_w = (1 + 0.5 * rng.standard_normal(k)).astype(np.float32)
    normed = ops.rms_norm(x, norm_w, eps)
    want_x = ops.q8_k(normed) if bits == 8 else normed.astype(np.float64)
    xb, record = upload(gpu, np.zeros(k, np.float32), "xb"), upload(gpu, np.zeros(matvec.record_words(k, bits), np.uint32))
    step = gpu.device.buffer(16, "step", uniform=True)
    gpu.device.write(step, pack_step(0, 1))
    norm = matmul.rms_norm_x_int(gpu.kernels, Binding(xb), Binding(record), Binding(upload(gpu, x, "x")),
                                 Binding(upload(gpu, norm_w, "norm_w")), Binding(step), n=k, eps=eps, max_rows=1,
                                 **matvec.record_layout(bits))
    assert norm.groups[0] == 3
    assert_close(run(gpu, [norm], xb, k), normed, atol=1e-5 * np.abs(normed).max(), rtol=1e-5, what="the norm's rows")
    words = run(gpu, [], record, matvec.record_words(k, bits), np.uint32)
    again = upload(gpu, np.zeros_like(words), "again")   # quantize_x of the norm's rows: an x that is not normed
    quantized = matmul.quantize_x(gpu.kernels, Binding(again), Binding(xb), Binding(step), k=k, max_rows=1,
                                  **matvec.record_layout(bits))
    np.testing.assert_array_equal(run(gpu, [quantized], again, words.shape, np.uint32), words)
    no_room = cramped(gpu, matvec.STAGE_SCRATCH)   # no x staged: a record needs none
    for t, m, kw in [(T.Q4_K, 67, dict(glu=True, tpr=8, rpt=2)), (T.Q6_K, 70, dict(tpr=1)),
                     (T.Q4_K, 300, dict(scale=0.375, bias=True)), (T.Q6_K, matvec.X_INT_MIN_ROWS, dict(device=no_room)),
                     (T.Q8_0, 9, {})]:
        raw, w = random_rows(t, m, k, rng)
        want = w.astype(np.float64) @ (want_x if t in quant.X_INT_TYPES else normed)
        spec = dict(wtype=t, k=k, m=m, scale=kw.get("scale"))
        if kw.get("glu"):
            raw_up, w_up = random_rows(t, m, k, rng)
            spec["w_up"] = Binding(upload(gpu, raw_up, "w_up"))
            want = glu_act(want, FFN_SILU) * (w_up.astype(np.float64) @ want_x)
        if kw.get("bias"):
            b = rng.standard_normal(m).astype(np.float32)
            spec["bias"] = Binding(upload(gpu, b, "bias"))
            want = want * kw["scale"] + b
        out = upload(gpu, np.zeros(m, np.float32), "out")
        dispatch = matvec.matvec(gpu.kernels, kw.get("device", gpu.device), Binding(out),
                                 Projection(Binding(upload(gpu, raw, "w")), **spec), Binding(xb), x_ints=Binding(record),
                                 int8=bits == 8, tune=Tuning(tpr=kw.get("tpr"), rpt=kw.get("rpt"), subgroups=subgroups,
                                                             x_bits=bits if m < matvec.X_INT_MIN_ROWS and t in quant.X_INT_TYPES else None))
        assert ("rec" in dispatch.label.split()) == (t in quant.X_INT_TYPES), dispatch.label
        mag = np.abs(w) @ np.abs(want_x)
        check_matvec(run(gpu, [norm, dispatch], out, m), want, mag * mag if kw.get("glu") else mag,
                     f"{t.name} {m}x{k} x{bits} {kw}")
    raw, _ = random_rows(T.Q4_K, 4, k, rng)
    with pytest.raises(ValueError, match="no norm or merge"):
        matvec.matvec(gpu.kernels, gpu.device, Binding(out), Projection(Binding(upload(gpu, raw, "w")), T.Q4_K, k, 4),
                      Binding(xb), norm=Binding(xb), eps=eps, x_ints=Binding(record), tune=Tuning(x_bits=24))


def test_matvec_rows_per_thread_rule():
    """Two rows a thread where x is in integers, long, and the matrix tall; one otherwise."""
    assert matvec.rows_per_thread(24, 4096, matvec.RPT_MIN_ROWS) == 2 == matvec.rows_per_thread(8, 3584, 152064)
    assert matvec.rows_per_thread(24, 4096, matvec.RPT_MIN_ROWS - 1) == 1 == matvec.rows_per_thread(0, 4096, 14336)
    assert matvec.rows_per_thread(24, 1536, 151936) == 1


@pytest.mark.parametrize("t, k, m, rpt", [(T.Q4_K, 4096, 14336, 2), (T.Q4_K, 3584, 18944, 2), (T.Q6_K, 4096, 128256, 2),
                                         (T.Q6_K, 4096, 1024, 1), (T.Q4_K, 256, 5, 1)])
def test_matvec_record_threads_rule(t, k, m, rpt):
    """A matvec reading x's record takes threads a row up to about RECORD_THREADS in all (a
    thread's rows counted once), no more than the row has items, and at least as many as the
    staged rule gives the same matrix."""
    items = quant.units_per_row(t, k) // quant.X_INT_ITEM_UNITS[t]
    tpr = matvec.record_threads_per_row(t, k, m, rpt)
    threads = lambda tpr: tpr * -(-m // rpt)
    assert threads(tpr) <= matvec.RECORD_THREADS and tpr <= items
    assert tpr == matvec.WORKGROUP or 2 * tpr > items or threads(2 * tpr) > matvec.RECORD_THREADS
    assert tpr >= matvec.x_int_threads_per_row(t, k, m, 24)


@pytest.mark.parametrize("workgroup", [4, 32, 64])
def test_matvec_integer_x_small_workgroups(gpu, workgroup, subgroups):
    """x's integers staged by workgroups of fewer threads than a 256-element block has 16-element
    groups (4, 32: a block's step from several rounds of its groups), or than a subgroup (4),
    with 24 and 8 bits."""
    rng = np.random.default_rng(110 + workgroup)
    for t, m, k in [(T.Q4_K, 67, 1536), (T.Q6_K, 70, 768)]:
        for bits in (24, 8):
            got, want, mag = matvec_case(gpu, t, m, k, rng, subgroups=subgroups, x_bits=bits, norm=True,
                                         workgroup=workgroup, tpr=min(workgroup, 4))
            check_matvec(got, want, mag, f"{t.name} workgroup={workgroup} x{bits}")


def test_int8_x_moves_results_as_llama_cpp_does(gpu):
    """8-bit x is not f32 x: against W @ x its error is quantization's (about 1% of |W||x| /
    sqrt(k)), well outside the f32 path's tolerance, and against W @ q8_k(x) it is rounding's:
    the test above is not passing by accident. 24-bit x is within the f32 tolerance of W @ x."""
    rng = np.random.default_rng(5)
    raw, w = random_rows(T.Q4_K, 64, 1536, rng)
    x = rng.standard_normal(1536).astype(np.float32)
    exact, quantized = w.astype(np.float64) @ x, w.astype(np.float64) @ ops.q8_k(x)
    got = {}
    for bits in (8, 24):
        out = upload(gpu, np.zeros(64, np.float32), "out")
        d = matvec.matvec(gpu.kernels, gpu.device, Binding(out), Projection(Binding(upload(gpu, raw, "w")), T.Q4_K, 1536, 64),
                          Binding(upload(gpu, x, "x")), tune=Tuning(x_bits=bits))
        got[bits] = run(gpu, [d], out, 64)
    assert np.abs(got[8] - quantized).max() < 1e-4 * np.abs(exact).max()
    assert np.abs(got[8] - exact).max() > 1e-3 * np.abs(exact).max()
    check_matvec(got[24], exact, np.abs(w) @ np.abs(x), "Q4_K x24")


def test_integer_x_checked(gpu):
    buf = Binding(gpu.device.buffer(4096, "x"))
    with pytest.raises(ValueError, match="no integer x dot product for Q8_0"):
        matvec.matvec(gpu.kernels, gpu.device, buf, Projection(buf, T.Q8_0, 256, 4), buf, tune=Tuning(x_bits=24))
    with pytest.raises(ValueError, match="3 rows per thread"):
        matvec.matvec(gpu.kernels, gpu.device, buf, Projection(buf, T.Q4_K, 256, 4), buf, tune=Tuning(rpt=3))
    with pytest.raises(ValueError, match="x_bits 16: expected one of 0, 8, 24"):
        matvec.matvec(gpu.kernels, gpu.device, buf, Projection(buf, T.Q4_K, 256, 4), buf, tune=Tuning(x_bits=16))
    no_dot = types.SimpleNamespace(features=frozenset(), limits=gpu.device.limits)
    with pytest.raises(ValueError, match="packed_4x8_integer_dot_product"):
        matvec.matvec(gpu.kernels, no_dot, buf, Projection(buf, T.Q4_K, 256, 4), buf, tune=Tuning(x_bits=8))
    assert matvec.x_int_bits(no_dot, T.Q4_K, 256, 4096, None, floats=True) == 0   # the default falls back to f32 x
    assert matvec.x_int_bits(gpu.device, T.Q4_K, 256, 4096, None, floats=True) == 24
    assert matvec.x_int_bits(gpu.device, T.Q4_K, 256, matvec.X_INT_MIN_ROWS - 1, None, floats=True) == 0


def test_q8_k_is_llama_cpps():
    """ops.q8_k against a transcription of ggml's quantize_row_q8_K_ref (signed max, negated
    scale, nearest_int by the 1.5 * 2^23 trick) on random blocks, one all zero, one with ties."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 256)).astype(np.float32) * 3
    x[1] = 0
    x[2, :6] = [0.5, 1.5, 2.5, -0.5, -2.5, 127]   # scale 1: ties at .5
    want = []
    for block in x:
        i = int(np.argmax(np.abs(block)))
        mx = block[i]
        if mx == 0:
            want.append(np.zeros(256, np.float32))
            continue
        iscale = np.float32(-127.0) / mx
        v = ((iscale * block).astype(np.float32) + np.float32(12582912.0)).astype(np.float32)
        q = np.minimum((v.view(np.int32) & 0x007FFFFF) - 0x00400000, 127)
        want.append(q.astype(np.float32) * (np.float32(1.0) / iscale))
    np.testing.assert_array_equal(ops.q8_k(x.ravel()).reshape(4, 256), np.array(want))
