"""`python -m cera serve` through the official `openai` client: the same greedy text as the CLI,
concurrent streams that do not mix, a client that leaves stops its generation, OpenAI-shaped
errors, Ctrl-C. Most tests run the app in-process on a small synthetic model; the CLI and
SmolLM2 (for a real chat template) run as subprocesses."""
import asyncio
import json
import logging
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

import numpy as np
import openai
import pytest
import uvicorn

from cera.jobs import Job, StopText
from cera.runner import Runner
from cera.sampling import Sampler
from cera.server import Server
from native_server import cera_serve
from synth import write_lora, write_model

MODEL_ID = "synth.gguf"
LONG = 2000   # tokens; a whole generation this long takes ~10 s here, so an early stop shows


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("serve") / MODEL_ID, "qwen3", wtype="q4_0", context=2048)


@pytest.fixture(scope="module")
def runner(model_path):
    runner = Runner.load(model_path, ctx=2048)
    yield runner
    runner.close()


@contextmanager
def serving(runner, **options):
    """The app on uvicorn in a thread, on a free loopback port: (base URL, the Server)."""
    server = Server(runner, MODEL_ID, **options)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    uv = uvicorn.Server(uvicorn.Config(server.app, lifespan="off", log_config=None, log_level="warning"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not uv.started:
        assert thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1", server
    finally:
        server.closing.set()
        uv.should_exit = True
        thread.join(30)


def client(url, key="none"):
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=120)


def error_of(exc: openai.APIStatusError) -> dict:
    error = exc.response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return error


def complete(c, prompt, n=12, **kw):
    return c.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=n, temperature=0, **kw)


def test_models(runner):
    with serving(runner) as (url, _):
        c = client(url)
        assert [m.id for m in c.models.list()] == [MODEL_ID]
        assert c.models.retrieve(MODEL_ID).owned_by == "cera"
        with pytest.raises(openai.NotFoundError) as err:
            c.models.retrieve("gpt-4")
        assert error_of(err.value)["code"] == "model_not_found"


def test_completion_and_stream_equal_the_engine(runner):
    want = runner.submit(Job(prompt="hello world", max_tokens=12)).result()
    with serving(runner) as (url, _):
        c = client(url)
        out = complete(c, "hello world")
        assert out.choices[0].text == want.text and out.choices[0].finish_reason == "length"
        assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(want.prompt_tokens), 12)
        chunks = list(complete(c, "hello world", stream=True, stream_options={"include_usage": True}))
        assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == want.text
        assert chunks[-1].usage.completion_tokens == 12 and not chunks[-1].choices


def test_frequency_and_presence_penalties(runner):
    """OpenAI's penalty fields reach the sampler (here at temperature 0: the best token after the
    penalties), and out of OpenAI's range they are refused."""
    sampler = Sampler(0.0, top_k=0, top_p=1.0, frequency_penalty=1.5, presence_penalty=0.5)
    want = runner.submit(Job(prompt="hello world", max_tokens=12, sampler=sampler)).result()
    with serving(runner) as (url, _):
        c = client(url)
        out = complete(c, "hello world", frequency_penalty=1.5, presence_penalty=0.5).choices[0].text
        assert out == want.text != complete(c, "hello world").choices[0].text
        with pytest.raises(openai.BadRequestError) as err:
            chat(c, "hi", 2, presence_penalty=2.5)
        assert error_of(err.value)["param"] == "presence_penalty"


def test_logit_bias(runner):
    """OpenAI's logit_bias reaches the sampler: +100 on a token makes greedy pick it each time,
    -100 keeps greedy off the token it picks unbiased; a key that is not a token id, an id past
    the vocabulary or a bias past 100 is a 400."""
    vocab = runner.engine.cfg.vocab_size
    with serving(runner) as (url, _):
        c = client(url)
        forced = complete(c, "hello world", 4, logit_bias={"42": 100}).choices[0]
        assert runner.engine.history[-4:] == [42] * 4 and forced.finish_reason == "length"
        complete(c, "hello world", 1)
        first = runner.engine.history[-1]
        complete(c, "hello world", 4, logit_bias={str(first): -100})
        assert first not in runner.engine.history[-4:]
        for bad, param in (({"x": 1}, None), ({str(vocab): 1}, None), ({"42": 101}, "logit_bias")):
            with pytest.raises(openai.BadRequestError) as err:
                complete(c, "hello world", 2, logit_bias=bad)
            assert param is None or param in error_of(err.value)["param"]


def test_concurrent_streams_do_not_mix(runner):
    prompts = ["hello world", "the quick brown fox", "a", "one two three", "def f(x):", "zzz", "Paris is", "42"]
    with serving(runner) as (url, server):
        c = client(url)
        alone = {p: (complete(c, p, 16).choices[0].text if i % 2 else chat(c, p, 16).choices[0].message.content)
                 for i, p in enumerate(prompts)}
        together, start = {}, threading.Barrier(len(prompts))

        def stream(i, p):
            start.wait()
            if i % 2:
                together[p] = "".join(ch.choices[0].text for ch in complete(c, p, 16, stream=True))
            else:
                together[p] = "".join(ch.choices[0].delta.content or "" for ch in chat(c, p, 16, stream=True))
        threads = [threading.Thread(target=stream, args=(i, p)) for i, p in enumerate(prompts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert together == alone
        assert len(set(alone.values())) > 1 and server.admitted == 0


def chat(c, text, n, **kw):
    return c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": text}],
                                     max_tokens=n, temperature=0, **kw)


def test_stop_strings(runner):
    with serving(runner) as (url, _):
        c = client(url)
        full = complete(c, "hello world", 16).choices[0].text
        stop = full[len(full) // 2: len(full) // 2 + 2]
        out = complete(c, "hello world", 16, stop=["never", stop]).choices[0]
        assert out.text == full[:full.index(stop)] and out.finish_reason == "stop"
        streamed = "".join(ch.choices[0].text for ch in complete(c, "hello world", 16, stop=stop, stream=True))
        assert streamed == out.text


def test_stop_text_holds_back_what_may_start_a_stop_string():
    stops = StopText(["END", "xy"])
    assert [stops.push(p) for p in ["ab", "cE", "N", "x", "zE", "ND!"]] == ["ab", "c", "", "EN", "xz", ""]
    assert stops.hit and stops.flush() == ""
    tail = StopText(["END"])
    assert tail.push("aEN") == "a" and tail.flush() == "EN"


def test_a_client_that_disconnects_stops_its_generation(runner, caplog):
    caplog.set_level(logging.INFO, logger="cera.server")
    with serving(runner) as (url, server):
        c = client(url)
        stream = complete(c, "hello", LONG, stream=True)
        chunks = iter(stream)
        for _ in range(3):
            next(chunks)
        stream.close()
        t0 = time.perf_counter()
        assert complete(c, "hi", 4).choices[0].text   # served at once, not after the abandoned 2000 tokens
        assert time.perf_counter() - t0 < 5
        assert server.finished["cancelled"] == 1
        [line] = [r.getMessage() for r in caplog.records if "cancelled" in r.getMessage()]
        assert int(re.search(r"(\d+) generated", line)[1]) < LONG // 4, line


def post_raw(url, body: bytes, path="/chat/completions"):
    req = urllib.request.Request(url + path, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def test_bad_requests_get_openai_errors(runner):
    with serving(runner) as (url, _):
        status, body = post_raw(url, b'{"model": "synth.gguf", "messages": [')
        assert status == 400 and body["error"]["type"] == "invalid_request_error"
        assert "JSON" in body["error"]["message"] and set(body["error"]) == {"message", "type", "param", "code"}
        status, body = post_raw(url, json.dumps({"messages": [], "temperature": 7}).encode())
        assert status == 400 and body["error"]["param"] in ("messages", "temperature")
        status, body = post_raw(url, b"[1, 2]")
        assert status == 400

        c = client(url)
        with pytest.raises(openai.NotFoundError) as err:
            c.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
        assert error_of(err.value)["code"] == "model_not_found"
        with pytest.raises(openai.BadRequestError) as err:
            chat(c, "hello " * 3000, 4)
        assert error_of(err.value)["code"] == "context_length_exceeded"
        assert "context holds 2048" in error_of(err.value)["message"]
        with pytest.raises(openai.BadRequestError) as err:
            c.chat.completions.create(model=MODEL_ID, messages=[{"content": "who am I?"}], max_tokens=2)
        assert error_of(err.value)["param"] == "messages.0.role"


def test_wrong_api_key_is_refused(runner):
    with serving(runner, api_key="sesame") as (url, _):
        with pytest.raises(openai.AuthenticationError) as err:
            client(url, "guess").models.list()
        assert err.value.status_code == 401 and error_of(err.value)["code"] == "invalid_api_key"
        status, _ = post_raw(url, b"{}")
        assert status == 401
        assert complete(client(url, "sesame"), "hi", 2).choices[0].text


def test_requests_past_the_queue_get_429(runner):
    with serving(runner, max_queue=1) as (url, server):
        c = client(url)
        running = complete(c, "hello", LONG, stream=True)
        next(iter(running))
        waiting = {}
        queued = threading.Thread(target=lambda: waiting.update(out=complete(c, "hi", 4)))
        queued.start()
        deadline = time.time() + 30
        while server.admitted < 2:
            assert time.time() < deadline, "the second request was never queued"
            time.sleep(0.01)
        with pytest.raises(openai.RateLimitError) as err:
            complete(c, "one too many", 4)
        assert err.value.status_code == 429 and error_of(err.value)["code"] == "rate_limit_exceeded"
        running.close()
        queued.join(60)
        assert waiting["out"].choices[0].text


def test_ctrl_c_stops_generations_and_exits(model_path, tmp_path):
    with cera_serve(tmp_path, "-m", str(model_path), "--ctx", "2048") as (url, proc, log):
        stream = complete(client(url), "hello", LONG, stream=True)
        chunks = iter(stream)
        next(chunks)
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        with pytest.raises(openai.APIError, match="shutting down"):   # an error event ends the stream
            for _ in chunks:
                pass
        assert proc.wait(20) == 0 and time.perf_counter() - t0 < 10
    text = log.read_text()
    assert "Shutting down" in text and "Traceback" not in text and "cancelled" in text


def test_chat_equals_the_cli_on_smollm2(tmp_path):
    """The whole path with a real chat template: server (chat, streamed chat) == generate --chat."""
    question, n = "What is the capital of France?", 8
    cli = json.loads(subprocess.run(
        [sys.executable, "-m", "cera", "generate", "--chat", "--json", "-p", question, "-n", str(n), "--ctx", "256"],
        capture_output=True, text=True, timeout=600, check=True).stdout)
    with cera_serve(tmp_path, "-m", "smollm2-135m-instruct", "--ctx", "256") as (url, proc, _):
        c = client(url)
        out = c.chat.completions.create(model="smollm2-135m-instruct", messages=[{"role": "user", "content": question}],
                                        max_tokens=n, temperature=0)
        streamed = c.chat.completions.create(model="smollm2-135m-instruct", max_tokens=n, temperature=0,
                                             messages=[{"role": "user", "content": question}], stream=True)
        text = "".join(ch.choices[0].delta.content or "" for ch in streamed)
        assert out.choices[0].message.content == text == cli["text"]
        assert out.usage.prompt_tokens == len(cli["prompt_tokens"]) and out.usage.completion_tokens == len(cli["tokens"])
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0


def test_a_request_picks_among_the_loaded_lora_adapters(model_path, tmp_path):
    """"lora": the adapters a request applies, by file name or index (absent: all that the server
    loaded; []: none); each answer is the engine's with those adapters."""
    lora = write_lora(tmp_path / "style.gguf", "qwen3_q4_0", rank=8, alpha=16.0,
                      targets=("blk.*.attn_q.weight", "blk.*.ffn_up.weight"))
    runner = Runner.load(model_path, ctx=256, lora=[(lora, 1.0)])
    try:
        want = {picked: runner.submit(Job(prompt="hello world", max_tokens=8, adapters=picked)).result().text
                for picked in ((), ("style.gguf",))}
        assert want[()] != want["style.gguf",]
        with serving(runner) as (url, _):
            c = client(url)
            assert complete(c, "hello world", 8, extra_body={"lora": []}).choices[0].text == want[()]
            assert complete(c, "hello world", 8, extra_body={"lora": [0]}).choices[0].text == want["style.gguf",]
            assert complete(c, "hello world", 8).choices[0].text == want["style.gguf",]
            with pytest.raises(openai.BadRequestError) as err:
                complete(c, "hello world", 8, extra_body={"lora": ["other.gguf"]})
            assert "not loaded (loaded: style.gguf)" in error_of(err.value)["message"]
    finally:
        runner.close()


def test_serve_help_explains_every_flag():
    out = subprocess.run([sys.executable, "-m", "cera", "serve", "--help"], capture_output=True, text=True).stdout
    for flag in ("--model", "--host", "--port", "--ctx", "--max-queue", "--api-key", "--backend", "--lora"):
        assert flag in out
    assert "127.0.0.1" in out and "8080" in out


def test_a_conversation_reuses_its_cached_prefix(runner):
    """The second turn of a chat carries the first; the server's one engine prefills only what is
    new (usage.prompt_tokens_details.cached_tokens), and answers as it would from scratch."""
    with serving(runner) as (url, _):
        c = client(url)
        first = [{"role": "user", "content": "hello there"}]
        reply = c.chat.completions.create(model=MODEL_ID, messages=first, max_tokens=6, temperature=0)
        second = first + [{"role": "assistant", "content": reply.choices[0].message.content},
                          {"role": "user", "content": "and then?"}]
        warm = c.chat.completions.create(model=MODEL_ID, messages=second, max_tokens=6, temperature=0)
        assert warm.usage.prompt_tokens_details.cached_tokens >= reply.usage.prompt_tokens
        runner.call(_reset(runner))
        cold = c.chat.completions.create(model=MODEL_ID, messages=second, max_tokens=6, temperature=0)
        assert cold.usage.prompt_tokens_details.cached_tokens == 0
        assert warm.choices[0].message.content == cold.choices[0].message.content


async def _reset(runner):
    runner.engine.reset()


# ---- /v1/embeddings ----

@pytest.fixture(scope="module")
def reference(model_path):
    """The same model on the numpy reference: the embeddings the server's must equal."""
    from cera.engine import Engine
    from cera.gguf_file import GGUFFile
    return asyncio.run(Engine.load(GGUFFile.open(model_path), None, ctx=2048))


def unit_mean(engine, text_or_ids):
    row = asyncio.run(engine.embed(text_or_ids, "mean"))[0].astype(np.float64)
    return row / np.linalg.norm(row)


def test_embeddings_are_the_references_mean_at_unit_length(runner, reference):
    """The official client (which asks for base64 and decodes it) and plain floats: each input's
    mean-pooled hidden state scaled to length 1, equal to the numpy reference's; texts, token ids
    and a batch of both; usage counts the tokens."""
    texts = ["The cat sat on the mat.", "A GPU runs many threads at once.", "hello"]
    ids = reference.embed_tokens(texts[1])
    with serving(runner) as (url, _):
        c = client(url)
        out = c.embeddings.create(model=MODEL_ID, input=texts)
        floats = c.embeddings.create(model=MODEL_ID, input=texts[:2], encoding_format="float")
        batch = c.embeddings.create(model=MODEL_ID, input=[ids, ids[:3]])
        one = c.embeddings.create(model=MODEL_ID, input=ids)
    assert out.object == "list" and out.model == MODEL_ID and [d.index for d in out.data] == [0, 1, 2]
    for d, text in zip(out.data, texts, strict=True):
        assert d.object == "embedding" and len(d.embedding) == reference.cfg.hidden
        np.testing.assert_allclose(d.embedding, unit_mean(reference, text), atol=2e-3)
    assert out.usage.prompt_tokens == out.usage.total_tokens == sum(len(reference.embed_tokens(t)) for t in texts)
    np.testing.assert_allclose(floats.data[0].embedding, out.data[0].embedding, atol=1e-6)   # float == base64
    np.testing.assert_allclose(floats.data[1].embedding, out.data[1].embedding, atol=1e-6)
    np.testing.assert_allclose(one.data[0].embedding, out.data[1].embedding, atol=1e-6)   # ids == their text
    np.testing.assert_allclose(batch.data[0].embedding, out.data[1].embedding, atol=1e-6)
    np.testing.assert_allclose(batch.data[1].embedding, unit_mean(reference, ids[:3]), atol=2e-3)
    assert one.usage.prompt_tokens == len(ids) and batch.usage.prompt_tokens == len(ids) + 3


def test_embeddings_leave_the_conversation_as_it_was(runner):
    with serving(runner) as (url, _):
        c = client(url)
        before = complete(c, "hello world", 8).choices[0].text
        c.embeddings.create(model=MODEL_ID, input="something else entirely")
        assert complete(c, "hello world", 8).choices[0].text == before


@pytest.mark.parametrize("body, param, says", [
    (dict(input=""), "input", "empty"),
    (dict(input=[]), "input", "non-empty array"),
    (dict(input=["text", [1, 2]]), "input", "valid"),
    (dict(input=["fine", ""]), "input", "input[1] is empty"),
    (dict(input=[10 ** 9]), "input", "token"),
    (dict(input="hi", encoding_format="int8"), "encoding_format", "float"),
    (dict(input="hi", dimensions=8), "dimensions", "does not honour dimensions"),
    (dict(input=None), "input", "input"),
    (dict(input="hi", model="text-embedding-3-small"), "model", "does not exist"),
])
def test_bad_embedding_requests_get_openai_errors(runner, body, param, says):
    with serving(runner) as (url, _):
        status, answer = post_raw(url, json.dumps({"model": MODEL_ID, **body}).encode(), "/embeddings")
    error = answer["error"]
    assert status == (404 if param == "model" else 400) and set(error) == {"message", "type", "param", "code"}
    assert error["param"].startswith(param) and says in error["message"], error
