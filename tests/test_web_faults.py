"""Faults the page survives: its GPU device lost mid-reply, the browser's storage full, a
download cut short, a model's hostile chat template.

The device is lost as a driver reset would lose it, by `device.destroy()` on the live
GPUDevice in the page's worker (through engine.python) while a reply streams. The demo page is
driven through its controls (tests/web_fixtures.py: demo_load, demo_generate), its engine reached
through its test hook for what the page does not show; cera.js through a page that imports it.
The fixtures (the built site, its server, the synthetic models, Chromium) are the session's.
"""
from __future__ import annotations

import hashlib
import http.server
import json
import subprocess
import sys
import threading

import pytest

from web_fixtures import demo_generate, demo_load, open_cera_page, open_page, python_in_worker
from synth import write_lora, write_model
from test_chat import HOSTILE, MESSAGES
from web_site import REPO

LINES = ["Hi there", "What next?"]   # a conversation's two user turns
REPLY_TOKENS = 8
DESTROY = "from cera_web.session import sessions\nsessions[0].host.device.destroy()\n'destroyed'"


def native_chat(path, lines) -> list[dict]:
    """`python -m cera chat --json`, one turn per line: a fresh engine's replies."""
    out = subprocess.run([sys.executable, "-m", "cera", "chat", "-m", str(path), "-n", str(REPLY_TOKENS), "--json"],
                         input="\n".join(lines) + "\n", capture_output=True, text=True, check=True, cwd=REPO)
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_page_survives_a_lost_gpu_device(browser, server, models):
    """The device destroyed while the second reply streams: that reply ends with DeviceLost,
    the page shows it and reloads the model on a new device without reloading itself, and the
    second message sent again gets `python -m cera chat`'s second reply, prefilling only that
    message (the first turn was restored)."""
    path, url = models["llama_q4_0"]
    want = native_chat(path, LINES)
    page = open_page(browser, server)
    page.evaluate("window.notReloaded = true")
    demo_load(page, url)
    demo_generate(page, LINES[0], REPLY_TOKENS, chat=True)
    page.fill("#prompt", LINES[1])
    page.fill("#max-tokens", "250")
    lost = page.evaluate("""async (destroy) => {
        const $ = (id) => document.getElementById(id), wait = () => new Promise((go) => setTimeout(go, 5));
        $("generate").click();
        const last = () => document.querySelector("#conversation li.assistant:last-child");
        while (!(last()?.textContent.length > 3)) await wait();
        await testHook.engine.python(destroy);
        while (!$("stop").disabled) await wait();   // the reply has ended
        const box = $("error");
        return box.hidden ? null : {name: box.querySelector(".name").textContent,
                                    message: box.querySelector(".message").textContent};
    }""", DESTROY)
    assert lost and lost["name"] == "DeviceLost" and "destroyed" in lost["message"], lost
    assert "DeviceLost" in page.inner_text("#error") and page.inner_text("#status") == "recovering"
    page.wait_for_function("document.getElementById('status').dataset.state === 'ready'")
    assert "recovered from a lost GPU device" in page.inner_text("#progress-text")
    assert "keeps the conversation" in page.inner_text("#error .advice")
    again = demo_generate(page, LINES[1], REPLY_TOKENS, chat=True)
    assert page.evaluate("window.notReloaded")
    page.close()
    assert again["text"] == want[1]["reply"]
    assert (again["prefilledTokens"], again["reusedTokens"]) == (want[1]["prefilled"], want[1]["reused"])


def test_cera_js_engine_survives_a_lost_gpu_device(browser, server, models, tmp_path):
    """Through cera.js, an engine with a context of its own and a LoRA adapter: the stream in
    flight throws DeviceLost, onDeviceLost then onRecovered are called (the model reloaded at
    that context), and the request sent again (it waits for the recovery) answers as a fresh
    engine so loaded answers the same messages."""
    lora = write_lora(tmp_path / "style.gguf", "llama_q4_0", rank=12, alpha=24.0, targets=("blk.*.attn_*.weight",))
    page = open_cera_page(browser, server)
    got = page.evaluate("""async ([url, lora, lines, n, destroy]) => {
        const load = async (events) => {
            const engine = await cera.createEngine({model: url, ctx: 192, ...events});
            await engine.loadLora(lora, {scale: 0.5});
            return engine;
        };
        const events = [];
        const engine = await load({
            onDeviceLost: (e) => events.push(`lost ${e.name}: ${e.message}`),
            onRecovered: (r) => events.push(`recovered ${r.model.name} ctx ${r.model.ctx}, ${r.restoredTokens} tokens`)});
        const ask = (messages, more) => engine.chat.completions.create({messages, max_tokens: n, temperature: 0, ...more});
        const first = (await ask([{role: "user", content: lines[0]}])).choices[0].message.content;
        const history = [{role: "user", content: lines[0]}, {role: "assistant", content: first},
                         {role: "user", content: lines[1]}];
        let thrown = null, chunks = 0;
        try {
            for await (const _ of await ask(history, {max_tokens: 250, stream: true})) {
                if (++chunks === 2) await engine.python(destroy);
            }
        } catch (e) {
            thrown = {name: e.name, message: e.message};
        }
        const again = await ask(history);
        const fresh = await load({});
        return {thrown, events, again, fresh: await fresh.chat.completions.create(
            {messages: history, max_tokens: n, temperature: 0})};
    }""", [models["llama_q4_0"][1], server.add(lora, "test-models/style.gguf"), LINES, REPLY_TOKENS, DESTROY])
    page.close()
    assert got["thrown"] and got["thrown"]["name"] == "DeviceLost", got["thrown"]
    assert [e.split()[0] for e in got["events"]] == ["lost", "recovered"], got["events"]
    assert "DeviceLost" in got["events"][0] and "llama_q4_0.gguf ctx 192" in got["events"][1]
    again, fresh = got["again"]["choices"][0], got["fresh"]["choices"][0]
    assert again["message"] == fresh["message"] and again["finish_reason"] == fresh["finish_reason"]
    assert got["again"]["usage"]["completion_tokens"] == got["fresh"]["usage"]["completion_tokens"]
    assert got["again"]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0   # the restored first turn


# --- the model cache (web/models.js) ---------------------------------------------------------
def in_worker(page, body: str, **values):
    """The result (through JSON) of the body of an async JavaScript function run in the worker of
    the page's engine, where models.js runs (evaluated there by engine.python), `values` bound by name."""
    call = f"(async ({{{', '.join(values)}}}) => {{{body}}})({json.dumps(values)})"
    source = f"(async () => JSON.stringify((await {call}) ?? null))()"
    return python_in_worker(page, f"from js import eval as evaluate\nawait evaluate({json.dumps(source)})")


CACHE = """const root = await navigator.storage.getDirectory();
    const dir = await root.getDirectoryHandle("cera-models", {create: true});
    const files = [];
    for await (const name of dir.keys()) files.push(name);
    const index = files.includes("index.json")
        ? JSON.parse(await (await (await dir.getFileHandle("index.json")).getFile()).text()) : {};
    return {files: files.sort(), index};"""   # the cache's files and index, in the worker
OPEN = """const { openModel } = await import(new URL("models.js", self.location.href));
    return openModel(url, () => {}, sha256).then(
        (m) => ({size: m.blob.size, cached: m.cached, cacheSkipped: m.cacheSkipped}),
        (e) => ({error: e.name, message: e.message}));"""   # models.js's openModel(url, sha256), in the worker


def test_a_full_storage_loads_the_model_without_the_cache(browser, server, models):
    """Every write of the model into OPFS refused as over quota (stubbed in the worker): the
    model loads from memory, the page says it was not cached and why, and OPFS holds nothing."""
    path, url = models["llama_q4_0"]
    page = open_page(browser, server)
    in_worker(page, """const write = FileSystemWritableFileStream.prototype.write;
        FileSystemWritableFileStream.prototype.write = function (data) {   // the model's bytes, not the index
            return typeof data === "string" ? write.call(this, data)
                : Promise.reject(new DOMException("the origin's quota is used up", "QuotaExceededError"));
        };""")
    loaded = demo_load(page, url)
    reply = demo_generate(page, "Once upon a time", 4)
    shown, cache = page.inner_text("#progress-text"), in_worker(page, CACHE)
    page.close()
    assert (loaded["cached"], loaded["bytes"]) == (False, path.stat().st_size)
    assert "QuotaExceededError" in loaded["cacheSkipped"] and "without the cache" in loaded["cacheSkipped"]
    assert "not cached" in shown and "QuotaExceededError" in shown
    assert reply["completionTokens"] == 4
    assert cache == {"files": [], "index": {}}


class Flaky(http.server.BaseHTTPRequestHandler):
    """Serves `body` to any origin as `mode` says: "whole"; "cut" (its whole Content-Length
    declared, the connection closed half-way); "short" (half of it, declared so: a file cut
    short on the server); "unsized" (whole, without a Content-Length)."""
    body, mode = b"", "whole"

    def do_GET(self):
        sent = self.body[: len(self.body) // 2] if self.mode in ("cut", "short") else self.body
        self.send_response(200)
        self.send_header("Access-Control-Allow-Origin", "*")
        if self.mode != "unsized":
            self.send_header("Content-Length", str(len(self.body if self.mode == "cut" else sent)))
        self.end_headers()
        self.wfile.write(sent)

    def log_message(self, *args):
        pass


@pytest.fixture
def flaky(models):
    """The URL of a server of llama_q4_0.gguf that fails as Flaky.mode says."""
    Flaky.body = models["llama_q4_0"][0].read_bytes()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/flaky/llama_q4_0.gguf"
    httpd.shutdown()
    httpd.server_close()


def test_a_cut_download_leaves_no_cache_entry(browser, server, flaky):
    """A download cut mid-way (FetchFailed, also as the page shows it), a file cut short on the
    server (not the file its SHA-256 names: BadFile) and one of unknown size (loaded, not
    cached) leave no entry in the cache; the whole file is then listed with its size and hash
    and trusted next time; asked for another hash, the entry is unlisted before the download."""
    size, sha256 = len(Flaky.body), hashlib.sha256(Flaky.body).hexdigest()
    page = open_page(browser, server)

    def open_model(mode, asked=None):
        Flaky.mode = mode
        return in_worker(page, OPEN, url=flaky, sha256=asked)

    cut = open_model("cut")
    shown = demo_load(page, flaky, refused=True)["name"]
    short = open_model("short", sha256)
    unsized = open_model("unsized")
    empty = in_worker(page, CACHE)
    whole = open_model("whole", sha256)
    listed = in_worker(page, CACHE)
    trusted = open_model("short", sha256)   # the server's copy is short now: this one came from the cache
    other = open_model("short", "0" * 64)
    unlisted = in_worker(page, CACHE)
    page.close()
    assert cut["error"] == "FetchFailed" and "cut after" in cut["message"], cut
    assert shown == "FetchFailed"
    assert short["error"] == "BadFile" and sha256 in short["message"]
    assert unsized["size"] == size and "Content-Length" in unsized["cacheSkipped"]
    assert empty == {"files": [], "index": {}}
    assert (whole["cached"], whole["size"], whole["cacheSkipped"]) == (False, size, None)
    assert listed["index"] == {flaky: {"file": listed["files"][0], "size": size, "sha256": sha256}}
    assert listed["files"][1:] == ["index.json"]
    assert (trusted["cached"], trusted["size"]) == (True, size)
    assert other["error"] == "BadFile" and unlisted == {"files": ["index.json"], "index": {}}


# --- a model's chat template --------------------------------------------------------------
RENDER_ALL = """import json
from cera.chat import render
from cera.errors import BadFile
outcomes = {}
for name, template in json.loads(%r).items():
    try:
        render(template, json.loads(%r))
        outcomes[name] = "rendered"
    except BadFile as err:
        outcomes[name] = "BadFile" if "chat template" in str(err) else str(err)
    except Exception as err:   # an escape: what the test reports
        outcomes[name] = f"{type(err).__name__}: {err}"
json.dumps(outcomes)"""


def test_a_hostile_chat_template_is_a_bad_file_in_the_page(browser, server, tmp_path):
    """test_chat.py's hostile templates (multiplying, nesting ranges, recursing, raising,
    reaching for __class__), rendered by the page's Python, are each a BadFile; a model that
    carries one answers a chat request with BadFile, which the page shows, and goes on
    completing plain text."""
    path = write_model(tmp_path / "hostile.gguf", "llama", chat_template=HOSTILE["multiplies a string"])
    url = server.add(path, "test-models/hostile.gguf")
    page = open_page(browser, server)
    outcomes = python_in_worker(page, RENDER_ALL % (json.dumps(HOSTILE), json.dumps(MESSAGES)))
    demo_load(page, url)
    refused = demo_generate(page, "hello", 2, chat=True, refused=True)["name"]
    shown = page.inner_text("#error")
    text = demo_generate(page, "hello", 2)
    page.close()
    assert outcomes == {name: "BadFile" for name in HOSTILE}
    assert refused == "BadFile" and "chat template" in shown
    assert text["completionTokens"] == 2
