"""The demo page as a user drives it: loading a file, a bundled model or a Hugging Face id, its
sampling settings, a conversation, stopping, and the errors a user can act on (bad files, too
long a prompt, an unknown arch, too large a model, no WebGPU). Through cera.js in a page of its
own: a URL model kept in OPFS, misuse of the API, and a model refused for the GPU's limits."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cera.config import ModelConfig
from cera.device import Limits
from cera.engine import DEFAULT_CTX
from cera.gguf_file import GGUFFile
from cera.gpu.footprint import footprint
from cera.gpu.model import DEFAULT_CHUNK
from web_site import CHROMIUM, CHROMIUM_ARGS, REPO
from fake_hub import FakeHub
from web_fixtures import (BOOT_MS, demo_generate, demo_load, native_generate, open_engine_page, open_page,
                          start_engine)


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
    assert page.evaluate("testHook.engine.runtimeStats()")["lastRequest"]["tokens"] == native["tokens"]
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
        stats = page.evaluate("testHook.engine.runtimeStats()")["lastRequest"]
        assert page.text_content("#conversation li.assistant:last-child") == turn["reply"]
        assert (stats["prefilledTokens"], stats["reusedTokens"]) == (turn["prefilled"], turn["reused"])
        assert f"{turn['prefilled']} prefilled" in page.inner_text("#speed")
        if i:
            assert turn["reused"] >= turns[i - 1]["prompt_tokens"]   # the whole history before this message
    assert page.locator("#conversation li").count() == 2 * len(lines)   # every turn, shown
    page.close()


def test_url_models_are_cached_in_opfs(browser, server, models):
    """A model loaded by URL (cera.js), then again by a new engine once the page reloads: from the browser's storage."""
    _, url = models["qwen2_q8_0"]
    page = open_engine_page(browser, server)
    first = page.evaluate("(url) => engine.reload(url)", url)
    page.reload()
    page.wait_for_function("window.cera !== undefined", timeout=BOOT_MS)
    start_engine(page)
    second = page.evaluate("(url) => engine.reload(url)", url)
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
        by_id = demo_generate(page, "Hello world", 8)
        demo_load(page, url)
        by_url = demo_generate(page, "Hello world", 8)
        assert by_id["tokens"] == by_url["tokens"] and len(by_id["tokens"]) == 8
        assert hub.gets_of("test-org/tiny-GGUF/tiny-Q4_K_M.gguf") == [None]
        err = demo_load(page, "test-org/tiny-GGUF:Q2_K", refused=True)   # looked up at the endpoint typed in
        page.close()
    assert err["name"] == "ModelNotFound" and "quant types: Q4_K_M, Q8_0" in err["message"]


@pytest.mark.parametrize("model,name,words", [
    ("not_gguf", "BadFile", "magic"),
    ("truncated", "TruncatedFile", "truncated"),
])
def test_bad_files_give_errors_a_user_can_act_on(page, models, model, name, words):
    err = demo_load(page, models[model][1], refused=True)
    assert err["name"] == name and words in err["message"].lower()
    assert page.is_visible("#error")
    assert name in page.inner_text("#error")
    assert ("download it again" if name == "TruncatedFile" else "complete .gguf") in page.inner_text("#error .advice")


def test_page_api_misuse_is_a_named_error(engine_page):
    """cera.js in a page: a completion before any model is loaded, reload() with no source, and
    an int8 option that is not a boolean are InvalidArgument errors."""
    got = engine_page.evaluate("""async () => {
        const name = (p) => p.then(() => null, (e) => ({name: e.name, message: e.message}));
        const fresh = new cera.Engine();
        try {
            return [await name(fresh.completions.create({prompt: "Hello"})), await name(fresh.reload()),
                    await name(fresh.reload("model.gguf", {int8: "yes"}))];
        } finally {
            await fresh.unload();
        }
    }""")
    assert [e["name"] for e in got] == ["InvalidArgument"] * 3
    assert "load" in got[0]["message"] and "source" in got[1]["message"]
    assert "int8" in got[2]["message"] and "true or false" in got[2]["message"]


def test_prompt_longer_than_the_context_is_named(page, models):
    """A prompt of more tokens than the model's context (256) typed into the demo page."""
    demo_load(page, models["llama_q4_0"][1])
    err = demo_generate(page, "word " * 400, 8, refused=True)
    assert err["name"] == "ContextFull" and "context" in err["message"]
    assert "larger context" in page.inner_text("#error .advice")


def test_unsupported_arch_is_named(page, models):
    err = demo_load(page, models["gemma"][1], refused=True)
    assert err["name"] == "Unsupported" and "gemma" in err["message"]
    assert "cera runs" in page.inner_text("#error .advice")


def needed_memory(path, limits: dict) -> dict:
    """The GPU memory the core says `path` needs at the default context on a GPU of `limits`."""
    g = GGUFFile.open(path)
    cfg = ModelConfig.from_gguf(g)
    return footprint(cfg, g, cfg.context(DEFAULT_CTX), DEFAULT_CHUNK, Limits(**limits)).to_dict()


def test_model_too_large_for_the_gpu_limits_is_refused_before_upload(browser, server, models):
    """An engine told to play a GPU whose largest buffer is 4 KiB (cera.js's `limits`) gives the
    GPU memory the model needs (onMemory: the core's figure) and refuses it before it creates a
    buffer or uploads a byte, naming the largest buffer and the limit."""
    page = open_engine_page(browser, server, limits={"max_buffer_size": 4096})
    limits = page.evaluate("engine.info.limits")
    before = page.evaluate("engine.runtimeStats()")["calls"]
    memory, err = page.evaluate("""async (url) => {
        let memory = null;
        const err = await engine.reload(url, {onMemory: (m) => { memory = m; }})
            .then(() => null, (e) => ({name: e.name, message: e.message}));
        return [memory, err];
    }""", models["llama_q4_0"][1])
    after = page.evaluate("engine.runtimeStats()")["calls"]
    page.close()
    want = needed_memory(models["llama_q4_0"][0], limits)
    assert memory["total"] == want["total"]
    largest = want["largest_buffer"]
    assert err["name"] == "TooLarge"
    assert f"{largest['name']} needs {largest['bytes']} bytes" in err["message"] and "4096" in err["message"]
    assert after.get("buffer") == before.get("buffer") and "uploadBlob" not in after, (before, after)


def test_page_shows_what_a_model_too_large_for_the_gpu_needs(browser, server, models):
    """The demo page told to play a GPU whose largest buffer is 4 KiB (?limits=...) shows the GPU
    memory a model needs (the core's figure) as it refuses it, and what to do."""
    page = open_page(browser, server, "?limits=max_buffer_size:4096")
    limits = page.evaluate("testHook.engine.info.limits")
    err = demo_load(page, models["llama_q4_0"][1], refused=True)
    shown, advice = page.inner_text("#memory"), page.inner_text("#error .advice")
    page.close()
    want = needed_memory(models["llama_q4_0"][0], limits)
    assert f"{want['total'] / 1048576:.1f} MiB" in shown
    assert err["name"] == "TooLarge"
    assert "shorter context" in advice


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
