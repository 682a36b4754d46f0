"""Where a decode step's time goes, natively: host encoding and wall time of a step (synchronous
and pipelined), and GPU time from timestamp queries, three ways:

  step     the whole step in one compute pass, as it runs (timestamps at the pass's ends)
  family   each kernel family's marginal cost inside that pass: the step with every dispatch of
           the family issued twice, minus the step (so barriers and launch are counted as they
           fall, and the families add up to about the step)
  alone    each dispatch in a pass of its own (includes a pass's fixed cost, see "floor")
  floor    a pass of N one-workgroup dispatches that depend on each other: the cost of a
           dispatch that does nothing

Each family's line also gives the bytes its dispatches move at that KV length (the plan's
accounting: weights, activations, KV rows read, bytes written) over its marginal time, and the
matvecs' total is given against `--copy-gbps`, the device's copy bandwidth (bytes read plus
written; DESIGN.md records 2,500 for the H200 through wgpu-py). Timing a buffer copy here, by
wall time around one submission, read 750 GB/s there: below what the LM head's matvec alone
reaches (1.1 TB/s), so it is not a ceiling and the figure is taken as an input.

With `--prefill N`, a submission of an N-token prompt instead: its wall time, and each dispatch
timed in a pass of its own (a prefill dispatch runs for tens to hundreds of microseconds, so a
pass's fixed cost hardly counts), summed per family, with the matmuls' arithmetic rate (2 x rows
x m x k FLOPs each, twice for a GLU, from the label "matmul TYPE MxK").

    python scripts/profile_decode.py MODEL.gguf [--pos 512] [--top 15]
    python scripts/profile_decode.py MODEL.gguf --prefill 512
"""
import argparse
import asyncio
import collections
import re
import time

import numpy as np
import wgpu

from cera.device import Binding, Dispatch
from cera.engine import Engine
from cera.gguf_file import GGUFFile
from cera.gpu import matmul
from cera.gpu.state import pack_step
from cera.native import NativeDevice
from cera.native.device import _encode_pass as encode_pass


def timed(fn, repeat: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t) / repeat * 1000


def family(step) -> str:
    """A dispatch's kernel family: its label without the layer ("blk.3.attention" -> "attention")."""
    return re.sub(r"^blk\.\d+\.", "", step.label)


class Timer:
    """GPU nanoseconds of compute passes, from timestamps at each pass's beginning and end."""

    def __init__(self, device, most: int):
        self.d = device._device
        self.queries = self.d.create_query_set(type="timestamp", count=2 * most)
        self.resolved = self.d.create_buffer(size=16 * most,
                                             usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)

    def passes(self, groups: list[list]) -> np.ndarray:
        """ns of each group of dispatches, each group encoded as one pass, all in one submission."""
        encoder = self.d.create_command_encoder()
        for i, steps in enumerate(groups):
            compute = encoder.begin_compute_pass(timestamp_writes={
                "query_set": self.queries, "beginning_of_pass_write_index": 2 * i,
                "end_of_pass_write_index": 2 * i + 1})
            for step in steps:
                compute.set_pipeline(step.kernel)
                compute.set_bind_group(0, step.bind_group)
                compute.dispatch_workgroups(*step.groups)
            compute.end()
        n = len(groups)
        encoder.resolve_query_set(self.queries, 0, 2 * n, self.resolved, 0)
        self.d.queue.submit([encoder.finish()])
        stamps = np.frombuffer(self.d.queue.read_buffer(self.resolved, 0, 16 * n), np.uint64)
        stamps = stamps.reshape(n, 2).astype(np.int64)
        return stamps[:, 1] - stamps[:, 0]

    def one_pass(self, steps: list, repeat: int = 7) -> float:
        """Median ns of `steps` in one pass."""
        self.passes([steps])
        return float(np.median([self.passes([steps])[0] for _ in range(repeat)]))


def floor(device, kernels, timer: Timer, n: int = 200) -> float:
    """ns per dispatch of n one-workgroup dispatches, each reading what the last one wrote
    (argmaxes of 4 floats, ping-ponging between two buffers)."""
    a, b = device.buffer(16, "floor a"), device.buffer(16, "floor b")
    ab = matmul.argmax(kernels, device, Binding(b, 0, 4), Binding(a, 0, 16), n=4)
    ba = matmul.argmax(kernels, device, Binding(a, 0, 4), Binding(b, 0, 16), n=4)
    return timer.one_pass([ab, ba] * (n // 2)) / n


def matmul_flops(label: str, rows: int) -> int:
    """FLOPs of a prefill matmul from its label ("matmul Q4_K 8960x1536 glu"), 0 for other kernels."""
    found = re.match(r"matmul \S+ (\d+)x(\d+)", label)
    if not found:
        return 0
    return 2 * rows * int(found[1]) * int(found[2]) * (2 if " glu" in label else 1)


def profile_prefill(device, engine, args) -> None:
    """Wall time of an n-token prompt's submission, and its dispatches' GPU time per family."""
    model, n = engine.backend, args.prefill
    tokens = list(range(1, n + 1))

    def prompt():
        model.reset()
        asyncio.run(model.forward(tokens, 0))
    wall = timed(prompt, max(args.repeat // 10, 3))
    print(f"a {n}-token prompt, submitted and read back: {wall:8.3f} ms ({n / wall * 1000:,.0f} tok/s)")
    if "timestamp-query" not in device.features:
        print("(no timestamp-query on this adapter: no GPU times)")
        return
    steps = [s for s in model.plan(n).steps if isinstance(s, Dispatch)]
    device.write(model.state.tokens.buffer, np.asarray(tokens, np.uint32).tobytes())
    device.write(model.state.step.buffer, pack_step(0, n))
    timer = Timer(device, len(steps))
    alone = np.median([timer.passes([[s] for s in steps]) for _ in range(5)], axis=0)
    ms, count, flops = collections.Counter(), collections.Counter(), collections.Counter()
    for s, ns in zip(steps, alone):
        ms[family(s)] += ns / 1e6
        count[family(s)] += 1
        flops[family(s)] += matmul_flops(family(s), n)
    total, total_flops = alone.sum() / 1e6, sum(flops.values())
    matmul_ms = sum(t for f, t in ms.items() if flops[f])
    print(f"GPU time of its {len(steps)} dispatches, each in its own pass: {total:.3f} ms "
          f"({n / total * 1000:,.0f} tok/s at that time)")
    print(f"matmuls: {matmul_ms:.3f} ms for {total_flops / 1e12:.3f} TFLOP, "
          f"{total_flops / matmul_ms / 1e9:.2f} TFLOP/s")
    for label, t in ms.most_common(args.top):
        rate = f"{flops[label] / t / 1e9:6.2f} TFLOP/s" if flops[label] else " " * 13
        print(f"  {t:8.3f} ms {count[label]:4d}x {t * 1e3 / count[label]:8.1f} us {rate}  {label}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--top", type=int, default=15, help="dispatch labels to list (alone)")
    ap.add_argument("--pos", type=int, default=512, help="position of the profiled token (KV length - 1)")
    ap.add_argument("--repeat", type=int, default=50, help="timed steps per wall-time figure")
    ap.add_argument("--ctx", type=int, default=2048, help="context the plan is built for (as `python -m cera bench`)")
    ap.add_argument("--copy-gbps", type=float, default=2500.0,
                    help="the device's copy bandwidth in GB/s, read plus written (default: DESIGN.md's H200 figure)")
    ap.add_argument("--prefill", type=int, metavar="N",
                    help="profile the submission of an N-token prompt instead of a decode step")
    args = ap.parse_args()
    device = NativeDevice()
    engine = asyncio.run(Engine.load(GGUFFile.open(args.model), device,
                                     ctx=max(args.ctx, args.pos + args.repeat + 2, (args.prefill or 0) + 1)))
    model = engine.backend
    if args.prefill:
        print(f"{device.adapter_name}; prefill of {args.prefill} tokens (chunks of {model.chunk})")
        return profile_prefill(device, engine, args)
    device.write(model.state.step.buffer, pack_step(args.pos, 1))
    steps = list(model.decode_plan.steps)
    print(f"{device.adapter_name}; {model.dispatches_per_token} dispatches per token, KV length {args.pos + 1}")

    def step():
        asyncio.run(device.run(model.decode_schedule, model.state.tokens))

    def encode():   # what a step costs the host before its submit
        encoder = device._device.create_command_encoder()
        for segment in model.decode_schedule:
            compute = encoder.begin_compute_pass()
            encode_pass(compute, segment[1])
            compute.end()
        encoder.finish()

    print(f"a step, submitted and read back:  {timed(step, args.repeat):7.3f} ms")
    print(f"a step's host encoding:           {timed(encode, args.repeat):7.3f} ms")

    async def pipelined():
        async for _ in model.greedy(0, args.pos, args.repeat):
            pass
    t = time.perf_counter()
    asyncio.run(pipelined())
    print(f"a step, pipelined greedy decode:  {(time.perf_counter() - t) / args.repeat * 1000:7.3f} ms")

    if "timestamp-query" not in device.features:
        print("(no timestamp-query on this adapter: no GPU times)")
        return
    device.write(model.state.step.buffer, pack_step(args.pos, 1))
    timer = Timer(device, max(len(steps), 64))
    whole = timer.one_pass(steps)
    print(f"GPU time of the step in one pass: {whole / 1e6:7.3f} ms "
          f"({whole / len(steps) / 1e3:.1f} us per dispatch)")
    print(f"floor: a dependent one-workgroup dispatch costs {floor(device, model.kernels, timer) / 1e3:.2f} us")

    # marginal cost of each family: its dispatches issued twice
    count = collections.Counter(family(s) for s in steps)
    print("marginal GPU time per family (its dispatches doubled, minus the step), bytes moved:")
    table, matvec_ns, matvec_bytes = model.decode_plan.table(args.pos + 1), 0, 0   # bytes per step, the plan's
    for name, n in count.most_common():
        doubled = [d for s in steps for d in ((s, s) if family(s) == name else (s,))]
        extra = timer.one_pass(doubled) - whole
        nbytes = sum(r["bytes_read"] + r["bytes_written"] for s, r in zip(steps, table) if family(s) == name)
        if name.startswith("matvec"):
            matvec_ns, matvec_bytes = matvec_ns + extra, matvec_bytes + nbytes
        rate = f"{nbytes / extra:7.1f}" if extra > 0 else "      -"   # a family within the noise
        print(f"  {extra / 1e6:8.3f} ms {n:4d}x {extra / n / 1e3:7.1f} us {nbytes / 1e6:9.2f} MB {rate} GB/s  {name}")
    print(f"matvecs: {matvec_ns / 1e6:.3f} ms for {matvec_bytes / 1e6:.1f} MB, {matvec_bytes / matvec_ns:.0f} GB/s: "
          f"{matvec_bytes / matvec_ns / args.copy_gbps:.0%} of {args.copy_gbps:.0f} GB/s (--copy-gbps)")

    alone = np.median([timer.passes([[s] for s in steps]) for _ in range(5)], axis=0)
    per_label = collections.Counter()
    for s, ns in zip(steps, alone):
        per_label[family(s)] += ns / 1e6
    print(f"GPU time of the dispatches, each in its own pass: {alone.sum() / 1e6:.3f} ms")
    for label, ms in per_label.most_common(args.top):
        print(f"  {ms:8.3f} ms {count[label]:4d}x {ms * 1e3 / count[label]:7.1f} us  {label}")


if __name__ == "__main__":
    main()
