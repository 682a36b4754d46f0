"""The browser tests' fixtures and helpers (test_web_*.py, test_web_faults.py): Playwright,
Debian's Chromium, the synthetic models, the built site and its server, one booted demo page, one
each for the whole session (tests/conftest.py takes the fixtures from here, so that every file
shares them; conftest.py runs the tests that use them last: see there), and the native results
they are compared with."""
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


def open_page(browser, server):
    page = browser.new_page()
    page.set_default_timeout(MODEL_MS)
    page.goto(server.url + "index.html")
    page.wait_for_function("document.getElementById('status').dataset.state === 'ready'", timeout=BOOT_MS)
    return page


@pytest.fixture(scope="session")
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
