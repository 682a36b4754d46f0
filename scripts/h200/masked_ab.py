"""A/B of constrained decode's structure on one GPU: tokens/s of 128 decode steps after a 512-token
prompt for (a) greedy, chained; (b) a mask of every token from a trivial matcher (the structure's
cost alone: two submissions and a readback a token); (c) the same with the pass ahead off (GpuModel._masked: as for a model with conv states);
(d) llguidance's JSON schema. Usage: python masked_ab.py MODEL.gguf [schema.json]"""
import asyncio
import json
import sys
import time
from dataclasses import replace

import numpy as np

from cera.constrain import Constraint
from cera.engine import Engine
from cera.gguf_file import GGUFFile
from cera.native import NativeDevice
from cera.sampling import Sampler


class Everything:
    def __init__(self, vocab):
        self.words = np.full(-(-vocab // 32), 0xFFFFFFFF, np.uint32)

    def matcher(self, constraint):
        return self

    def mask(self):
        return self.words

    def advance(self, token):
        pass


MASK_TIMES = []


def timed(matcher):
    """Record the host time of each mask() call of a matcher."""
    mask = matcher.mask

    def timed_mask():
        t0 = time.perf_counter()
        words = mask()
        MASK_TIMES.append(time.perf_counter() - t0)
        return words
    matcher.mask = timed_mask
    return matcher


class Timed:
    def __init__(self, grammars):
        self.grammars = grammars

    def matcher(self, constraint):
        return timed(self.grammars.matcher(constraint))


async def main(path, schema):
    engine = await Engine.load(GGUFFile.open(path), NativeDevice(), ctx=1024)
    ids = np.random.default_rng(0).integers(0, engine.cfg.vocab_size, 512).tolist()
    llg = engine.grammars
    constraint = Constraint.json_schema(schema)

    async def run(label, sampler, grammars=llg, ahead=True):
        engine.grammars = grammars
        engine.backend.chain = chain if ahead else replace(chain, conv={"off": None})   # as a model with conv states
        runs = []
        for _ in range(4):
            engine.reset()
            MASK_TIMES.clear()
            r = await engine.generate(ids, 128, stop_at_eos=False, sampler=sampler)
            runs.append(r.decode_tokens_per_s)
        best = max(runs)
        masks = f"mask {1e6 * np.mean(MASK_TIMES):.0f} us mean, {1e6 * np.max(MASK_TIMES):.0f} max" if MASK_TIMES else ""
        engine.backend.chain = chain
        print(f"{label:40s} {best:8.1f} tok/s  (runs {', '.join(f'{x:.0f}' for x in runs)}; {len(r.tokens)} tokens, "
              f"{r.stop_reason}) {masks}", flush=True)

    chain = engine.backend.chain
    await run("greedy, chained", Sampler())
    await run("every token allowed, pass ahead", Sampler(constraint=constraint), Everything(engine.cfg.vocab_size))
    await run("every token allowed, no pass ahead", Sampler(constraint=constraint), Everything(engine.cfg.vocab_size),
              ahead=False)
    for _ in range(2):
        await run("json schema (llguidance), pass ahead", Sampler(constraint=constraint), Timed(llg))
        await run("json schema (llguidance), no pass ahead", Sampler(constraint=constraint), Timed(llg), ahead=False)
        await run("greedy, chained", Sampler())


asyncio.run(main(sys.argv[1], json.load(open(sys.argv[2])) if len(sys.argv) > 2 else {"type": "string"}))
