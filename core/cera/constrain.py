"""Constrained output: a reply that must match a JSON schema, a regular expression or a grammar.

A `Constraint` says what the reply must match (pure data: a Sampler carries it, a request makes
it). A host's `Grammars` compiles it for one tokenizer into a `Matcher` per generation, which
walks the reply a token at a time:

    matcher = grammars.matcher(Constraint.json_schema({"type": "object"}))
    words = matcher.mask()       # the tokens allowed next: bit i % 32 of uint32 word i // 32
    matcher.advance(token)       # the token chosen

The mask is the sampler's mask input (cera.sampling, cera.gpu.sample: the same bit layout), so the
GPU never chooses a token the constraint forbids; a matcher whose language is complete allows
only the end-of-generation tokens.

The grammar engine is a maintained one, not cera's own: natively `llguidance` (`LLGuidance`
below: JSON schema, regex, Lark and llama.cpp's GBNF; the engine llama.cpp links), in the page
XGrammar compiled to WebAssembly (web/cera_web/grammar.py), each set up to accept the same
language. JSON is compact with fixed separators (", " and ": ", no other whitespace) in both,
numbers are written as llama.cpp's JSON grammars write them, with bounded digits (at most 15
before the point and DECIMALS after it, no exponent) unless the schema bounds them itself, and a
string of bounded length (minLength, maxLength, no pattern) as a pattern of PLAIN characters, no
escapes (XGrammar computes such a mask 10-20x faster than one with escapes): a model can neither
spin in whitespace nor run on in digits, and the two engines agree token for token. What comes
out is always valid under the schema as given.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

import numpy as np

from cera.errors import InvalidArgument, Unsupported
from cera.tokenizer import CONTROL, USER_DEFINED, Tokenizer

KINDS = ("json_schema", "regex", "grammar")
ANY_OBJECT = {"type": "object"}      # OpenAI's response_format {"type": "json_object"}
JSON_SEPARATORS = (", ", ": ")       # item, key
LARGEST = 10 ** 15 - 1               # a number's largest magnitude, unless its schema says otherwise
DECIMALS = 10                        # a number's digits after the point, unless its schema sets multipleOf
PLAIN = r'[^"\\\x00-\x1f\x7f]'   # a string's character that needs no escape
_DATA = ("const", "enum", "default", "examples")   # schema keys whose values are JSON data, not schemas


@dataclass(frozen=True)
class Constraint:
    """What a reply must match. kind "json_schema": `source` a JSON schema (as JSON text);
    "regex": a regular expression (Rust regex syntax, matched against the whole reply);
    "grammar": a grammar in llama.cpp's GBNF (root rule `root`) or Lark (`start`)."""
    kind: str
    source: str

    def __post_init__(self):
        if self.kind not in KINDS:
            raise InvalidArgument(f"constraint kind {self.kind!r}: one of {', '.join(KINDS)}")
        if not isinstance(self.source, str) or not self.source.strip():
            raise InvalidArgument(f"an empty {self.kind.replace('_', ' ')}: nothing to constrain the reply to")

    @classmethod
    def json_schema(cls, schema: dict | str | bool) -> "Constraint":
        """A JSON value valid under `schema` (a dict, a boolean or JSON text)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise InvalidArgument(f"the JSON schema is not JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise InvalidArgument(f"a JSON schema is an object or a boolean, not {type(schema).__name__}")
        return cls("json_schema", json.dumps(rewrite(schema, _bounded)))

    @classmethod
    def one_of(cls, json_schema=None, regex: str | None = None, grammar: str | None = None,
               response_format: dict | None = None) -> "Constraint | None":
        """The constraint of a request's fields (OpenAI's response_format, llama.cpp server's
        json_schema and grammar, a regex), None without one; more than one is refused."""
        fields = {"json_schema": json_schema, "regex": regex, "grammar": grammar,
                  "response_format": None if response_format is None else _response_schema(response_format)}
        given = {k: v for k, v in fields.items() if v is not None}
        if len(given) > 1:
            raise InvalidArgument(f"give one of {', '.join(given)}: a reply matches one constraint")
        if not given:
            return None
        kind, source = given.popitem()
        return cls.json_schema(source) if kind in ("json_schema", "response_format") else cls(kind, source)

    @property
    def label(self) -> str:
        return self.kind.replace("_", " ")


def rewrite(schema, fix):
    """`schema` with fix(subschema) -> subschema applied to each of its objects, innermost first
    (the values of const, enum, default and examples are data, left as they are)."""
    if isinstance(schema, list):
        return [rewrite(s, fix) for s in schema]
    if not isinstance(schema, dict):
        return schema
    return fix({k: v if k in _DATA else rewrite(v, fix) for k, v in schema.items()})


def _bounded(schema: dict) -> dict:
    """A numeric schema with the module docstring's bounds where it sets none; a string of
    bounded length as a pattern of plain characters (module docstring)."""
    types = schema.get("type")
    types = types if isinstance(types, list) else [types]
    if types == ["string"] and "pattern" not in schema and ("maxLength" in schema or "minLength" in schema):
        rest = {k: v for k, v in schema.items() if k not in ("minLength", "maxLength")}
        return {**rest, "pattern": f"^{PLAIN}{{{schema.get('minLength', 0)},{schema.get('maxLength', '')}}}$"}
    if "number" not in types and "integer" not in types:
        return schema
    bounds = {"minimum": -LARGEST, "maximum": LARGEST}
    if "number" in types:
        bounds["multipleOf"] = 10 ** -DECIMALS
    taken = {"minimum": ("minimum", "exclusiveMinimum"), "maximum": ("maximum", "exclusiveMaximum"),
             "multipleOf": ("multipleOf",)}
    return {**{k: v for k, v in bounds.items() if not any(t in schema for t in taken[k])}, **schema}


def _response_schema(response_format) -> dict | bool | None:
    """The JSON schema of OpenAI's response_format: {"type": "text"} (None), {"type":
    "json_object"} (any object; llama.cpp's server also takes a "schema" beside it), or
    {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}."""
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return response_format.get("schema") or ANY_OBJECT
    if kind == "json_schema" and isinstance(response_format.get("json_schema"), dict):
        return response_format["json_schema"].get("schema") or ANY_OBJECT
    raise InvalidArgument('response_format is {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", '
                          '"json_schema": {"name": ..., "schema": {...}}}')


class Matcher(Protocol):
    """One generation's walk through a constraint (module docstring)."""

    def mask(self) -> np.ndarray: ...            # (ceil(vocab / 32),) uint32: the tokens allowed next

    def advance(self, token: int) -> None: ...   # the token chosen (one the mask allowed)


class Grammars(Protocol):
    """A host's grammar engine for one model's tokenizer."""

    def matcher(self, constraint: Constraint) -> Matcher: ...


def token_bytes(tokenizer: Tokenizer, vocab: int) -> list[bytes]:
    """Each token's bytes as a grammar engine reads them (`vocab` entries; ids past the
    tokenizer's are empty): control tokens, and user-defined ones written like them (<...>),
    marked with a leading 0xFF, a byte no UTF-8 text holds, so no grammar's text can match them."""
    out = []
    for i in range(vocab):
        if i >= tokenizer.vocab_size:
            out.append(b"")
            continue
        piece, attr = tokenizer.token_to_piece(i, special=True), tokenizer.attrs[i]
        special = attr & CONTROL or (attr & USER_DEFINED and piece.startswith(b"<") and piece.endswith(b">"))
        out.append(b"\xff" + piece if special else piece)
    return out


class LLGuidance:
    """`llguidance` over cera's tokenizer: compiled grammars are kept (a request repeated with
    the same schema compiles nothing) and each generation gets a fresh copy of one."""

    def __init__(self, tokenizer: Tokenizer, vocab: int):
        try:
            import llguidance
        except ImportError:
            raise Unsupported("constrained output needs llguidance natively: pip install llguidance") from None
        self._llg, self.tokenizer, self.vocab = llguidance, tokenizer, vocab
        self._lltokenizer = None
        self._compiled = lru_cache(maxsize=64)(self._compile)

    @property
    def lltokenizer(self):
        """llguidance's view of the vocabulary (made on first use: a few hundred ms)."""
        if self._lltokenizer is None:
            tok = self.tokenizer
            wrapper = _Vocabulary(token_bytes(tok, self.vocab), tok.eos_id, tok.bos_id,
                                  lambda text: tok.encode(text.decode("utf-8", "replace"), False, False))
            self._lltokenizer = self._llg.LLTokenizer(self._llg.TokenizerWrapper(wrapper), n_vocab=self.vocab,
                                                      eos_token=sorted(tok.eog_ids) or None)
        return self._lltokenizer

    def matcher(self, constraint: Constraint) -> "LLGuidanceMatcher":
        return LLGuidanceMatcher(self._compiled(constraint).deep_copy(), self.vocab, self.tokenizer.eog_ids)

    def _compile(self, constraint: Constraint):
        """llguidance's matcher at the start of `constraint`, compiled with no_forcing: where the
        grammar forces text (`{"name": ` opening an object whose first key is required) every
        token that spells a prefix of it is allowed, not only the text's canonical first token;
        XGrammar in the page can only do the same, and the hosts must agree."""
        llg, text = self._llg, constraint.source
        try:
            if constraint.kind == "json_schema":
                schema = json.loads(text)
                if schema is False:
                    raise ValueError("the schema false allows no value")
                options = {"whitespace_flexible": False, "item_separator": JSON_SEPARATORS[0],
                           "key_separator": JSON_SEPARATORS[1]}
                lark = "start: %json " + json.dumps({**(schema if schema is not True else {}), "x-guidance": options})
                grammars = [{"lark_grammar": lark}]
            else:
                spec = llg.grammar_from("regex" if constraint.kind == "regex" else "grammar", text)
                grammars = json.loads(spec)["grammars"] if spec.startswith("{") else [{"lark_grammar": spec}]
        except ValueError as e:
            raise InvalidArgument(f"the {constraint.label} does not compile: {e}") from None
        for grammar in grammars:
            grammar["lark_grammar"] = '%llguidance {"no_forcing": true}\n' + grammar["lark_grammar"]
        matcher = llg.LLMatcher(self.lltokenizer, json.dumps({"grammars": grammars}), log_level=0)
        if matcher.is_error():
            raise InvalidArgument(f"the {constraint.label} does not compile: {matcher.get_error()}")
        return matcher


class LLGuidanceMatcher:
    """A walk through an llguidance matcher. After a token the grammar refused, or an end of
    generation, nothing is allowed (llguidance would allow the ends again; XGrammar nothing)."""

    def __init__(self, matcher, vocab: int, ends: frozenset[int]):
        self._matcher, self._words, self._ends = matcher, -(-vocab // 32), ends
        self._ended = False

    def mask(self) -> np.ndarray:
        if self._ended or self._matcher.is_error():
            return np.zeros(self._words, np.uint32)
        return np.frombuffer(self._matcher.compute_bitmask(), np.uint32)[: self._words]

    def advance(self, token: int) -> None:
        self._ended = self._ended or token in self._ends
        self._matcher.consume_token(token)


@dataclass
class _Vocabulary:
    """What llguidance.TokenizerWrapper reads from a tokenizer: token bytes, ids, encode(bytes)."""
    tokens: list[bytes]
    eos_token_id: int | None
    bos_token_id: int | None
    encode: object

    def __call__(self, text: bytes) -> list[int]:
        return self.encode(text)
