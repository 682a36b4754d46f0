"""Where a decode step's time goes: the whole step, then each dispatch of the decode schedule
submitted alone (with a 4-byte readback, so each figure includes one submit's overhead),
summed per kernel variant.

    python scripts/profile_decode.py MODEL.gguf [--top 15]
"""
import argparse
import asyncio
import collections
import time

from cera.engine import Engine
from cera.gguf_file import GGUFFile
from cera.gpu.step import pack_step
from cera.native import NativeDevice


def timed(fn, repeat: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t) / repeat * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--top", type=int, default=15, help="kernel variants to list")
    ap.add_argument("--pos", type=int, default=256, help="position of the profiled token (KV length)")
    ap.add_argument("--repeat", type=int, default=20, help="timed submissions per figure")
    args = ap.parse_args()
    device = NativeDevice()
    engine = asyncio.run(Engine.load(GGUFFile.open(args.model), device, ctx=max(1024, args.pos + 1)))
    model = engine.backend
    device.write(model.step.buffer, pack_step(args.pos, 1))
    step_ms = timed(lambda: device.submit(model.decode_schedule, model.tokens), args.repeat)
    print(f"{device.adapter_name}\ndecode step: {step_ms:.3f} ms ({model.dispatches_per_token} dispatches)")
    per_kernel, count = collections.Counter(), collections.Counter()
    for dispatch in model.decode_steps:
        alone = device.schedule([dispatch])
        ms = timed(lambda: device.submit(alone, model.tokens), max(1, args.repeat // 4))
        per_kernel[dispatch.kernel.label] += ms
        count[dispatch.kernel.label] += 1
    empty_ms = timed(lambda: device.submit([], model.tokens), args.repeat)
    print(f"an empty submit with readback: {empty_ms:.3f} ms; per kernel (sum of solo runs, count):")
    for label, ms in per_kernel.most_common(args.top):
        print(f"{ms:9.3f} ms {count[label]:4d}x  {label}")


if __name__ == "__main__":
    main()
