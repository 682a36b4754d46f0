"""Byte-level BPE merges in Rust, through the HF `tokenizers` library where it is installed.

cera.tokenizer is pure Python so that it runs in Pyodide, and it stays the oracle. Natively its
merge loop is the slow part (it grows with the square of a word's length below 48 symbols), so
only that loop moves here: llama.cpp's special-token partition and cera's pre-tokenizer split stay
in Python, each distinct word is spelled in the byte alphabet as the pure path spells it (lone
surrogates included), and `tokenizers`' BPE model merges it, lowest rank first, leftmost on ties,
as llama.cpp does. The model is called alone, a word at a time: a whole Encoding (offsets,
token strings) costs more than the merging. HF's own regex pre-tokenizers are not used:
Oniguruma's Unicode tables (16.0 in tokenizers 0.23.3) class 4,382 code points that llama.cpp's
(15.1) leave unassigned, and the Python split serves every `tokenizer.ggml.pre` cera knows.

The glue is hand-written because a GGUF holds a vocabulary (tokens, merges), not a
tokenizer.json. Byte symbols that are not tokens (SmolLM2 has no 0x04 nor 0xC0) stay in place
in llama.cpp, keeping their neighbours apart, and give no id: here they become a sentinel
"unknown" token that no merge names, dropped from the ids. `FastBPE.build` returns None, so
that vocabulary keeps the pure path, where the library cannot reproduce llama.cpp:
- `tokenizers` is not installed (Pyodide);
- a merge names a byte symbol that is not a token (HF cannot merge its sentinel);
- a merge of two tokens makes a text that is not a token (HF refuses it; llama.cpp applies it
  and spells the result byte by byte).
SentencePiece vocabularies never come here: llama.cpp merges the pair whose token scores
highest, ties (equal scores, or one token reached by two splits, (ab, a) and (a, ba) in
"ab a ba") to the leftmost pair, an order that HF's ranks, one per pair, cannot express.
"""
from __future__ import annotations

from cera.pretokenize import BYTE_CHARS

_UNKNOWN = "<byte symbol not in the vocabulary>"   # spaces: no word (byte alphabet) is this text


def bpe_tokenizer(token_to_id: dict[str, int], merges: list[str], ignore_merges: bool):
    """A `tokenizers.Tokenizer` doing llama.cpp's byte-level BPE of one word already spelled in
    the byte alphabet (no pre-tokenizer), or None where it cannot (the module's docstring).

    merges: "left right" as tokenizer.ggml.merges lists them, by rank; of a merge listed twice
    the first counts, as in llama.cpp (HF would keep the last).
    ignore_merges: a whole word that is a token is taken as is (the same flag in both).
    """
    try:
        import tokenizers
        from tokenizers import models
    except ImportError:
        return None
    # Symbols are byte symbols and what merges make of them, so none holds a space (the byte
    # alphabet has none) and, once every merge of two tokens makes a token, every symbol is a
    # token or an unknown byte symbol: a merge naming anything else never applies.
    try:   # a token that is not UTF-8 (a corrupt file's, kept as surrogates) is no str to tokenizers
        "".join(token_to_id).encode("utf-8")
    except UnicodeEncodeError:
        return None
    unknown = {ch for ch in BYTE_CHARS if ch not in token_to_id}
    pairs = [tuple(p) for p in (text.split(" ") for text in dict.fromkeys(merges)) if len(p) == 2]
    if unknown and any(a in unknown or b in unknown for a, b in pairs):
        return None
    pairs = [(a, b) for a, b in pairs if a in token_to_id and b in token_to_id]
    if any(a + b not in token_to_id for a, b in pairs):
        return None
    vocab = {**token_to_id, _UNKNOWN: max(token_to_id.values()) + 1}
    return tokenizers.Tokenizer(models.BPE(vocab, pairs, unk_token=_UNKNOWN, ignore_merges=ignore_merges))


class FastBPE:
    """The byte-level BPE of one vocabulary in `tokenizers`: spelled words in, ids out."""

    def __init__(self, hf):
        self._tokenize = hf.model.tokenize
        self._unknown = hf.token_to_id(_UNKNOWN)

    @classmethod
    def build(cls, token_to_id: dict[str, int], merges: list[str],
              ignore_merges: bool) -> FastBPE | None:
        """None where `tokenizers` cannot reproduce llama.cpp (see bpe_tokenizer)."""
        hf = bpe_tokenizer(token_to_id, merges, ignore_merges)
        return None if hf is None else cls(hf)

    def merge(self, word: str) -> list[int]:
        """The ids of one word spelled in the byte alphabet."""
        ids = [t.id for t in self._tokenize(word)]
        return [i for i in ids if i != self._unknown] if self._unknown in ids else ids
