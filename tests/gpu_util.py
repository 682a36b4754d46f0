"""Helpers for the kernel tests: upload arrays, run dispatches, compare with numpy."""
import asyncio

import numpy as np
import pytest

from cera import ops
from cera.config import FFN_GELU
from cera.device import Binding, Dispatch
from cera.gpu.numerics import CACHE_TYPES, Numerics
from cera.gpu.state import STEP_BYTES, pack_step
from quantdata import padded


def upload(gpu, data, label="data"):
    data = padded(np.ascontiguousarray(data))
    buffer = gpu.device.buffer(len(data), label)
    gpu.device.write(buffer, data)
    return buffer


def zeros(gpu, shape, label="zeros"):
    return upload(gpu, np.zeros(shape, np.float32), label)


def step_buffer(gpu, pos, n_tokens):
    buf = gpu.device.buffer(STEP_BYTES, "step", uniform=True)
    gpu.device.write(buf, pack_step(pos, n_tokens))
    return buf


def submit(gpu, steps):
    """Submit a dispatch, a list of steps, or a prepared schedule (reads after it wait for it)."""
    if isinstance(steps, Dispatch):
        steps = [steps]
    asyncio.run(gpu.device.run(gpu.device.schedule(steps) if isinstance(steps, list) else steps))


def read(gpu, buffer, shape, dtype=np.float32, offset=0):
    """An array of `shape` and `dtype` read from `buffer` at `offset`."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer(asyncio.run(gpu.device.read(buffer, offset, size)), dtype).reshape(shape)


def run(gpu, dispatches, buffer, shape, dtype=np.float32, offset=0):
    """Submit dispatches, then read an array of `shape` and `dtype` from `buffer` at `offset`."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    data = asyncio.run(gpu.device.run(gpu.device.schedule(list(dispatches)), Binding(buffer, offset, size)))
    return np.frombuffer(data, dtype).reshape(shape)


def glu_act(gate, act):
    """The GLU's gate activation in float64: silu, or with act FFN_GELU the tanh-approximated GELU."""
    if act == FFN_GELU:
        return 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate ** 3)))
    return gate / (1 + np.exp(-gate))


def assert_close(got, want, atol, rtol, what=""):
    """|got - want| <= atol + rtol |want| everywhere, else fail listing the first mismatches."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    atol = np.broadcast_to(atol, want.shape)
    bad = np.argwhere(~(np.abs(got - want) <= atol + rtol * np.abs(want)))
    if bad.size:
        lines = [f"  {tuple(int(j) for j in i)}: got {got[tuple(i)]:.7g} want {want[tuple(i)]:.7g}"
                 for i in bad[:8]]
        pytest.fail(f"{what}: {len(bad)} of {got.size} mismatch\n" + "\n".join(lines))


# --- KV caches of each type (cera.gpu.numerics) ------------------------------------------------

F32_CACHE, F16_CACHE, Q8_CACHE = ("f32", "f32"), ("f16", "f16"), ("q8_0", "q8_0")   # (K's, V's) cache type
CACHES = [F32_CACHE, F16_CACHE, Q8_CACHE]
MIXED_CACHES = [("f16", "f32"), ("f32", "f16")]
Q8_MIXED_CACHES = [("q8_0", "f16"), ("f32", "q8_0")]
# Blocks of 32 values whose q8_0 quantization is an edge: ties at .5 (d = 1 and d = 1/8 exactly,
# so x * id lands on k + 0.5: roundf takes them away from zero, numpy's rint would not), an
# all-zero block, d not exact (amax 1: id = 1 / (1/127) rounded) with values near the ties, a block
# whose amax is negative, blocks of tiny and huge scale, and one whose ties are ties only with id as
# llama.cpp rounds it (1 / d, not 127 / amax: x * id = k + 0.5 there, just below it with the other).
Q8_EDGES = np.array([
    [127.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5, -126.5, 3.5, 64.5, -0.49999997, 0.50000006, *np.arange(19) * 6.5],
    [0.125 * 127, 0.0625, -0.0625, 0.1875, -0.1875, 0.3125, 0.4375, -15.8125, *(0.0625 * (2 * np.arange(24) + 1))],
    np.zeros(32),
    [1.0, *np.linspace(-1, 1, 31)],
    [-3.0, *np.linspace(-2.9, 2.9, 31)],
    [*np.linspace(-1e-30, 1e-30, 31), 2e-30],
    [*np.linspace(-6e5, 6e5, 31), 7e5],
    [3.8202732, 0.015040444, 0.045121334, 0.07520223, 0.10528311, -0.015040444, -0.07520223, *np.zeros(25)],
], np.float32)
# Values whose f16 rounding is an edge: ties to even (up and down), subnormals and their ties, the
# largest finite half and the ties around it, overflow to infinity, and below the smallest half.
HALF_EDGES = np.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, -(1 + 2 ** -11), 1.5 * 2 ** -24, 2.5 * 2 ** -24,
                       2 ** -25, 3 * 2 ** -26, 2 ** -14 * (1 - 2 ** -11), 65504, 65519.99, 65520, -7e4,
                       1e-9, 0.1, -0.0, 2 ** -14], np.float32)


def to_cache(a, cache_type):
    """f32 rows (..., head_dim) as a KV cache of `cache_type` holds them (cera.ops.to_cache: f16
    rounded as numpy casts, q8_0 quantized as llama.cpp does), NaN and overflow as they come."""
    with np.errstate(invalid="ignore", over="ignore"):
        return ops.to_cache(np.asarray(a, np.float32), CACHE_TYPES[cache_type])


def as_cached(a, cache_type):
    """An f32 array as a KV cache of `cache_type` holds it, in f32."""
    return ops.from_cache(to_cache(a, cache_type))


def upload_cache(gpu, a, cache_type, label="cache"):
    """An f32 array uploaded as a KV cache of `cache_type`."""
    return upload(gpu, to_cache(a, cache_type), label)


def write_cache(gpu, buffer, a, cache_type):
    gpu.device.write(buffer, to_cache(a, cache_type).tobytes())


def read_cache_raw(gpu, buffer, shape, cache_type):
    """A KV cache of `cache_type` with rows `shape` (..., head_dim) read back as it holds them."""
    dtype = CACHE_TYPES[cache_type]
    return read(gpu, buffer, ops.cache_shape(dtype, *shape), dtype)


def read_cache(gpu, buffer, shape, cache_type):
    """A KV cache of `cache_type` read back, in f32."""
    return ops.from_cache(read_cache_raw(gpu, buffer, shape, cache_type))


# Two engines or kernel paths that compute a key or value within f32 rounding of each other (the
# GPU and numpy; decode's matvecs and prefill's matmuls) can hold it as neighbouring halves in an
# f16 cache, 2^-11 of it apart: that moves the logits (or hidden states) by up to ~1e-3 of the
# largest (measured up to 1.9e-4 on the synthetic models), their NMSE to ~1e-8 (measured <= 1.2e-8,
# where an f32 cache holds ~1e-12).
F16_CACHE_TOLERANCE = 1e-3
NMSE_F16_CACHE = 1e-7
# Likewise a q8_0 cache can hold such a value a q8_0 step (max |x| / 127 of its block) apart:
# rarer (the steps are coarser) but larger, and the flip moves the next layers' blocks (their
# amax, so their scales) too. Measured NMSE up to 6.4e-9 on the synthetic models (most ~1e-12),
# 1.4e-6 with a LoRA adapter (one value's flip in layer 1 of 4); the q8_0 cache itself moves
# them ~5e-5 from an f32 one.
NMSE_Q8_CACHE = 1e-5
# ... and the logits of two such paths then part by up to ~5e-4 of the largest (measured 4.7e-4 on
# the synthetic models, an f16 cache's 7e-5)
Q8_CACHE_TOLERANCE = 3e-3


def cache_tolerance(cache_type):
    """(atol, rtol) of a value the GPU computed in f32 and stored in a cache of `cache_type`, against
    numpy's computed likewise: f32's, or one f16 ulp where the two round to neighbours, or one
    q8_0 step (d = max |x| / 127 of the block, <= 0.04 for the tests' randn rows) where they do."""
    return {"f32": (1e-4, 1e-4), "f16": (1e-4, 2 ** -10), "q8_0": (0.04, 1e-4)}[cache_type]


def cache_numerics(cache):
    """The Numerics of a (K's, V's) cache type, no opt-ins."""
    return Numerics(cache_type_k=cache[0], cache_type_v=cache[1])
