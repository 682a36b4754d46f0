"""Constrained output (cera.constrain, cera.tools) on the real SmolLM2: seeded sampled replies
under JSON schemas that the `jsonschema` library validates, GPU tokens equal to the numpy
reference's under the same constraint, llama.cpp's own GBNF grammars, regexes, tool calls
parsed and forced, logprobs against the model's logits, and the errors of bad constraints in
the Python API and the CLI. Qwen2.5-Coder-1.5B's runs and Qwen2.5-Coder-0.5B's own tool call are
in the slow set."""
import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import openai
import numpy as np
import pytest

import cera
from cera import catalogue
from cera.constrain import Constraint
from cera.engine import Engine, log_softmax
from cera.errors import InvalidArgument
from cera.gguf_file import GGUFFile
from cera.gpu.numerics import Numerics
from cera.jobs import Job, run_job
from cera.sampling import Sampler, as_bools
from cera.tools import HERMES, LLAMA3, CallText, Tools, parse
from native_server import cera_serve

F32_CACHE = Numerics(cache_type_k="f32", cache_type_v="f32")

GRAMMARS = Path(__file__).parent / "data" / "grammars"
SCHEMAS = json.loads((Path(__file__).parent / "data" / "schemas.json").read_text())   # name -> JSON schema
PROMPT = "Answer with one JSON object describing something. Be brief."
REPLIES = 50   # seeded sampled replies per schema


@pytest.fixture(scope="module")
def smollm2():
    return GGUFFile.open(catalogue.fetch("smollm2-135m-instruct"))


@pytest.fixture(scope="module")
def reference(smollm2):
    return asyncio.run(Engine.load(smollm2, None, ctx=512))


def replies(engine: Engine, schema: dict, seeds, max_tokens: int = 96) -> list:
    """Chat replies under `schema`, sampled with each seed."""
    out = []
    for seed in seeds:
        sampler = Sampler(temperature=0.8, top_k=40, top_p=0.95, seed=seed, constraint=Constraint.json_schema(schema))
        out.append(asyncio.run(engine.generate(PROMPT, max_tokens, chat=True, sampler=sampler)))
    return out


def check_valid(results, schema: dict) -> None:
    for r in results:
        assert r.stop_reason == "eos", (r.stop_reason, r.text)   # complete: only the end could follow
        jsonschema.validate(json.loads(r.text), schema)


@pytest.mark.parametrize("name", SCHEMAS)
def test_sampled_replies_fit_the_schema(reference, name):
    """Every seeded sampled reply is JSON that jsonschema validates, ended by the model's EOS."""
    check_valid(replies(reference, SCHEMAS[name], range(REPLIES)), SCHEMAS[name])


@pytest.mark.slow
def test_qwen_replies_fit_the_schemas():
    """The same on Qwen2.5-Coder-1.5B (1.1 GB), on the GPU."""
    from cera.runner import open_device
    engine = asyncio.run(Engine.load(GGUFFile.open(catalogue.fetch("qwen2.5-coder-1.5b-instruct")), open_device(),
                                     ctx=512))
    for name, schema in SCHEMAS.items():
        check_valid(replies(engine, schema, range(REPLIES)), schema)


def test_gpu_tokens_equal_the_reference(smollm2, reference, device):
    """The GPU's sampler, masked by the same matcher, chooses the reference's tokens."""
    gpu = asyncio.run(Engine.load(smollm2, device, ctx=512))
    for name in ("nested objects", "bounded numbers"):
        got, want = (replies(e, SCHEMAS[name], [3, 4], 64) for e in (gpu, reference))
        assert [r.tokens for r in got] == [r.tokens for r in want], name


def test_a_constraint_survives_a_context_shift(smollm2):
    """A reply longer than the context: the matcher goes on where the reply had taken it."""
    engine = asyncio.run(Engine.load(smollm2, None, ctx=64))
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 30, "maxItems": 40}
    r = asyncio.run(engine.generate("Digits:", 200, sampler=Sampler(temperature=0.9, seed=1, constraint=Constraint
                                                                        .json_schema(schema))))
    assert len(r.prompt_tokens) + len(r.tokens) > 64, "no shift happened"
    jsonschema.validate(json.loads(r.text), schema)


CHECKS = {   # an independent test of each grammar's language, where Python's re or json can say
    "arithmetic": lambda t: re.fullmatch(r"([a-z0-9_+\-*/()= \t\n]+\n)+", t),
    "list": lambda t: re.fullmatch(r"(- [^\r\n]+\n)+", t),
    "chess": lambda t: re.fullmatch(r"1\. \S+ \S+\n([1-9][0-9]?\. \S+ \S+\n)+", t),
    "json": lambda t: isinstance(json.loads(t), dict),
    "json_arr": lambda t: isinstance(json.loads(t), list),
}


@pytest.mark.parametrize("path", sorted(GRAMMARS.glob("*.gbnf")), ids=lambda p: p.stem)
def test_llama_cpp_grammars_compile_and_constrain(reference, path):
    """Each of llama.cpp's grammars/ compiles; a reply under it matches it (checked by re or
    json where they can say) or, cut by max_tokens, is a prefix the grammar still accepts."""
    constraint = Constraint("grammar", path.read_text())
    r = asyncio.run(reference.generate("Here is the answer:\n", 48, sampler=Sampler(temperature=0.7, seed=2,
                                                                                     constraint=constraint)))
    assert r.tokens and r.stop_reason in ("eos", "max_tokens")
    matcher = reference.grammars.matcher(constraint)
    for token in r.tokens:
        assert as_bools(matcher.mask(), reference.cfg.vocab_size)[token], "a token the grammar refuses"
        matcher.advance(token)
    if r.stop_reason == "eos" and path.stem in CHECKS:
        assert CHECKS[path.stem](r.text), r.text


def test_a_constraint_that_allows_nothing_more_ends_the_reply(reference):
    """Past a complete match only the end of the turn is allowed; told to go on past it anyway
    (stop_at_eos False), the matcher allows nothing: the reply ends, saying why."""
    r = asyncio.run(reference.generate("Say a:", 8, stop_at_eos=False, sampler=Sampler(constraint=Constraint("regex",
                                                                                                              "a"))))
    assert r.stop_reason == "no_allowed_token" and reference.tokenizer.decode(r.tokens[:-1]) == "a"
    assert reference.tokenizer.is_eog(r.tokens[-1])


def test_regex_and_grammar_through_the_api(smollm2):
    with cera.load(catalogue.fetch("smollm2-135m-instruct"), backend="reference", ctx=256) as m:
        r = m.generate("My favourite number is", 12, regex=r" [0-9]{2,3}\.")
        assert re.fullmatch(r" [0-9]{2,3}\.", r.text)
        r = m.generate("Yes or no?", 8, grammar='root ::= " " ("yes" | "no")')
        assert r.text in (" yes", " no")
        r = m.chat([{"role": "user", "content": "A color?"}], 32, temperature=0.5, seed=1,
                   response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMAS["enums"]}})
        jsonschema.validate(json.loads(r.text), SCHEMAS["enums"])
        r = m.chat([{"role": "user", "content": "Anything"}], 40, response_format={"type": "json_object"})
        assert isinstance(json.loads(r.text), dict)


@pytest.mark.parametrize("request_fields, message", [
    (dict(json_schema={"type": "nonsense"}), "json schema does not compile"),
    (dict(json_schema="{not json"), "not JSON"),
    (dict(regex="("), "regex does not compile"),
    (dict(grammar="root ::= missing"), "grammar does not compile"),
    (dict(regex="a", grammar='root ::= "a"'), "give one of"),
    (dict(response_format={"type": "yaml"}), "response_format is"),
    (dict(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice={"type": "function",
                                                                               "function": {"name": "g"}}),
     "tool_choice names function 'g'"),
])
def test_bad_constraints_are_invalid_arguments(request_fields, message):
    with cera.load(catalogue.fetch("smollm2-135m-instruct"), backend="reference", ctx=128) as m:
        with pytest.raises(InvalidArgument, match=message):
            m.chat([{"role": "user", "content": "hi"}], 4, **request_fields)


def test_cli_constraint_flags(tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMAS["bounded numbers"]))
    run = lambda *args: subprocess.run([sys.executable, "-m", "cera", "generate", "--backend", "reference", "--json",
                                        "-n", "48", *args], capture_output=True, text=True)
    out = run("--chat", "-p", "A person's age and score?", "--json-schema", str(schema), "--seed", "3",
              "--temperature", "0.7")
    assert out.returncode == 0, out.stderr
    jsonschema.validate(json.loads(json.loads(out.stdout)["text"]), SCHEMAS["bounded numbers"])
    out = run("-p", "Moves:", "--grammar", str(GRAMMARS / "chess.gbnf"), "-n", "12")
    assert json.loads(out.stdout)["text"].startswith("1. ")
    bad = run("-p", "x", "--regex", "[")
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"]["type"] == "invalid_argument"
    assert "regex does not compile" in json.loads(bad.stdout)["error"]["message"]


# --- tool calls ------------------------------------------------------------------------------
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


NAMES = {"get_weather", "get_time"}


def test_parse_calls_of_each_format():
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    content, calls = parse(text, HERMES, NAMES)
    assert content == "Let me check." and [c["function"]["name"] for c in calls] == ["get_weather"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    content, calls = parse('{"name": "get_time", "parameters": {}}', LLAMA3, NAMES)
    assert content is None and calls[0]["function"] == {"name": "get_time", "arguments": "{}"}
    fenced = '```json\n{"name": "get_time", "arguments": {}}\n```'   # a Hermes-style model's other habit
    assert parse(fenced, HERMES, NAMES)[1][0]["function"] == {"name": "get_time", "arguments": "{}"}
    for plain in ("<tool_call>\nnot json\n</tool_call>", '{"name": "unknown", "arguments": {}}', '{"a": 1}'):
        assert parse(plain, HERMES, NAMES) == (plain, [])
    assert parse("plain words", LLAMA3, NAMES) == ("plain words", [])


def test_streamed_text_stops_where_a_call_may_begin():
    stream = CallText(HERMES, NAMES)
    shown = [stream.push(p) for p in ["Sure", ". <tool", "_call>\n{\"name\": \"get_time\", ",
                                      "\"arguments\": {}}\n</tool_call>"]]
    assert "".join(shown) == "Sure. "
    held, content, calls = stream.end()
    assert (held, content, len(calls)) == ("", "Sure.", 1)
    plain = CallText(HERMES, NAMES)
    assert plain.push("a <tool") == "a " and plain.end()[0] == "<tool"
    json_answer = CallText(HERMES, NAMES)   # may be a call until it ends: held, then given back
    assert json_answer.push('{"a": ') == "" and json_answer.push("1}") == ""
    assert json_answer.end() == ('{"a": 1}', '{"a": 1}', [])


def test_a_forced_call_fits_its_schema(smollm2):
    """tool_choice "required" and a named function: the reply is a call to that function whose
    arguments validate against its parameters (SmolLM2's template knows no tools: cera lists
    them in a system message, Hermes' way)."""
    engine = asyncio.run(Engine.load(smollm2, None, ctx=512))
    messages = [{"role": "user", "content": "What's the weather in Paris?"}]
    for choice, name in (("required", None), ({"type": "function", "function": {"name": "get_time"}}, "get_time")):
        for seed in range(3):
            job = Job(messages=messages, max_tokens=80, tools=Tools.of([WEATHER, TIME], choice),
                      sampler=Sampler(temperature=0.8, seed=seed))
            r = asyncio.run(run_job(engine, job))
            assert r.stop_reason == "tool_calls" and len(r.tool_calls) == 1, r
            call = r.tool_calls[0]["function"]
            tool = {"get_weather": WEATHER, "get_time": TIME}[call["name"]]
            assert name in (None, call["name"])
            jsonschema.validate(json.loads(call["arguments"]), tool["function"]["parameters"])


@pytest.mark.slow
def test_qwen_0_5b_calls_the_weather_tool():
    """Qwen2.5-Coder-0.5B (491 MB), told of a weather tool by its own template and asked about
    the weather, writes a call of its own accord (tool_choice "auto", greedy, nothing
    constrained) that cera.tools parses: get_weather, its arguments valid."""
    engine = asyncio.run(Engine.load(GGUFFile.open(catalogue.fetch("qwen2.5-coder-0.5b-instruct")), None, ctx=1024))
    messages = [{"role": "user", "content": "What is the weather like in Oslo right now?"}]
    r = asyncio.run(run_job(engine, Job(messages=messages, max_tokens=64, tools=Tools.of([WEATHER]))))
    assert r.stop_reason == "tool_calls" and len(r.tool_calls) == 1, r
    call = r.tool_calls[0]["function"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"])["city"] == "Oslo"
    jsonschema.validate(json.loads(call["arguments"]), WEATHER["function"]["parameters"])


def test_tool_choice_none_tells_no_tools(smollm2):
    engine = asyncio.run(Engine.load(smollm2, None, ctx=512))
    messages = [{"role": "user", "content": "hi"}]
    assert engine.chat_tokens(messages, Tools.of([WEATHER], "none")) == engine.chat_tokens(messages)
    assert len(engine.chat_tokens(messages, Tools.of([WEATHER]))) > len(engine.chat_tokens(messages))


# --- logprobs ------------------------------------------------------------------------------
def test_logprobs_are_the_models(smollm2):
    """Each token's logprob and top alternatives equal the log-softmax of the logits the engine
    computes for the whole sequence afresh. On an f32 cache: with f16's, a last-bit difference
    between numpy's batched and per-token products can round a cached value the other way, which
    moves a logprob by ~2e-4."""
    reference = asyncio.run(Engine.load(smollm2, None, ctx=512, numerics=F32_CACHE))
    r = asyncio.run(reference.generate("The capital of France is", 6, logprobs=3, stop_at_eos=False))
    rows = log_softmax(asyncio.run(reference.logits(r.prompt_tokens + r.tokens[:-1]))[len(r.prompt_tokens) - 1:])
    for p, row in zip(r.logprobs, rows, strict=True):
        assert p.logprob == pytest.approx(row[p.token], abs=1e-4)
        assert [t for t, _ in p.top] == np.argsort(-row, kind="stable")[:3].tolist()
    assert r.logprobs[0].top[0][0] == r.tokens[0]   # greedy: the best one


# --- the server, through the official openai client ------------------------------------------
@pytest.fixture(scope="module")
def smollm2_server():
    from cera.runner import Runner
    from test_server import serving
    runner = Runner.load("smollm2-135m-instruct", ctx=1024, backend="reference")
    with serving(runner) as (url, _):
        yield openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    runner.close()


def test_server_response_format_and_llama_cpp_fields(smollm2_server):
    c, schema = smollm2_server, SCHEMAS["nested objects"]
    ask = dict(model="synth.gguf", messages=[{"role": "user", "content": PROMPT}], max_tokens=96, temperature=0.8,
               seed=5, response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    whole = c.chat.completions.create(**ask)
    jsonschema.validate(json.loads(whole.choices[0].message.content), schema)
    streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(**ask, stream=True))
    assert streamed == whole.choices[0].message.content
    ask.pop("response_format")
    for extra in ({"json_schema": schema}, {"grammar": (GRAMMARS / "json.gbnf").read_text()}):
        reply = c.chat.completions.create(**ask, extra_body=extra).choices[0].message.content
        assert isinstance(json.loads(reply), dict)
    text = c.completions.create(model="synth.gguf", prompt="Digits:", max_tokens=8,
                                extra_body={"grammar": 'root ::= " " [0-9]+'}).choices[0].text
    assert re.fullmatch(r" [0-9]+", text)


def test_server_tool_call_round_trip(smollm2_server):
    """A forced call arrives as tool_calls (whole and streamed), valid under the tool's schema;
    the tool's answer goes back as a "tool" message and the conversation goes on."""
    c = smollm2_server
    messages = [{"role": "user", "content": "What's the weather in Oslo?"}]
    ask = dict(model="synth.gguf", tools=[WEATHER, TIME], tool_choice="required", max_tokens=80, temperature=0.7,
               seed=2)
    reply = c.chat.completions.create(messages=messages, **ask).choices[0]
    assert reply.finish_reason == "tool_calls" and reply.message.content is None
    call = reply.message.tool_calls[0]
    schema = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]["function"]["parameters"]
    jsonschema.validate(json.loads(call.function.arguments), schema)
    chunks = list(c.chat.completions.create(messages=messages, stream=True, **ask))
    deltas = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or [])] if chunks else []
    assert [(d.function.name, d.function.arguments) for d in deltas] == [(call.function.name, call.function.arguments)]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    messages += [reply.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "unit": "C"}'}]
    answer = c.chat.completions.create(model="synth.gguf", messages=messages, tools=[WEATHER, TIME], max_tokens=24,
                                       temperature=0)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert answer.usage.prompt_tokens_details.cached_tokens > 0   # the conversation's prefix, not prefilled again


def test_server_logprobs(smollm2_server):
    c = smollm2_server
    reply = c.chat.completions.create(model="synth.gguf", messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                                      temperature=0, logprobs=True, top_logprobs=2).choices[0]
    content = reply.logprobs.content
    assert len(content) == 5 and all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)
    assert "".join(t.token for t in content) == reply.message.content
    assert all(t.top_logprobs[0].logprob == pytest.approx(t.logprob) for t in content)   # greedy: the best
    text = c.completions.create(model="synth.gguf", prompt="Once", max_tokens=4, temperature=0, logprobs=3).choices[0]
    assert len(text.logprobs.tokens) == 4 and all(len(t) == 3 for t in text.logprobs.top_logprobs)


def test_server_refuses_what_it_does_not_honour(smollm2_server):
    c = smollm2_server
    ask = dict(model="synth.gguf", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    for extra, param in (({"n": 2}, "n"), ({"audio": {"voice": "x"}}, "audio"), ({"modalities": ["text"]}, "modalities"),
                         ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema":
                                                                                       {"type": "bogus"}}}}, None)):
        with pytest.raises(openai.BadRequestError) as err:
            c.chat.completions.create(**ask, extra_body=extra)
        if param:
            assert err.value.body["param"] == param or param in err.value.body["message"]
    assert c.chat.completions.create(**ask, user="me", parallel_tool_calls=False).choices[0].message.content


@pytest.mark.slow
def test_qwen_tool_call_round_trip(tmp_path):
    """The issue's round trip on `python -m cera serve -m qwen2.5-coder-1.5b-instruct` (its own
    template lists the tools; its calls are single <tool_call> tokens): the call arrives as
    tool_calls with valid arguments, whole and streamed; the tool's answer goes back and the
    reply uses it (asked with tool_choice "none": this small coder would call again)."""
    with cera_serve(tmp_path, "-m", "qwen2.5-coder-1.5b-instruct", "--ctx", "1024") as (url, proc, _):
        c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=1200)
        messages = [{"role": "user", "content": "What is the weather like in Oslo right now?"}]
        ask = dict(model="qwen2.5-coder-1.5b-instruct", tools=[WEATHER, TIME], max_tokens=64, temperature=0)
        reply = c.chat.completions.create(messages=messages, **ask).choices[0]
        assert reply.finish_reason == "tool_calls", reply
        call = reply.message.tool_calls[0]
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
        chunks = list(c.chat.completions.create(messages=messages, stream=True, **ask))
        deltas = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or [])]
        assert [(d.function.name, d.function.arguments) for d in deltas] == [("get_weather", call.function.arguments)]
        messages += [reply.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 17, "unit": "C", '
                                                                         '"sky": "light rain"}'}]
        answer = c.chat.completions.create(messages=messages, **{**ask, "tool_choice": "none"}).choices[0]
        assert answer.finish_reason == "stop" and "17" in answer.message.content, answer
