#!/usr/bin/env python3
"""Tokenizing speed: 1,000,000 characters through the fast and the pure path.

The text is seeded, the same every run. By default it mixes scripts: prose (the Python docs
passage of tests/data/text), code (modules of Python's standard library), CJK (Han, kana,
Hangul), other scripts (Greek, Cyrillic, Arabic, Devanagari), numbers and emoji (skin tones,
ZWJ sequences, flags), in runs of 100 to 2,000 characters. Two hostile texts: --text run, one
pre-token of random Han characters (one word of 3 MB to merge); --text random, random code
points of every plane (a pre-token or two a character, most of them distinct).

Each vocabulary and path runs in a child process of its own, so that its peak memory (the
maximum resident set) is its own: printed whole and above the state before encoding (vocabulary
built, text made). Seconds are wall time, with the process's CPU time beside them (a busy
machine shows in the gap). The parent checks that both paths gave the same ids.

    python scripts/bench_tokenize.py                                  # SmolLM2, both paths
    python scripts/bench_tokenize.py --vocab smollm2 qwen2 llama-bpe --paths fast
    python scripts/bench_tokenize.py --vocab ~/.cache/cera/models/SmolLM2-135M-Instruct.Q4_1.gguf
    python scripts/bench_tokenize.py --text run

A vocabulary is a GGUF file or the name of one of tests/data/tokenizer's vocabularies
(smollm2, gpt-2, llama-bpe, qwen2, starcoder, mpt, deepseek-coder, llama-spm, phi-3).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cera.gguf_file import GGUFFile
from cera.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
VOCABS = ROOT / "tests" / "data" / "tokenizer"
sys.path.insert(0, str(ROOT / "tests"))

from tokenizer_texts import TEXTS  # noqa: E402  (tests/tokenizer_texts.py)


def metadata(vocab: str) -> dict:
    """A GGUF file's metadata, or one of the committed test vocabularies' by name."""
    path = Path(vocab).expanduser()
    if path.exists():
        return dict(GGUFFile.open(path).metadata)
    xz = VOCABS / ("smollm2-vocab.gguf.xz" if vocab == "smollm2" else f"ggml-vocab-{vocab}.gguf.xz")
    if not xz.exists():
        sys.exit(f"no GGUF file {vocab} and no vocabulary {xz.name} in {VOCABS}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / xz.name[:-3]
        path.write_bytes(lzma.decompress(xz.read_bytes()))
        return dict(GGUFFile.open(path).metadata)


def measure(vocab: str, path: str, kind: str, n_chars: int) -> dict:
    """Encode the text once on one path (in this process): seconds, peak memory, ids' digest."""
    tok = Tokenizer.from_metadata(metadata(vocab), fast=path == "fast")
    if path == "fast" and not tok.fast:
        return {"note": "no fast path for this vocabulary (pure Python)"}
    text = TEXTS[kind](n_chars)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start, cpu = time.perf_counter(), time.process_time()
    ids = tok.encode(text)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss                    # KiB on Linux
    return {"chars": len(text), "bytes": len(text.encode("utf-8")), "tokens": len(ids),
            "seconds": seconds, "cpu": cpu, "peak_mib": peak / 1024, "above_mib": (peak - before) / 1024,
            "digest": hashlib.sha256(str(ids).encode()).hexdigest()[:16]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", nargs="+", default=["smollm2"],
                    help="GGUF files or names of tests/data/tokenizer's vocabularies (default: smollm2)")
    ap.add_argument("--paths", nargs="+", choices=("fast", "pure"), default=["fast", "pure"],
                    help="fast: byte-level BPE in `tokenizers`; pure: cera's pure Python (default: both)")
    ap.add_argument("--chars", type=int, default=1_000_000, help="length of the text (default: 1,000,000)")
    ap.add_argument("--text", choices=TEXTS, default="mixed",
                    help="mixed scripts, or a hostile run (one long pre-token) or random code points (default: mixed)")
    ap.add_argument("--child", nargs=2, metavar=("VOCAB", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child, args.text, args.chars)))
        return
    for vocab in args.vocab:
        digests = set()
        for path in args.paths:
            out = subprocess.run([sys.executable, __file__, "--chars", str(args.chars), "--text", args.text,
                                  "--child", vocab, path],
                                 capture_output=True, text=True, check=True)
            r = json.loads(out.stdout)
            if "note" in r:
                print(f"{Path(vocab).name:24} {path}: {r['note']}")
                continue
            digests.add(r["digest"])
            print(f"{Path(vocab).name:24} {path}: {r['chars']:,} characters ({r['bytes']:,} bytes) -> "
                  f"{r['tokens']:,} tokens in {r['seconds']:.2f} s ({r['cpu']:.2f} s CPU), "
                  f"{r['chars'] / r['seconds']:,.0f} "
                  f"characters/s; peak memory {r['peak_mib']:.0f} MiB ({r['above_mib']:+.0f} MiB encoding)")
        if len(digests) > 1:
            sys.exit(f"{vocab}: the paths gave different ids")


if __name__ == "__main__":
    main()
