"""The browser tests' fixtures and helpers (test_web_*.py, test_web_faults.py): Playwright,
Debian's Chromium, the synthetic models, the built site and its server, one page that embeds
cera.js with an engine booted and one booted demo page, one each for the whole session
(tests/conftest.py takes the fixtures from here, so that every file shares them; conftest.py runs
the tests that use them last: see there), and the native results they are compared with.

Tests of the engine drive cera.js as any page that imports it would (ENGINE_PAGE: `cera` the
module, `engine` an Engine); tests of the demo page (web/index.html) type and click into its
controls and read what it shows, and read the numbers behind it from its engine (`testHook`)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from synth import ENCODER_VARIANTS, VARIANTS, write_model
from web_site import CHROMIUM, CHROMIUM_ARGS, REPO, Server, build_site

BOOT_MS = 120_000     # Pyodide + numpy + cera on a 2-core machine
MODEL_MS = 600_000


@pytest.fixture(scope="session")
def pw():
    """Playwright for the session's browser tests (not pytest-playwright's): it keeps an event loop
    running in this thread, where asyncio.run() in a native test would fail, so conftest.py runs
    the tests that use it after every other."""
    from playwright.sync_api import sync_playwright
    playwright = sync_playwright().start()
    yield playwright
    playwright.stop()


@pytest.fixture(scope="session")
def browser(pw):
    """Debian's Chromium with WebGPU (SwiftShader), never a browser Playwright downloads."""
    chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
    yield chromium
    chromium.close()


@pytest.fixture(scope="session")
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


@pytest.fixture(scope="session")
def site(tmp_path_factory, synth):
    """The site as `python pyodide_build --gguf llama_q4_0.gguf` builds it."""
    return build_site(tmp_path_factory.mktemp("web") / "site", ggufs=[synth["llama_q4_0"]])


@pytest.fixture(scope="session")
def server(site):
    srv = Server(site)
    yield srv
    srv.close()


@pytest.fixture(scope="session")
def models(synth, server):
    """name -> (path, URL on the test server)."""
    return {name: (path, server.add(path, f"test-models/{path.name}")) for name, path in synth.items()}


# A page of an app that uses cera.js (web/README.md, "In your own page"): the module as `cera`;
# a file input for a model from disk, and a reply streamed into #out as the page shows it.
ENGINE_PAGE = """<!doctype html>
<meta charset="utf-8">
<title>cera.js under test</title>
<input id="file" type="file" accept=".gguf">
<pre id="out"></pre>
<script type="module">
  import * as cera from "./cera.js";
  window.cera = cera;
</script>
"""


def open_cera_page(browser, server, boot_ms: int = BOOT_MS):
    """A new page (its own browser storage) of ENGINE_PAGE, served from the site as engine.html,
    once it has imported cera.js."""
    (server.root / "engine.html").write_text(ENGINE_PAGE)
    page = browser.new_page()
    page.set_default_timeout(MODEL_MS)
    page.goto(server.url + "engine.html")
    page.wait_for_function("window.cera !== undefined", timeout=boot_ms)
    return page


def start_engine(page, **options) -> dict:
    """window.engine = new cera.Engine(options) (cera.js's EngineOptions) in a page of
    ENGINE_PAGE; its info once ready."""
    return page.evaluate("async (options) => { window.engine = new cera.Engine(options); return engine.ready; }",
                         options)


def open_engine_page(browser, server, boot_ms: int = BOOT_MS, **options):
    """A new page of ENGINE_PAGE with `engine` ready (no model yet)."""
    page = open_cera_page(browser, server, boot_ms)
    start_engine(page, **options)
    return page


@pytest.fixture(scope="session")
def engine_page(browser, server):
    """The session's page that embeds cera.js, its `engine` booted; tests load their models into it
    (engine.reload)."""
    page = open_engine_page(browser, server)
    yield page
    page.close()


# What a page does to show a reply as it streams: greedy unless `request` says otherwise; with
# `chat`, `prompt` is a user's message. Its text (as #out shows it) and the request's numbers
# (engine.runtimeStats().lastRequest: tokens, promptTokens, prefilledTokens, hostCalls, ...).
GENERATE = """async ([prompt, chat, request]) => {
    const out = document.getElementById("out");
    out.textContent = "";
    const stream = await (chat ? engine.chat.completions.create({...request, messages: [{role: "user", content: prompt}]})
                               : engine.completions.create({...request, prompt}));
    for await (const {choices: [choice]} of stream) out.textContent += (chat ? choice.delta.content : choice.text) ?? "";
    return {text: out.textContent, ...(await engine.runtimeStats()).lastRequest};
}"""


def generate(page, prompt: str, max_tokens: int, chat: bool = False, **fields) -> dict:
    """A reply of the engine of a page of ENGINE_PAGE, streamed (GENERATE); `fields` are the
    request's (OpenAI's names), temperature 0 unless given."""
    return page.evaluate(GENERATE, [prompt, chat, {"max_tokens": max_tokens, "temperature": 0, **fields,
                                                   "stream": True}])


def open_page(browser, server, query: str = ""):
    """A new demo page (index.html?QUERY), once its status says ready."""
    page = browser.new_page()
    page.set_default_timeout(MODEL_MS)
    page.goto(server.url + "index.html" + query)
    page.wait_for_function("document.getElementById('status').dataset.state === 'ready'", timeout=BOOT_MS)
    return page


@pytest.fixture(scope="session")
def page(browser, server):
    """The session's demo page, for tests of what it shows; a test that changes a setting puts it back."""
    page = open_page(browser, server)
    yield page
    page.close()


IDLE = """() => document.getElementById("stop").disabled
    && !["starting", "loading", "generating"].includes(document.getElementById("status").dataset.state)"""


def shown_error(page) -> dict | None:
    """The error the demo page shows ({name, message, advice}), or None."""
    return page.evaluate("""() => {
        const box = document.getElementById("error"), text = (part) => box.querySelector(part).textContent;
        return box.hidden ? null : {name: text(".name"), message: text(".message"), advice: text(".advice")};
    }""")


def demo_load(page, url: str, refused: bool = False) -> dict:
    """A URL (or Hugging Face id) typed into the demo page and Load clicked, as a user does: the
    model's info (its engine's), or with `refused` the error the page shows instead (shown_error)."""
    page.fill("#url", url)
    page.click("#load-url")
    page.wait_for_function(IDLE)
    return _outcome(page, refused, lambda: page.evaluate("testHook.engine.info.model"))


def demo_generate(page, prompt: str, max_tokens: int, chat: bool = False, refused: bool = False) -> dict:
    """`prompt` typed into the demo page (a chat message with `chat`), max tokens set and Generate
    clicked (with the sampling settings as they are: greedy by default): the reply's text as the
    page shows it and the request's numbers (its engine's runtimeStats().lastRequest), or with
    `refused` the error the page shows instead (shown_error)."""
    page.set_checked("#chat", chat)
    page.fill("#prompt", prompt)
    page.fill("#max-tokens", str(max_tokens))
    page.click("#generate")
    page.wait_for_function(IDLE)
    return _outcome(page, refused, lambda: {
        "text": page.text_content("#conversation li.assistant:last-child" if chat else "#output"),
        **page.evaluate("testHook.engine.runtimeStats()")["lastRequest"]})


def _outcome(page, refused: bool, result) -> dict:
    error = shown_error(page)
    if refused:
        assert error, "the page shows no error"
        return error
    assert not error, error
    return result()


def native_cli(*args: str) -> dict:
    """`python -m cera ARGS --json`."""
    out = subprocess.run([sys.executable, "-m", "cera", *args, "--json"], capture_output=True, text=True, check=True,
                         cwd=REPO)
    return json.loads(out.stdout.strip().splitlines()[-1])


def native_generate(path: Path, prompt: str, n: int, chat: bool = False, *options: str) -> dict:
    return native_cli("generate", "-m", str(path), "-p", prompt, "-n", str(n), *(["--chat"] if chat else []), *options)


def python_in_worker(page, code: str) -> dict:
    """`code` run in the worker of the page's engine (engine.python: an engine page's, or the demo's
    through its test hook), its last expression a JSON string: that, parsed."""
    return json.loads(page.evaluate("(code) => (window.engine ?? testHook.engine).python(code)", code))
