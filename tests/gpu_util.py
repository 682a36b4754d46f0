"""Helpers for the kernel tests: upload arrays, run dispatches, compare with numpy."""
import asyncio

import numpy as np
import pytest

from cera.config import FFN_GELU
from cera.device import Binding, Dispatch
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
