"""Pre-tokenizer splits for byte-level BPE, as llama.cpp applies them.

llama.cpp splits text before BPE with a list of regexes per `tokenizer.ggml.pre`
(`llm_tokenizer_bpe` in its `src/llama-vocab.cpp`), applied one after another:
each regex splits every piece the previous one left, and both its matches and
the text between them become pieces (`unicode_regex_split` in `src/unicode.cpp`).
The patterns use `\\p{L}`, `\\p{N}`, ... which the stdlib `re` lacks, and this
module must run in Pyodide without the `regex` package. So, like llama.cpp's own
std::regex fallback, the text is first *collapsed*: every non-ASCII code point is
replaced by one marker character for its class (letter, number, mark,
punctuation, symbol, other) or by "\\v" when it is whitespace, keeping the length.
The patterns are then written with ASCII classes plus those markers and run with
the stdlib `re` on the collapsed text; offsets map back 1:1 to the original.

The classes are llama.cpp's: Unicode general categories (its tables are Unicode
15.1; code points Python's `unicodedata` does not know yet are patched below) and
its own whitespace set (`\\s`), which is Unicode White_Space, not `str.isspace`.
For the GPT-2, Llama-3 and Qwen2 patterns llama.cpp runs hand-written splitters
(`unicode_regex_split_custom_*`); they implement exactly the regex semantics used
here (checked against llama.cpp's tokenizer test vocabularies and HF tokenizers).
"""
from __future__ import annotations

import re
import unicodedata
from cera.errors import Unsupported

# ---- code point classes -------------------------------------------------------

# Non-ASCII White_Space code points (the ASCII ones are \t \n \v \f \r and space).
_WHITESPACE = frozenset([0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029,
                         0x202F, 0x205F, 0x3000])

# Marker characters standing for a non-ASCII code point of each class in the
# collapsed text (private-use code points: every non-ASCII input is replaced, so
# a private-use character in the input cannot be mistaken for a marker).
OTHER, LETTER, NUMBER, MARK, PUNCT, SYMBOL = "\ue000", "\ue001", "\ue002", "\ue003", "\ue004", "\ue005"
_CATEGORY_MARKER = {"L": LETTER, "N": NUMBER, "M": MARK, "P": PUNCT, "S": SYMBOL}

# Code points assigned in Unicode 15.0/15.1 (llama.cpp's tables) that Python
# 3.11's unicodedata (Unicode 14) reports as unassigned: (first, last, class).
_UNICODE_15 = (
    (0x0CF3, 0x0CF3, MARK), (0x0ECE, 0x0ECE, MARK), (0x2FFC, 0x2FFF, SYMBOL),
    (0x31EF, 0x31EF, SYMBOL), (0x10EFD, 0x10EFF, MARK), (0x1123F, 0x11240, LETTER),
    (0x11241, 0x11241, MARK), (0x11B00, 0x11B09, PUNCT), (0x11F00, 0x11F01, MARK),
    (0x11F02, 0x11F02, LETTER), (0x11F03, 0x11F03, MARK), (0x11F04, 0x11F10, LETTER),
    (0x11F12, 0x11F33, LETTER), (0x11F34, 0x11F3A, MARK), (0x11F3E, 0x11F42, MARK),
    (0x11F43, 0x11F4F, PUNCT), (0x11F50, 0x11F59, NUMBER), (0x1342F, 0x1342F, LETTER),
    (0x13439, 0x1343F, OTHER), (0x13440, 0x13440, MARK), (0x13441, 0x13446, LETTER),
    (0x13447, 0x13455, MARK), (0x1B132, 0x1B132, LETTER), (0x1B155, 0x1B155, LETTER),
    (0x1D2C0, 0x1D2D3, NUMBER), (0x1DF25, 0x1DF2A, LETTER), (0x1E030, 0x1E06D, LETTER),
    (0x1E08F, 0x1E08F, MARK), (0x1E4D0, 0x1E4EB, LETTER), (0x1E4EC, 0x1E4EF, MARK),
    (0x1E4F0, 0x1E4F9, NUMBER), (0x1F6DC, 0x1F6DC, SYMBOL), (0x1F774, 0x1F776, SYMBOL),
    (0x1F77B, 0x1F77F, SYMBOL), (0x1F7D9, 0x1F7D9, SYMBOL), (0x1FA75, 0x1FA77, SYMBOL),
    (0x1FA87, 0x1FA88, SYMBOL), (0x1FAAD, 0x1FAAF, SYMBOL), (0x1FABB, 0x1FABD, SYMBOL),
    (0x1FABF, 0x1FABF, SYMBOL), (0x1FACE, 0x1FACF, SYMBOL), (0x1FADA, 0x1FADB, SYMBOL),
    (0x1FAE8, 0x1FAE8, SYMBOL), (0x1FAF7, 0x1FAF8, SYMBOL), (0x2B739, 0x2B739, LETTER),
    (0x2EBF0, 0x2EE5D, LETTER), (0x31350, 0x323AF, LETTER),
)


def _marker(cp: int) -> str:
    """The collapsed stand-in for one non-ASCII code point."""
    if cp in _WHITESPACE:
        return "\v"
    cat = unicodedata.category(chr(cp))
    if cat == "Cn":
        for first, last, marker in _UNICODE_15:
            if first <= cp <= last:
                return marker
    return _CATEGORY_MARKER.get(cat[0], OTHER)   # C* (control, format, private, surrogate), unassigned


class _Collapser:
    """str.translate table from non-ASCII code points to markers, filled on demand."""

    def __init__(self):
        self.table: dict[int, str] = {}
        self.raw_table: dict[int, str] = {}   # whitespace -> "\v" only, others unchanged

    def _learn(self, text: str) -> None:
        for ch in set(text):
            cp = ord(ch)
            if cp >= 128 and cp not in self.table:
                self.table[cp] = m = _marker(cp)
                if m == "\v":
                    self.raw_table[cp] = m

    def collapse(self, text: str) -> str:
        if text.isascii():
            return text
        self._learn(text)
        return text.translate(self.table)

    def raw(self, text: str) -> str:
        """The text itself with non-ASCII whitespace as "\\v" (llama.cpp's std::wregex path)."""
        if text.isascii():
            return text
        self._learn(text)
        return text.translate(self.raw_table)


_COLLAPSER = _Collapser()


# ---- the patterns, over collapsed text ------------------------------------------

_L = "A-Za-z" + LETTER
_N = "0-9" + NUMBER
_M = MARK
_P = re.escape("!\"#%&'()*,-./:;?@[\\]_{}") + PUNCT      # \p{P}: ASCII punctuation + marker
_S = re.escape("$+<=>^`|~") + SYMBOL                     # \p{S}
_WS = "\t\n\v\f\r "                                     # \s (non-ASCII whitespace is "\v")
_NOT_WS = f"(?![^{_WS}])"                               # (?!\S)

# 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
GPT2 = (f"'s|'t|'re|'ve|'m|'ll|'d| ?[{_L}]+| ?[{_N}]+| ?[^{_WS}{_L}{_N}]+"
        f"|[{_WS}]+{_NOT_WS}|[{_WS}]+")

_CONTRACTIONS = "'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"


def _llama3_like(digits: str, letters: str, not_other: str) -> str:
    # (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*
    #   |\s*[\r\n]+|\s+(?!\S)|\s+
    return (f"{_CONTRACTIONS}|[^\r\n{_L}{_N}]?[{letters}]+|[{_N}]{digits}| ?[^{_WS}{not_other}]+[\r\n]*"
            f"|[{_WS}]*[\r\n]+|[{_WS}]+{_NOT_WS}|[{_WS}]+")


LLAMA3 = _llama3_like("{1,3}", _L, _L + _N)
QWEN2 = _llama3_like("", _L, _L + _N)                  # digits one by one
QWEN35 = _llama3_like("", _L + _M, _L + _M + _N)       # letter runs take combining marks


def _c(pattern: str) -> tuple[re.Pattern, bool]:
    return re.compile(pattern), True       # True: run on the collapsed text


def _raw(pattern: str) -> tuple[re.Pattern, bool]:
    return re.compile(pattern), False      # False: run on the raw text


_GPT2_STEPS = [_c(GPT2)]
_STARCODER_STEPS = [_c(f"[{_N}]"), _c(GPT2)]
_LLAMA3_STEPS = [_c(LLAMA3)]
_QWEN2_STEPS = [_c(QWEN2)]

# tokenizer.ggml.pre -> the list of splits llama.cpp applies for it.
PRE_TOKENIZERS: dict[str, list] = {
    "default": [_c(f"[{_P}$+<=>^~|]+"), _c(GPT2), _c(f"[{_N}]+"), _c("[0-9][0-9][0-9]")],
    "falcon": [_c(f"[{_P}$+<=>^~|`]+"), _c(GPT2), _c("[0-9][0-9][0-9]")],
    "deepseek-coder": [_raw("[\r\n]"), _c(f"[{_WS}]?[{_L}]+"), _c(f"[{_WS}]?[{_P}]+"),
                       _raw("[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"), _c(f"[{_N}]")],
    "qwen35": [_c(QWEN35)],
}
for _name in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
              "a.x-4.0", "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe",
              "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4"):
    PRE_TOKENIZERS[_name] = _GPT2_STEPS
for _name in ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b",
              "mellum2"):
    PRE_TOKENIZERS[_name] = _STARCODER_STEPS
for _name in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
              "lfm2", "jina-v5-nano", "dbrx", "smaug-bpe", "chatglm-bpe", "glm4", "glm5"):
    PRE_TOKENIZERS[_name] = _LLAMA3_STEPS
for _name in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan",
              "solar-open"):
    PRE_TOKENIZERS[_name] = _QWEN2_STEPS


def splitter(pre: str):
    """The split function for a `tokenizer.ggml.pre` value; ValueError if unsupported."""
    steps = PRE_TOKENIZERS.get(pre)
    if steps is None:
        raise Unsupported(f"unsupported pre-tokenizer tokenizer.ggml.pre={pre!r}; "
                         f"supported: {', '.join(sorted(PRE_TOKENIZERS))}")
    return lambda text: split(text, steps)


def split(text: str, steps) -> list[str]:
    """Apply the splits in order; every match and every gap between matches is a piece."""
    spans = [(0, len(text))] if text else []
    collapsed = raw = None
    for pattern, on_collapsed in steps:
        if on_collapsed:
            subject = collapsed = collapsed if collapsed is not None else _COLLAPSER.collapse(text)
        else:
            subject = raw = raw if raw is not None else _COLLAPSER.raw(text)
        finditer = pattern.finditer
        out = []
        for start, end in spans:
            pos = start
            for m in finditer(subject, start, end):
                s, e = m.span()
                if e == s:
                    continue
                if s > pos:
                    out.append((pos, s))
                out.append((s, e))
                pos = e
            if pos < end:
                out.append((pos, end))
        spans = out
    return [text[s:e] for s, e in spans]


# ---- GPT-2 byte <-> unicode mapping ----------------------------------------------

def _bytes_to_unicode() -> list[str]:
    """Byte b -> the printable character byte-level BPE vocabularies spell it with."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = [""] * 256, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


BYTE_CHARS = _bytes_to_unicode()                          # byte -> char
CHAR_BYTES = {c: b for b, c in enumerate(BYTE_CHARS)}      # char -> byte
_BYTE_TABLE = {b: c for b, c in enumerate(BYTE_CHARS)}     # for str.translate over latin-1


def byte_encode(piece: str) -> str:
    """UTF-8 bytes of a piece spelled in the byte-level alphabet ('Ġ' for a space...)."""
    return piece.encode("utf-8", "surrogatepass").decode("latin-1").translate(_BYTE_TABLE)
