"""The issue's measure of constrained output on a real GPU: seeded sampled chat replies of a model
under each JSON schema of tests/data/schemas.json (the prompt and sampler of
tests/test_constrain.py), natively and in the page, then every reply validated with `jsonschema`
and the page's tokens compared with the native host's.

    python3 constrained.py native MODEL.gguf OUT.json [REPLIES]   # natively, on the GPU
    python3 constrained.py page OUT.py [REPLIES]                  # the page's half: RUN_PY for
                                                                  # browser_bench.py (device.sh browser)
    python3 constrained.py compare NATIVE.json PAGE.json          # here: validity and equality
"""
import asyncio
import json
import sys
from pathlib import Path

SCHEMAS = json.loads((Path(__file__).parents[2] / "tests" / "data" / "schemas.json").read_text())
PROMPT = "Answer with one JSON object describing something. Be brief."
SAMPLING = dict(temperature=0.8, top_k=40, top_p=0.95)

# the replies, as Python run by either host: `engine` an Engine, `replies` the count
RUN = """
import json
from cera.constrain import Constraint
from cera.sampling import Sampler
out = {}
for name, schema in json.loads(%r).items():
    out[name] = []
    for seed in range(replies):
        sampler = Sampler(**json.loads(%r), seed=seed, constraint=Constraint.json_schema(schema))
        r = await engine.generate(%r, 96, chat=True, sampler=sampler)
        out[name].append({"tokens": r.tokens, "text": r.text, "stop_reason": r.stop_reason,
                          "decode_tokens_per_s": r.decode_tokens_per_s})
result = json.dumps(out)
""" % (json.dumps(SCHEMAS), json.dumps(SAMPLING), PROMPT)

# in the page's worker: XGrammar started over the loaded model's vocabulary, as a request would
PAGE = """
from cera_web.session import sessions
from cera_web.grammar import XGrammar
session = sessions[-1]
engine = session.engine
engine.grammars = await XGrammar.load(session.grammar_host, engine.tokenizer, engine.cfg.vocab_size)
replies = %d
""" + RUN + "\nresult"


async def native(model: str, out: str, replies: int) -> None:
    from cera.engine import Engine
    from cera.gguf_file import GGUFFile
    from cera.native import NativeDevice
    engine = await Engine.load(GGUFFile.open(model), NativeDevice(), ctx=2048)
    scope = {"engine": engine, "replies": replies}
    await eval(compile(RUN, "<replies>", "exec", flags=0x2000), scope)   # top-level await
    Path(out).write_text(scope["result"])


def compare(native_json: str, page_json: str) -> None:
    import jsonschema
    mine, theirs = json.loads(Path(native_json).read_text()), json.loads(Path(page_json).read_text())
    for name, schema in SCHEMAS.items():
        valid = equal = 0
        for a, b in zip(mine[name], theirs[name], strict=True):
            for r in (a, b):
                try:
                    jsonschema.validate(json.loads(r["text"]), schema)
                    valid += r["stop_reason"] == "eos"
                except (json.JSONDecodeError, jsonschema.ValidationError):
                    pass
            equal += a["tokens"] == b["tokens"]
        n = len(mine[name])
        print(f"{name:30s} native+page valid {valid}/{2 * n}, page tokens == native {equal}/{n}")


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "native":
        asyncio.run(native(args[0], args[1], int(args[2]) if len(args) > 2 else 50))
    elif mode == "page":
        Path(args[0]).write_text(PAGE % (int(args[1]) if len(args) > 1 else 50))
    else:
        compare(*args)
