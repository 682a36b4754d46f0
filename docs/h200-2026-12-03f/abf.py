"""Throwaway prefill A/B of the f32 tiles' register blocks in one process: per variant a
512-token prompt's wall time (best of 6) and the prefill profile.
    python3 .varA/abf.py CLONE base,g48,... [rounds]"""
import asyncio, os, sys, time
from cera.engine import Engine
from cera.gguf_file import GGUFFile
from cera.native import NativeDevice
from cera.gpu import batched, profile
from cera.gpu.batched import MatmulTiles as MT

from pathlib import Path
from cera import kernels
MM = (Path(__file__).resolve().parents[1] / "shaders/matmul.wgsl").read_text()
STAGE = "        stage(lid, fetched, m0, slice);\n"
FETCH = "            fetched = fetch(lid, m0, t0, n_tokens, slice + 1u);   // in flight during the FMAs below\n"
LOOP = "        for (var kk = 0u; kk < BK; kk++) {\n"
NOSTAGE = MM.replace(STAGE, "        if (slice == 0u) { stage(lid, fetched, m0, slice); }\n").replace(FETCH, "")
NOLOOP = MM.replace(LOOP, "        for (var kk = 0u; kk < 1u; kk++) {\n")
OLD = {n: (Path(__file__).parent / f).read_text() for n, f in (
    ("matmul.wgsl", "matmul_old.wgsl"), ("matmul_io.wgsl", "matmul_io_old.wgsl"), ("matmul_int.wgsl", "matmul_int_old.wgsl"))}
SPLIT = dict(SPLIT_MAX=batched.SPLIT_MAX, SPLIT_MIN_K=batched.SPLIT_MIN_K, SPLIT_WORKGROUPS=batched.SPLIT_WORKGROUPS)
BASE = dict(glu=list(batched._GLU_TILES), sb=list(batched._SUPERBLOCK_TILES), mw=batched.MIN_WORKGROUPS)
VARIANTS = {
    "base": {}, "old": dict(src=OLD, split=dict(SPLIT_MAX=1)), "g16": dict(glu=[MT(64, 64, 16, 4, 4)]),
    "n1": dict(split=dict(SPLIT_MAX=1)), "s2": dict(split=dict(SPLIT_MAX=2)), "s4": dict(split=dict(SPLIT_MAX=4)),
    "s8": dict(split=dict(SPLIT_MAX=8, SPLIT_MIN_K=1024, SPLIT_WORKGROUPS=3072)), "s4w": dict(split=dict(SPLIT_WORKGROUPS=3072)),
    "s4all": dict(split=dict(SPLIT_MIN_K=384)), "s2all": dict(split=dict(SPLIT_MIN_K=768, SPLIT_MAX=2)),
    "stest": dict(split=dict(SPLIT_MIN_K=128)),
    "x8old": dict(src=OLD, split=dict(SPLIT_MAX=1), int8=True), "x8n1": dict(split=dict(SPLIT_MAX=1), int8=True),
    "x8": dict(int8=True), "x8s2": dict(split=dict(SPLIT_MAX=2), int8=True),
    "x8s4w": dict(split=dict(SPLIT_WORKGROUPS=3072), int8=True),
    "g48k16n": dict(glu=[MT(64, 128, 16, 4, 8)]), "nostage": dict(src={"matmul.wgsl": NOSTAGE}), "noloop": dict(src={"matmul.wgsl": NOLOOP}),
    "g48nostage": dict(glu=[MT(64, 128, 32, 4, 8)], src={"matmul.wgsl": NOSTAGE}),
    "d48nostage": dict(sb=[MT(64, 128, 32, 4, 8)], mw=1, src={"matmul.wgsl": NOSTAGE}),
    "g48": dict(glu=[MT(64, 128, 32, 4, 8)]), "g84": dict(glu=[MT(128, 64, 32, 8, 4)]),
    "g48k16": dict(glu=[MT(64, 128, 16, 4, 8)]), "g84k16": dict(glu=[MT(128, 64, 16, 8, 4)]),
    "d84": dict(sb=[MT(128, 64, 32, 8, 4)], mw=1), "d48": dict(sb=[MT(64, 128, 32, 4, 8)], mw=1),
    "d88": dict(sb=[MT(128, 128, 32, 8, 8)], mw=1), "d88k16": dict(sb=[MT(128, 128, 16, 8, 8)], mw=1),
    "d88s": dict(sb=[MT(64, 64, 32, 8, 8)], mw=1), "d84t32": dict(sb=[MT(128, 32, 32, 8, 4)], mw=1),
}

def measure(path, int8=False, n=int(os.environ.get("N", 512))):
    from cera.gpu.numerics import Numerics
    dev = NativeDevice()
    model = asyncio.run(Engine.load(GGUFFile.open(path), dev, ctx=2048, numerics=Numerics(int8=int8))).backend
    tokens = list(range(1, n + 1))
    best = 1e9
    for _ in range(6):
        model.reset()
        t = time.perf_counter(); asyncio.run(model.forward(tokens, 0)); best = min(best, time.perf_counter() - t)
    lines = asyncio.run(profile.prefill_report(model, tokens, top=9))
    return f"{n / best:8.0f} tok/s wall {best * 1e3:6.2f} ms", lines

if __name__ == "__main__":
    path, names = sys.argv[1], sys.argv[2].split(",")
    for r in range(int(sys.argv[3]) if len(sys.argv) > 3 else 1):
        for name in names:
            v = {**BASE, **VARIANTS[name]}
            batched._GLU_TILES = v["glu"] + BASE["glu"]
            batched._SUPERBLOCK_TILES = v["sb"] + BASE["sb"]
            batched.MIN_WORKGROUPS = v["mw"]
            kernels._sources.clear(); kernels._sources.update(v.get("src", {}))
            for attr, value in {**SPLIT, **v.get("split", {})}.items():
                setattr(batched, attr, value)
            try:
                head, lines = measure(path, v.get("int8", False))
            except Exception as e:
                print(f"== {name}: failed: {type(e).__name__}: {e}", flush=True); continue
            print(f"== {name} round {r}: {head}")
            print("\n".join(lines), flush=True)
