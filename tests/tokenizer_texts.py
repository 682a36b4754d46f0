"""Seeded texts for tokenizer tests and scripts/bench_tokenize.py: `mixed` (prose, code, CJK,
other scripts, numbers and emoji in runs), and two hostile ones, `run` (one pre-token of random
Han characters) and `random` (random code points of every plane). TEXTS[kind](n_chars, seed).
"""
from __future__ import annotations

import argparse
import heapq
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def mixed_text(n_chars: int, seed: int = 0) -> str:
    """n_chars of prose, code, CJK, other scripts, numbers and emoji, in seeded runs."""
    rng = random.Random(seed)
    prose = (ROOT / "tests" / "data" / "text" / "python_docs_execmodel_import.txt").read_text(encoding="utf-8")
    code = "\n".join(Path(m.__file__).read_text(encoding="utf-8") for m in (argparse, heapq, json.decoder, random))

    def excerpt(source: str, n: int) -> str:
        at = rng.randrange(len(source) - n)
        return source[at:at + n]

    def words(alphabets, n: int, sep=" ") -> str:
        out = []
        while sum(map(len, out)) < n:
            lo, hi = rng.choice(alphabets)
            out.append("".join(chr(rng.randrange(lo, hi)) for _ in range(rng.randrange(1, 9))))
        return sep.join(out)[:n]

    def cjk(n: int) -> str:
        text = words([(0x4E00, 0x9FFF), (0x3041, 0x3097), (0x30A1, 0x30FB), (0xAC00, 0xD7A4)], n, "")
        return "".join(ch + rng.choice("，。、！？") if rng.random() < 0.1 else ch for ch in text)

    def numbers(n: int) -> str:
        forms = (lambda: str(rng.randrange(10 ** rng.randrange(1, 12))),
                 lambda: f"{rng.uniform(-1e4, 1e4):.{rng.randrange(1, 7)}f}",
                 lambda: f"{rng.randrange(1900, 2100)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}",
                 lambda: f"${rng.randrange(1, 10**6):,}.{rng.randrange(100):02d}",
                 lambda: hex(rng.getrandbits(32)), lambda: f"{rng.random():.3e}")
        return " ".join(rng.choice(forms)() for _ in range(n // 6))[:n]

    def emoji(n: int) -> str:
        forms = (lambda: chr(rng.randrange(0x1F300, 0x1F650)),
                 lambda: chr(rng.randrange(0x1F466, 0x1F46A)) + chr(rng.randrange(0x1F3FB, 0x1F400)),
                 lambda: "\u200d".join(chr(rng.randrange(0x1F466, 0x1F46A)) for _ in range(3)),
                 lambda: "".join(chr(0x1F1E6 + rng.randrange(26)) for _ in range(2)),
                 lambda: chr(rng.randrange(0x1F900, 0x1FA00)) + " ")
        out = ""
        while len(out) < n:
            out += rng.choice(forms)()
        return out[:n]

    kinds = ((0.35, lambda n: excerpt(prose, n)), (0.25, lambda n: excerpt(code, n)), (0.15, cjk),
             (0.10, lambda n: words([(0x391, 0x3CA), (0x410, 0x450), (0x621, 0x64B), (0x905, 0x93A)], n)),
             (0.10, numbers), (0.05, emoji))
    runs, total = [], 0
    while total < n_chars:
        make = rng.choices([k for _, k in kinds], [w for w, _ in kinds])[0]
        runs.append(make(rng.randrange(100, 2000)) + rng.choice(("\n", "\n\n", " ")))
        total += len(runs[-1])
    return "".join(runs)[:n_chars]


TEXTS = {
    "mixed": mixed_text,
    "run": lambda n, seed=0: "".join(chr(c) for c in random.Random(seed).choices(range(0x4E00, 0xA000), k=n)),
    "random": lambda n, seed=0: "".join(chr(c) for c in random.Random(seed).choices(
        [*range(0x20, 0xD800), *range(0xE000, 0x110000)], k=n)),
}
