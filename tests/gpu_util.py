"""Helpers for the kernel tests: upload arrays, run dispatches, compare with numpy."""
import asyncio

import numpy as np
import pytest

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

F32_CACHE, F16_CACHE = ("f32", "f32"), ("f16", "f16")   # (K's, V's) cache type
CACHES = [F32_CACHE, F16_CACHE]
MIXED_CACHES = [("f16", "f32"), ("f32", "f16")]
# Values whose f16 rounding is an edge: ties to even (up and down), subnormals and their ties, the
# largest finite half and the ties around it, overflow to infinity, and below the smallest half.
HALF_EDGES = np.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, -(1 + 2 ** -11), 1.5 * 2 ** -24, 2.5 * 2 ** -24,
                       2 ** -25, 3 * 2 ** -26, 2 ** -14 * (1 - 2 ** -11), 65504, 65519.99, 65520, -7e4,
                       1e-9, 0.1, -0.0, 2 ** -14], np.float32)


def as_cached(a, cache_type):
    """An f32 array as a KV cache of `cache_type` holds it (f16: rounded as numpy casts), in f32."""
    return np.asarray(a, np.float32).astype(CACHE_TYPES[cache_type]).astype(np.float32)


def upload_cache(gpu, a, cache_type, label="cache"):
    """An f32 array uploaded as a KV cache of `cache_type`."""
    return upload(gpu, np.asarray(a, np.float32).astype(CACHE_TYPES[cache_type]), label)


def write_cache(gpu, buffer, a, cache_type):
    gpu.device.write(buffer, np.asarray(a, np.float32).astype(CACHE_TYPES[cache_type]).tobytes())


def read_cache(gpu, buffer, shape, cache_type):
    """A KV cache of `cache_type` read back, in f32."""
    return read(gpu, buffer, shape, CACHE_TYPES[cache_type]).astype(np.float32)


# Two engines or kernel paths that compute a key or value within f32 rounding of each other (the
# GPU and numpy; decode's matvecs and prefill's matmuls) can hold it as neighbouring halves in an
# f16 cache, 2^-11 of it apart: that moves the logits (or hidden states) by up to ~1e-3 of the
# largest (measured up to 1.9e-4 on the synthetic models), their NMSE to ~1e-8 (measured <= 1.2e-8,
# where an f32 cache holds ~1e-12).
F16_CACHE_TOLERANCE = 1e-3
NMSE_F16_CACHE = 1e-7


def cache_tolerance(cache_type):
    """(atol, rtol) of a value the GPU computed in f32 and stored in a cache of `cache_type`, against
    numpy's computed likewise: f32's, or one f16 ulp where the two round to neighbours."""
    return (1e-4, 1e-4) if cache_type == "f32" else (1e-4, 2 ** -10)


def cache_numerics(cache):
    """The Numerics of a (K's, V's) cache type, no opt-ins."""
    return Numerics(cache_type_k=cache[0], cache_type_v=cache[1])
