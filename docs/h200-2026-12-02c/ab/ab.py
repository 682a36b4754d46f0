"""Throwaway A/B of decode variants in one process: each variant patches shader sources and/or
builder knobs, loads the model afresh, and reports the step's GPU time in one pass, pipelined
greedy tok/s, and per-family marginal GPU time. Variants alternate over rounds."""
import asyncio, collections, sys, time, os
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
import numpy as np
import profile_decode as pd
from cera import kernels as K
from cera.engine import Engine
from cera.gguf_file import GGUFFile
from cera.gpu import matmul, layers
from cera.gpu.state import pack_step
from cera.native import NativeDevice

HERE = os.path.dirname(__file__)
orig_matvec = matmul.matvec
SERIAL_KEYS, SPLIT = layers.ATTENTION_SERIAL_KEYS, layers.ATTENTION_SPLIT   # the engine's own

def tpr_rule(budget, pairs):
    # matmul.threads_per_row's rule with its thread budget and units (pairs: two a thread) as inputs
    def rule(wtype, k, m, workgroup=matmul.WORKGROUP):
        units = matmul.units_per_row(wtype, k) // (2 if pairs else 1)
        tpr = 16 if matmul.GGML_QUANT_SIZES[matmul.T(wtype)][0] == 1 else 4
        while tpr < workgroup and tpr * 2 * m <= budget and tpr * 2 <= units:
            tpr *= 2
        return tpr
    return rule

def knobbed(pairs, tpr_of, stage=None):
    def mv(kernels, device, out, w, x, **kw):
        if tpr_of is not None:
            t = tpr_of(kw["m"], kw["k"], not isinstance(x, matmul.Binding), kw.get("w_up") is not None)
            if t:
                kw["tpr"] = t
        kw["two_units"] = pairs
        if stage is not None and isinstance(x, matmul.Binding):
            kw["stage"] = stage
        return orig_matvec(kernels, device, out, w, x, **kw)
    return mv

def variant(name, src=None, pairs=False, budget=1 << 19, serial=None, split=None, tpr_of=None, stage=None):
    def apply():
        K._sources.clear()
        for k, v in (src or {}).items():
            K._sources[k] = open(os.path.join(HERE, v)).read()
        matmul.threads_per_row = tpr_rule(budget, pairs)
        matmul.matvec = knobbed(pairs, tpr_of, stage)
        layers.ATTENTION_SERIAL_KEYS = serial or SERIAL_KEYS
        sp = split or SPLIT
        layers.attention_scratch_bytes.__kwdefaults__["split"] = sp
        layers.attention_partials.__kwdefaults__["split"] = sp
    return name, apply

def measure(path, reps=int(os.environ.get("REPS", 120))):
    dev = NativeDevice()
    eng = asyncio.run(Engine.load(GGUFFile.open(path), dev, ctx=2048))
    model = eng.backend
    pos = 512
    async def pipelined():
        async for _ in model.greedy(0, pos, reps):
            pass
    asyncio.run(pipelined())
    t = time.perf_counter(); asyncio.run(pipelined()); wall = (time.perf_counter() - t) / reps
    dev.write(model.state.step.buffer, pack_step(pos, 1))
    steps = list(model.decode_plan.steps)
    timer = pd.Timer(dev, max(len(steps) * 2, 64))
    whole = timer.one_pass(steps, repeat=9)
    fam = collections.Counter()
    for name in sorted({pd.family(s) for s in steps}):
        if not name.startswith(("matvec", "attention")):
            continue
        doubled = [d for s in steps for d in ((s, s) if pd.family(s) == name else (s,))]
        fam[name] = (timer.one_pass(doubled, repeat=7) - whole) / 1e3
    return 1 / wall, whole / 1e6, fam

OLD = {"matvec.wgsl": "matvec_old.wgsl", "attention.wgsl": "attention_old.wgsl", "attention_merge.wgsl": "merge_old.wgsl"}
VARIANTS = dict([
    variant("old", OLD),
    variant("base"),
    variant("attn", {"attention_merge.wgsl": "merge_old.wgsl"}),
    variant("cheap", {"quant.wgsl": "quant_cheap.wgsl"}),
    variant("nostage", stage=False),
    variant("base-s8", serial=8),
    variant("q6al", {"quant.wgsl": "quant_q6al.wgsl"}),
])

if __name__ == "__main__":
    path, names, rounds = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]) if len(sys.argv) > 3 else 2
    results = collections.defaultdict(list)
    for r in range(rounds):
        for n in names:
            VARIANTS[n]()
            tps, gpu, fam = measure(path)
            results[n].append((tps, gpu, fam))
            print(f"round {r} {n:14s} {tps:7.1f} tok/s  step GPU {gpu:.3f} ms  " +
                  "  ".join(f"{k.replace('matvec ', '')}={v:.1f}" for k, v in sorted(fam.items())), flush=True)
    print("summary (median over rounds):")
    for n in names:
        tps = np.median([x[0] for x in results[n]]); gpu = np.median([x[1] for x in results[n]])
        print(f"  {n:14s} {tps:7.1f} tok/s  GPU {gpu:.3f} ms")
