"""WordPiece (`tokenizer.ggml.model` "bert"), as llama.cpp's WPM tokenizer splits and matches.

A text fragment becomes words (`words`): each code point is replaced by the first code point
of its NFD decomposition (llama.cpp's NFD table keeps one: "é" -> "e", so precomposed accents
go while a combining mark already in the text stays) and lowercased (the first code point of
its lowercase); whitespace ends a word; NUL, U+FFFD and control characters (category C*, not
unassigned ones) are dropped; punctuation, ASCII symbols and CJK ideographs are words of
their own. Each word, prefixed with "▁" (llama.cpp's converted vocabularies mark word starts
with U+2581 where BERT's own spell continuations "##"), is matched greedily, longest vocabulary
entry first, from its start (`match_word`); a word with a position no entry matches is [UNK].

Pure Python and stdlib only: it runs in Pyodide too.
"""
from __future__ import annotations

import unicodedata

WORD_START = "\u2581"
# llama.cpp's whitespace set (unicode.cpp), the same as cera.pretokenize's
_WHITESPACE = frozenset([*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                         0x2028, 0x2029, 0x202F, 0x205F, 0x3000])
# the CJK ideograph ranges of llama.cpp's is_chinese_char (0x2B920, as HF's code has it)
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _own_word(ch: str, cp: int, category: str) -> bool:
    """Punctuation, an ASCII symbol or a CJK ideograph: a word by itself."""
    return category[0] == "P" or (cp < 0x7F and category[0] == "S") or any(a <= cp <= b for a, b in _CJK)


def words(text: str) -> list[str]:
    """A text fragment's words, normalised (lowercase, first code point of NFD)."""
    out, word = [], []
    for ch in text:
        if len(ch) == 1 and ord(ch) not in _WHITESPACE:
            ch = unicodedata.normalize("NFD", ch)[0]
        cp = ord(ch)
        if cp in _WHITESPACE:
            if word:
                out.append("".join(word))
                word = []
            continue
        category = unicodedata.category(ch)
        if cp in (0, 0xFFFD) or (category[0] == "C" and category != "Cn") or category[0] == "M":
            continue
        low = ch.lower()[0]
        if _own_word(ch, cp, category):
            if word:
                out.append("".join(word))
                word = []
            out.append(low)
        else:
            word.append(low)
    if word:
        out.append("".join(word))
    return out


def match_word(word: str, token_to_id: dict, longest: int, unk_id: int) -> list[int]:
    """The ids of "▁" + word, greedy longest match from the left (entries of at most `longest`
    characters); [UNK] alone when some position matches nothing."""
    word = WORD_START + word
    ids, i, n = [], 0, len(word)
    while i < n:
        for j in range(min(n, i + longest), i, -1):
            tid = token_to_id.get(word[i:j])
            if tid is not None:
                ids.append(tid)
                i = j
                break
        else:
            return [unk_id]
    return ids
