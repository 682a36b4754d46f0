"""Throwaway prefill A/B of the integer matmul (CERA_PREFILL_X_BITS) and its tilings in one
process: per variant a 512-token prompt's wall time (best of 6) and the prefill profile.
    python3 .varA/abi.py CLONE f32,x16,x8,... [rounds]"""
import asyncio, sys, time
from pathlib import Path
from cera.engine import Engine
from cera.gguf_file import GGUFFile
from cera.native import NativeDevice
from cera import kernels
from cera.gpu import batched, plan, profile
from cera.gpu.batched import IntTiles as IT
from cera.gpu.numerics import Numerics

NOQ = """#include "common.wgsl"
#include "x_int_record.wgsl"
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> xi: array<u32>;
@group(0) @binding(2) var<uniform> step: Step;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    if (wid.y >= step.n_tokens || lid > 0u) { return; }
    xi[wid.y * X_STRIDE + X_STEPS + wid.x] = bitcast<u32>(x[wid.y * K / 4u + 64u * wid.x].x);
}
"""
# the kernels it compares (beside this script): the one before per-32 Q4_K scales, `git show
# 8796657:shaders/matmul_int.wgsl > matmul_int_old.wgsl`; and 7c09393's with each scale group's
# words of x loaded before its products (matmul_int_xw.wgsl: docs/h200-2026-12-03e/README.md)
OLD, XW = ((Path(__file__).parent / f).read_text() if (Path(__file__).parent / f).exists() else ""
           for f in ("matmul_int_old.wgsl", "matmul_int_xw.wgsl"))
BASE, GLU, FLUSH = list(batched._INT_TILES), list(batched._INT_GLU_TILES), plan.FLUSH_LAYERS
VARIANTS = {
    "f32": dict(on=False), "x8": dict(on=True),
    "x8glu64": dict(on=True, glu=[IT(64, 64, 64)]), "x8bk128": dict(on=True, tiles=[IT(64, 64, 128)]),
    "v32": dict(on=True, tiles=[IT(64, 64, 64), IT(32, 64, 64)]), "v32t32": dict(on=True, tiles=[IT(64, 64, 64), IT(32, 32, 128)]),
    "v32b": dict(on=True, tiles=[IT(64, 64, 64), IT(32, 64, 128)]),
    "g32x128": dict(on=True, glu=[IT(32, 128, 128)]), "g128x32": dict(on=True, glu=[IT(128, 32, 64)]),
    "g32x128b": dict(on=True, glu=[IT(32, 128, 64)]),
    "d128x32": dict(on=True, tiles=[IT(128, 32, 64)]), "d32x128": dict(on=True, tiles=[IT(32, 128, 64)]),
    "noq": dict(on=True, src={"quantize_x.wgsl": NOQ}),
    "x8old": dict(on=True, src={"matmul_int.wgsl": OLD}),
    "x8xw": dict(on=True, src={"matmul_int.wgsl": XW}),
    "x8nf": dict(on=True, flush=frozenset()), "f32nf": dict(on=False, flush=frozenset()),   # diagnostic: quantize_x does nothing (x wrong)
}

def measure(path, int8, n=int(__import__("os").environ.get("N", 512))):
    dev = NativeDevice()
    model = asyncio.run(Engine.load(GGUFFile.open(path), dev, ctx=2048, numerics=Numerics(int8=int8))).backend
    tokens = list(range(1, n + 1))
    best = 1e9
    for _ in range(6):
        model.reset()
        t = time.perf_counter(); asyncio.run(model.forward(tokens, 0)); best = min(best, time.perf_counter() - t)
    lines = asyncio.run(profile.prefill_report(model, tokens, top=10))
    return f"{n / best:8.0f} tok/s wall {best * 1e3:6.2f} ms", lines

if __name__ == "__main__":
    path, names = sys.argv[1], sys.argv[2].split(",")
    for r in range(int(sys.argv[3]) if len(sys.argv) > 3 else 1):
        for name in names:
            v = VARIANTS[name]
            kernels._sources.clear(); kernels._sources.update(v.get("src", {}))
            plan.FLUSH_LAYERS = v.get("flush", FLUSH)
            batched._INT_TILES, batched._INT_GLU_TILES = v.get("tiles", []) + BASE, v.get("glu", []) + GLU
            try:
                head, lines = measure(path, v["on"])
            except Exception as e:
                print(f"== {name}: failed: {type(e).__name__}: {e}", flush=True); continue
            print(f"== {name} round {r}: {head}")
            print("\n".join(lines), flush=True)
