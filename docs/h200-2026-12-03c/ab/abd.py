"""Throwaway decode A/B of matvec variants in one process: per variant the pipelined greedy tok/s
(KV 512) and cera.gpu.profile.decode_report's step, matvec and family lines.
    python3 abd.py CLONE base,wg128,... [rounds]
Variants: workgroup sizes (threads per row kept), keyword overrides of matmul.matvec per family
(the downs, the merging output projection, the small projections), and edits of matvec.wgsl
(`unroll`, the prologue diagnostics `xfree` / `xnfree` / `allfree`, `warm`, `old`: another tree's
matvec.wgsl at .varA/old/). The diagnostics leave x wrong: time only."""
import asyncio, os, sys, time
from cera.engine import Engine
from cera.gguf_file import GGUFFile
from cera.native import NativeDevice
from cera.gpu import matmul, profile

orig = matmul.matvec
matmul.WORKGROUP = 1024                       # the cap (SwiftShader's 256), lifted for the A/B
matmul.STAGE_SCRATCH = 3 * 4 * 1024
POS = int(os.environ.get("POS", 512))

def sized(pick):   # pick(m, k, glu, merge, tpr) -> workgroup or None
    def mv(kernels, device, out, w, x, **kw):
        t = matmul._type(kw["wtype"])
        merge = not isinstance(x, matmul.Binding)
        bits = matmul.x_int_bits(device, t, kw["k"], kw["m"], kw.get("x_bits"), floats=merge or kw.get("norm") is not None)
        tpr = kw.get("tpr") or (matmul.x_int_threads_per_row(t, kw["k"], kw["m"], bits) if bits
                                else matmul.threads_per_row(t, kw["k"], kw["m"]))
        wg = pick(kw["m"], kw["k"], kw.get("w_up") is not None, merge, tpr)
        if isinstance(wg, dict):   # keyword overrides
            kw.update(wg)
        elif wg:
            kw.update(tpr=tpr, workgroup=max(wg, tpr))
        return orig(kernels, device, out, w, x, **kw)
    return mv

def small(m, k, glu, merge):
    return not glu and m <= 2048 and m < 100000
VARIANTS = {
    "base": None,
    "wg128": lambda m, k, g, mg, tpr: 128,
    "wg64": lambda m, k, g, mg, tpr: 64,
    "glu128": lambda m, k, g, mg, tpr: 128 if g else None,
    "glu64": lambda m, k, g, mg, tpr: 64 if g else None,
    "small128": lambda m, k, g, mg, tpr: 128 if not g and k < m * 8 and m < 4096 and k <= 2048 else None,
    "small64": lambda m, k, g, mg, tpr: 64 if not g and k < m * 8 and m < 4096 and k <= 2048 else None,
    "down128": lambda m, k, g, mg, tpr: 128 if k > 4 * m and m < 4096 else None,
    "head128": lambda m, k, g, mg, tpr: 128 if m > 40000 else None,
    "wg512": lambda m, k, g, mg, tpr: 512,
    "wg1024": lambda m, k, g, mg, tpr: 1024,
    "glu512": lambda m, k, g, mg, tpr: 512 if g else None,
    "glu1024": lambda m, k, g, mg, tpr: 1024 if g else None,
    "small512": lambda m, k, g, mg, tpr: 512 if not g and k < m * 8 and m < 4096 and k <= 2048 else None,
    "down512": lambda m, k, g, mg, tpr: 512 if k > 4 * m and m < 4096 else None,
    "down1024": lambda m, k, g, mg, tpr: 1024 if k > 4 * m and m < 4096 else None,
    "head512": lambda m, k, g, mg, tpr: 512 if m > 40000 else None,
}

def measure(path, reps=int(os.environ.get("REPS", 128))):
    dev = NativeDevice()
    model = asyncio.run(Engine.load(GGUFFile.open(path), dev, ctx=2048)).backend
    async def pipelined():
        async for _ in model.greedy(0, POS, reps):
            pass
    asyncio.run(pipelined())
    best = 1e9
    for _ in range(3):
        t = time.perf_counter(); asyncio.run(pipelined()); best = min(best, (time.perf_counter() - t) / reps)
    lines = asyncio.run(profile.decode_report(model, POS, 2500.0))
    return f"{1 / best:7.1f} tok/s", lines

from cera import kernels as K
from pathlib import Path
def edited(name, a, b):
    src = Path("shaders", name).read_text()
    assert a in src, a
    return {name: src.replace(a, b)}
FREE = edited("matvec.wgsl", "fn stage_x_int(lid: u32) {\n", "fn stage_x_int(lid: u32) {\n    if (K > 4096u) {\n        workgroupBarrier();\n        return;\n    }\n")
down = lambda kw: (lambda m, k, g, mg, tpr: kw if k > 4 * m and m < 4096 else None)
VARIANTS.update({
    "d24": down(dict(x_bits=24)),
    "d24t16": down(dict(x_bits=24, tpr=16)),
    "d24t64": down(dict(x_bits=24, tpr=64)),
    "d24free": down(dict(x_bits=24)),
    "d24freet16": down(dict(x_bits=24, tpr=16)),
    "d24freet64": down(dict(x_bits=24, tpr=64)),
})
SOURCES = {"d24free": FREE, "d24freet16": FREE, "d24freet64": FREE}
merge = lambda kw: (lambda m, k, g, mg, tpr: kw if mg else None)
smallp = lambda kw: (lambda m, k, g, mg, tpr: kw if not g and not mg and k < 4096 and m <= 2048 else None)
UNROLL = edited("matvec.wgsl", """        for (var n = 0u; n < LANE_ITEMS; n++) {
            if (n >= items) {
                break;
            }
            acc += item_sums(row_byte, lane + n * TPR);
        }""", """        for (var n = 0u; n < LANE_ITEMS; n++) {   // every lane's loads in flight at once
            let u = lane + n * TPR;
            acc += select(Sums(0.0), item_sums(row_byte, min(u, ITEMS_PER_ROW - 1u)), u < ITEMS_PER_ROW);
        }""")
def edits(name, *pairs):
    src = Path("shaders", name).read_text()
    for a, b in pairs:
        assert a in src, a
        src = src.replace(a, b)
    return {name: src}
X_FREE = ("fn stage_x_int(lid: u32) {\n", "fn stage_x_int(lid: u32) {\n    if (K == 1536u) {\n        workgroupBarrier();\n        return;\n    }\n")
N_FREE = ("    inv_rms = inverseSqrt(workgroup_sum(lid, sg_size, squares) / f32(K) + EPS);", "    inv_rms = 1.0 + squares * 1e-30;")
S_FREE = ("    for (var n = 0u; n < (UNITS_PER_ROW * 4u + WG - 1u) / WG; n++) {", "    for (var n = 0u; n < select(0u, 1u, K != 1536u) * (UNITS_PER_ROW * 4u + WG - 1u) / WG; n++) {")
SOURCES.update({"xfree": edits("matvec.wgsl", X_FREE), "xnfree": edits("matvec.wgsl", X_FREE, N_FREE),
                "allfree": edits("matvec.wgsl", X_FREE, N_FREE, S_FREE)})
VARIANTS.update({"xfree": lambda *a: None, "xnfree": lambda *a: None, "allfree": lambda *a: None})
WARM_A = ("    let r = (wid.x + wid.y * nwg.x) * ROWS + lid / TPR;\n", """    let r = (wid.x + wid.y * nwg.x) * ROWS + lid / TPR;
#ifdef X_INT
#ifdef Q4_K
    var warm = vec4<u32>(0u);
    if (r < M && lane < ITEMS_PER_ROW) {   // the lane's first item's quads, loaded before the prologue
        let quad = (r * ROW_BYTES + (lane / 8u) * BLOCK_BYTES) >> 4u;
        warm = wquad(0u, quad) ^ wquad(0u, quad + 1u + lane % 8u);
#ifdef GLU
        warm ^= wquad(1u, quad) ^ wquad(1u, quad + 1u + lane % 8u);
#endif
    }
#endif
#endif
""")
WARM_B = ("    let sums = row_sum(lid, sg_size, acc) * inv_rms;", """#ifdef X_INT
#ifdef Q4_K
    acc += select(Sums(0.0), Sums(1e-30), all(warm == vec4<u32>(0x12345u, 0x6789u, 0x2468u, 0x1357u)));
#endif
#endif
    let sums = row_sum(lid, sg_size, acc) * inv_rms;""")
SOURCES.update({"warm": edits("matvec.wgsl", WARM_A, WARM_B)})
VARIANTS.update({"warm": lambda *a: None})
OLD = Path(".varA/old/matvec.wgsl")   # another tree's matvec.wgsl, carried along for `old`
if OLD.exists():
    SOURCES.update({"old": {"matvec.wgsl": OLD.read_text()}})
    VARIANTS.update({"old": lambda *a: None})
SOURCES.update({"unroll": UNROLL, "unroll64": UNROLL, "unroll256": UNROLL})
VARIANTS.update({"unroll": lambda m, k, g, mg, tpr: None, "unroll64": down(dict(tpr=64)), "unroll256": down(dict(tpr=256))})
VARIANTS.update({
    "dt16": down(dict(tpr=16)), "dt32": down(dict(tpr=32)), "dt64": down(dict(tpr=64)),
    "ds": down(dict(stage=True)), "ds16": down(dict(stage=True, tpr=16)), "ds32": down(dict(stage=True, tpr=32)),
    "ds64": down(dict(stage=True, tpr=64)),
    "d2u": down(dict(two_units=True)), "d2u64": down(dict(two_units=True, tpr=64)), "dt256": down(dict(tpr=256)),
    "g2u": (lambda m, k, g, mg, tpr: dict(two_units=True, x_bits=0) if g else None),
    "mf32": merge(dict(x_bits=0)), "mf32t32": merge(dict(x_bits=0, tpr=32)), "mt8": merge(dict(tpr=8)),
    "mt32": merge(dict(tpr=32)),
    "sf32": smallp(dict(x_bits=0)), "st8": smallp(dict(tpr=8)), "st32": smallp(dict(tpr=32)),
})

if __name__ == "__main__":
    path, names = sys.argv[1], sys.argv[2].split(",")
    for r in range(int(sys.argv[3]) if len(sys.argv) > 3 else 1):
        for name in names:
            matmul.matvec = sized(VARIANTS[name]) if VARIANTS[name] else orig
            K._sources.clear()
            K._sources.update(SOURCES.get(name, {}))
            try:
                head, lines = measure(path)
            except Exception as e:
                print(f"== {name}: failed: {type(e).__name__}: {e}", flush=True); continue
            keep = [l for l in lines if "one pass" in l or l.startswith("matvecs") or (" GB/s " in l and "matvec" in l)]
            print(f"== {name} round {r}: {head}")
            print("\n".join(keep), flush=True)
