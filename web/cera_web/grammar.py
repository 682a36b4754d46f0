"""Constrained output in the page: cera.constrain's `Grammars` over XGrammar in WebAssembly.

Natively cera runs llguidance (cera.constrain.LLGuidance), which has no WebAssembly build; the
page runs XGrammar (@mlc-ai/web-xgrammar, the grammar engine WebLLM uses) through web/grammar.js's
GrammarHost, set up so that the two accept the same language and a seeded constrained reply is the
same token for token:

- the same vocabulary: each token's bytes from cera.constrain.token_bytes (control tokens behind
  a 0xFF, which no text matches), the same end-of-generation tokens, ids past the tokenizer's never
  allowed;
- JSON compact with the separators ", " and ": " (XGrammar: no indent, any_whitespace off),
  properties beyond the schema's allowed as llguidance allows them (XGrammar's strict mode off);
  XGrammar's grammar for the schema is then edited where it reads JSON otherwise: llguidance's
  string characters and escapes, and llguidance's own digit patterns for integer and number
  ranges (grammar.js says how);
- a regex through XGrammar's regex converter, a grammar in GBNF (XGrammar reads no Lark).

tests/test_grammar_parity.py holds the two to the same masks step by step, and its DIFFERENT lists
what still differs; the largest: llguidance narrows text the grammar forces to its canonical
tokens unless compiled with `no_forcing`, which XGrammar cannot do.
"""
from __future__ import annotations

import weakref
from collections import OrderedDict

import numpy as np

from cera.constrain import JSON_SEPARATORS, Constraint, token_bytes
from cera.errors import InvalidArgument
from cera.tokenizer import Tokenizer
from pyodide.ffi import JsException, to_js

_COMPILED = 64   # compiled grammars kept (LLGuidance keeps as many)


class XGrammar:
    """cera.constrain.Grammars in the page: `host` a GrammarHost (web/grammar.js) made over the
    model's vocabulary (`XGrammar.load`). Compiled grammars are kept, the least recently used
    freed past _COMPILED; each generation gets a fresh matcher of one."""

    def __init__(self, host, vocab: int):
        self._host, self._words = host, -(-vocab // 32)
        self._compiled: OrderedDict[Constraint, int] = OrderedDict()   # constraint -> the host's id

    @classmethod
    async def load(cls, grammar_host, tokenizer: Tokenizer, vocab: int) -> "XGrammar":
        """`grammar_host`: the GrammarHost class (its create() starts XGrammar: a few hundred ms)."""
        pieces = token_bytes(tokenizer, vocab)
        ends = np.cumsum([len(p) for p in pieces], dtype=np.uint32)
        host = await grammar_host.create(to_js(b"".join(pieces)), to_js(memoryview(ends)), vocab,
                                         to_js(sorted(tokenizer.eog_ids)), to_js(list(JSON_SEPARATORS)))
        return cls(host, vocab)

    def matcher(self, constraint: Constraint) -> "XGrammarMatcher":
        return XGrammarMatcher(self._host, self._host.matcher(self._compile(constraint)), self._words)

    def _compile(self, constraint: Constraint) -> int:
        if constraint in self._compiled:
            self._compiled.move_to_end(constraint)
            return self._compiled[constraint]
        try:
            compiled = self._host.compile(constraint.kind, constraint.source)
        except JsException as err:   # a CeraError InvalidArgument, with XGrammar's message
            raise InvalidArgument(str(getattr(err, "message", err))) from None
        self._compiled[constraint] = compiled
        if len(self._compiled) > _COMPILED:
            self._host.free(self._compiled.popitem(last=False)[1])   # its matchers hold their own reference
        return compiled


class XGrammarMatcher:
    """One generation's walk (cera.constrain.Matcher): a matcher in the GrammarHost, freed with this."""

    def __init__(self, host, matcher: int, words: int):
        self._host, self._id, self._words = host, matcher, words
        self._refused = False   # a token the grammar refused came: nothing is allowed after it (as llguidance)
        weakref.finalize(self, host.free, matcher)

    def mask(self) -> np.ndarray:
        words = np.zeros(self._words, np.uint32)
        if not self._refused:
            self._host.mask(self._id).assign_to(words)   # one call; the words copied once, from JS
        return words

    def advance(self, token: int) -> None:
        self._refused = self._refused or not self._host.accept(self._id, token)
