"""The page's grammar engine against the native one: XGrammar (web/grammar.js over
@mlc-ai/web-xgrammar, run in node by grammar_parity.mjs) must allow the same tokens as llguidance
(cera.constrain) at every step, over SmolLM2's real vocabulary (padded past its tokens, as a
model's may be), for a seeded constrained reply to be the same in the page as natively.

Paths through each constraint: valid documents as cera tokenizes them and one character a token,
and seeded random walks through tokens both engines allow (drawn mostly among short tokens and
ending at a stop token now and then, so they reach keys, numbers and ends rather than wander in a
string). Schemas go through Constraint.json_schema, as a request's do.

llguidance runs as cera.constrain.LLGuidance compiles it, with `no_forcing`: by default, where
the grammar forces text (`{"name": ` opening an object whose first property is required) it
allows only the first token of that text's canonical tokenization, where XGrammar allows every
token that spells a prefix of it and has no such mode.

DIFFERENT lists what the engines still read differently; test_known_differences checks that each
case still differs, so a fixed engine shows up here.
"""
from __future__ import annotations

import base64
import json
import shutil
import struct
import subprocess
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from cera import catalogue
from cera.constrain import JSON_SEPARATORS, Constraint, LLGuidance, token_bytes
from cera.gguf_file import GGUFFile
from cera.sampling import as_bools
from cera.tokenizer import Tokenizer
from cera_site import fetch

HERE = Path(__file__).parent
PADDING = 40                                 # ids past the tokenizer's (a model's padded vocabulary)
LEADS = {0xE0, 0xED, 0xF0, 0xF4}             # UTF-8 lead bytes that narrow the next byte (see DIFFERENT)
WALKS, STEPS = 12, 64                        # random walks per constraint, steps per walk

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "email": {"type": "string"}},
          "required": ["name", "age"], "additionalProperties": False}
JSON_SCHEMAS = {
    "any_object": ({"type": "object"},
                   ['{}', '{"a": [1, -2.5e3, "x\\ny", null, true, {"b": {}}], "": 0.5}']),
    "person": (PERSON, ['{"name": "Ada Lovelace", "age": 36}',
                        '{"name": "Grace \\"Amazing\\" Hopper", "age": -0, "email": "grace@navy.mil"}']),
    "nested": ({"type": "object",
                "properties": {"user": {"type": "object",
                                        "properties": {"id": {"type": "integer"},
                                                       "tags": {"type": "array", "items": {"type": "string"}}},
                                        "required": ["id"], "additionalProperties": False},
                               "ok": {"type": "boolean"}, "note": {"type": ["string", "null"]}},
                "required": ["user", "ok"], "additionalProperties": False},
               ['{"user": {"id": 7, "tags": ["a", "b c"]}, "ok": true, "note": null}',
                '{"user": {"id": 123456}, "ok": false, "note": "ça va"}']),
    "array_bounds": ({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4},
                     ["[1, 2]", "[10, -20, 30, 0]"]),
    "enums": ({"type": "object", "properties": {"color": {"enum": ["red", "green", "é-ü 🙂"]},
                                                "size": {"enum": [1, 2.5, None, True]},
                                                "kind": {"const": "fixed"}},
               "required": ["color", "kind"], "additionalProperties": False},
              ['{"color": "é-ü 🙂", "size": 2.5, "kind": "fixed"}', '{"color": "red", "kind": "fixed"}']),
    "integers": ({"type": "object", "properties": {"month": {"type": "integer", "minimum": 1, "maximum": 12},
                                                   "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                                                   "offset": {"type": "integer", "minimum": -10, "maximum": 120},
                                                   "count": {"type": "integer", "exclusiveMinimum": 0},
                                                   "any": {"type": "integer"}},
                  "required": ["month", "year", "offset", "count", "any"], "additionalProperties": False},
                 ['{"month": 12, "year": 1999, "offset": -0, "count": 1, "any": -999999999999999}',
                  '{"month": 1, "year": 2100, "offset": 120, "count": 42, "any": 0}']),
    "numbers": ({"type": "object", "properties": {"price": {"type": "number", "minimum": 0, "multipleOf": 0.01},
                                                  "ratio": {"type": "number", "minimum": 0, "maximum": 1},
                                                  "celsius": {"type": "number", "minimum": -40, "maximum": 60.5},
                                                  "any": {"type": "number"},
                                                  "maybe": {"type": ["number", "null"], "maximum": 10}},
                 "required": ["price", "ratio", "celsius", "any", "maybe"], "additionalProperties": False},
                ['{"price": 19.99, "ratio": 0.125, "celsius": -0.5, "any": 3.14159, "maybe": null}',
                 '{"price": 0, "ratio": 1.0, "celsius": 60.50, "any": -999999999999999.0, "maybe": 10.0}']),
    "strings": ({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"},
                                                  "short": {"type": "string", "minLength": 2, "maxLength": 5},
                                                  "text": {"type": "string"}},
                 "required": ["code", "short", "text"], "additionalProperties": False},
                ['{"code": "ABC-123", "short": "a\\tb", "text": "line\\nbreak \\u0001 \\\\ / 日本 🙂"}',
                 '{"code": "XYZ-0000", "short": "ok", "text": ""}']),
    "choices": ({"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "maxLength": 3}, {"type": "null"},
                           {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}]},
                ['17', '"abc"', 'null', '[true, false]']),
    "rows": ({"type": "array", "items": {"type": "object", "properties": {"x": {"type": "number"},
                                                                          "y": {"type": "number"}},
                                         "required": ["x", "y"], "additionalProperties": False},
              "minItems": 1, "maxItems": 3},
             ['[{"x": 1, "y": -2.5}]', '[{"x": 0, "y": 0}, {"x": 0.1, "y": 10}, {"x": -7, "y": 8.25}]']),
}
OTHERS = {
    "regex_sentence": (Constraint("regex", r"[A-Z][a-z]+ (is|was) [0-9]{1,3}(\.[0-9]+)?"),
                       ["Paris is 12.5", "Bob was 999"]),
    "regex_choice": (Constraint("regex", r"(yes|no|maybe)[.!]?"), ["yes", "maybe!"]),
    "regex_line": (Constraint("regex", r"[^\n]{1,20}\n"), ["hello, world ☀\n"]),
    # llama.cpp's grammars/chess.gbnf (tests/data/grammars/README.md)
    "gbnf_chess": (Constraint("grammar", (HERE / "data" / "grammars" / "chess.gbnf").read_text()),
                   ["1. e4 e5\n2. Nf3 Nc6\n3. Bb5 a6\n", "1. d4 d5\n2. c4 dxc4\n10. O-O O-O-O\n",
                    "1. e8=Q+ Kxe8#\n2. exd5 Qxd5\n"]),
}
CONSTRAINTS = {**{name: (Constraint.json_schema(schema), docs) for name, (schema, docs) in JSON_SCHEMAS.items()},
               **OTHERS}

# name: (constraint, a path as text (one token a character) or bytes (one token a byte), how the
# engines differ on it).
DIFFERENT = {
    "additional_keys": (Constraint.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}}),
                        '{"a": 1}', "properties the schema does not name: XGrammar admits a named key again "
                        "(after {\"a\": any value may follow), llguidance admits no named key and more \\u escapes"),
    "pattern_quotes": (Constraint.json_schema({"type": "string", "pattern": "^.{2,5}$"}), '"ab"',
                       "a pattern's . or [^...]: XGrammar matches it against the JSON text (a raw \" inside), "
                       "llguidance against the decoded string"),
    "format_date": (Constraint.json_schema({"type": "string", "format": "date"}), '"2024-02-29"',
                    "format date: XGrammar takes day 30 and 31 in February"),
    "prefix_items": (Constraint.json_schema({"type": "array", "prefixItems": [{"type": "integer"}], "items": False}),
                     "[1]", "prefixItems: XGrammar requires every prefix item ([] refused)"),
    "multiple_of": (Constraint.json_schema({"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.5}),
                    "0.5", "multipleOf other than 10^-k: XGrammar ignores it"),
    "untyped_bounds": (Constraint.json_schema({"minimum": 5}), "7",
                       "numeric keywords without a type: XGrammar ignores them"),
    "regex_digit": (Constraint("regex", r"\d{3}"), "555", "regex \\d: Unicode digits in llguidance, 0-9 in XGrammar"),
    "gbnf_greedy": (Constraint("grammar", 'root ::= [a-z]+ ws "\\n"\nws ::= [ \\t\\n]*'), "ab \n",
                    "GBNF: llguidance lexes ws greedily, so it eats the \\n the grammar then needs"),
    "gbnf_negated_unicode": (Constraint("grammar", "root ::= [^\\n\\u2028]+"), "a(b)",
                             "GBNF [^...] with a non-ASCII member: XGrammar also refuses ( (0x28)"),
    "utf8": (Constraint.json_schema({"type": "string"}), b'"\xed\xa0\x80"',
             "a character split over tokens: XGrammar takes a surrogate, overlong or past-U+10FFFF continuation "
             "after E0, ED, F0, F4"),
}


class XGrammarNode:
    """grammar_parity.mjs: web/grammar.js's GrammarHost over the same token bytes, in node."""

    def __init__(self, pieces: list[bytes], vocab: int, stops: list[int], folder: Path):
        ends = np.cumsum([len(p) for p in pieces], dtype=np.uint32)
        (folder / "vocab.bin").write_bytes(struct.pack("<I", len(pieces)) + ends.tobytes() + b"".join(pieces))
        index = fetch.xgrammar(fetch.default_cache()) / "lib" / "index.js"
        self.process = subprocess.Popen(["node", str(HERE / "grammar_parity.mjs"), str(index), str(folder / "vocab.bin"),
                                         str(vocab), ",".join(map(str, stops)), json.dumps(JSON_SEPARATORS)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.call()["ready"]

    def call(self, **request) -> dict:
        if request:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    @lru_cache(maxsize=None)
    def compiled(self, constraint: Constraint) -> int:
        answer = self.call(op="compile", kind=constraint.kind, source=constraint.source)
        assert "id" in answer, answer
        return answer["id"]

    def matcher(self, constraint: Constraint) -> int:
        return self.call(op="matcher", grammar=self.compiled(constraint))["id"]

    def walk(self, matcher: int, tokens: list[int]) -> list[np.ndarray]:
        """The masks before each token and after the last (fewer if one is refused)."""
        masks = self.call(op="walk", matcher=matcher, tokens=tokens)["masks"]
        return [np.frombuffer(base64.b64decode(m), np.uint32) for m in masks]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=10)


class Engines:
    """Both engines over SmolLM2's vocabulary, and the paths the tests take."""

    def __init__(self, folder: Path):
        self.tok = Tokenizer.from_metadata(GGUFFile.open(catalogue.fetch(catalogue.DEFAULT_MODEL)).metadata)
        self.vocab = self.tok.vocab_size + PADDING
        self.pieces = token_bytes(self.tok, self.vocab)
        self.stops = sorted(self.tok.eog_ids)
        self.llg = LLGuidance(self.tok, self.vocab)
        self.xg = XGrammarNode(self.pieces, self.vocab, self.stops, folder)
        self.single = {}                                     # bytes -> the one token spelling them
        for i, piece in enumerate(self.pieces):
            if piece and not piece.startswith(b"\xff"):
                self.single.setdefault(piece, i)
        last = [piece[-1] if piece else None for piece in self.pieces]
        self.walkable = np.array([b is not None and b not in LEADS for b in last])
        self.short = np.array([0 < len(p) <= 2 for p in self.pieces])

    def one_a_character(self, text: str) -> list[int]:
        out = []
        for ch in text:
            token = self.single.get(ch.encode())
            out += [token] if token is not None else self.tok.encode(ch, False, False)
        return out

    def paths(self, text: str) -> list[list[int]]:
        return [self.tok.encode(text, False, False), self.one_a_character(text)]

    def show(self, path: list[int], llg: np.ndarray, xg: np.ndarray) -> str:
        """Where two masks differ: the text so far, the first tokens only one engine allows."""
        only = [np.nonzero(as_bools(a, self.vocab) & ~as_bools(b, self.vocab))[0][:8] for a, b in ((llg, xg), (xg, llg))]
        names = [[self.pieces[t] for t in ids] for ids in only]
        return f"after {b''.join(self.pieces[t] for t in path)!r}: only llguidance {names[0]}, only XGrammar {names[1]}"

    def first_difference(self, constraint: Constraint, path: list[int]) -> str | None:
        """Walk both engines along `path`; where their masks first differ (None: nowhere)."""
        llg = self.llg.matcher(constraint)
        matcher = self.xg.matcher(constraint)
        masks = self.xg.walk(matcher, path)
        self.xg.call(op="free", id=matcher)
        for step, xg in enumerate(masks):
            mask = llg.mask()
            if not np.array_equal(mask, xg):
                return self.show(path[:step], mask, xg)
            if step < len(path):
                llg.advance(path[step])
        return None

    def random_walk(self, constraint: Constraint, rng: np.random.Generator) -> str | None:
        """A walk through tokens both allow (not ending in a lone E0, ED, F0, F4: DIFFERENT's utf8);
        where the masks first differ (None: nowhere)."""
        llg, matcher, path = self.llg.matcher(constraint), self.xg.matcher(constraint), []
        xg = self.xg.walk(matcher, [])[0]
        try:
            for _ in range(STEPS):
                mask = llg.mask()
                if not np.array_equal(mask, xg):
                    return self.show(path, mask, xg)
                both = as_bools(mask, self.vocab) & self.walkable
                stops = [s for s in self.stops if both[s]]
                short = np.nonzero(both & self.short)[0]
                if stops and rng.random() < 0.3:
                    token = int(rng.choice(stops))
                elif len(short) and rng.random() < 0.6:
                    token = int(rng.choice(short))
                elif both.any():
                    token = int(rng.choice(np.nonzero(both)[0]))
                else:
                    return None
                if token in self.stops:
                    return None
                path.append(token)
                llg.advance(token)
                xg = self.xg.walk(matcher, [token])[1]
            return None
        finally:
            self.xg.call(op="free", id=matcher)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    if shutil.which("node") is None:
        pytest.fail("node not found: scripts/setup.sh installs Node.js")
    made = Engines(tmp_path_factory.mktemp("grammar_parity"))
    yield made
    made.xg.close()


@pytest.mark.parametrize("name", CONSTRAINTS)
def test_documents_get_the_same_masks(engines, name):
    """Every step of each valid document, as cera tokenizes it and one character a token."""
    constraint, documents = CONSTRAINTS[name]
    for text in documents:
        for path in engines.paths(text):
            assert (where := engines.first_difference(constraint, path)) is None, f"{name}, {text!r}: {where}"


@pytest.mark.parametrize("name", CONSTRAINTS)
def test_random_walks_get_the_same_masks(engines, name):
    constraint, _ = CONSTRAINTS[name]
    rng = np.random.default_rng(list(CONSTRAINTS).index(name))
    for _ in range(WALKS):
        assert (where := engines.random_walk(constraint, rng)) is None, f"{name}: {where}"


@pytest.mark.parametrize("name", DIFFERENT)
def test_known_differences(engines, name):
    """Each case of DIFFERENT still differs (a fix upstream: move it to the equal set)."""
    constraint, text, how = DIFFERENT[name]
    path = [engines.single[bytes([b])] for b in text] if isinstance(text, bytes) else engines.one_a_character(text)
    assert engines.first_difference(constraint, path) is not None, f"{name} no longer differs: {how}"


def test_a_grammar_xgrammar_cannot_read_is_an_error_and_the_host_recovers(engines):
    """A bad grammar aborts the spare instance reading it; the error names the problem, and the
    host compiles the next grammar once a new spare has started."""
    for rule in ("undefined_rule", "another_one"):   # each kills a spare
        bad = engines.xg.call(op="compile", kind="grammar", source=f'root ::= "a" {rule}')
        assert bad["name"] == "InvalidArgument" and f'Rule "{rule}" is not defined' in bad["error"], bad
    bad = engines.xg.call(op="compile", kind="json_schema", source=json.dumps({"type": "integer", "minimum": 3,
                                                                              "maximum": 1}))
    assert bad["name"] == "InvalidArgument" and "between 3 and 1" in bad["error"], bad
    good = Constraint("grammar", 'root ::= "yes" | "no"')
    for _ in range(100):   # new spares start meanwhile
        answer = engines.xg.call(op="compile", kind=good.kind, source=good.source)
        if "id" in answer:
            break
        assert "restarting" in answer["error"], answer
        time.sleep(0.05)
    assert engines.first_difference(good, engines.paths("yes")[0]) is None
