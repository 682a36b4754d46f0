"""Chat templates from strangers (cera.chat): rendering is sandboxed and bounded, so a template
that multiplies, loops, recurses, raises or reaches for Python's internals is a BadFile that
says so, fast; in the CLI (exit status 4, the JSON error shape) and in the server, which goes
on serving. A template's own refusal of the messages stays an InvalidArgument."""
import json
import subprocess
import sys

import openai
import pytest

from cera.chat import render
from cera.errors import BadFile, InvalidArgument
from synth import CHATML_TEMPLATE, write_model

MESSAGES = [{"role": "user", "content": "hello"}]
HOSTILE = {
    "multiplies a string": "{{ 'x' * 10**10 }}",
    "multiplies the other way": "{{ 10**10 * 'x' }}",
    "multiplies a list": "{{ (messages * 10**9) | length }}",
    "raises to a huge power": "{{ 7 ** 100000000 }}",
    "nests ranges": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "renders megabytes": "{% for i in range(50000) %}{{ 'abcdefghijklmnopqrstuvwxyz' * 100 }}{% endfor %}",
    "recurses": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "calls what is not there": "{{ nothing() }}",
    "reaches for __class__": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "is not jinja": "{% for %}",
    "fails a filter's assert": "{{ 'abc' | truncate(-1) }}",
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_template_is_a_bad_file(name):
    with pytest.raises(BadFile, match="the model's chat template fails"):
        render(HOSTILE[name], MESSAGES)


def test_a_long_conversation_still_renders_and_refusals_stay_invalid_arguments():
    long = [{"role": "user", "content": "word " * 300_000}]   # beyond the template's own allowance
    assert render(CHATML_TEMPLATE, long).count("word") == 300_000
    with pytest.raises(InvalidArgument, match="refuses these messages: roles"):
        render("{{ raise_exception('roles must alternate') }}", MESSAGES)


@pytest.fixture(scope="module")
def hostile_model(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("chat") / "hostile.gguf", "llama", chat_template=HOSTILE["multiplies a string"])


def test_the_cli_says_bad_file(hostile_model):
    run = subprocess.run([sys.executable, "-m", "cera", "generate", "-m", str(hostile_model), "--chat", "-p", "hi",
                          "-n", "2", "--ctx", "64", "--json"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 4
    error = json.loads(run.stdout)["error"]
    assert error["type"] == "bad_file" and "chat template" in error["message"]


def test_the_server_answers_400_and_goes_on(hostile_model):
    from cera.runner import Runner
    from test_server import MODEL_ID, client, error_of, serving
    runner = Runner.load(str(hostile_model), ctx=64)
    try:
        with serving(runner) as (url, _):
            c = client(url)
            with pytest.raises(openai.BadRequestError) as err:
                c.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=2)
            assert "chat template" in error_of(err.value)["message"]
            text = c.completions.create(model=MODEL_ID, prompt="hello", max_tokens=2, temperature=0)
            assert text.choices[0].finish_reason in ("length", "stop")
    finally:
        runner.close()
