"""cera.js as another page imports it (createEngine; chat.completions, completions and
embeddings; interrupt; errors), against `python -m cera serve` through the official `openai`
client on the same file."""
from __future__ import annotations

import base64
import json
from contextlib import ExitStack
from urllib.parse import quote

import numpy as np
import openai
import pytest

from web_site import REPO, Server
from native_server import cera_serve
from web_fixtures import MODEL_MS, open_cera_page


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
    """A page of the site that imports cera.js (`cera`, web_fixtures.ENGINE_PAGE) and made one
    engine per model (window.engines.NAME), each in its own worker."""
    page = open_cera_page(browser, server)
    page.evaluate("""async (urls) => {
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
    page = open_cera_page(browser, server)
    requests = [dict(messages=[{"role": "user", "content": "Describe a person."}], max_tokens=40, seed=seed,
                     temperature=0.8, response_format={"type": "json_schema", "json_schema": {"name": "p",
                                                                                             "schema": PERSON}})
                for seed in (1, 2)]
    requests.append(dict(messages=[{"role": "user", "content": "Weather in Oslo?"}], max_tokens=40, seed=3,
                         temperature=0.7, tools=[WEATHER], tool_choice="required"))
    got = page.evaluate("""async (requests) => {
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
