"""What naga's bounds checks cost: `python -m cera bench`'s loop (a random 512-token prompt,
128 greedy tokens, EOS ignored, each run from engine.reset(), best of 3 after a warm-up) on a
NativeDevice whose kernels are compiled with and without them, in one process.

    python3 scripts/h200/bench_unchecked.py MODEL.gguf
Prints one JSON object per setting.
"""
import asyncio
import json
import sys

from cera.engine import Engine
from cera.gguf_file import GGUFFile
from cera.native import NativeDevice


async def bench(path: str, bounds_checks: bool) -> dict:
    engine = await Engine.load(GGUFFile.open(path), NativeDevice(bounds_checks=bounds_checks), ctx=2048)
    runs = await engine.bench(512, 128, 3)
    return {"model": path, "bounds_checks": bounds_checks,
            "prefill_tokens_per_s": round(max(r.prefill_tokens_per_s for r in runs), 2),
            "decode_tokens_per_s": round(max(r.decode_tokens_per_s for r in runs), 2)}


if __name__ == "__main__":
    for checks in (True, False):
        print(json.dumps(asyncio.run(bench(sys.argv[1], checks))), flush=True)
