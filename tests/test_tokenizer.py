"""cera.tokenizer against llama.cpp, the oracle.

- llama.cpp's own tokenizer test cases (`models/ggml-vocab-*.gguf.inp/.out`, checked
  there with add_special=False, parse_special=False) for every vocabulary in
  tests/data/tokenizer/;
- llama.cpp's tokenization and detokenization of longer passages and seeded random
  strings, with and without special tokens (llamacpp_golden.json, made by
  tests/data/tokenizer/make_testdata.py with llama-cpp-python 0.3.36), plus the golden files
  of the model tests (SmolLM2, the synthetic vocabulary) when present;
- HF `tokenizers` built from the same vocab and merges with the equivalent
  pre-tokenizer;
- the fast path (byte-level BPE in `tokenizers`, cera.fast_tokenizer) against the pure one,
  the oracle: the same ids on every vocabulary here, over the golden texts, long and
  mixed-script passages, seeded random strings and texts full of special tokens;
- decode round trips, streaming UTF-8, flags and ids, speed.
"""
from __future__ import annotations

import json
import lzma
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

from cera import fast_tokenizer, pretokenize
from cera.errors import Unsupported
from cera.pretokenize import BYTE_CHARS
from cera.tokenizer import CONTROL, UNKNOWN, USER_DEFINED, Tokenizer
from tokenizer_texts import TEXTS

DATA = Path(__file__).parent / "data"
TOK = DATA / "tokenizer"
GOLDEN = json.loads((TOK / "llamacpp_golden.json").read_text(encoding="utf-8"))
VOCABS = ["gpt-2", "llama-bpe", "qwen2", "llama-spm", "phi-3", "starcoder", "mpt", "deepseek-coder"]
VOCABS += ["bert-bge"]   # WordPiece
SEP = "\n__ggml_vocab_test__\n"
# optional: the unpacked llama-cpp-python sdist's vendor/llama.cpp/models, for more vocabularies
SDIST_MODELS = os.environ.get("CERA_LLAMA_CPP_MODELS")


def _read_metadata(path: Path) -> dict:
    try:
        from cera.gguf_file import GGUFFile
    except ImportError:   # the PyPI gguf reader: slower, same values
        import gguf
        reader = gguf.GGUFReader(path)
        return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    return dict(GGUFFile.open(path).metadata)


@pytest.fixture(scope="session")
def vocab_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vocab")


@lru_cache(maxsize=None)
def _metadata(name: str, tmp: Path) -> dict:
    xz = TOK / ("smollm2-vocab.gguf.xz" if name == "smollm2" else f"ggml-vocab-{name}.gguf.xz")
    path = tmp / xz.name[:-3]
    path.write_bytes(lzma.decompress(xz.read_bytes()))
    return _read_metadata(path)


def _synth_metadata() -> dict:
    """The synthetic models' tiny vocabulary (tests/synth.py)."""
    import synth
    tokens, types, merges = synth.tokenizer_vocab()
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": synth.BOS_ID,
            "tokenizer.ggml.eos_token_id": synth.EOS_ID, "tokenizer.ggml.padding_token_id": synth.PAD_ID,
            "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": False}


@lru_cache(maxsize=None)
def _tokenizer(name: str, tmp: Path, fast: bool) -> Tokenizer:
    if name == "qwen35":   # the qwen2 vocabulary under pre "qwen35", as llama.cpp's test file
        return Tokenizer.from_metadata({**_metadata("qwen2", tmp), "tokenizer.ggml.pre": "qwen35"}, fast)
    if name == "synth":
        return Tokenizer.from_metadata(_synth_metadata(), fast)
    return Tokenizer.from_metadata(_metadata(name, tmp), fast)


@pytest.fixture(scope="session")
def vocab(vocab_dir):
    """name -> its Tokenizer; fast=False: the pure path even where `tokenizers` is installed."""
    return lambda name, fast=True: _tokenizer(name, vocab_dir, fast)


def _cases(inp: Path) -> list[tuple[str, list[int]]]:
    """llama.cpp's .inp/.out pairs (tests/test-tokenizer-0.cpp's read_tests)."""
    raw = inp.read_bytes().decode("utf-8")
    texts = raw.split(SEP)
    if raw.endswith(SEP):
        texts.pop()
    lines = inp.with_suffix(".out").read_bytes().decode("utf-8").split("\n")
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines)]


def _mismatches(tok: Tokenizer, cases, add_special=False, parse_special=False) -> list[str]:
    bad = []
    for text, want in cases:
        got = tok.encode(text, add_special=add_special, parse_special=parse_special)
        if got != want:
            bad.append(f"{text[:60]!r}: got {got[:16]} want {want[:16]}")
    return bad


# ---- llama.cpp's tokenizer test vocabularies ---------------------------------------

@pytest.mark.parametrize("name", VOCABS + ["qwen35"])
def test_llamacpp_vocab_cases(vocab, name):
    cases = _cases(TOK / f"ggml-vocab-{name}.gguf.inp")
    assert len(cases) >= 46
    bad = _mismatches(vocab(name), cases)
    assert not bad, f"{len(bad)}/{len(cases)} differ:\n" + "\n".join(bad[:5])


@pytest.fixture(scope="module")
def sdist_models() -> Path:
    """llama.cpp's models/ folder: $CERA_LLAMA_CPP_MODELS, else the vocabularies taken once
    from the llama-cpp-python 0.3.36 sdist on PyPI (76 MB) into the cera cache."""
    if SDIST_MODELS:
        return Path(SDIST_MODELS)
    from cera.catalogue import cache_dir
    folder = cache_dir().parent / "llama-cpp-python-0.3.36-vocabs"
    if not (folder / "done").exists():
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                            "--dest", tmp, "llama-cpp-python==0.3.36"], check=True)
            with tarfile.open(next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))) as tar:
                for member in tar.getmembers():
                    if "/vendor/llama.cpp/models/ggml-vocab-" in member.name and member.isfile():
                        member.name = Path(member.name).name
                        tar.extract(member, folder)
        (folder / "done").touch()
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("name", ["falcon", "refact", "command-r", "qwen35"])
def test_llamacpp_vocab_cases_from_sdist(sdist_models, name):
    """The larger vocabularies of llama.cpp's own test cases (from the llama-cpp-python sdist, a
    76 MB download; test_llamacpp_vocab_cases runs the same cases on the committed vocabularies)."""
    path = sdist_models / f"ggml-vocab-{name}.gguf"
    tok = Tokenizer.from_metadata(_read_metadata(path))
    cases = _cases(path.with_suffix(".gguf.inp"))
    bad = _mismatches(tok, cases)
    assert not bad, f"{len(bad)}/{len(cases)} differ:\n" + "\n".join(bad[:5])


# ---- llama.cpp's tokenization of passages and random strings -------------------------

@pytest.mark.parametrize("name", list(GOLDEN["vocabs"]))
def test_llamacpp_golden(vocab, name):
    tok, want = vocab(name), GOLDEN["vocabs"][name]
    none = lambda i: None if i == -1 else i    # llama.cpp's LLAMA_TOKEN_NULL
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (none(want["bos_id"]), none(want["eos_id"]), want["add_bos"])
    assert sorted(tok.eog_ids) == want["eog_ids"]
    bad = []
    for key, case in want["cases"].items():
        text = GOLDEN["texts"][key]
        got = {"special": tok.encode(text, add_special=True, parse_special=True),
               "plain": tok.encode(text, add_special=False, parse_special=False),
               "decode": tok.decode(case["special"]),
               "decode_special": tok.decode(case["special"], special=True)}
        bad += [f"{key} {what}: got {got[what]!r:.120} want {case[what]!r:.120}"
                for what in got if got[what] != case[what]]
    assert not bad, "\n".join(bad[:8])


@pytest.mark.parametrize("name", ["smollm2", pytest.param("qwen2.5-coder", marks=pytest.mark.slow),
                                  pytest.param("gemma-3-270m", marks=pytest.mark.slow),
                                  pytest.param("qwen2.5-coder-0.5b", marks=pytest.mark.slow)])
def test_model_golden(vocab, name):
    """The model tests' golden files: llama.cpp's tokens for the real models' passages and
    for the perplexity text (SmolLM2 from its committed vocabulary, the others from the
    catalogue's model file; Gemma's is SentencePiece without a space prefix)."""
    from cera import catalogue
    from golden import REAL_MODELS
    golden = json.loads((DATA / "golden" / f"{name}.json").read_text(encoding="utf-8"))
    if name == "smollm2":
        tok = vocab("smollm2")
    else:
        tok = Tokenizer.from_metadata(_read_metadata(catalogue.fetch(REAL_MODELS[name])))
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (golden["bos_id"], golden["eos_id"], golden["add_bos"])
    # those files' eog_ids are picked by token text; llama.cpp's set can hold more
    # (SmolLM2: <reponame>, id 4, the FIM repo token), as test_llamacpp_golden checks
    assert set(golden["eog_ids"]) <= tok.eog_ids
    for case in golden["tokenization"]:
        assert tok.encode(case["text"], case["add_bos"], case["special"]) == case["ids"], case["name"]
    ppl = golden["perplexity"]
    text = (Path(__file__).parents[1] / ppl["text_file"]).read_text(encoding="utf-8")
    ids = tok.encode(text, ppl["add_bos"], ppl["special"])
    assert len(ids) == ppl["text_tokens"] and ids[:len(ppl["tokens"])] == ppl["tokens"]


def test_synth_vocab_golden(vocab):
    """The synthetic models' tiny vocabulary (tests/synth.py) against llama.cpp."""
    files = sorted((DATA / "golden").glob("synth_*.json"))
    assert files, "no tests/data/golden/synth_*.json"
    tok = vocab("synth")
    seen = 0
    for f in files:
        for case in json.loads(f.read_text(encoding="utf-8")).get("tokenization", []):
            got = tok.encode(case["text"], case["add_bos"], case["special"])
            assert got == case["ids"], (f.name, case["name"])
            seen += 1
    assert seen


# ---- HF tokenizers, same vocabulary, equivalent pre-tokenizer -------------------------

_HF_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_HF_QWEN2 = _HF_LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")


def _hf_tokenizer(tok: Tokenizer, meta: dict):
    """The fast path's BPE model (cera.fast_tokenizer) behind HF's own pre-tokenizers: checks
    cera's split against HF's regexes (on text whose code points Unicode 15.1 assigns)."""
    from tokenizers import Regex, pre_tokenizers
    pre = tok.pre
    hf = fast_tokenizer.bpe_tokenizer(tok.token_to_id, meta["tokenizer.ggml.merges"], pre == "llama-bpe")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    gpt2_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    seq, split = pre_tokenizers.Sequence, pre_tokenizers.Split
    hf.pre_tokenizer = {
        "gpt-2": gpt2_level,
        "llama-bpe": seq([split(Regex(_HF_LLAMA3), "isolated"), byte_level]),
        "qwen2": seq([split(Regex(_HF_QWEN2), "isolated"), byte_level]),
        "smollm": seq([pre_tokenizers.Digits(individual_digits=True), gpt2_level]),
    }[pre]
    return hf


def _passages() -> list[str]:
    """Long texts without special or user-defined token texts."""
    texts = [GOLDEN["texts"][k] for k in ("prose", "code", "numbers", "unicode", "emoji", "whitespace",
                                          "contractions")]
    texts.append((DATA / "text" / "python_docs_execmodel_import.txt").read_text(encoding="utf-8")[:6000])
    texts.append("".join(texts))
    texts.append("   \n\n \t  x  \n" * 40 + "9" * 50 + " " * 300 + "end")
    return texts


@pytest.mark.parametrize("name", ["gpt-2", "llama-bpe", "qwen2", "smollm2"])
def test_hf_tokenizers(vocab, vocab_dir, name):
    tok = vocab(name)
    hf = _hf_tokenizer(tok, _metadata(name, vocab_dir))
    for text in _passages():
        want = hf.encode(text, add_special_tokens=False).ids
        assert tok.encode(text, add_special=False, parse_special=False) == want, text[:80]


# ---- the fast path against the pure one ----------------------------------------------

BPE_VOCABS = ["gpt-2", "llama-bpe", "qwen2", "qwen35", "starcoder", "mpt", "deepseek-coder", "smollm2", "synth"]
_FLAGS = [(True, True), (False, False), (True, False), (False, True)]    # add_special, parse_special


def _random_texts(seed: int, n: int) -> list[str]:
    """Seeded random strings: ASCII (contractions, digit and whitespace runs), Latin-1, the BMP,
    astral planes, Unicode 16 code points (unassigned in llama.cpp's 15.1 tables), joiners, the
    control bytes SmolLM2's vocabulary lacks, lone surrogates."""
    rng = random.Random(seed)
    snippets = ["'s", "'T", "'re", "'VE", "'ll", "  ", "\n\n", "\r\n", " \t", "\u3000", "12345", "\u200d",
                "\x04", "\x06", "\u1c89", "\U000105c0", "e\u0301", "\ud800", "\udfff"]
    ranges = [(0x20, 0x7F), (0, 0x20), (0x80, 0x100), (0x100, 0xD800), (0xE000, 0x10000), (0x10000, 0x110000)]
    texts = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randrange(1, 120)):
            kind = rng.choices(range(len(ranges) + 1), [50, 5, 8, 15, 5, 7, 10])[0]
            if kind == len(ranges):
                parts.append(rng.choice(snippets))
            else:
                parts.append(chr(rng.randrange(*ranges[kind])))
        texts.append("".join(parts))
    return texts


def _special_texts(tok: Tokenizer, seed: int, n: int) -> list[str]:
    """Seeded texts made of the vocabulary's special tokens (control, user-defined, unknown)
    between and inside words, with spaces and newlines around them (LSTRIP, RSTRIP)."""
    rng = random.Random(seed)
    specials = [t for t, a in zip(tok.tokens, tok.attrs) if a & (CONTROL | USER_DEFINED | UNKNOWN)]
    specials = rng.sample(specials, min(len(specials), 60))
    words = GOLDEN["texts"]["prose"].split() + _random_texts(seed, 20)
    fillers = [" ", "\n", " \n ", "", "", "hi", "x'll"]
    return ["".join(rng.choice((rng.choice(specials), rng.choice(words), rng.choice(fillers)))
                    for _ in range(rng.randrange(1, 40))) for _ in range(n)]


def _bench_text(kind: str, n_chars: int) -> str:
    """One of the benchmark's texts (tests/tokenizer_texts.py, scripts/bench_tokenize.py's: mixed, run,
    random), n_chars long."""
    return TEXTS[kind](n_chars)


def _assert_same_ids(fast: Tokenizer, pure: Tokenizer, texts, flags=_FLAGS[:2]) -> None:
    assert fast.fast and not pure.fast
    bad = [f"{text[:60]!r} add_special={a} parse_special={p}" for text in texts for a, p in flags
           if fast.encode(text, a, p) != pure.encode(text, a, p)]
    assert not bad, f"{len(bad)} differ:\n" + "\n".join(bad[:5])


@pytest.mark.parametrize("name", BPE_VOCABS)
def test_fast_matches_pure(vocab, name):
    """Every byte-level BPE vocabulary here: the same ids from both paths, on the golden texts,
    llama.cpp's test cases, long and mixed-script passages, random strings and special tokens."""
    fast, pure = vocab(name), vocab(name, fast=False)
    inp = TOK / f"ggml-vocab-{name}.gguf.inp"
    texts = list(GOLDEN["texts"].values()) + _passages() + _random_texts(1, 200)
    texts += [_bench_text("mixed", 50_000), _bench_text("run", 2_000), _bench_text("random", 5_000)]
    texts += [text for text, _ in _cases(inp)] if inp.exists() else []
    _assert_same_ids(fast, pure, texts)
    _assert_same_ids(fast, pure, _special_texts(fast, 2, 30), _FLAGS)


def test_fast_path_where_exact(vocab):
    """Byte-level BPE vocabularies take the fast path; SentencePiece ones keep the pure one (the
    module's docstring says why), as does every vocabulary where `tokenizers` is missing."""
    assert all(vocab(name).fast for name in BPE_VOCABS)
    assert not vocab("llama-spm").fast and not vocab("phi-3").fast
    assert not vocab("smollm2", fast=False).fast


def test_fast_path_without_tokenizers(vocab_dir, monkeypatch):
    """Where `tokenizers` cannot be imported (Pyodide), a vocabulary builds on the pure path."""
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    tok = Tokenizer.from_metadata(_metadata("smollm2", vocab_dir))
    assert not tok.fast and tok.encode("Hello world") == [19556, 905]


def _byte_vocab(tokens: list[str], merges: list[str], drop: tuple[int, ...] = ()) -> dict:
    """A byte-level vocabulary: the byte symbols but those of `drop`, then `tokens`."""
    symbols = [ch for b, ch in enumerate(BYTE_CHARS) if b not in drop]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
            "tokenizer.ggml.tokens": symbols + tokens, "tokenizer.ggml.merges": merges}


def test_fast_path_rules():
    """The vocabulary shapes where HF's BPE alone would differ from llama.cpp: reproduced by the
    fast path, or left to the pure one."""
    b = BYTE_CHARS
    e4, b8, ad = b[0xE4], b[0xB8], b[0xAD]                     # 中 is E4 B8 AD; b[0x20] is "Ġ", id 32
    cases = [
        # a byte symbol that is no token keeps its neighbours apart (HF would drop it and merge)
        ("unknown byte", _byte_vocab([e4 + ad], [f"{e4} {ad}"], drop=(0xB8,)), "中 x中", True,
         [0xE3, 0xAD, 32, 120, 0xE3, 0xAD]),                    # E4 is id 0xE3 once B8 is gone
        # of a merge listed twice the first counts (HF would keep the last): "b c" before "a b"
        ("duplicate merge", _byte_vocab(["ab", "bc"], ["b c", "a b", "b c"]), "abc abcbc", True,
         [97, 257, 32, 97, 257, 257]),
        # merges that never apply: a part that is no token, a part with a space
        ("unreachable merges", _byte_vocab(["ab"], ["q zz", "a b c", "a b"]), "abab", True, [256, 256]),
        # a merge naming a byte symbol that is no token: left to the pure path
        ("merge of an unknown byte", _byte_vocab([e4 + b8], [f"{e4} {b8}"], drop=(0xB8,)), "中", False,
         [255, 0xAD]),
        # a merge whose text is no token (llama.cpp spells it byte by byte): the pure path
        ("merge into no token", _byte_vocab([], ["a b"]), "abc ab", False, [97, 98, 99, 32, 97, 98]),
    ]
    for name, meta, text, fast, want in cases:
        tok, pure = Tokenizer.from_metadata(meta), Tokenizer.from_metadata(meta, fast=False)
        assert tok.fast == fast, name
        assert tok.encode(text) == pure.encode(text) == want, name


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mixed", "run", "random"])
def test_fast_matches_pure_megabyte(vocab, kind):
    """The benchmark's texts whole (a million characters; "run" is one word of 3 MB) on SmolLM2;
    test_fast_matches_pure runs shorter ones on every vocabulary."""
    text = _bench_text(kind, 1_000_000)
    assert vocab("smollm2").encode(text) == vocab("smollm2", fast=False).encode(text)


@pytest.mark.slow
def test_fast_matches_pure_sdist(sdist_models):
    """Every byte-level BPE vocabulary of llama.cpp's models/ that cera supports (test_fast_matches_pure
    runs the committed ones): the same ids from both paths on its own test cases and more."""
    seen = []
    for path in sorted(sdist_models.glob("ggml-vocab-*.gguf")):
        meta = _read_metadata(path)
        if meta.get("tokenizer.ggml.model") != "gpt2":
            continue
        try:
            fast, pure = Tokenizer.from_metadata(meta), Tokenizer.from_metadata(meta, fast=False)
        except Unsupported:
            continue
        inp = path.with_suffix(".gguf.inp")
        texts = list(GOLDEN["texts"].values()) + _passages() + _random_texts(3, 200)
        texts += [text for text, _ in _cases(inp)] if inp.exists() else []
        _assert_same_ids(fast, pure, texts)
        _assert_same_ids(fast, pure, _special_texts(fast, 4, 30), _FLAGS)
        seen.append(path.name)
    assert len(seen) >= 12, seen


# ---- the pre-tokenizer ---------------------------------------------------------------

def test_pretokenize_examples():
    text = "Hello  world's 123456 naïve 中文!!\n\n  x"
    assert pretokenize.splitter("gpt-2")(text) == [
        "Hello", " ", " world", "'s", " 123456", " naïve", " 中文", "!!", "\n\n ", " x"]
    assert pretokenize.splitter("llama-bpe")(text) == [
        "Hello", " ", " world", "'s", " ", "123", "456", " naïve", " 中文", "!!\n\n", " ", " x"]
    assert pretokenize.splitter("qwen2")(text)[4:11] == [" ", "1", "2", "3", "4", "5", "6"]
    assert pretokenize.splitter("smollm")(text)[4:11] == [" ", "1", "2", "3", "4", "5", "6"]
    assert pretokenize.splitter("default")("a+=1234;") == ["a", "+=", "123", "4", ";"]
    assert pretokenize.splitter("gpt-2")("") == []


def test_pretokenize_unicode_classes():
    # U+3000 is whitespace, U+00B2 a number, U+0301 a mark; U+1F6DC (Unicode 15) a symbol
    assert pretokenize.splitter("gpt-2")("a\u3000\u3000b ²³ e\u0301 \U0001F6DC\U0001F6DC") == [
        "a", "\u3000", "\u3000", "b", " ²³", " e", "\u0301", " \U0001F6DC\U0001F6DC"]
    # \x1c is not whitespace for llama.cpp (str.isspace says it is)
    assert pretokenize.splitter("gpt-2")("a\x1c\x1cb") == ["a", "\x1c\x1c", "b"]


def test_unsupported_vocabularies():
    base = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "ab"],
            "tokenizer.ggml.merges": ["a b"]}
    with pytest.raises(ValueError, match=r"'deepseek-llm'.*supported: .*llama-bpe.*qwen2.*smollm"):
        Tokenizer.from_metadata({**base, "tokenizer.ggml.pre": "deepseek-llm"})
    with pytest.raises(ValueError, match="'t5'"):
        Tokenizer.from_metadata({**base, "tokenizer.ggml.model": "t5"})
    tok = Tokenizer.from_metadata(base)          # no pre: llama.cpp's 'default'
    assert tok.pre == "default" and tok.encode("abab") == [2, 2]
    assert not tok.add_bos and tok.bos_id is None and tok.eos_id is None   # default 11 is out of range


# ---- ids, flags, special tokens --------------------------------------------------------

def test_flags_and_ids(vocab):
    spm = vocab("llama-spm")
    assert (spm.bos_id, spm.eos_id, spm.unk_id, spm.add_bos, spm.add_eos) == (1, 2, 0, True, False)
    assert spm.encode("Hello")[0] == 1 and spm.encode("Hello", add_special=False)[0] != 1
    assert spm.encode("") == [1] and spm.encode("", add_special=False) == []

    llama3 = vocab("llama-bpe")      # no add_bos_token key: llama.cpp's default for llama3 is True
    assert (llama3.bos_id, llama3.eos_id, llama3.add_bos) == (128000, 128001, True)
    assert llama3.eot_id == 128009 and llama3.token_text(128009) == "<|eot_id|>"
    assert llama3.is_eog(128001) and llama3.is_eog(128009) and not llama3.is_eog(128000)
    assert llama3.vocab_size == 128256

    smol = vocab("smollm2")
    assert (smol.bos_id, smol.eos_id, smol.add_bos, smol.pre) == (1, 2, False, "smollm")
    assert smol.is_eog(2) and smol.is_eog(0) and not smol.is_eog(1)
    assert smol.token_text(None) == "" and smol.token_text(1) == "<|im_start|>"


def test_parse_special(vocab):
    smol = vocab("smollm2")
    text = "<|im_start|>user\nhi<|im_end|>"
    ids = smol.encode(text, add_special=True, parse_special=True)
    assert ids[0] == 1 and ids[-1] == 2 and 1 not in ids[1:-1]
    plain = smol.encode(text, add_special=True, parse_special=False)
    assert 1 not in plain and 2 not in plain
    assert smol.decode(plain) == text == smol.decode(ids, special=True)
    assert smol.decode(ids) == "user\nhi"                      # control tokens render empty


def test_user_defined_always_matched(vocab):
    """USER_DEFINED tokens are cut out even without parse_special (qwen2's [PAD...])."""
    qwen = vocab("qwen2")
    pad = qwen.token_to_id["[PAD151650]"]
    assert pad in qwen.encode("x[PAD151650]y", add_special=False, parse_special=False)
    assert qwen.decode([pad]) == "[PAD151650]"


def test_phi3_rstrip(vocab):
    """Phi-3 special tokens swallow the whitespace after them (llama.cpp's RSTRIP)."""
    phi = vocab("phi-3")
    a = phi.encode("<|user|>\nhi<|end|>\n<|assistant|>", add_special=False)
    b = phi.encode("<|user|>hi<|end|><|assistant|>", add_special=False)
    assert a == b and a[0] == phi.token_to_id["<|user|>"]


# ---- decode ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["qwen2", "smollm2", "llama-spm", "llama-bpe", "gpt-2", "deepseek-coder"])
def test_roundtrip(vocab, name):
    tok = vocab(name)
    for text in _passages() + [GOLDEN["texts"][k] for k in GOLDEN["texts"] if k.startswith("fuzz")]:
        ids = tok.encode(text, add_special=False, parse_special=False)
        stream = tok.detokenizer(special=True)
        streamed = "".join(stream.push(i) for i in ids) + stream.flush()
        if not tok.is_spm:
            assert streamed == text, text[:60]        # pieces, concatenated: the exact text
        if not tok.clean_spaces:
            assert tok.decode(ids, special=True) == text, text[:60]


def test_streaming_utf8_split_across_tokens(vocab):
    spm = vocab("llama-spm")
    ids = spm.encode("a 𝄞 b", add_special=False)        # 𝄞 is four byte-fallback tokens
    byte_tokens = [i for i in ids if spm.token_text(i).startswith("<0x")]
    assert len(byte_tokens) == 4
    stream = spm.detokenizer()
    outs = [stream.push(i) for i in ids]
    assert "".join(outs) + stream.flush() == " a 𝄞 b"
    assert "\ufffd" not in "".join(outs) and outs.count("") >= 3

    gpt2 = vocab("gpt-2")
    ids = gpt2.encode("🙂🎉 ok", add_special=False)
    stream = gpt2.detokenizer()
    outs = [stream.push(i) for i in ids]
    assert "".join(outs) == "🙂🎉 ok" and "" in outs and "\ufffd" not in "".join(outs)


def test_streaming_invalid_and_unfinished_bytes(vocab):
    spm = vocab("llama-spm")
    b = {n: spm.token_to_id[f"<0x{n:02X}>"] for n in (0x80, 0xE4, 0xB8, 0x41)}
    stream = spm.detokenizer()
    assert stream.push(b[0x80]) == "\ufffd"                   # a stray continuation byte
    assert stream.push(b[0xE4]) == "" and stream.push(b[0xB8]) == ""
    assert stream.push(b[0x41]) == "\ufffdA"                  # the unfinished character is dropped
    assert stream.push(b[0xE4]) == "" and stream.flush() == "\ufffd"


def test_decode_special_and_spaces(vocab):
    spm = vocab("llama-spm")
    ids = spm.encode("Hello world")
    assert spm.decode(ids) == " Hello world"         # llama_detokenize: the BOS took the strip
    assert spm.decode(ids[1:]) == "Hello world"
    assert spm.decode(ids, special=True) == "<s> Hello world"
    gpt2 = vocab("gpt-2")                           # clean_spaces: " ," -> ","
    assert gpt2.decode(gpt2.encode("a , b ' c 's", add_special=False)) == "a, b'c's"


# ---- Pyodide --------------------------------------------------------------------------

def test_pure_python():
    """The tokenizer runs in Pyodide: it imports only the stdlib."""
    code = ("import sys, cera.tokenizer; bad = [m for m in sys.modules if m.split('.')[0] in "
            "('numpy', 'regex', 'tokenizers', 'gguf', 'wgpu', 'js')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


_PYODIDE_SCRIPT = r"""
const fs = require("fs");
const [runtime, src, work] = process.argv.slice(2);
const { loadPyodide } = require(runtime + "/pyodide.js");
(async () => {
  const py = await loadPyodide({ indexURL: runtime + "/" });
  py.FS.mkdirTree("/work/cera");
  py.FS.writeFile("/work/cera/__init__.py", "");
  for (const f of ["tokenizer.py", "fast_tokenizer.py", "pretokenize.py", "wordpiece.py", "errors.py"]) py.FS.writeFile("/work/cera/" + f, fs.readFileSync(src + "/" + f));
  for (const f of fs.readdirSync(work)) py.FS.writeFile("/work/" + f, fs.readFileSync(work + "/" + f));
  console.log(py.runPython(`
import json, sys, unicodedata
sys.path.insert(0, "/work")
from cera.tokenizer import Tokenizer
golden, bad, n = json.load(open("/work/golden.json")), [], 0
for name in ("smollm2", "llama-spm", "bert-bge"):
    tok = Tokenizer.from_metadata(json.load(open(f"/work/{name}.json")))
    for key, case in golden["vocabs"][name]["cases"].items():
        text, n = golden["texts"][key], n + 1
        if (tok.encode(text, True, True) != case["special"] or tok.encode(text, False, False) != case["plain"]
                or tok.decode(case["special"]) != case["decode"]):
            bad.append(name + " " + key)
json.dumps({"python": sys.version.split()[0], "unicode": unicodedata.unidata_version, "n": n, "bad": bad})
`));
})();
"""


def test_runs_in_pyodide(vocab_dir, tmp_path):
    """The same golden cases inside Pyodide (its Python and its Unicode tables), under node."""
    from cera_site import fetch   # pyodide_build/cera_site (pytest's pythonpath)
    root = Path(__file__).parents[1]
    runtime = fetch.pyodide_runtime(fetch.default_cache())   # npm install once, sha256-checked
    assert shutil.which("node"), "node is needed to run Pyodide outside the browser"
    work = tmp_path / "work"
    work.mkdir()
    for name in ("smollm2", "llama-spm", "bert-bge"):
        meta = {k: v for k, v in _metadata(name, vocab_dir).items() if k.startswith(("tokenizer.ggml.", "general."))}
        (work / f"{name}.json").write_text(json.dumps(meta), encoding="utf-8")
    shutil.copy(TOK / "llamacpp_golden.json", work / "golden.json")
    script = tmp_path / "run.cjs"
    script.write_text(_PYODIDE_SCRIPT, encoding="utf-8")
    out = subprocess.run(["node", str(script), str(runtime), str(root / "core" / "cera"), str(work)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["n"] == 3 * len(GOLDEN["texts"]) and result["bad"] == [], result
