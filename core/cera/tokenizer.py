"""Tokenizer from the GGUF's own vocabulary, matching llama.cpp's `llama_tokenize`.

Three vocabulary types (`tokenizer.ggml.model`):
- "gpt2": byte-level BPE. The text is split by the pre-tokenizer named in
  `tokenizer.ggml.pre` (see pretokenize.py), each piece is spelled in the GPT-2
  byte alphabet and merged pair by pair, lowest merge rank first.
- "llama": SentencePiece BPE. Spaces become "▁", a space is prefixed to each text
  fragment (add_space_prefix), the highest-scoring adjacent pair that is a token
  is merged first, and characters with no token fall back to "<0xNN>" byte tokens.
- "bert": WordPiece (cera.wordpiece): normalised words matched greedily, longest entry
  first; [CLS] before and [SEP] after the text with add_special.

Special tokens (CONTROL, USER_DEFINED, UNKNOWN) are cut out of the text first,
longest first, as llama.cpp's `tokenizer_st_partition` does; control tokens only
when parse_special is set. Token attributes, special ids, the end-of-generation
set and the add_bos/add_eos defaults follow llama.cpp's `llama_vocab::impl::load`.

Pure Python and stdlib only: this module runs in Pyodide too. Natively, where the `tokenizers`
library is installed, byte-level BPE merges run in Rust instead (cera.fast_tokenizer), to the
same ids; `fast=False` keeps the pure path, the oracle the tests hold the fast one to.
"""
from __future__ import annotations

import codecs
from collections.abc import Callable
import functools
import heapq

from cera.fast_tokenizer import FastBPE
from cera.pretokenize import CHAR_BYTES, byte_encode, splitter
from cera import wordpiece
from cera.errors import BadFile, Unsupported

# token_type values in the GGUF, and llama.cpp's token attribute bits
TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = 1, 2, 3, 4, 5, 6
UNKNOWN, UNUSED, NORMAL, CONTROL, USER_DEFINED, BYTE = 1, 2, 4, 8, 16, 32
LSTRIP, RSTRIP = 128, 256
_ATTR_OF_TYPE = {TYPE_NORMAL: NORMAL, TYPE_UNKNOWN: UNKNOWN, TYPE_CONTROL: CONTROL,
                 TYPE_USER_DEFINED: USER_DEFINED, TYPE_UNUSED: UNUSED, TYPE_BYTE: BYTE}
_SPECIAL = CONTROL | USER_DEFINED | UNKNOWN       # cut out of the text before BPE
_HIDDEN = CONTROL | UNKNOWN                       # rendered empty unless special=True
_SPACES = " \t\n\v\f\r"                           # C isspace, for LSTRIP/RSTRIP

K = "tokenizer.ggml."

# Token texts llama.cpp recognizes when the GGUF does not name the id (in this
# order of preference here; llama.cpp takes whichever its hash map yields first).
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
              "<end_of_utterance>")
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_TEXTS = frozenset(("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",
                        "<|flush|>", "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>",
                        "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
                        "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
                        "<｜end▁of▁sentence｜>", "[e~["))

# Per-pre flags llama.cpp sets beside the regexes: add_bos default, ignore_merges
# (a whole pre-token found in the vocab is taken as is), clean_spaces on decode.
_ADD_BOS_PRE = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                "lfm2", "jina-v5-nano", "tekken", "chameleon"}
_IGNORE_MERGES_PRE = _ADD_BOS_PRE - {"chameleon"} | {"minicpm5", "youtu", "glm4", "glm5",
                                                     "granite-embed-multi-97m"}
_NO_BOS_PRE = {"chatglm-bpe", "glm4", "glm5"}
_KEEP_SPACES_PRE = {"deepseek-llm", "deepseek-coder", "deepseek-v3", "spark2_5", "youtu",
                    "command-r", "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "qwen35",
                    "poro-chat", "viking", "tekken", "smollm", "chameleon", "gpt-4o", "llama4",
                    "kanana2", "talkie", "granite-embed-multi-97m", "tiny_aya", "cohere2moe",
                    "superbpe", "trillion", "granite-docling", "bailingmoe", "bailingmoe2",
                    "llada-moe", "seed-coder", "hunyuan", "hunyuan-dense", "hy_v4", "joyai-llm",
                    "kimi-k2", "ufakzeka", "grok-2", "afmoe", "laguna", "minimax-m2",
                    "solar-open", "sarvam-moe"}


def merge_pairs(parts: list[str], priority: Callable[[str, str], float | None]) -> list[str]:
    """Merge adjacent parts, the pair of lowest priority(left, right) first and the leftmost on
    ties (llama.cpp's queue order); a pair whose priority is None never merges. A heap of pairs
    over a linked list of the parts: a popped pair whose joined length changed is stale (parts
    only grow), as is one whose left part was merged away."""
    n = len(parts)
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    heap: list = []

    def push(left: int, right: int) -> None:
        if left >= 0 and right >= 0:
            p = priority(parts[left], parts[right])
            if p is not None:
                heapq.heappush(heap, (p, left, len(parts[left]) + len(parts[right])))

    for i in range(n - 1):
        push(i, i + 1)
    while heap:
        _, left, size = heapq.heappop(heap)
        right = nxt[left]
        if not parts[left] or right < 0 or len(parts[left]) + len(parts[right]) != size:
            continue
        parts[left], parts[right] = parts[left] + parts[right], ""
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prv[nxt[right]] = left
        push(prv[left], left)
        push(left, nxt[left])
    return [p for p in parts if p]


class Tokenizer:
    """A GGUF vocabulary: encode text to ids, decode ids to text."""

    def __init__(self, meta: dict, fast: bool = True):
        model = meta.get(K + "model")
        if model not in ("gpt2", "llama", "bert"):
            raise Unsupported(f"unsupported tokenizer.ggml.model={model!r:.80}; supported: 'gpt2' "
                             "(byte-level BPE), 'llama' (SentencePiece), 'bert' (WordPiece)")
        tokens = meta.get(K + "tokens")
        if not tokens:
            raise BadFile("GGUF has no tokenizer.ggml.tokens")
        _check_vocabulary(meta)
        self.model, self.is_spm, self.is_wpm = model, model == "llama", model == "bert"
        self.pre = meta.get(K + "pre") or "default"   # absent: llama.cpp warns, uses 'default'
        n = len(tokens)
        self.tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.token_to_id = {t: i for i, t in enumerate(self.tokens)}   # a duplicate: the last id
        types = meta.get(K + "token_type")
        self.attrs = [_ATTR_OF_TYPE.get(t, 0) for t in types] if types else [NORMAL] * n
        scores = meta.get(K + "scores")
        self.scores = [float(s) for s in scores] if scores else [0.0] * n

        default_ids = self._model_defaults(meta)
        self._ids = self._special_ids(meta, default_ids)
        self._find_special_tokens(meta)

        # byte fallback tokens (SPM) and the special tokens cut out first, longest first
        find = self.token_to_id.get
        self._byte_ids = [find(f"<0x{b:02X}>", find(chr(b)) if b < 0x80 else None) for b in range(256)]
        special = [i for i in range(n) if self.attrs[i] & _SPECIAL]
        special.sort(key=lambda i: (-len(self.tokens[i].encode("utf-8", "surrogatepass")), i))
        self._special = [(self.tokens[i], i, self.attrs[i]) for i in special]
        self._pieces: dict[int, bytes] = {}    # token_to_piece(special=True), filled on use
        self._cache: dict[str, tuple[int, ...]] = {}
        self._fast = (FastBPE.build(self.token_to_id, meta[K + "merges"], self._ignore_merges)
                      if fast and not self.is_spm and not self.is_wpm else None)    # None: the pure path
        self._longest = max(map(len, self.tokens)) if self.is_wpm else 0   # WordPiece: longest entry

    def _model_defaults(self, meta: dict) -> dict:
        """Flags per vocabulary type and pre-tokenizer, then the GGUF's flag keys; the
        default special ids."""
        self.add_sep = False
        if self.is_spm:
            self.add_space_prefix, self.clean_spaces = True, False
            self.add_bos, self.add_eos = True, False
            self._ignore_merges = False
            ids = {"bos": 1, "eos": 2, "unk": 0}
        elif self.is_wpm:   # [CLS] is BOS; [SEP] follows the text (llama.cpp's "bert" defaults)
            self.add_space_prefix, self.clean_spaces = False, True
            self.add_bos, self.add_eos, self.add_sep = True, False, True
            self._ignore_merges = False
            ids = {"bos": 101, "eos": None, "unk": 100, "sep": 102, "pad": 0, "mask": 103}
        else:
            self._split = splitter(self.pre)
            self.add_space_prefix = False
            self.clean_spaces = self.pre not in _KEEP_SPACES_PRE
            self.add_bos, self.add_eos = self.pre in _ADD_BOS_PRE, False
            self._ignore_merges = self.pre in _IGNORE_MERGES_PRE
            ids = {"bos": None if self.pre in _NO_BOS_PRE else 11, "eos": 11}
            merges = meta.get(K + "merges")
            if merges is None:
                raise BadFile("byte-level BPE vocabulary without tokenizer.ggml.merges")
            # "left right" -> rank; the first of duplicate merges wins. Looked up as
            # left + " " + right: byte-level tokens hold no spaces, so this is llama.cpp's
            # split at the first space after the first character.
            self._ranks = dict(zip(reversed(merges), range(len(merges) - 1, -1, -1)))
        self.add_space_prefix = bool(meta.get(K + "add_space_prefix", self.add_space_prefix))
        self.add_bos = bool(meta.get(K + "add_bos_token", self.add_bos))
        self.add_eos = bool(meta.get(K + "add_eos_token", self.add_eos))
        self.add_sep = bool(meta.get(K + "add_sep_token", self.add_sep))
        return ids

    def _special_ids(self, meta: dict, defaults: dict) -> dict:
        """Defaults (dropped when out of range), then the GGUF's *_token_id keys."""
        n = len(self.tokens)
        ids = {k: (v if v is not None and v < n else None) for k, v in defaults.items()}
        for name, key in (("bos", "bos"), ("eos", "eos"), ("eot", "eot"), ("eom", "eom"),
                          ("unk", "unknown"), ("sep", "seperator"), ("pad", "padding"),
                          ("mask", "mask"), ("fim_pre", "fim_pre"), ("fim_suf", "fim_suf"),
                          ("fim_mid", "fim_mid"), ("fim_pad", "fim_pad"), ("fim_rep", "fim_rep"),
                          ("fim_sep", "fim_sep"), ("fim_pre", "prefix"), ("fim_suf", "suffix"),
                          ("fim_mid", "middle")):   # the last three: deprecated key names
            v = meta.get(f"{K}{key}_token_id")
            if isinstance(v, int) and 0 <= v < n:
                ids[name] = int(v)
        return ids

    @classmethod
    def from_metadata(cls, meta: dict, fast: bool = True) -> "Tokenizer":
        """Build from a GGUF metadata dict (keys verbatim: "tokenizer.ggml.tokens", ...)."""
        return cls(meta, fast)

    # ---- vocabulary facts ------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    bos_id = property(lambda self: self._ids.get("bos"))
    eos_id = property(lambda self: self._ids.get("eos"))
    eot_id = property(lambda self: self._ids.get("eot"))
    unk_id = property(lambda self: self._ids.get("unk"))

    @property
    def fast(self) -> bool:
        """True where byte-level BPE merges run in `tokenizers` (cera.fast_tokenizer)."""
        return self._fast is not None

    def is_eog(self, token_id: int) -> bool:
        """True for tokens that end generation (EOS, EOT, <|im_end|>, ...)."""
        return token_id in self.eog_ids

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """The most bytes of text one token can stand for: its entry's UTF-8 length bounds it
        (byte-level symbols, "▁" and <0xNN> entries are as long as what they stand for, or longer),
        so a text of b bytes is at least b / max_token_bytes tokens."""
        return max(len(t.encode("utf-8", "surrogatepass")) for t in self.tokens)

    def token_text(self, token_id: int | None) -> str:
        """The token's entry in the vocabulary ("" for None), e.g. "<s>" or "Ġthe"."""
        return "" if token_id is None else self.tokens[token_id]

    def _find_special_tokens(self, meta: dict) -> None:
        """llama.cpp's text-based detection of EOT/EOM/FIM tokens and the EOG set."""
        ids, attrs, find = self._ids, self.attrs, self.token_to_id.get
        if ids.get("eot") is None:
            for text in _EOT_TEXTS:
                if text in self.token_to_id:
                    ids["eot"] = find(text)
                    attrs[ids["eot"]] |= CONTROL
                    break
        if ids.get("eom") is None and "<|eom_id|>" in self.token_to_id:
            ids["eom"] = find("<|eom_id|>")
            attrs[ids["eom"]] |= CONTROL
        for name, texts in _FIM_TEXTS.items():
            if ids.get(name) is None:
                found = [find(t) for t in texts if t in self.token_to_id]
                if found:
                    ids[name] = found[0]
                    attrs[found[0]] |= CONTROL
        eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids.get(k) is not None}
        for text in _EOG_TEXTS:
            if text in self.token_to_id:
                eog.add(find(text))
                attrs[find(text)] |= CONTROL
        for text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):  # gpt-oss
            if text in self.token_to_id:
                attrs[find(text)] = USER_DEFINED
        for k in ("eos", "eot", "eom"):
            if ids.get(k) is not None:
                eog.add(ids[k])
        texts = {self.tokens[i]: i for i in eog}
        if "<|end|>" in texts and ({"<|return|>", "<|call|>"} <= texts.keys() or
                                   {"<|calls|>", "<|flush|>"} <= texts.keys()):
            eog.discard(texts["<|end|>"])                  # o200k_harmony / solar-open
            attrs[texts["<|end|>"]] = USER_DEFINED
        if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
            eog.discard(texts["</s>"])                     # gemma4, plamo: a normal </s>
            attrs[texts["</s>"]] = NORMAL
        self.eog_ids = frozenset(eog)

        # per-model strip attributes of special tokens
        name = str(meta.get("general.name", "")).lower()
        arch = str(meta.get("general.architecture", ""))
        pre = str(meta.get(K + "pre", ""))
        if (any(p in pre for p in ("jina-v2-de", "jina-v2-es", "jina-v2-code"))
                or any(a in arch for a in ("nomic-bert-moe", "jina-bert-v3"))):
            if "<mask>" in self.token_to_id:
                attrs[find("<mask>")] |= LSTRIP
        elif "phi-3" in name or "phi3" in name:
            for i, a in enumerate(attrs):
                if a & _SPECIAL:
                    attrs[i] |= RSTRIP
            for text, on in (("</s>", True), ("<unk>", False), ("<s>", False),
                             ("<|endoftext|>", False)):
                if text in self.token_to_id:
                    i = find(text)
                    attrs[i] = attrs[i] | RSTRIP if on else attrs[i] & ~RSTRIP
        elif "modern-bert" in name and "[MASK]" in self.token_to_id:
            attrs[find("[MASK]")] |= LSTRIP

    # ---- encode ----------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text`, as llama.cpp's llama_tokenize(text, add_special, parse_special).

        add_special adds BOS (and EOS) where the vocabulary asks for them;
        parse_special lets control tokens written in the text ("<|im_end|>") become
        their ids. User-defined tokens are always matched.
        """
        out: list[int] = []
        if add_special and self.add_bos:
            if self.bos_id is None:
                raise BadFile("the vocabulary asks for a BOS token but has none")
            out.append(self.bos_id)
        prev_special = True
        for frag in self._partition(text, parse_special):
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
            elif self.is_wpm:
                for word in wordpiece.words(frag):
                    out += wordpiece.match_word(word, self.token_to_id, self._longest, self.unk_id)
            elif self.is_spm:
                if self.add_space_prefix and prev_special:
                    frag = " " + frag
                self._encode_spm(frag.replace(" ", "▁"), out)
                prev_special = False
            elif self._fast is not None:
                out += self._encode_words(self._split(frag))
            else:
                for word in self._split(frag):
                    out.extend(self._encode_word(byte_encode(word)))
        if add_special and self.add_eos:
            if self.eos_id is None:
                raise BadFile("the vocabulary asks for an EOS token but has none")
            out.append(self.eos_id)
        if add_special and self.add_sep:
            if self._ids.get("sep") is None:
                raise BadFile("the vocabulary asks for a separator token but has none")
            out.append(self._ids["sep"])
        return out

    def _partition(self, text: str, parse_special: bool) -> list:
        """Cut special tokens out of the text: a list of str fragments and int ids."""
        frags: list = [text] if text else []
        for tok, tid, attr in self._special:
            if not parse_special and attr & _HIDDEN:
                continue
            if tok not in text:
                continue
            out = []
            for frag in frags:
                if isinstance(frag, int) or tok not in frag:
                    out.append(frag)
                    continue
                pos = 0
                while True:
                    at = frag.find(tok, pos)
                    if at < 0:
                        break
                    left = frag[pos:at]
                    if attr & LSTRIP:
                        left = left.rstrip(_SPACES)
                    if left:
                        out.append(left)
                    out.append(tid)
                    pos = at + len(tok)
                    if attr & RSTRIP:
                        while pos < len(frag) and frag[pos] in _SPACES:
                            pos += 1
                if pos < len(frag):
                    out.append(frag[pos:])
            frags = out
        return frags

    def _encode_words(self, words: list[str]) -> list[int]:
        """The fast path's byte-level BPE: each distinct word spelled and merged once, in
        `tokenizers` (a text repeats most of its words)."""
        table = dict.fromkeys(words)
        for word in table:
            table[word] = self._fast.merge(byte_encode(word))
        return [i for word in words for i in table[word]]

    def _encode_word(self, word: str) -> tuple[int, ...]:
        """Byte-level BPE of one pre-token (already in the byte alphabet), cached."""
        ids = self._cache.get(word)
        if ids is not None:
            return ids
        whole = self.token_to_id.get(word) if self._ignore_merges else None
        if whole is not None:
            ids = (whole,)
        else:
            parts = self._merge(word) if len(word) > 1 else [word]
            ids = []
            for part in parts:
                tid = self.token_to_id.get(part)
                if tid is not None:
                    ids.append(tid)
                else:   # llama.cpp looks each byte of the part up alone; most are absent
                    for b in part.encode("utf-8"):
                        tid = self.token_to_id.get(chr(b)) if b < 0x80 else None
                        if tid is not None:
                            ids.append(tid)
            ids = tuple(ids)
        if len(self._cache) > 200_000:
            self._cache.clear()
        self._cache[word] = ids
        return ids

    def _merge(self, word: str) -> list[str]:
        """Apply merges, lowest rank first, the leftmost pair on ties (llama.cpp's queue order)."""
        ranks = self._ranks
        parts = list(word)
        if len(parts) > 48:
            return merge_pairs(parts, lambda left, right: ranks.get(left + " " + right))
        while len(parts) > 1:
            best, best_rank = -1, 1 << 62
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + " " + parts[i + 1])
                if r is not None and r < best_rank:
                    best, best_rank = i, r
            if best < 0:
                break
            parts[best:best + 2] = [parts[best] + parts[best + 1]]
        return parts

    def _encode_spm(self, text: str, out: list[int]) -> None:
        """SentencePiece BPE of one fragment (spaces already "▁"): highest score first."""
        find, scores = self.token_to_id.get, self.scores

        def priority(left: str, right: str) -> float | None:
            tid = find(left + right)
            return None if tid is None else -scores[tid]

        for piece in merge_pairs(list(text), priority) if text else []:
            tid = find(piece)
            if tid is not None:
                out.append(tid)
            else:
                for b in piece.encode("utf-8", "surrogatepass"):
                    bid = self._byte_ids[b]
                    if bid is None:
                        raise BadFile(f"no byte token <0x{b:02X}> in the vocabulary")
                    out.append(bid)

    # ---- decode ----------------------------------------------------------------------

    def _piece(self, token_id: int) -> bytes:
        """The bytes a token stands for when shown (llama.cpp's token_to_piece, special=True)."""
        text, attr = self.tokens[token_id], self.attrs[token_id]
        if attr & (_HIDDEN | USER_DEFINED):
            return text.encode("utf-8", "surrogatepass")
        if attr & NORMAL:
            if self.is_spm or self.is_wpm:
                return text.replace("▁", " ").encode("utf-8", "surrogatepass")
            out = bytearray()
            for ch in text:
                b = CHAR_BYTES.get(ch)
                if b is not None:
                    out.append(b)
                else:   # not in the byte alphabet: llama.cpp writes this marker
                    out += (f"[UNK_BYTE_0x{ch.encode('utf-8', 'surrogatepass').hex()}"
                            f"{text}]").encode("utf-8", "surrogatepass")
            return bytes(out)
        if attr & BYTE:
            return bytes([int(text[3:5], 16)])
        return b""          # unused / undefined types

    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """One token's bytes; control and unknown tokens are empty unless `special`."""
        if not special and self.attrs[token_id] & _HIDDEN:
            return b""
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = self._piece(token_id)
        return piece

    def decode_bytes(self, ids, special: bool = False) -> bytes:
        """llama.cpp's llama_detokenize(ids, remove_special=False, unparse_special=special)."""
        out = bytearray()
        lstrip = self.add_space_prefix     # drop one leading space of the first token
        for tid in ids:
            piece = self.token_to_piece(tid, special)
            if lstrip and piece[:1] == b" ":
                piece = piece[1:]
            lstrip = False
            out += piece
        return _clean_spaces(out) if self.clean_spaces else bytes(out)

    def decode(self, ids, special: bool = False) -> str:
        """Text of a token sequence; invalid UTF-8 becomes U+FFFD."""
        return self.decode_bytes(ids, special).decode("utf-8", "replace")

    def detokenizer(self, special: bool = False) -> "Detokenizer":
        """A streaming decoder for generated tokens."""
        return Detokenizer(self, special)


def _check_vocabulary(meta: dict) -> None:
    """Refuse vocabulary arrays of the wrong type or length before anything indexes them (a corrupt
    header's). A GGUF array holds values of one type: its first speaks for all."""
    n = None
    for name, kind, what in (("tokens", str, "strings"), ("merges", str, "strings"),
                             ("token_type", int, "integers"), ("scores", (int, float), "numbers")):
        value = meta.get(K + name)
        if value is None or value == []:
            continue
        if not isinstance(value, list) or not isinstance(value[0], kind):
            raise BadFile(f"{K}{name} is not a list of {what}")
        if name == "tokens":
            n = len(value)
        elif name != "merges" and len(value) != n:
            raise BadFile(f"{K}{name} has {len(value)} entries for {n} tokens")
    if not isinstance(meta.get(K + "pre", ""), str):
        raise BadFile(f"{K}pre is a {type(meta[K + 'pre']).__name__}, not a name")


class Detokenizer:
    """Streaming decode: push(id) returns the text completed so far, never half a
    UTF-8 character; flush() returns what is left. Pieces are llama.cpp's per-token
    token_to_piece (no leading-space strip, no clean-up), as its examples print them."""

    def __init__(self, tokenizer: Tokenizer, special: bool = False):
        self.tokenizer, self.special = tokenizer, special
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self.tokenizer.token_to_piece(token_id, self.special))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


def _clean_spaces(text: bytearray) -> bytes:
    """llama.cpp's clean_up_tokenization_spaces passes over detokenized bytes."""
    t = bytearray(text)
    sp, q = ord(" "), ord("'")
    # pass 1: " ?", " !", " .", " ," lose the space
    n, total = len(t), 1 if t else 0
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == sp and x in b"?!.,":
            total -= 1
        t[total] = x
        total += 1
    # pass 2: " ' " becomes "'"
    n, total, i = total, 1 if total else 0, 1
    while i < n:
        x = t[i]
        if x == q and i + 1 < n and t[i - 1] == sp and t[i + 1] == sp:
            total -= 1
            i += 1
            t[i] = 0
        t[total] = x
        total += 1
        i += 1
    # pass 3: " 's", " 'm", " 're", " 've" lose the space
    n, total = total, 1 if total else 0
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == sp and x == q and i + 1 < n:
            x1 = t[i + 1]
            if x1 in b"sm":
                total -= 1
            elif x1 not in b"td" and i + 2 < n and (x1, t[i + 2]) in ((ord("r"), ord("e")),
                                                                        (ord("v"), ord("e"))):
                total -= 1
        t[total] = x
        total += 1
    return bytes(t[:total])
