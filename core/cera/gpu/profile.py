"""Where a step's GPU time goes, on any host with timestamp queries (`Device.time_passes`): the
same report natively (`scripts/profile_decode.py`) and inside the page (`scripts/h200/browser_bench.py
--profile`), so the two hosts' kernels compare family by family.

A decode step three ways:
  step     the whole step in one compute pass, as it runs (timestamps at the pass's ends)
  family   each kernel family's marginal cost inside that pass: the step with every dispatch of
           the family issued twice, minus the step (so barriers and launch are counted as they
           fall, and the families add up to about the step)
  alone    each dispatch in a pass of its own (includes a pass's fixed cost, see "floor")
  floor    a pass of N one-workgroup dispatches that depend on each other: the cost of a
           dispatch that does nothing
Each family's line also gives the bytes its dispatches move at that KV length (the plan's
accounting: weights, activations, KV rows read, bytes written) over its marginal time, and the
matvecs' total against `copy_gbps`, the device's copy bandwidth (read plus written).

A prefill submission: each dispatch timed in a pass of its own (a prefill dispatch runs for tens
to hundreds of microseconds, so a pass's fixed cost hardly counts), summed per family, with the
matmuls' arithmetic rate (2 x rows x m x k FLOPs each, twice for a GLU, from the label
"matmul TYPE MxK").
"""
from __future__ import annotations

import collections
import re
import statistics

import numpy as np

from cera.device import Binding, Dispatch
from cera.gpu import ops
from cera.gpu.state import pack_step


def family(step: Dispatch) -> str:
    """A dispatch's kernel family: its label without the layer ("blk.3.attention" -> "attention")."""
    return re.sub(r"^blk\.\d+\.", "", step.label)


def matmul_flops(label: str, rows: int) -> int:
    """FLOPs of a prefill matmul from its label ("matmul Q4_K 8960x1536 glu"), 0 for other kernels."""
    found = re.match(r"matmul \S+ (\d+)x(\d+)", label)
    if not found:
        return 0
    return 2 * rows * int(found[1]) * int(found[2]) * (2 if " glu" in label else 1)


async def one_pass(device, steps: list[Dispatch], repeat: int = 7) -> float:
    """Median ns of `steps` in one pass, after a warm-up."""
    await device.time_passes([steps])
    return statistics.median([(await device.time_passes([steps]))[0] for _ in range(repeat)])


async def each_alone(device, steps: list[Dispatch], repeat: int = 5) -> np.ndarray:
    """Median ns of each dispatch in a pass of its own."""
    return np.median([await device.time_passes([[s] for s in steps]) for _ in range(repeat)], axis=0)


async def floor(device, kernels, n: int = 200) -> float:
    """ns per dispatch of n one-workgroup dispatches, each reading what the last one wrote
    (argmaxes of 4 floats, ping-ponging between two buffers)."""
    a, b = device.buffer(16, "floor a"), device.buffer(16, "floor b")
    ab = ops.argmax(kernels, device, Binding(b, 0, 4), Binding(a, 0, 16), n=4)
    ba = ops.argmax(kernels, device, Binding(a, 0, 4), Binding(b, 0, 16), n=4)
    return await one_pass(device, [ab, ba] * (n // 2)) / n


async def decode_report(model, pos: int, copy_gbps: float, top: int = 15) -> list[str]:
    """A decode step at KV length pos + 1: the step, the floor, each family's marginal time and
    rate, and each family's dispatches alone; one line each."""
    device = model.device
    device.write(model.state.step.buffer, pack_step(pos, 1))
    steps = list(model.decode_plan.steps)
    whole = await one_pass(device, steps)
    lines = [f"GPU time of the step in one pass: {whole / 1e6:7.3f} ms ({whole / len(steps) / 1e3:.1f} us per dispatch)",
             f"floor: a dependent one-workgroup dispatch costs {await floor(device, model.kernels) / 1e3:.2f} us",
             "marginal GPU time per family (its dispatches doubled, minus the step), bytes moved:"]
    count = collections.Counter(family(s) for s in steps)
    table, matvec_ns, matvec_bytes = model.decode_plan.table(pos + 1), 0, 0   # bytes per step, the plan's
    for name, n in count.most_common():
        doubled = [d for s in steps for d in ((s, s) if family(s) == name else (s,))]
        extra = await one_pass(device, doubled) - whole
        nbytes = sum(r["bytes_read"] + r["bytes_written"] for s, r in zip(steps, table) if family(s) == name)
        if name.startswith("matvec"):
            matvec_ns, matvec_bytes = matvec_ns + extra, matvec_bytes + nbytes
        rate = f"{nbytes / extra:7.1f}" if extra > 0 else "      -"   # a family within the noise
        lines.append(f"  {extra / 1e6:8.3f} ms {n:4d}x {extra / n / 1e3:7.1f} us {nbytes / 1e6:9.2f} MB {rate} GB/s  {name}")
    if matvec_ns > 0:
        lines.append(f"matvecs: {matvec_ns / 1e6:.3f} ms for {matvec_bytes / 1e6:.1f} MB, {matvec_bytes / matvec_ns:.0f} "
                     f"GB/s: {matvec_bytes / matvec_ns / copy_gbps:.0%} of {copy_gbps:.0f} GB/s (copy bandwidth)")
    alone = await each_alone(device, steps)
    lines.append(f"GPU time of the dispatches, each in its own pass: {alone.sum() / 1e6:.3f} ms")
    per_label = collections.Counter()
    for s, ns in zip(steps, alone):
        per_label[family(s)] += ns / 1e6
    for label, ms in per_label.most_common(top):
        lines.append(f"  {ms:8.3f} ms {count[label]:4d}x {ms * 1e3 / count[label]:7.1f} us  {label}")
    return lines


async def prefill_report(model, tokens: list[int], top: int = 15) -> list[str]:
    """The dispatches of a len(tokens)-token prompt's plan, each alone, per family, with the
    matmuls' arithmetic rate; one line each."""
    device, n = model.device, len(tokens)
    steps = [s for s in model.plan(n).steps if isinstance(s, Dispatch)]
    device.write(model.state.tokens.buffer, np.asarray(tokens, np.uint32).tobytes())
    device.write(model.state.step.buffer, pack_step(0, n))
    alone = await each_alone(device, steps)
    ms, count, flops = collections.Counter(), collections.Counter(), collections.Counter()
    for s, ns in zip(steps, alone):
        ms[family(s)] += ns / 1e6
        count[family(s)] += 1
        flops[family(s)] += matmul_flops(family(s), n)
    total, total_flops = alone.sum() / 1e6, sum(flops.values())
    matmul_ms = sum(t for f, t in ms.items() if flops[f])
    lines = [f"GPU time of its {len(steps)} dispatches, each in its own pass: {total:.3f} ms "
             f"({n / total * 1000:,.0f} tok/s at that time)"]
    if matmul_ms > 0:
        lines.append(f"matmuls: {matmul_ms:.3f} ms for {total_flops / 1e12:.3f} TFLOP, "
                     f"{total_flops / matmul_ms / 1e9:.2f} TFLOP/s")
    for label, t in ms.most_common(top):
        rate = f"{flops[label] / t / 1e9:6.2f} TFLOP/s" if flops[label] else " " * 13
        lines.append(f"  {t:8.3f} ms {count[label]:4d}x {t * 1e3 / count[label]:8.1f} us {rate}  {label}")
    return lines
