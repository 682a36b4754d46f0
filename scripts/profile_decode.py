"""Where a decode step's time goes, natively: host encoding and wall time of a step (synchronous
and pipelined), then the GPU times of `cera.gpu.profile` (timestamp queries): the step in one
pass, each kernel family's marginal cost, each dispatch alone, and a dispatch's floor. The page
prints the same GPU report (`scripts/h200/browser_bench.py --profile`).

The matvecs' rate is given against `--copy-gbps`, the device's copy bandwidth (bytes read plus
written; the default is the H200's through wgpu-py, docs/PERFORMANCE.md's method). Timing a
buffer copy here, by wall time around one submission, read below what the LM head's matvec alone
reaches, so it is not a ceiling and the figure is taken as an input.

With `--prefill N`, a submission of an N-token prompt instead: its wall time, and each dispatch
timed in a pass of its own, summed per family, with the matmuls' arithmetic rate.

    python scripts/profile_decode.py MODEL.gguf [--pos 512] [--top 15]
    python scripts/profile_decode.py MODEL.gguf --prefill 512 [--int8]
"""
import argparse
import asyncio
import time

from cera.cli import add_numerics_args, numerics_from
from cera.engine import Engine
from cera.gguf_file import GGUFFile
from cera.gpu import profile
from cera.gpu.state import pack_step
from cera.native import NativeDevice


def timed(fn, repeat: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t) / repeat * 1000


def profile_prefill(device, model, args) -> None:
    """Wall time of an n-token prompt's submission, and its dispatches' GPU time per family."""
    n = args.prefill
    tokens = list(range(1, n + 1))

    def prompt():
        model.reset()
        asyncio.run(model.forward(tokens, 0))
    wall = timed(prompt, max(args.repeat // 10, 3))
    print(f"a {n}-token prompt, submitted and read back: {wall:8.3f} ms ({n / wall * 1000:,.0f} tok/s)")
    if "timestamp-query" not in device.features:
        print("(no timestamp-query on this adapter: no GPU times)")
        return
    print("\n".join(asyncio.run(profile.prefill_report(model, tokens, args.top))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--top", type=int, default=15, help="dispatch labels to list (alone)")
    ap.add_argument("--pos", type=int, default=512, help="position of the profiled token (KV length - 1)")
    ap.add_argument("--repeat", type=int, default=50, help="timed steps per wall-time figure")
    ap.add_argument("--ctx", type=int, default=2048, help="context the plan is built for (as `python -m cera bench`)")
    ap.add_argument("--copy-gbps", type=float, default=2500.0,
                    help="the device's copy bandwidth in GB/s, read plus written (default: the H200's, docs/PERFORMANCE.md)")
    ap.add_argument("--prefill", type=int, metavar="N",
                    help="profile the submission of an N-token prompt instead of a decode step")
    add_numerics_args(ap)
    args = ap.parse_args()
    device = NativeDevice()
    engine = asyncio.run(Engine.load(GGUFFile.open(args.model), device,
                                     ctx=max(args.ctx, args.pos + args.repeat + 2, (args.prefill or 0) + 1),
                                     numerics=numerics_from(args)))
    model = engine.backend
    if args.prefill:
        print(f"{device.adapter_name}; prefill of {args.prefill} tokens (chunks of {model.chunk})")
        return profile_prefill(device, model, args)
    device.write(model.state.step.buffer, pack_step(args.pos, 1))
    print(f"{device.adapter_name}; {model.dispatches_per_token} dispatches per token, KV length {args.pos + 1}")

    def step():
        asyncio.run(device.run(model.decode_schedule, model.state.tokens))

    def encode() -> tuple[float, float]:
        """What a step costs the host before its submit: recording, then finish() (seconds)."""
        return device.encode_cost(model.decode_schedule)

    print(f"a step, submitted and read back:  {timed(step, args.repeat):7.3f} ms")
    encode()   # warm-up, as timed() does
    runs = [encode() for _ in range(args.repeat)]
    record, finish = (1000 * sum(part) / len(runs) for part in zip(*runs))
    print(f"a step's host encoding:           {record + finish:7.3f} ms (recording {record:.3f}, finish {finish:.3f})")

    async def pipelined():
        async for _ in model.decode(0, args.pos, args.repeat):
            pass
    t = time.perf_counter()
    asyncio.run(pipelined())
    print(f"a step, pipelined greedy decode:  {(time.perf_counter() - t) / args.repeat * 1000:7.3f} ms")
    if "timestamp-query" not in device.features:
        print("(no timestamp-query on this adapter: no GPU times)")
        return
    print("\n".join(asyncio.run(profile.decode_report(model, args.pos, args.copy_gbps, args.top))))


if __name__ == "__main__":
    main()
