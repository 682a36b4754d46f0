"""Where a decode step's time goes, natively: GPU time per kernel from timestamp queries
(each dispatch in a pass of its own) and the wall time of a
step, synchronous and pipelined.

    python scripts/profile_decode.py MODEL.gguf [--pos 512] [--top 15]
"""
import argparse
import asyncio
import collections
import time

import numpy as np
import wgpu

from cera.engine import Engine
from cera.gguf_file import GGUFFile
from cera.gpu.state import pack_step
from cera.native import NativeDevice


def timed(fn, repeat: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t) / repeat * 1000


def gpu_times(device, steps) -> np.ndarray:
    """Nanoseconds each dispatch takes on the GPU, from begin/end-of-pass timestamps."""
    d, n = device._device, len(steps)
    queries = d.create_query_set(type="timestamp", count=2 * n)
    resolved = d.create_buffer(size=16 * n, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
    encoder = d.create_command_encoder()
    for i, step in enumerate(steps):
        compute = encoder.begin_compute_pass(timestamp_writes={
            "query_set": queries, "beginning_of_pass_write_index": 2 * i, "end_of_pass_write_index": 2 * i + 1})
        compute.set_pipeline(step.kernel)
        compute.set_bind_group(0, step.bind_group)
        compute.dispatch_workgroups(*step.groups)
        compute.end()
    encoder.resolve_query_set(queries, 0, 2 * n, resolved, 0)
    d.queue.submit([encoder.finish()])
    stamps = np.frombuffer(d.queue.read_buffer(resolved), np.uint64).reshape(n, 2).astype(np.int64)
    return stamps[:, 1] - stamps[:, 0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--top", type=int, default=15, help="kernel variants to list")
    ap.add_argument("--pos", type=int, default=512, help="position of the profiled token (KV length)")
    ap.add_argument("--repeat", type=int, default=50, help="timed steps per wall-time figure")
    args = ap.parse_args()
    device = NativeDevice()
    engine = asyncio.run(Engine.load(GGUFFile.open(args.model), device, ctx=max(1024, args.pos + args.repeat + 2)))
    model, d = engine.backend, device._device
    device.write(model.state.step.buffer, pack_step(args.pos, 1))
    steps = model.decode_plan.steps
    print(f"{device.adapter_name}; {model.dispatches_per_token} dispatches per token, KV length {args.pos + 1}")

    def step():
        asyncio.run(device.run(model.decode_schedule, model.state.tokens))

    print(f"a step, submitted and read back:  {timed(step, args.repeat):7.3f} ms")

    async def pipelined():
        async for _ in model.greedy(0, args.pos, args.repeat):
            pass
    t = time.perf_counter()
    asyncio.run(pipelined())
    print(f"a step, pipelined greedy decode:  {(time.perf_counter() - t) / args.repeat * 1000:7.3f} ms")

    if "timestamp-query" not in device.features:
        print("(no timestamp-query on this adapter: no per-kernel GPU times)")
        return
    ns = np.median([gpu_times(device, steps) for _ in range(5)], axis=0)
    per_kernel, count = collections.Counter(), collections.Counter()
    for step, t in zip(steps, ns):
        per_kernel[step.kernel.label.split(" ")[0] + " " + step.label] += t / 1e6
        count[step.kernel.label.split(" ")[0] + " " + step.label] += 1
    family = collections.Counter()
    for step, t in zip(steps, ns):
        family[step.kernel.label.split(" ")[0]] += t / 1e6
    print(f"GPU time of the dispatches, each in its own pass: {ns.sum() / 1e6:.3f} ms")
    for name, ms in family.most_common():
        print(f"  {ms:8.3f} ms  {name}")
    print("by dispatch label:")
    for label, ms in per_kernel.most_common(args.top):
        print(f"  {ms:8.3f} ms {count[label]:4d}x  {label}")


if __name__ == "__main__":
    main()
