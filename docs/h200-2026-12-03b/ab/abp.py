"""Throwaway prefill A/B of matmul tilings in one process: per variant, a 512-token prompt's wall
time (best of 5) and each family's GPU time (cera.gpu.profile.prefill_report).
    python3 .varA/abp.py CLONE base,sb32,... [rounds]"""
import asyncio, sys, time
from cera.engine import Engine
from cera.gguf_file import GGUFFile
from cera.native import NativeDevice
from cera.gpu import batched, profile
from cera.gpu.batched import MatmulTiles as MT

BASE = {n: getattr(batched, n) for n in ("_MATMUL_TILES", "_SUPERBLOCK_TILES", "_GLU_TILES", "MIN_WORKGROUPS")}
SB = BASE["_SUPERBLOCK_TILES"]
VARIANTS = {
    "base": {},
    "sb32": dict(_SUPERBLOCK_TILES=SB + [MT(32, 32, 32, 4, 4)], MIN_WORKGROUPS=600),
    "sbt16": dict(_SUPERBLOCK_TILES=SB + [MT(64, 16, 32, 4, 4)], MIN_WORKGROUPS=600),
    "sbbk64": dict(_SUPERBLOCK_TILES=[MT(64, 32, 64, 4, 4)] + SB),
    "glubk64": dict(_GLU_TILES=[MT(64, 64, 64, 4, 4)] + BASE["_GLU_TILES"]),
    "glut32": dict(_GLU_TILES=[MT(64, 32, 32, 4, 4)] + BASE["_GLU_TILES"]),
    "sb128": dict(_SUPERBLOCK_TILES=[MT(128, 32, 32, 8, 4)] + SB),
}

def measure(path, n=int(__import__("os").environ.get("N", 512))):
    dev = NativeDevice()
    model = asyncio.run(Engine.load(GGUFFile.open(path), dev, ctx=2048)).backend
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
            for k, v in {**BASE, **VARIANTS[name]}.items():
                setattr(batched, k, v)
            try:
                head, lines = measure(path)
            except Exception as e:
                print(f"== {name}: failed: {type(e).__name__}: {e}"); continue
            print(f"== {name} round {r}: {head}")
            print("\n".join(lines), flush=True)
