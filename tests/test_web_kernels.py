"""The Pyodide host in headless Chromium (WebGPU on SwiftShader): the device the page makes,
kernels compiled from shaders/ and run on it against numpy, compile errors, subgroups, the
page's GPU times, and the loops Chromium's shader compiler guards."""
from __future__ import annotations

import base64

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from cera import ops
from cera.device import PACKED_DOT
from cera.gpu.quant import INT_TILE_TYPES
from cera.gpu.quant import WEIGHT_TYPES, X_INT_TYPES
from cera.gpu.numerics import CACHE_TYPES, cache_row_bytes
from gpu_util import assert_close
from quantdata import padded, random_rows
import chromium_shaders
from web_fixtures import python_in_worker


def test_page_is_ready_on_swiftshader_with_max_limits(engine_page):
    assert "swiftshader" in engine_page.evaluate("engine.info.adapter").lower()
    got = python_in_worker(engine_page, """
import json
from js import navigator
from cera.device import PACKED_DOT
from cera_web.session import sessions
dev = sessions[0].device
adapter = await navigator.gpu.requestAdapter()
json.dumps({"limits": dict(dev.limits.__dict__), "features": sorted(dev.features),
            "packed_dot": navigator.gpu.wgslLanguageFeatures.has(PACKED_DOT),
            "adapter": {k: getattr(adapter.limits, v) for k, v in {
                "max_storage_buffer_binding_size": "maxStorageBufferBindingSize",
                "max_compute_invocations_per_workgroup": "maxComputeInvocationsPerWorkgroup",
                "max_storage_buffers_per_shader_stage": "maxStorageBuffersPerShaderStage",
                "min_storage_buffer_offset_alignment": "minStorageBufferOffsetAlignment"}.items()}})
""")
    for field, value in got["adapter"].items():
        assert got["limits"][field] == value, field
    assert got["limits"]["max_compute_invocations_per_workgroup"] == 256   # SwiftShader
    assert "shader-f16" not in got["features"]
    assert got["packed_dot"] and PACKED_DOT in got["features"]   # WGSL's language feature, as gpu.js reads it


def test_kernel_from_shaders_runs_on_the_pyodide_device(engine_page):
    """rms_norm.wgsl through cera.kernels.Kernels on the browser device, checked with numpy;
    rows and width that are not multiples of the workgroup."""
    got = python_in_worker(engine_page, """
import json
import numpy as np
from cera.device import Binding, Copy, Dispatch
from cera.gpu.state import pack_step
from cera.kernels import Kernels
from cera_web.session import sessions
dev = sessions[0].device
N, ROWS, EPS = 300, 5, 1e-5
rng = np.random.default_rng(0)
x = rng.standard_normal((ROWS, N)).astype(np.float32)        # (rows, N)
w = rng.standard_normal(N).astype(np.float32)                # (N,)
kernel = Kernels(dev).get("rms_norm.wgsl", N=N, ROWS_PER_TOKEN=1, EPS=EPS, WG=64)
bx, bw, out = dev.buffer(x.nbytes, "x"), dev.buffer(w.nbytes, "w"), dev.buffer(x.nbytes, "out")
step = dev.buffer(16, "step", uniform=True)
dev.write(bx, x.tobytes()); dev.write(bw, w.tobytes()); dev.write(step, pack_step(0, ROWS))
row1 = dev.buffer(4 * N, "row1")
schedule = dev.schedule([Dispatch(kernel, dev.bind(kernel, [Binding(bx), Binding(bw), Binding(out), Binding(step)]),
                                  (1, ROWS, 1)),
                         Copy(out, 4 * N, row1, 0, 4 * N)])
calls0 = dev.calls().get("run", 0)
got = np.frombuffer(await dev.run(schedule, Binding(out, 0, x.nbytes)), np.float32).reshape(ROWS, N)
again = np.frombuffer(await dev.read(row1, 0, 4 * N), np.float32)
ref = x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w
json.dumps({"err": float(np.abs(got - ref).max()), "row1": bool(np.array_equal(again, got[1])),
            "runs": dev.calls()["run"] - calls0})
""")
    assert got["err"] < 1e-5
    assert got["row1"]
    assert got["runs"] == 2     # run() and read() are one JS call each


@pytest.mark.parametrize("cache", ["f32", "f16", "q8_0"])
def test_layer_kernels_on_the_pyodide_device(engine_page, cache):
    """rope (QK-norm, NEOX) into the cache, prefill attention over 7 rows, split-KV decode
    attention with RoPE fused for an 8th (its raw q | k | v in one buffer), and the output
    projection merging that attention's splits itself, the context shift's key re-rotation, and
    LFM2's short conv, through the browser host, against cera.ops computed here; the KV cache in
    f32, f16 (halves packed in u32 and rounded by integer operations: SwiftShader has no
    shader-f16) or q8_0 (its keys within a q8_0 step of numpy's)."""
    from cera import ops
    rng = np.random.default_rng(5)
    hd, heads, kv_heads, theta, eps, ctx, hidden = 32, 4, 2, 1e4, 1e-6, 16, 40
    q, k, v = (rng.standard_normal((8, n, hd)).astype(np.float32) for n in (heads, kv_heads, kv_heads))
    qn, kn = rng.standard_normal(hd).astype(np.float32), rng.standard_normal(hd).astype(np.float32)
    bcx, conv_w = rng.standard_normal((3, 3 * hidden)).astype(np.float32), rng.standard_normal((hidden, 3)).astype(np.float32)
    w_o = rng.standard_normal((24, heads * hd)).astype(np.float32)   # an F32 output projection
    b64 = lambda a: base64.b64encode(np.ascontiguousarray(a, np.float32).tobytes()).decode()
    slot_bytes = kv_heads * cache_row_bytes(cache, hd)   # a cache slot's keys
    got = python_in_worker(engine_page, f"""
import base64, json
import numpy as np
from cera.gpu import attention, matvec, ops
from cera.gpu.spec import Projection
from cera.gpu.state import pack_step
from cera.kernels import Kernels
from cera_web.session import sessions
dev = sessions[0].device
kernels = Kernels(dev)
def upload(text):
    data = base64.b64decode(text)
    buf = dev.buffer(len(data), "in")
    dev.write(buf, data)
    return buf
zeros = lambda n: dev.buffer(4 * n, "out")
q, k, v = upload({b64(q)!r}), upload({b64(k)!r}), upload({b64(v)!r})
qk_norm, bcx, conv_w = upload({b64(np.concatenate([qn, kn]))!r}), upload({b64(bcx)!r}), upload({b64(conv_w)!r})
qkv7 = upload({b64(np.concatenate([q[7].ravel(), k[7].ravel(), v[7].ravel()]))!r})
q_rot, kc, vc, att = zeros(8 * {heads * hd}), zeros({ctx * kv_heads * hd}), zeros({ctx * kv_heads * hd}), zeros(8 * {heads * hd})
step = dev.buffer(16, "step", uniform=True)
shape = dict(head_dim={hd}, n_heads={heads}, n_kv_heads={kv_heads}, cache_types=({cache!r}, {cache!r}))
rope = ops.Rope({theta}, True, qk_norm=qk_norm, eps={eps})
out = {{}}
dev.write(step, pack_step(0, 7))
await dev.run(dev.schedule([ops.rope_kv(kernels, dev, q_rot, kc, vc, q, k, v, step, rope=rope, max_tokens=7, **shape),
                            attention.prefill_attention(kernels, dev, att, q_rot, kc, vc, step, max_rows=7, **shape)]))
out["prefill"] = await dev.read(att, 0, 4 * 7 * {heads * hd})
dev.write(step, pack_step(7, 1))
await dev.run(dev.schedule(attention.attention(kernels, dev, att, qkv7, kc, vc, step, max_ctx={ctx}, split=4, rope=rope,
                                            kv_offsets=({heads * hd}, {(heads + kv_heads) * hd}), **shape)))
out["decode"] = await dev.read(att, 0, 4 * {heads * hd})
first, partials = attention.attention_partials(kernels, dev, qkv7, kc, vc, step, max_ctx={ctx}, split=4, rope=rope,
                                            kv_offsets=({heads * hd}, {(heads + kv_heads) * hd}), **shape)
w_o, merged = upload({b64(w_o)!r}), zeros(24)
await dev.run(dev.schedule([first, matvec.matvec(kernels, dev, merged, Projection(w_o, 0, {heads * hd}, 24), partials)]))
out["merged"] = await dev.read(merged, 0, 4 * 24)
out["cache"] = await dev.read(kc, 0, {slot_bytes} * 8)
shift, k_out, v_out = dev.buffer(16, "shift", uniform=True), zeros(8 * {kv_heads * hd}), zeros(8 * {kv_heads * hd})
dev.write(shift, ops.pack_shift(1, 3, 4))   # keep 1, drop 3, move 4
await dev.run(dev.schedule([ops.kv_shift(kernels, dev, k_out, v_out, kc, vc, shift, head_dim={hd},
                                            n_kv_heads={kv_heads}, rope=ops.Rope({theta}, True), max_rows=4,
                                            cache_types=shape["cache_types"])]))
out["shifted"] = await dev.read(k_out, 0, {slot_bytes} * 4)
state, conv = zeros({2 * hidden}), zeros(3 * {hidden})
dev.write(step, pack_step(0, 3))
await dev.run(dev.schedule([ops.shortconv(kernels, dev, conv, bcx, conv_w, state, step, hidden={hidden})]))
out["conv"] = await dev.read(conv, 0, 4 * 3 * {hidden})
json.dumps({{name: base64.b64encode(data).decode() for name, data in out.items()}})
""")
    arr = lambda name, *shape, dtype=np.float32: np.frombuffer(base64.b64decode(got[name]), dtype).reshape(shape)
    dtype = CACHE_TYPES[cache]
    cached = lambda name, *shape: ops.from_cache(arr(name, *ops.cache_shape(dtype, *shape), dtype=dtype))
    pos = np.arange(8)
    q_ref = ops.rope(ops.rms_norm(q, qn, eps), pos, theta, True)
    k_ref = ops.rope(ops.rms_norm(k, kn, eps), pos, theta, True)
    # over the keys as the cache holds them (numpy's own rounding may part from them by an f16 ulp
    # or a q8_0 step) and the values as the cache type holds them (bit for bit)
    att = ops.attention(q_ref, cached("cache", 8, kv_heads, hd), ops.from_cache(ops.to_cache(v, dtype)), pos,
                        1.0 / np.sqrt(hd))                                         # (8, heads, hd)
    # WGSL lets sin and cos be off by 2^-11 (absolute); SwiftShader's are (lavapipe's are closer)
    tol = dict(atol=2e-3, rtol=1e-3)
    assert_close(arr("prefill", 7, heads, hd), att[:7], **tol, what="prefill attention")
    assert_close(arr("decode", 1, heads, hd), att[7:], **tol, what="split-KV decode attention")
    assert_close(arr("merged", 24), w_o @ att[7].ravel(), **tol, what="output projection merging the splits")
    key_tol = dict(atol=0.04, rtol=1e-3) if cache == "q8_0" else tol   # a q8_0 step (gpu_util.cache_tolerance)
    assert_close(cached("cache", 8, kv_heads, hd), k_ref, **key_tol, what="keys in the cache")
    shifted = ops.rope(cached("cache", 8, kv_heads, hd)[4:8], np.full(4, -3), theta, True)
    assert_close(cached("shifted", 4, kv_heads, hd), shifted, **key_tol, what="re-rotated keys of a context shift")
    y, _ = ops.shortconv(bcx, conv_w, np.zeros((2, hidden), np.float32))
    assert_close(arr("conv", 3, hidden), y, 1e-4, 1e-4, "short conv")


@pytest.mark.parametrize("wtype", [t.name for t in sorted(WEIGHT_TYPES)])
def test_quantized_weights_decode_on_the_pyodide_device(engine_page, wtype):
    """matvec, the batched matmul and the embedding lookup of a weight type, decoded in WGSL on
    SwiftShader (no shader-f16), against gguf.quants.dequantize of the same random blocks;
    row counts that are not multiples of the workgroups. The X_INT_TYPES also dot x in integers:
    24 bits (matvec x_bits=24, decode's default) against W @ x, 8 against W @ ops.q8_k(x); the
    INT_TILE_TYPES' batched matmul with 8-bit x (quantize_x, matmul_int) against q8_k(x) @ W^T;
    and the batched matmul with K in 3 parts (split, split_sum)."""
    t = GGMLQuantizationType[wtype]
    integer, tiled = t in X_INT_TYPES, t in INT_TILE_TYPES
    m, k, tokens = 37, 4 * GGML_QUANT_SIZES[t][0], [36, 0, 17, 36, 5]
    n_tokens = len(tokens)
    rng = np.random.default_rng(int(t))
    raw, w = random_rows(t, m, k, rng)                           # (m, row bytes), (m, k)
    x = rng.standard_normal((n_tokens, k)).astype(np.float32)    # (n_tokens, k)
    got = python_in_worker(engine_page, f"""
import base64, json
import numpy as np
from cera.device import Binding
from cera.gpu import matmul, matvec, ops
from cera.gpu.spec import Projection, Tuning
from cera.gpu.state import pack_step
from cera.kernels import Kernels
from cera_web.session import sessions
dev = sessions[0].device
kernels = Kernels(dev)
def upload(data, label):
    buf = dev.buffer(len(data), label)
    dev.write(buf, data)
    return buf
w = upload(base64.b64decode({base64.b64encode(padded(raw)).decode()!r}), "w")
x = upload(base64.b64decode({base64.b64encode(x.tobytes()).decode()!r}), "x")
tokens = upload(np.array({tokens}, np.uint32).tobytes(), "tokens")
step = dev.buffer(16, "step", uniform=True)
dev.write(step, pack_step(0, {n_tokens}))
vec, mat = dev.buffer(4 * {m}, "vec"), dev.buffer(4 * {n_tokens * m}, "mat")
emb, vec8, vec24 = dev.buffer(4 * {n_tokens * k}, "emb"), dev.buffer(4 * {m}, "vec8"), dev.buffer(4 * {m}, "vec24")
mat8, xi = dev.buffer(4 * {n_tokens * m}, "mat8"), dev.buffer(4 * {n_tokens} * matmul.x_int_stride({k}), "xi")
mats, parts = dev.buffer(4 * {n_tokens * m}, "mats"), dev.buffer(3 * 4 * {n_tokens * m}, "parts")
p = Projection(Binding(w), {int(t)}, {k}, {m})
integer = [matvec.matvec(kernels, dev, Binding(out), p, Binding(x), tune=Tuning(x_bits=bits))
           for out, bits in ((vec8, 8), (vec24, 24))] if {integer} else []
integer += [matmul.quantize_x(kernels, xi, x, step, k={k}, max_rows={n_tokens}),
            matmul.matmul_int(kernels, dev, mat8, p, xi, step, max_rows={n_tokens})] if {tiled} else []
schedule = dev.schedule(integer + [
    matvec.matvec(kernels, dev, Binding(vec), p, Binding(x)),
    matmul.matmul(kernels, dev, mat, p, x, step, max_rows={n_tokens}),
    matmul.matmul(kernels, dev, parts, p, x, step, max_rows={n_tokens}, split=3),
    matmul.split_sum(kernels, mats, parts, step, m={m}, split=3, max_rows={n_tokens}, accumulate=False, label="sum"),
    ops.embed(kernels, dev, Binding(emb), Binding(w), Binding(tokens), Binding(step), wtype={int(t)}, k={k},
                 max_rows={n_tokens})])
out = {{"vec": await dev.run(schedule, Binding(vec)), "mat": await dev.read(mat, 0, 4 * {n_tokens * m}),
       "emb": await dev.read(emb, 0, 4 * {n_tokens * k}), "vec8": await dev.read(vec8, 0, 4 * {m}),
       "vec24": await dev.read(vec24, 0, 4 * {m}), "mat8": await dev.read(mat8, 0, 4 * {n_tokens * m}),
       "mats": await dev.read(mats, 0, 4 * {n_tokens * m})}}
json.dumps({{name: base64.b64encode(data).decode() for name, data in out.items()}})
""")
    vec, mat, emb, vec8, vec24, mat8, mats = (np.frombuffer(base64.b64decode(got[n]), np.float32)
                                              for n in ("vec", "mat", "emb", "vec8", "vec24", "mat8", "mats"))
    xs = x.astype(np.float64)
    assert_close(vec, w @ xs[0], 1e-6 * (np.abs(w) @ np.abs(xs[0])) + 1e-6, 1e-5, f"matvec {wtype}")
    if integer:
        x8 = ops.q8_k(x[0]).astype(np.float64)
        assert_close(vec8, w @ x8, 1e-6 * (np.abs(w) @ np.abs(x8)) + 1e-6, 1e-5, f"matvec {wtype} x8")
        assert_close(vec24, w @ xs[0], 1e-6 * (np.abs(w) @ np.abs(xs[0])) + 1e-6, 1e-5, f"matvec {wtype} x24")
    assert_close(mat.reshape(n_tokens, m), xs @ w.T, 2e-6 * (np.abs(xs) @ np.abs(w.T)) + 1e-6, 1e-5,
                 f"batched matmul {wtype}")
    assert_close(mats.reshape(n_tokens, m), xs @ w.T, 2e-6 * (np.abs(xs) @ np.abs(w.T)) + 1e-6, 1e-5,
                 f"batched matmul {wtype}, K in 3 parts")
    assert_close(emb.reshape(n_tokens, k), w[tokens], 1e-6, 1e-6, f"embed {wtype}")
    if tiled:
        x8 = ops.q8_k(x).astype(np.float64)
        assert_close(mat8.reshape(n_tokens, m), x8 @ w.T, 2e-6 * (np.abs(x8) @ np.abs(w.T)) + 1e-6, 1e-5,
                     f"batched matmul {wtype} x8")


def test_compile_error_names_the_kernel(engine_page):
    got = python_in_worker(engine_page, """
import json
from cera_web.session import sessions
dev = sessions[0].device
try:
    dev.kernel("broken.wgsl N=3", "@compute @workgroup_size(1) fn main() { let x: u32 = 1.5; }")
    await dev.check()
    message = None
except RuntimeError as err:
    message = str(err)
json.dumps({"message": message})
""")
    assert got["message"].startswith("shader broken.wgsl N=3 failed to compile: ")
    assert "line 1" in got["message"]


SUBGROUP_SUM = """
enable subgroups;
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) i: u32, @builtin(subgroup_size) n: u32) {
    let total = subgroupAdd(1u);
    if (i == 0u) { out[0] = total; out[1] = n; }
}"""


def test_subgroup_kernels_enable_the_wgsl_extension_themselves(engine_page):
    """A kernel of subgroup operations declares `enable subgroups;`, as the browser wants (the
    native host drops it: naga lacks the directive), and runs in the page as it is."""
    got = python_in_worker(engine_page, f"""
import json
import numpy as np
from cera.device import Binding, Dispatch
from cera_web.session import sessions
dev = sessions[0].device
kernel = dev.kernel("subgroup_sum.wgsl", {SUBGROUP_SUM!r})
out = dev.buffer(8, "out")
schedule = dev.schedule([Dispatch(kernel, dev.bind(kernel, [Binding(out)]), (1, 1, 1))])
got = np.frombuffer(await dev.run(schedule, Binding(out)), np.uint32)
json.dumps({{"total": int(got[0]), "size": int(got[1]), "features": sorted(dev.features)}})
""")
    if "subgroups" not in got["features"]:
        pytest.skip("this adapter has no subgroups")
    assert got["total"] == got["size"] > 0


def test_gpu_times_in_the_page(engine_page, models):
    """The page's host times passes with timestamp queries as the native one does
    (test_profile.py): one span per group, the dispatches run on the bytes written just before;
    and the profile's decode report has a marginal line for each kernel family of the plan."""
    engine_page.evaluate("(url) => engine.reload(url)", models["llama_q4_0"][1])
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    got = python_in_worker(engine_page, f"""
import base64, json
import numpy as np
from cera.device import Binding
from cera.gpu import ops, profile
from cera_web.session import sessions
model = sessions[0].engine.backend
dev = model.device
logits, first, second = dev.buffer(256, "logits"), dev.buffer(4, "first"), dev.buffer(4, "second")
dev.write(logits, base64.b64decode({base64.b64encode(x.tobytes()).decode()!r}))
whole = ops.argmax(model.kernels, dev, Binding(first), Binding(logits), n=64)
half = ops.argmax(model.kernels, dev, Binding(second), Binding(logits, 0, 128), n=32)
spans = await dev.time_passes([[whole], [half, half]])
argmaxes = [int(np.frombuffer(await dev.read(b, 0, 4), np.uint32)[0]) for b in (first, second)]
report = await profile.decode_report(model, 5, 2500.0, top=100)
json.dumps(dict(spans=spans, argmaxes=argmaxes, report=report,
                families=sorted({{profile.family(s) for s in model.decode_plan.steps}})))
""")
    assert len(got["spans"]) == 2 and all(isinstance(ns, int) and ns >= 0 for ns in got["spans"])
    assert got["argmaxes"] == [np.argmax(x), np.argmax(x[:32])]
    report = got["report"]
    marginal = report[report.index(next(x for x in report if x.startswith("marginal"))) + 1:]
    assert sorted({line.split("  ")[-1] for line in marginal if line.startswith("  ") and " MB " in line}) == got["families"]


def test_no_kernel_loop_pays_chromiums_infinite_loop_guard(pw, site, synth, tmp_path):
    """Tint guards every loop it cannot prove finite with an iteration counter (robustness), which
    cost the page's decode 10-20% (docs/PERFORMANCE.md): in the SPIR-V Chromium compiles from the
    kernels of a model's greedy and sampled decode and prefill (Q4_K, Q6_K, windowed attention),
    and of its greedy decode and prefill with int8 numerics (the integer tiles), the only guarded loops are those with a runtime bound: prefill attention's loop over key
    tiles (one a pipeline); the sampler's are all bounded by constants."""
    log = chromium_shaders.run_page(pw.chromium, site, synth["gemma3_q4_k_m"], tmp_path / "chromium.log")
    found = chromium_shaders.guarded_loops(log)
    assert {"matvec", "matmul", "matmul_int", "quantize_x", "attention", "attention_prefill", "argmax", "sample",
            "rms_norm", "rope"} <= set(found)
    runtime_bound = {"attention_prefill"}
    assert {name: c["guarded"] for name, c in found.items()} == {
        name: c["pipelines"] if name in runtime_bound else 0 for name, c in found.items()}
