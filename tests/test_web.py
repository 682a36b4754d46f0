"""The browser half: the built static site in headless Chromium (WebGPU on SwiftShader).

The site is built by `python -m pyodide_build` (downloads cached in ~/.cache/cera), served
from 127.0.0.1 by a thread, and driven through the page's controls and its automation
API `window.cera`. Native results come from `python -m cera generate` on the same file.
"""
from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cera.config import ModelConfig
from cera.device import Limits
from cera.engine import DEFAULT_CTX
from cera.gguf_file import GGUFFile
from cera.gpu.footprint import footprint
from cera.gpu.model import DEFAULT_CHUNK
from web_site import CHROMIUM, CHROMIUM_ARGS, REPO, Server, build_site

sys.path.insert(0, str(Path(__file__).parent))
from synth import VARIANTS, write_model  # noqa: E402

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
    # unless the core pads them
    # gemma3: sliding-window and global layers, GeGLU, post-norms, Gemma-3-270M's mix of types
    for name, kwargs in {"llama_q4_0": dict(arch="llama", wtype="q4_0"),
                         "qwen2_q8_0": dict(arch="qwen2", wtype="q8_0"),
                         "gemma3_q4_k_m": VARIANTS["gemma3_q4_k_m"]}.items():
        made[name] = Path(write_model(folder / f"{name}.gguf", **kwargs, seed=0))
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


def native_generate(path: Path, prompt: str, n: int, chat: bool = False) -> dict:
    cmd = [sys.executable, "-m", "cera", "generate", "-m", str(path), "-p", prompt, "-n", str(n), "--json"]
    out = subprocess.run(cmd + (["--chat"] if chat else []), capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(out.stdout.strip().splitlines()[-1])


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
from cera_web.app import _sessions
dev = _sessions[0].device
adapter = await navigator.gpu.requestAdapter()
json.dumps({"limits": dict(dev.limits.__dict__), "features": sorted(dev.features),
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


def test_kernel_from_shaders_runs_on_the_pyodide_device(page):
    """rms_norm.wgsl through cera.kernels.Kernels on the browser device, checked with numpy;
    rows and width that are not multiples of the workgroup."""
    got = python_in_worker(page, """
import json
import numpy as np
from cera.device import Binding, Copy, Dispatch
from cera.gpu.state import pack_step
from cera.kernels import Kernels
from cera_web.app import _sessions
dev = _sessions[0].device
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


def test_compile_error_names_the_kernel(page):
    got = python_in_worker(page, """
import json
from cera_web.app import _sessions
dev = _sessions[0].device
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
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) i: u32, @builtin(subgroup_size) n: u32) {
    let total = subgroupAdd(1u);
    if (i == 0u) { out[0] = total; out[1] = n; }
}"""


def test_subgroup_kernels_get_the_wgsl_extension_enabled(page):
    """The browser wants `enable subgroups;` (native wgpu wants it absent): the host adds it."""
    got = python_in_worker(page, f"""
import json
import numpy as np
from cera.device import Binding, Dispatch
from cera_web.app import _sessions
dev = _sessions[0].device
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
                                              ("gemma3_q4_k_m", "Hello world, and the rest of it", False)])
def test_greedy_text_matches_the_native_host(page, models, name, prompt, chat):
    path, url = models[name]
    native = native_generate(path, prompt, 12, chat)
    info = page.evaluate("(url) => window.cera.load(url)", url)
    assert info["arch"] == name.split("_")[0]
    result = page.evaluate("([p, c]) => window.cera.generate(p, {maxTokens: 12, chat: c})", [prompt, chat])
    assert result["tokens"] == native["tokens"]
    assert result["text"] == native["text"]
    assert page.inner_text("#output") == native["text"]
    assert result["decodeTokensPerS"] > 0
    # Again, now that the prompt-length schedule exists: per token, one Python->JS call (run)
    # plus at most one postMessage of streamed text; the prompt is one submission.
    again = page.evaluate("([p, c]) => window.cera.generate(p, {maxTokens: 12, chat: c})", [prompt, chat])
    assert again["tokens"] == result["tokens"]
    calls = again["hostCalls"]
    assert set(calls) == {"run", "postMessage"}, calls
    assert calls["run"] == len(again["tokens"]) and calls["postMessage"] <= len(again["tokens"])


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
    assert page.inner_text("#output") == native["text"].strip() or page.text_content("#output") == native["text"]
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
    """generate() before any load(), and load() with no source, are InvalidArgument errors."""
    page = open_page(browser, server)
    got = page.evaluate("""async () => {
        const name = (p) => p.then(() => null, (e) => ({name: e.name, message: e.message}));
        return [await name(window.cera.generate("Hello")), await name(window.cera.load())];
    }""")
    page.close()
    assert [e["name"] for e in got] == ["InvalidArgument", "InvalidArgument"]
    assert "load" in got[0]["message"] and "source" in got[1]["message"]


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


def test_device_loss_is_reported(browser, server, models):
    page = open_page(browser, server)
    page.evaluate("(url) => window.cera.load(url)", models["llama_q4_0"][1])
    page.evaluate("(code) => window.cera.python(code)",
                  "from cera_web.app import _sessions\n_sessions[0].host.device.destroy()\n'ok'")
    page.wait_for_selector("#error:not([hidden])")
    text = page.inner_text("#error")
    page.close()
    assert "DeviceLost" in text and "Reload the page" in text


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
@pytest.mark.real_model
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
