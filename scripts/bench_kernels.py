#!/usr/bin/env python3
"""Micro-benchmark of the weight kernels on whatever WebGPU adapter is present.

Times the decode matvec (1 row, cera.gpu.matvec) and the prefill matmul (--rows rows,
cera.gpu.matmul) for every weight matrix of a layer and the LM head, plus the prefill
attention and decode attention (one row over --depth cached positions of an f16 cache), at the
real shapes and weight types of:

  smollm2   SmolLM2-135M Q4_1: hidden 576, ff 1536, 9/3 heads of 64, vocab 49152 (Q8_0 head)
  qwen2.5   Qwen2.5-1.5B Q4_K_M: hidden 1536, ff 8960, 12/2 heads of 128, vocab 151936
            (Q4_K; ffn_down and the LM head Q6_K)
  llama-3.1-8b, qwen2.5-7b, mistral-7b
            the shapes of scripts/shape_clone.py's SHAPES in Q4_K_M: q|k|v stacked as the plans
            stack them (Q4_K, or q|k with a Q6_K v), ffn_down in Q4_K and Q6_K (Q4_K_M alternates
            them), the LM head Q6_K
  tiny      a few small matrices: the script's own test (tests/test_bench_kernels.py)

Weights are random valid blocks (tests/quantdata.py): timing does not depend on values.
Each kernel runs back to back in one submission, repeated until --min-time seconds pass (0:
one run after the warm-up); the time per run is the wall time divided by the repeats (one
4-byte readback closes each submission). Prints ms, GB/s (weights + activations read and
written once) and GFLOP/s. Where a model's decode reads x's integers from a record
(cera.gpu.matvec.uses_record: the 7-8B shapes), so do its matvecs here, the record made once
before the timing, as the plan makes it once per token ("rec" in the configuration). The builders' knobs are cera.gpu.spec.Tuning's fields, each an option of the same name: --tpr,
--rpt, --workgroup, --subgroups, --x-bits (the decode matvec), --tiles (the prefill matmul) and
--heads (decode attention, beside its --split); left
out, the builder's rule chooses. The prefill matmul runs as each of --variants (f32; f16: f16
tiles, where the adapter has shader-f16); with --tiles sweep, over a grid of tile shapes and K
slices per variant, then a table per matrix (weight type and shape) of GFLOP/s, tiling by
variant, to choose the defaults in cera.gpu.matmul from.

    python scripts/bench_kernels.py                        # both models, 512-row prefill
    python scripts/bench_kernels.py --model smollm2 --rows 128 --min-time 0.5
    python scripts/bench_kernels.py --only matmul --tiles 64x64x32x4x4
    python scripts/bench_kernels.py --only matmul --tiles sweep     # choose the tile tables, f32 and f16
    python scripts/bench_kernels.py --only matmul --variants f16    # the f16 variant only
    python scripts/bench_kernels.py --model qwen2.5 --wtype IQ2_S   # the same shapes, another type
    python scripts/bench_kernels.py --only matvec --sweep           # every matvec reduction, TPR, workgroup
    python scripts/bench_kernels.py --model qwen2.5 --only matvec --x-bits 0,8,24
    python scripts/bench_kernels.py --model llama-3.1-8b --only decode --heads 1,2,4 --split 64,128

A matvec sweep (--sweep, or lists given to --subgroups, --tpr, --rpt, --workgroup, --x-bits) times the
builder's choice, then every combination, and ends each model with a table: per matrix the
builder's configuration and the fastest one. A combination the builder refuses for a matrix
(integer x for a type without it) is left out there, saying so.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, replace
from itertools import product
from pathlib import Path

import numpy as np
from gguf.constants import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantdata import padded, random_rows  # noqa: E402
from shape_clone import SHAPES, Shape  # noqa: E402

from cera.device import Binding  # noqa: E402
from cera.errors import InvalidArgument, Unsupported  # noqa: E402
from cera.gpu import attention, matmul, matvec  # noqa: E402
from cera.gpu.spec import Projection, Tuning  # noqa: E402
from cera.gpu.state import STEP_BYTES, pack_step  # noqa: E402
from cera.kernels import Kernels  # noqa: E402


@dataclass(frozen=True)
class Matrix:
    name: str
    wtype: T
    m: int        # output rows
    k: int        # input length
    glu: bool = False   # gate and up of this shape, fused (SwiGLU)


@dataclass(frozen=True)
class Model:
    name: str
    matrices: tuple[Matrix, ...]
    n_heads: int
    n_kv_heads: int
    head_dim: int


MODELS = {
    "smollm2": Model("SmolLM2-135M Q4_1", (
        Matrix("attn_q", T.Q4_1, 576, 576), Matrix("attn_k", T.Q4_1, 192, 576),
        Matrix("attn_v", T.Q4_1, 192, 576), Matrix("attn_output", T.Q4_1, 576, 576),
        Matrix("ffn_gate+up", T.Q4_1, 1536, 576, glu=True), Matrix("ffn_down", T.Q4_1, 576, 1536),
        Matrix("lm_head", T.Q8_0, 49152, 576)), n_heads=9, n_kv_heads=3, head_dim=64),
    "qwen2.5": Model("Qwen2.5-1.5B Q4_K_M", (
        Matrix("attn_q", T.Q4_K, 1536, 1536), Matrix("attn_k", T.Q4_K, 256, 1536),
        Matrix("attn_v", T.Q6_K, 256, 1536), Matrix("attn_output", T.Q4_K, 1536, 1536),
        Matrix("ffn_gate+up", T.Q4_K, 8960, 1536, glu=True), Matrix("ffn_down", T.Q6_K, 1536, 8960),
        Matrix("lm_head", T.Q6_K, 151936, 1536)), n_heads=12, n_kv_heads=2, head_dim=128),
    "tiny": Model("tiny", (
        Matrix("attn_q", T.Q4_K, 96, 256), Matrix("ffn_gate+up", T.Q4_0, 40, 64, glu=True)),
        n_heads=2, n_kv_heads=1, head_dim=32),
}


def q4_k_m_layers(s: Shape) -> Model:
    """A 7-8B Q4_K_M model's matrices (shape_clone.SHAPES): q|k|v stacked as the plans stack them
    (all Q4_K, or q|k beside a Q6_K v), ffn_down in both types Q4_K_M alternates, the LM head Q6_K."""
    q, kv, h = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim, s.hidden
    return Model(f"{s.title} Q4_K_M", (
        Matrix("attn_qkv", T.Q4_K, q + 2 * kv, h), Matrix("attn_qk", T.Q4_K, q + kv, h), Matrix("attn_v", T.Q6_K, kv, h),
        Matrix("attn_output", T.Q4_K, h, q), Matrix("ffn_gate+up", T.Q4_K, s.ff, h, glu=True),
        Matrix("ffn_down", T.Q4_K, h, s.ff), Matrix("ffn_down_q6", T.Q6_K, h, s.ff),
        Matrix("lm_head", T.Q6_K, s.vocab, h)), s.n_heads, s.n_kv_heads, s.head_dim)


MODELS.update({name: q4_k_m_layers(shape) for name, shape in SHAPES.items()})
EVERY = ("smollm2", "qwen2.5")   # --model all


def describe(device, mat: Matrix, tune: Tuning, record: bool = False) -> str:
    """A matvec's knobs as the builder resolves them for `mat` (x's integers in a record with
    `record`), e.g. "sg tpr 32 wg 256 x24"."""
    t = matvec.tuned(device, Projection(None, mat.wtype, mat.k, mat.m), tune, record=record)
    return f"{'sg' if t.subgroups else 'wg'} tpr {t.tpr} wg {t.workgroup}" + (f" x{t.x_bits}" if t.x_bits else "") \
        + (f" rpt {t.rpt}" if t.rpt > 1 else "") + (" rec" if record and t.x_bits else "")


@dataclass
class Timing:
    matrix: Matrix
    config: str      # describe()
    seconds: float


class Bench:
    def __init__(self, device, min_time: float):
        self.device, self.min_time = device, min_time
        self.kernels = Kernels(device)
        self.sync = device.buffer(4, "sync")

    def buffer(self, data: bytes | np.ndarray, label: str):
        data = padded(data)
        buf = self.device.buffer(len(data), label)
        self.device.write(buf, data)
        return buf

    def zeros(self, nbytes: int, label: str):
        return self.buffer(bytes(nbytes), label)

    def weights(self, wtype: T, m: int, k: int, rng) -> tuple[object, int]:
        """A valid raw (m, k) matrix: 64 random rows repeated."""
        raw, _ = random_rows(wtype, min(m, 64), k, rng)
        raw = np.tile(raw, (-(-m // raw.shape[0]), 1))[:m]
        return self.buffer(np.ascontiguousarray(raw), "w"), raw.nbytes

    def run(self, dispatches) -> None:
        """Run `dispatches` once, to their end."""
        asyncio.run(self.device.run(self.device.schedule(list(dispatches)), Binding(self.sync, 0, 4)))

    def time(self, dispatches) -> float:
        """Seconds per run of `dispatches`."""
        dev = self.device
        read = Binding(self.sync, 0, 4)
        once = dev.schedule(list(dispatches))
        submit = lambda schedule: asyncio.run(dev.run(schedule, read))
        submit(once)   # compile, warm up
        start = time.perf_counter()
        submit(once)
        single = time.perf_counter() - start
        if single >= self.min_time / 2:
            return single
        reps = max(1, min(1000, int(self.min_time / max(single, 1e-6))))
        schedule = dev.schedule(list(dispatches) * reps)
        start = time.perf_counter()
        submit(schedule)
        return (time.perf_counter() - start) / reps


def report(what: str, seconds: float, nbytes: int, flops: int, note: str = "") -> None:
    print(f"  {what:<46} {seconds * 1e3:9.3f} ms {nbytes / seconds / 1e9:9.2f} GB/s "
          f"{flops / seconds / 1e9:9.2f} GFLOP/s  {note}".rstrip(), flush=True)


def bench_matrix(bench: Bench, mat: Matrix, rows: int, only: set, tiles, configs: list[Tuning], halves,
                 rng, record: bool = False) -> list[Timing]:
    """Time the kernels of `only` for one matrix; return the matvec timings (builder's first).
    With `record`, the matvecs that take integer x read it from a record of x made before the
    timing (matmul.quantize_x), as decode's do in a model whose x has records
    (cera.gpu.matvec.uses_record)."""
    dev = bench.device
    w, wbytes = bench.weights(mat.wtype, mat.m, mat.k, rng)
    w_up = bench.weights(mat.wtype, mat.m, mat.k, rng)[0] if mat.glu else None
    p = Projection(Binding(w), mat.wtype, mat.k, mat.m, w_up=Binding(w_up) if mat.glu else None)
    n_mats = 2 if mat.glu else 1
    x = bench.buffer(rng.standard_normal((rows, mat.k)).astype(np.float32), "x")
    out = bench.zeros(4 * rows * mat.m, "out")
    step = dev.buffer(STEP_BYTES, "step", uniform=True)
    tag = f"{mat.name} {mat.wtype.name} {mat.m}x{mat.k}"
    timings = []
    if "matvec" in only:
        dev.write(step, pack_step(0, 1))
        ints = None
        if record:   # x's record, made once here as the plan makes it once per token (not timed)
            bits = max(matvec.X_BITS)
            ints = Binding(bench.zeros(4 * matvec.record_words(mat.k, bits), "x record"))
            bench.run([matmul.quantize_x(bench.kernels, ints, Binding(x), Binding(step), k=mat.k, max_rows=1,
                                         **matvec.record_layout(bits))])
        for tune in configs:
            try:
                config = describe(dev, mat, tune, record)
                dispatches = matvec.matvec_tiled(bench.kernels, dev, Binding(out), p, Binding(x), x_ints=ints, tune=tune)
            except (InvalidArgument, Unsupported) as e:
                print(f"  matvec {tag}: {e}; left out")
                continue
            if any(t.config == config for t in timings):
                continue   # the builder's choice again
            seconds = bench.time(dispatches)
            timings.append(Timing(mat, config, seconds))
            report(f"matvec {tag}", seconds, n_mats * wbytes + 4 * (mat.k + mat.m), 2 * n_mats * mat.m * mat.k,
                   config + (" (builder)" if tune == Tuning() else ""))
    if "matmul" in only:
        dev.write(step, pack_step(0, rows))
        flops = 2 * n_mats * rows * mat.m * mat.k
        table = {}   # (tiling name, half) -> GFLOP/s
        for half in halves:
            variant = "f16" if half else "f32"
            for t in tilings(tiles, dev.limits, rows, mat, half):
                dispatches = matmul.matmul_tiled(bench.kernels, dev, out, p, x, step, max_rows=rows, half=half,
                                                 tune=Tuning(tiles=t))
                name = "builder: " if t is None else ""
                t = t or matmul.matmul_tiles(dev.limits, rows, mat.glu, mat.m, half, mat.wtype)
                name += tiles_name(t)
                seconds = bench.time(dispatches)
                table[name, half] = flops / seconds / 1e9
                report(f"matmul {rows} rows {tag} {variant}", seconds, n_mats * wbytes + 4 * rows * (mat.k + mat.m),
                       flops, f"tiles {tiles_name(t)}, {t.storage(mat.glu, half)} B"
                       + (f", {len(dispatches)} dispatches" if len(dispatches) > 1 else ""))
        if tiles == "sweep":
            print_table(f"{tag}{' glu' if mat.glu else ''}, {rows} rows", table, halves)
    return timings


def int_list(text: str) -> list[int]:
    """The integers of a comma-separated option ("" -> [])."""
    return [int(v) for v in text.split(",") if v]


def matvec_configs(device, subgroups: str, tprs: str, rpts: str, workgroups: str, x_bits: str,
                   sweep: bool) -> list[Tuning]:
    """The builder's choice, then every combination of the given knobs (--sweep: all of them
    but x's bits), less those with more threads per row than a workgroup has."""
    def ints(text: str, everything: list[int]) -> list[int]:
        return int_list(text) or (everything if sweep else [])
    has = "subgroups" in device.features
    named = {"on": True, "off": False}
    chosen = [named[r] for r in subgroups.split(",") if r] or ([True, False] if sweep and has else [None])
    tpr_list = ints(tprs, [4, 8, 16, 32, 64, 128, 256]) or [None]
    wg_list = ints(workgroups, [64, 128, 256]) or [None]
    bits_list = int_list(x_bits) or [None]
    rpt_list = int_list(rpts) or [None]
    combos = [Tuning(tpr=t, rpt=p, workgroup=g, subgroups=r, x_bits=b)
              for r, t, p, g, b in product(chosen, tpr_list, rpt_list, wg_list, bits_list)
              if not t or t <= (g or matvec.WORKGROUP)]
    return [Tuning()] + [c for c in combos if c != Tuning()]


def sweep_table(timings: list[Timing]) -> None:
    """Per matrix: the builder's configuration and time, the fastest and its time."""
    print(f"  {'matvec':<36} {'builder':<22} {'us':>8}   {'fastest':<22} {'us':>8} {'speedup':>8}")
    for mat in dict.fromkeys(t.matrix for t in timings):
        mine = [t for t in timings if t.matrix == mat]
        builder, best = mine[0], min(mine, key=lambda t: t.seconds)
        print(f"  {mat.name + ' ' + mat.wtype.name + f' {mat.m}x{mat.k}':<36} {builder.config:<22} "
              f"{builder.seconds * 1e6:8.1f}   {best.config:<22} {best.seconds * 1e6:8.1f} "
              f"{builder.seconds / best.seconds:7.2f}x")


def tiles_name(t) -> str:
    return f"{t.tile_m}x{t.tile_t}x{t.bk}x{t.rm}x{t.rt}"   # the --tiles syntax


def print_table(title: str, table: dict, halves: list) -> None:
    """GFLOP/s per tiling (rows) and variant (columns), and the best of each variant."""
    names = sorted({name for name, _ in table}, key=lambda n: (not n.startswith("builder"), n))
    variants = ["f16" if h else "f32" for h in halves]
    print(f"  == {title}: GFLOP/s")
    print(f"    {'tiling (TILE_MxTILE_TxBKxRMxRT)':<34}" + "".join(f"{v:>10}" for v in variants))
    for name in names:
        cells = [table.get((name, h)) for h in halves]
        print(f"    {name:<34}" + "".join(f"{c:10.1f}" if c is not None else f"{'-':>10}" for c in cells))
    best = {h: max(((g, n) for (n, hh), g in table.items() if hh == h), default=None) for h in halves}
    print("    best: " + ", ".join(f"{v} {b[0]:.1f} ({b[1]})" for v, b in zip(variants, best.values()) if b)
          + (f"; f16/f32 {best[True][0] / best[False][0]:.2f}x" if all(best.get(h) for h in (False, True)) else ""),
          flush=True)


SWEEP_BK = (16, 32, 64, 128)
SWEEP_SHAPES = {   # (tile_m, tile_t, rm, rt) beyond the builder's tables
    False: [(128, 64, 8, 8), (64, 128, 4, 8), (64, 32, 4, 4), (32, 64, 4, 4), (32, 32, 4, 4)],
    True: [(64, 64, 4, 8), (128, 64, 8, 8), (64, 64, 4, 4), (32, 32, 4, 4), (16, 64, 4, 4)],
}


def tilings(tiles, limits, rows: int, mat: Matrix, half: bool) -> list:
    """The matmul tilings to time: the builder's (None), a given one, or ("sweep") the
    builder's, then every tile shape of its tables (and SWEEP_SHAPES) with every bk of
    SWEEP_BK that fits this device's workgroup memory (f16 tiles: half the bytes)."""
    if tiles != "sweep":
        return [tiles]
    pool = (matmul._GLU_TILES + matmul._SMALL_GLU_TILES if mat.glu
            else matmul._MATMUL_TILES + matmul._SUPERBLOCK_TILES + matmul._SMALL_TILES)
    shapes = sorted({(t.tile_m, t.tile_t, t.rm, t.rt) for t in pool} | set(SWEEP_SHAPES[mat.glu]), reverse=True)
    grid = [matmul.MatmulTiles(tile_m=tm, tile_t=tt, bk=bk, rm=rm, rt=rt) for tm, tt, rm, rt in shapes
            for bk in SWEEP_BK]
    return [None] + [t for t in grid if t.storage(mat.glu, half) <= limits.max_compute_workgroup_storage_size
                     and t.invocations <= limits.max_compute_invocations_per_workgroup]


def bench_attention(bench: Bench, model: Model, rows: int, pos: int, rng) -> None:
    """Time the prefill attention of `rows` query rows at `pos` cached positions."""
    dev = bench.device
    hd, nh, nkv = model.head_dim, model.n_heads, model.n_kv_heads
    ctx = pos + rows
    q = bench.buffer(rng.standard_normal((rows, nh * hd)).astype(np.float32), "q")
    k_cache = bench.buffer(rng.standard_normal((ctx, nkv * hd)).astype(np.float32), "k_cache")
    v_cache = bench.buffer(rng.standard_normal((ctx, nkv * hd)).astype(np.float32), "v_cache")
    out = bench.zeros(4 * rows * nh * hd, "out")
    step = dev.buffer(STEP_BYTES, "step", uniform=True)
    dev.write(step, pack_step(pos, rows))
    d = attention.prefill_attention(bench.kernels, dev, out, q, k_cache, v_cache, step, head_dim=hd, n_heads=nh,
                                  n_kv_heads=nkv, max_rows=rows)
    seconds = bench.time([d])
    keys = sum(pos + t + 1 for t in range(rows))            # (row, key) pairs attended
    report(f"prefill attention {rows} rows at pos {pos} ({nh}/{nkv}x{hd})", seconds,
           4 * (2 * rows * nh * hd + 2 * ctx * nkv * hd), 4 * keys * nh * hd)


def bench_decode_attention(bench: Bench, model: Model, depth: int, split: int, heads: int | None, rng) -> None:
    """Time decode attention (cera.gpu.attention.attention: split-KV pass and combine, no fused
    RoPE) of one row over depth + 1 cached positions of an f16 cache, `heads` query heads a
    workgroup (None: the builder's) and `split` keys a workgroup. Bytes as the builder counts them."""
    dev = bench.device
    hd, nh, nkv = model.head_dim, model.n_heads, model.n_kv_heads
    slots = depth + 1
    caches = [bench.buffer(rng.standard_normal((slots, nkv * hd)).astype(np.float16), name)
              for name in ("k_cache", "v_cache")]
    q = bench.buffer(rng.standard_normal(nh * hd).astype(np.float32), "q")
    out = bench.zeros(4 * nh * hd, "out")
    step = dev.buffer(STEP_BYTES, "step", uniform=True)
    dev.write(step, pack_step(depth, 1))
    try:
        dispatches = attention.attention(bench.kernels, dev, out, q, *caches, step, head_dim=hd, n_heads=nh,
                                         n_kv_heads=nkv, max_ctx=slots, split=split, cache_types=("f16", "f16"),
                                         tune=Tuning(heads=heads))
    except (InvalidArgument, Unsupported) as e:
        print(f"  decode attention at depth {depth}, split {split}: {e}; left out")
        return
    seconds = bench.time(dispatches)
    hpw = nh // dispatches[0].groups[0]   # the first pass runs n_heads / heads-a-workgroup workgroups across
    report(f"decode attention at depth {depth} ({nh}/{nkv}x{hd} f16)", seconds,
           sum(d.reads + d.writes + d.reads_per_position * slots for d in dispatches), 4 * slots * nh * hd,
           f"heads {hpw} split {split}" + (" (builder)" if heads is None and split == attention.ATTENTION_SPLIT else ""))


def parse_tiles(text: str | None):
    if not text:
        return None
    if text == "sweep":
        return text
    tile_m, tile_t, bk, rm, rt = (int(v) for v in text.lower().split("x"))
    return matmul.MatmulTiles(tile_m=tile_m, tile_t=tile_t, bk=bk, rm=rm, rt=rt)


def main(argv=None, device=None) -> None:
    """The command line (argv: sys.argv's); device: the adapter's own (NativeDevice) unless given."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", choices=[*MODELS, "all"], default="all",
                    help=f"which model's shapes (all: {', '.join(EVERY)})")
    ap.add_argument("--rows", type=int, default=512, help="prefill chunk rows for matmul and attention")
    ap.add_argument("--pos", type=int, nargs="+", default=[0, 512],
                    help="positions of the prefill attention chunk (0: first chunk)")
    ap.add_argument("--only", default="matvec,matmul,attention,decode",
                    help="comma-separated kernels to time: matvec, matmul, attention (prefill), decode "
                         "(decode attention)")
    ap.add_argument("--depth", default="512,4096",
                    help="decode attention: cached positions before the row, comma-separated")
    ap.add_argument("--heads", default="", help="decode attention: query heads a workgroup, comma-separated "
                    "divisors of the GQA group (default: the builder's)")
    ap.add_argument("--split", default=str(attention.ATTENTION_SPLIT),
                    help="decode attention: keys a workgroup, comma-separated powers of two")
    ap.add_argument("--matrices", default="", help="comma-separated matrix names (default: all)")
    ap.add_argument("--tiles", default="", help="matmul tiling TILE_MxTILE_TxBKxRMxRT, or 'sweep' (the builder's pick, then every "
                         "candidate that fits); default: the builder's")
    ap.add_argument("--variants", default="f32,f16",
                    help="prefill matmul variants, comma-separated: f32, f16 (f16 tiles; skipped without shader-f16)")
    ap.add_argument("--wtype", default="", help="time every matrix as this weight type (e.g. IQ2_S) instead "
                    "of the model's")
    ap.add_argument("--tpr", default="", help="matvec threads per row, comma-separated (default: the builder's)")
    ap.add_argument("--rpt", default="", help="matvec rows per thread, comma-separated: 1, 2 (default: the builder's)")
    ap.add_argument("--workgroup", default="", help="matvec invocations per workgroup, comma-separated powers of two "
                    f"<= {matvec.WORKGROUP} (default: {matvec.WORKGROUP})")
    ap.add_argument("--subgroups", default="", help="matvec reductions, comma-separated: on (subgroup operations), "
                    "off (workgroup memory); default: on where the device has subgroups")
    ap.add_argument("--x-bits", default="", help="matvec x's bits, comma-separated: 0 (f32 x), 8 or 24 (integers per "
                    "256-element block; Q4_K, Q6_K); default: the builder's (f32 for these matvecs of a plain x)")
    ap.add_argument("--sweep", action="store_true", help="matvec: time every reduction the device has, TPR 4..256, "
                    "and workgroups 64, 128, 256 (a list given above replaces its part), "
                    "then print a table")
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds of repeats per measurement")
    args = ap.parse_args(argv)

    if device is None:
        from cera.native.device import NativeDevice
        device = NativeDevice()
    lim = device.limits
    print(f"adapter: {device.adapter_name}; workgroup storage {lim.max_compute_workgroup_storage_size} B, "
          f"invocations {lim.max_compute_invocations_per_workgroup}, binding {lim.max_storage_buffer_binding_size} B")
    tiles = parse_tiles(args.tiles)
    variants = args.variants.split(",")
    if not set(variants) <= {"f32", "f16"}:
        ap.error(f"--variants: f32 and/or f16, not {args.variants!r}")
    halves = [v == "f16" for v in variants if v == "f32" or "shader-f16" in device.features]
    if "f16" in args.variants and "shader-f16" not in device.features:
        print("no shader-f16 on this adapter: the f16 variant is skipped")
    if not set(filter(None, args.subgroups.split(","))) <= {"on", "off"}:
        ap.error(f"--subgroups: on and/or off, not {args.subgroups!r}")
    configs = matvec_configs(device, args.subgroups, args.tpr, args.rpt, args.workgroup, args.x_bits, args.sweep)
    bench, rng = Bench(device, args.min_time), np.random.default_rng(0)
    only = set(args.only.split(","))
    names = set(filter(None, args.matrices.split(",")))
    for key in EVERY if args.model == "all" else [args.model]:
        model = MODELS[key]
        print(f"{model.name}:")
        timings = []
        hidden = model.matrices[0].k   # attn_q's x
        for mat in model.matrices:
            if args.wtype:
                mat = replace(mat, wtype=T[args.wtype.upper()])
            if not names or mat.name in names:
                record = matvec.uses_record(device, hidden) and matvec.uses_record(device, mat.k)
                timings += bench_matrix(bench, mat, args.rows, only, tiles, configs, halves, rng, record)
        if len(configs) > 1 and timings:
            sweep_table(timings)
        if "attention" in only:
            at = attention.attention_tiles(lim, model.head_dim)
            print(f"  attention: {at.block_q} query rows x {at.block_kv} keys per tile, "
                  f"{at.invocations} invocations")
            for pos in args.pos:
                bench_attention(bench, model, args.rows, pos, rng)
        if "decode" in only:
            for depth, split, heads in product(int_list(args.depth), int_list(args.split), int_list(args.heads) or [None]):
                bench_decode_attention(bench, model, depth, split, heads, rng)


if __name__ == "__main__":
    main()
