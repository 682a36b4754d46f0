"""A fuzz campaign over what cera reads from strangers: GGUF headers, LoRA adapters, chat templates.

    python tests/fuzz.py --cases 1000000 --seed 0 --kind all --workers 2

Each case is made from (seed, kind, index) alone, so any one can be made again. Kinds:
- headers: mutated headers of the real SmolLM2 file (its tensor data kept behind the header), of
  synthetic models (tests/synth.py) and of SentencePiece and BPE vocabularies (tests/data/tokenizer),
  taken through everything a load does before the GPU: GGUFFile, ModelConfig.from_gguf,
  Tokenizer.from_metadata, and where both hold, Engine.chat_tokens (template lookup, rendering,
  tokenizing) on an engine without a GPU.
- lora: mutated write_lora adapters, read against their base model as Engine.load_lora does.
- templates: hostile Jinja templates, generated and mutated from real ones, through
  Engine.chat_tokens.
Mutations: bit flips, bytes set to 0, 0xFF, 0x7F, 0x80..., chunks duplicated or deleted, the file
cut anywhere, and, knowing the header's layout, counts, types, lengths, shapes, offsets and
numbers set to values that break assumptions (0, 2^32 - 1, 2^64 - 1, the bytes left, NaN...).

Every case must end in a normal result or a typed error (cera.errors): anything else, a hang past
HANG_SECONDS of CPU time included (CPU time: a busy machine's scheduler cannot fake a hang), is
an escape, saved under --out with what makes it again
(`--replay FILE.json`). Per case: wall time (perf_counter) and peak memory (the growth of the
process's peak RSS during the case: Linux's VmHWM, reset before each case). The slowest cases
are run again RERUNS times and their fastest run counts, which a busy machine's scheduler
cannot inflate.
"""
from __future__ import annotations

import argparse
import json
import lzma
import multiprocessing
import os
import random
import signal
import struct
import sys
import tempfile
import time
import traceback
import types
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from cera import catalogue
from cera.config import ModelConfig
from cera.engine import Engine
from cera.errors import CeraError
from cera.gguf_file import GGUFFile
from cera.lora import LoraAdapter
from cera.tokenizer import Tokenizer

sys.path.insert(0, str(Path(__file__).parent))
from synth import CHATML_TEMPLATE, LORA_VARIANTS, write_lora_variant, write_variant  # noqa: E402

KINDS = ("headers", "lora", "templates")
# how each host builds a tokenizer: natively with `tokenizers` where installed (cera.fast_tokenizer),
# in the page (Pyodide has no `tokenizers`) the pure one
HOSTS = {"native": {}, "page": {"fast": False}}
_host: dict = HOSTS["native"]
HANG_SECONDS = 10
RERUNS = 5
DATA = Path(__file__).parent / "data" / "tokenizer"
SMOLLM2 = catalogue.cache_dir() / catalogue.CATALOGUE[catalogue.DEFAULT_MODEL].filename
SYNTH = ("llama_f32", "qwen2_q8_0", "lfm2_q8_0", "gemma2_f32", "gemma3_f32", "granite_f32", "llama_q4_1_tied",
         "phi3_f32")
VOCABS = ("ggml-vocab-llama-spm", "ggml-vocab-phi-3", "ggml-vocab-deepseek-coder")
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there! ¿Qué tal? 你好"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Count to three."}]


# ---- the inputs: header seeds and the source a mutated header is read through --------------

@dataclass
class Seed:
    """A valid file cut in two: its header (mutated per case) and the rest (kept)."""
    name: str
    head: bytes
    tail: object                 # bytes, or a path whose bytes from len(head) on are the rest
    size: int                    # the whole file's
    fields: dict = field(default_factory=dict)   # category -> [(offset, struct format)]
    base: GGUFFile | None = None   # a LoRA adapter's model


class Spliced:
    """A GGUF source: `head`, then the seed's bytes after its header, the whole cut at `size`."""

    def __init__(self, seed: Seed, head: bytes, size: int):
        self.seed, self.head, self.size = seed, head, size
        self._file = open(seed.tail, "rb") if isinstance(seed.tail, (str, Path)) else None

    def read(self, offset: int, n: int) -> bytes:
        end = min(offset + n, self.size)
        if end <= offset:
            return b""
        out = self.head[offset:end]
        if end > len(self.head):    # the rest comes from the seed's tail
            start = max(offset, len(self.head)) - len(self.head) + len(self.seed.head)
            count = end - max(offset, len(self.head))
            if self._file is not None:
                self._file.seek(start)
                out += self._file.read(count)
            else:
                out += self.seed.tail[start:start + count]
        return out

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def field_map(head: bytes) -> dict:
    """Where a valid header keeps its fields: category -> [(offset, struct format)]."""
    fields, pos = defaultdict(list), 4
    number_formats = "BbHhIif?xxQqd"   # by GGUF value type; x: a string or an array

    def take(fmt: str, category: str | None):
        nonlocal pos
        value = struct.unpack_from("<" + fmt, head, pos)[0]
        if category:
            fields[category].append((pos, fmt))
        pos += struct.calcsize(fmt)
        return value

    def string(category: str) -> None:
        nonlocal pos
        n = take("Q", category)
        pos += n

    def value(vtype: int, top: bool) -> None:
        nonlocal pos
        if vtype == 8:
            string("length" if top else "element length")
        elif vtype == 9:
            etype, n = take("I", "type"), take("Q", "count")
            if etype in (8, 9):
                for _ in range(n):
                    value(etype, False)
            else:
                pos += n * struct.calcsize(number_formats[etype])
        else:
            take(number_formats[vtype], "number" if top else None)

    take("I", "version")
    n_tensors, n_kv = take("Q", "count"), take("Q", "count")
    for _ in range(n_kv):
        string("length")
        value(take("I", "type"), True)
    for _ in range(n_tensors):
        string("length")
        for _ in range(take("I", "dims")):
            take("Q", "dim")
        take("I", "ggml type")
        take("Q", "offset")
    return dict(fields)


def _seed_from_file(name: str, path: Path, in_memory: bool) -> Seed:
    g = GGUFFile.open(path)
    g.source.close()
    with open(path, "rb") as f:
        head = f.read(g.data_offset)
        tail = head + f.read() if in_memory else path
    return Seed(name, head, tail, path.stat().st_size, field_map(head))


def _seed_from_bytes(name: str, data: bytes) -> Seed:
    return Seed(name, data, data, len(data), field_map(data))


@dataclass
class Seeds:
    headers: list[Seed]
    loras: list[Seed]
    templates: list[str]
    model: Engine              # a synthetic model's engine for the templates (no GPU)


def make_seeds(folder: Path) -> Seeds:
    headers = [_seed_from_file("SmolLM2", SMOLLM2, False)] if SMOLLM2.exists() else []
    headers += [_seed_from_file(n, write_variant(folder / f"{n}.gguf", n), True) for n in SYNTH]
    headers += [_seed_from_bytes(n, lzma.open(DATA / f"{n}.gguf.xz").read()) for n in VOCABS]
    loras = []
    for name, spec in LORA_VARIANTS.items():
        seed = _seed_from_file(name, write_lora_variant(folder / f"lora_{name}.gguf", name), True)
        seed.base = GGUFFile.open(write_variant(folder / f"{spec['base']}.gguf", spec["base"]))
        loras.append(seed)
    vocab = GGUFFile.open(write_variant(folder / "llama_f32.gguf", "llama_f32"))
    model = Engine(vocab, _NO_GPU, Tokenizer.from_metadata(vocab.metadata, **_host), ModelConfig.from_gguf(vocab))
    templates = [CHATML_TEMPLATE, LLAMA3_TEMPLATE, TOOLS_TEMPLATE] + [
        GGUFFile(Spliced(s, s.head, s.size)).metadata["tokenizer.chat_template"]
        for s in headers if s.name in ("SmolLM2", "ggml-vocab-phi-3")]
    return Seeds(headers, loras, templates, model)


_NO_GPU = types.SimpleNamespace(ctx=4096)   # what Engine.chat_tokens asks of a backend (its context)

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\n' }}{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- endif %}{{- '\n\n# Tools\n<tools>' }}{%- for tool in tools %}{{- '\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\n</tools><|im_end|>\n' }}{%- endif %}{%- for message in messages %}{%- if message.role == 'tool' %}"
    "{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}{%- else %}"
    "{{- '<|im_start|>' + message.role + '\n' + (message.content or '') }}{%- for call in message.tool_calls or [] %}"
    "{{- '\n<tool_call>\n' + call.function | tojson + '\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\n' }}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")


# ---- header mutations ------------------------------------------------------------------------

U64S = (0, 1, 2, 7, 8, 12, 13, 31, 32, 255, 256, 0x7FFF, 0xFFFF, 1 << 16, (1 << 31) - 1, 1 << 31, (1 << 32) - 1,
        1 << 32, 1 << 40, 1 << 48, 1 << 56, (1 << 63) - 1, 1 << 63, (1 << 64) - 1)
BYTES = (0x00, 0x01, 0x7F, 0x80, 0xFF, 0xFE, 0x20, 0x0A, 0x08, 0x09)
FLOATS = (0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1e-45, 3.4e38, -1.0, 0.5)


FIELD_WEIGHTS = {"number": 30, "type": 12, "count": 12, "length": 10, "element length": 10, "dims": 5, "dim": 8,
                 "ggml type": 6, "offset": 5, "version": 2}   # how often each kind of field is picked


def _pick_field(rng: random.Random, seed: Seed) -> tuple[int, str]:
    """(offset, struct format) of a field of the seed's layout."""
    categories = list(seed.fields)
    category = rng.choices(categories, [FIELD_WEIGHTS[c] for c in categories])[0]
    return rng.choice(seed.fields[category])


def _pick_pos(rng: random.Random, seed: Seed, data: bytearray) -> int:
    """A byte to mutate: anywhere in the header, or in or near a field."""
    if rng.random() < 0.5 or not seed.fields:
        return rng.randrange(len(data))
    return min(len(data) - 1, max(0, _pick_field(rng, seed)[0] + rng.randrange(-4, 12)))


def _field_value(rng: random.Random, fmt: str, old, pos: int, seed: Seed, data: bytearray):
    """A value for a field of format `fmt` that breaks an assumption."""
    if fmt in "fd":
        return rng.choice(FLOATS + ((1e300,) if fmt == "d" else ()))
    bits = 8 * struct.calcsize(fmt)
    signed = fmt in "bhiq"
    left = (len(data) - pos, seed.size - pos)
    choice = rng.random()
    if choice < 0.4:
        value = rng.choice(U64S)
    elif choice < 0.6:
        value = rng.choice(left) + rng.randrange(-9, 9)
    elif choice < 0.8 and isinstance(old, int):
        value = rng.choice((old + 1, old - 1, old * 2, old // 2, old + rng.randrange(1, 64), old ^ (1 << rng.randrange(bits))))
    elif fmt == "I":    # a type: every value type and a few beyond
        value = rng.randrange(16) if rng.random() < 0.8 else rng.choice((255, 1 << 31, (1 << 32) - 1))
    else:
        value = rng.getrandbits(bits)
    value %= 1 << bits
    return value - (1 << bits) if signed and value >= 1 << (bits - 1) else value


def mutate_header(rng: random.Random, seed: Seed) -> tuple[bytes, int]:
    """(mutated header, file size) for one case: 1 to 16 stacked mutations."""
    data = bytearray(seed.head)
    size_delta, cut = 0, None
    for _ in range(rng.choice((1,) * 12 + (2, 2, 2, 2, 3, 4, rng.randrange(5, 9), rng.randrange(9, 17)))):
        op = rng.random()
        if op < 0.2:       # bit flips
            for _ in range(rng.randrange(1, 9)):
                data[_pick_pos(rng, seed, data)] ^= 1 << rng.randrange(8)
        elif op < 0.35:    # bytes set to telling values
            for _ in range(rng.randrange(1, 9)):
                data[_pick_pos(rng, seed, data)] = rng.choice(BYTES) if rng.random() < 0.8 else rng.randrange(256)
        elif op < 0.8 and seed.fields:   # a field of the layout set to a breaking value
            pos, fmt = _pick_field(rng, seed)
            if pos + struct.calcsize(fmt) <= len(data):
                old = struct.unpack_from("<" + fmt, data, pos)[0]
                struct.pack_into("<" + fmt, data, pos, _field_value(rng, fmt, old, pos, seed, data))
        elif op < 0.87:    # a chunk duplicated
            a = _pick_pos(rng, seed, data)
            chunk = bytes(data[a:a + rng.choice((1, 4, 8, 12, rng.randrange(1, 256)))])
            b = _pick_pos(rng, seed, data)
            data[b:b] = chunk
            size_delta += len(chunk)
        elif op < 0.94:    # a chunk deleted
            a = _pick_pos(rng, seed, data)
            n = min(len(data) - a - 1, rng.choice((1, 4, 8, 12, rng.randrange(1, 256))))
            del data[a:a + max(n, 0)]
            size_delta -= max(n, 0)
        else:              # the file cut: in its header mostly, else in its tensor data
            cut = rng.randrange(len(data)) if rng.random() < 0.8 else len(data) + rng.randrange(seed.size - len(seed.head) + 1)
    size = seed.size + size_delta
    return bytes(data), size if cut is None else min(cut, size)


# ---- hostile templates -------------------------------------------------------------------------

WIDTHS = ("10**9", "10**6", "2**31", "-1", "-10**9", "100000", "999999999999", "10**100", "80")
ATOMS = ("messages", "messages[0]", "messages[0]['content']", "message", "message.content", "bos_token",
         "'x'", "'ab'", "''", "'{:>1000000000}'", "'%1000000000d'", "'%*d'", "[1, 2, 3]", "{'a': 1}", "range(10)",
         "range(100000)", "10**10", "7", "-1", "none", "true", "loop", "ns", "ns.s", "ns.l", "s", "l0", "l1", "x",
         "'\\udcff'", "'\\x00'")
SUFFIXES = (".__class__", ".__class__.__mro__[1].__subclasses__()", ".__globals__", ".__init__.__globals__",
            ".__dict__", ".mro()", ".__builtins__", "[0]", "['content']", ".items()", ".keys()", ".split()",
            ".upper()", ".ljust({w})", ".center({w})", ".zfill({w})", ".expandtabs({w})", ".replace('', {e})",
            ".replace('x', {e})", ".join({e})", ".format({e})", ".format(x={e})", ".__len__()", ".copy()",
            ".pop()", ".append(1)", ".update({{}})", ".real", ".title()", ".count('')")
FILTERS = ("center({w})", "indent({w})", "indent({w}, true)", "wordwrap({w})", "truncate({w})", "format({e})",
           "join", "join({e})", "replace('', {e})", "list", "string", "tojson", "tojson(indent={w})", "pprint",
           "batch({w})", "batch(3, {e})", "slice({w})", "sum", "sum(start=[])", "map('upper')", "select",
           "unique", "sort", "reverse", "length", "upper", "title", "trim", "int", "float", "round({w})", "first",
           "last", "dictsort", "items", "urlize", "xmlattr", "filesizeformat", "groupby('x')", "random",
           "default({e})", "attr('__class__')", "map(attribute='__class__')", "selectattr('__class__')", "min",
           "max", "abs", "capitalize", "wordcount", "striptags", "escape", "safe", "forceescape", "count")
TEMPLATE_CHARS = 3000
BINOPS = ("*", "**", "+", "-", "%", "~", "//", "/", "in", "==", "and", "or")


def hostile_expr(rng: random.Random, depth: int = 0) -> str:
    """A Jinja expression that multiplies, formats, nests, recurses or reaches for internals."""
    w = lambda: rng.choice(WIDTHS)                       # noqa: E731
    e = lambda: hostile_expr(rng, depth + 1)             # noqa: E731
    if depth > 3 or rng.random() < 0.3:
        return rng.choice(ATOMS)
    pick = rng.random()
    if pick < 0.3:
        return f"({e()} {rng.choice(BINOPS)} {e()})"
    if pick < 0.55:
        return f"{e()} | " + rng.choice(FILTERS).format(w=w(), e=e())
    if pick < 0.75:
        return e() + rng.choice(SUFFIXES).format(w=w(), e=e())
    if pick < 0.85:
        return f"[{', '.join(e() for _ in range(rng.randrange(1, 4)))}]"
    if pick < 0.92:
        return rng.choice(("range({w})", "lipsum({w})", "namespace(s={e})", "dict(a={e})", "cycler({e}).next()",
                           "joiner({e})()", "raise_exception({e})", "m({w})", "caller()")).format(w=w(), e=e())
    return f"({e()} if {e()} else {e()})"


def hostile_block(rng: random.Random, depth: int = 0) -> str:
    """A Jinja statement sequence: loops over huge or nested ranges, macros that recurse, sets that grow."""
    if depth > 6 or rng.random() < 0.25:
        return "{{ " + hostile_expr(rng) + " }}"
    body = lambda: "".join(hostile_block(rng, depth + 1) for _ in range(rng.randrange(1, 3)))   # noqa: E731
    pick = rng.random()
    if pick < 0.25:
        return f"{{% for x in {hostile_expr(rng)} %}}{body()}{{% endfor %}}"
    if pick < 0.35:
        return f"{{% for x in {hostile_expr(rng)} recursive %}}{body()}{{{{ loop(x) }}}}{{% endfor %}}"
    if pick < 0.5:
        return f"{{% if {hostile_expr(rng)} %}}{body()}{{% else %}}{body()}{{% endif %}}"
    if pick < 0.62:
        return f"{{% set ns.{rng.choice('sl')} = {hostile_expr(rng)} %}}{body()}"
    if pick < 0.7:
        return f"{{% set s = {hostile_expr(rng)} %}}{body()}"
    if pick < 0.8:
        return (f"{{% macro m(n) %}}{body()}{{{{ m(n - 1) }}}}{{{{ m(n - 1) }}}}{{% endmacro %}}"
                f"{{{{ m({rng.choice(WIDTHS)}) }}}}")
    if pick < 0.86:
        return f"{{% filter {rng.choice(('upper', 'center(10**9)', 'indent(10**6)', 'trim'))} %}}{body()}{{% endfilter %}}"
    if pick < 0.92:
        return f"{{% call m(1) %}}{body()}{{% endcall %}}"
    return rng.choice(("{% include 'x' %}", "{% extends 'x' %}", "{% import 'x' as y %}", "{% break %}",
                       "{% raw %}{{{% endraw %}", "{# comment #}", "{%- with x = 1 -%}{{ x }}{%- endwith %}"))


def hostile_template(rng: random.Random, seeds: Seeds) -> str:
    """Generated (statements, deep nesting) or a real template mutated character by character, cut at
    TEMPLATE_CHARS (jinja compiles 3 to 8 us a character: a longer template costs its length)."""
    return _hostile_template(rng, seeds)[:TEMPLATE_CHARS]


def _hostile_template(rng: random.Random, seeds: Seeds) -> str:
    pick = rng.random()
    setup = "{% set ns = namespace(s='ab', l=[1]) %}{% set l0 = [1, 2] %}{% set l1 = [l0, l0] %}"
    if pick < 0.45:
        return setup + "".join(hostile_block(rng) for _ in range(rng.randrange(1, 4)))
    if pick < 0.55:   # deep nesting: blocks, parentheses, filters, string doubling
        n = rng.choice((10, 19, 20, 21, 25, 50, 99, 100, 101, 200, 500, 1000))
        return rng.choice((
            "{% for x in [1] %}" * n + "x" + "{% endfor %}" * n,
            "{% if true %}" * n + "x" + "{% endif %}" * n,
            "{{ " + "(" * n + "1" + ")" * n + " }}",
            "{{ 'x'" + " | list" * n + " }}",
            "{{ [" * n + "1" + "]" * n + " }}",
            "{% macro m(n) %}{{ m(n) }}{% endmacro %}{{ m(1) }}",
            setup + f"{{% for i in range({n}) %}}{{% set ns.s = ns.s ~ ns.s %}}{{% endfor %}}{{{{ ns.s | length }}}}",
            setup + f"{{% for i in range({n}) %}}{{% set ns.s = ns.s + ns.s %}}{{% endfor %}}{{{{ ns.s | length }}}}",
            setup + f"{{% for i in range({n}) %}}{{% set ns.l = ns.l + ns.l %}}{{% endfor %}}{{{{ ns.l | length }}}}",
            setup + f"{{% set ns.s = 10**64 %}}{{% for i in range({n}) %}}{{% set ns.s = ns.s * ns.s %}}{{% endfor %}}",
        ))
    text = rng.choice(seeds.templates)
    for _ in range(rng.randrange(1, 6)):   # character-level mutations of a real template
        a, b = sorted(rng.randrange(len(text) + 1) for _ in range(2))
        op = rng.random()
        if op < 0.3:
            text = text[:a] + text[b:]
        elif op < 0.6:
            text = text[:b] + text[a:b] * rng.choice((2, 3, 10)) + text[b:]
        elif op < 0.8:
            text = text[:a] + rng.choice(("{{", "}}", "{%", "%}", "{% for x in range(10**9) %}", "{% endfor %}",
                                          "'", '"', "|", "(", ")", "[", ".__class__", " * 10**10", "\x00",
                                          "\udcff", "{#", "-")) + text[a:]
        else:
            text = text[:a] + hostile_block(rng) + text[a:]
    return text


# ---- one case ----------------------------------------------------------------------------------

def make_case(seeds: Seeds, seed: int, kind: str, index: int):
    """(seed file or None, the input) of case `index`: deterministic in (seed, kind, index)."""
    rng = random.Random(f"{seed}/{kind}/{index}")
    if kind == "templates":
        return None, hostile_template(rng, seeds)
    base = rng.choice(seeds.headers if kind == "headers" else seeds.loras)
    return base, mutate_header(rng, base)


def run_case(seeds: Seeds, base: Seed | None, case) -> str:
    """What a load (or a chat) does with the input, up to the GPU: the outcome's name."""
    if base is None:   # a template, rendered for MESSAGES and tokenized as Engine.chat_tokens does
        seeds.model.gguf = types.SimpleNamespace(metadata={"tokenizer.chat_template": case})
        seeds.model.chat_tokens(MESSAGES)
        return "ok"
    head, size = case
    source = Spliced(base, head, size)
    try:
        g = GGUFFile(source)
        if base.base is not None:
            LoraAdapter.read(g, base.base, "fuzz")
            return "ok"
        outcome, cfg, tok = "ok", None, None
        try:
            cfg = ModelConfig.from_gguf(g)
        except CeraError as err:
            outcome = type(err).__name__
        try:   # a load stops at a bad config; the tokenizer is fuzzed on regardless
            tok = Tokenizer.from_metadata(g.metadata, **_host)
        except CeraError as err:
            outcome = type(err).__name__
        if cfg is not None and tok is not None:
            Engine(g, types.SimpleNamespace(ctx=cfg.context(4096)), tok, cfg).chat_tokens(MESSAGES)
        return outcome
    finally:
        source.close()


class Hang(BaseException):
    """A case still running after HANG_SECONDS of CPU time (BaseException: no `except Exception`
    swallows it)."""


def _on_alarm(signum, frame):
    raise Hang(f"still running after {HANG_SECONDS} s of CPU time")


def _kb(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name):
                return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    """Reset the process's peak RSS (VmHWM) to its RSS now: Linux's clear_refs, where allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure(seeds: Seeds, base, case) -> tuple[str, float, int, str]:
    """(outcome, wall seconds, peak bytes the case added, traceback of an escape or "")."""
    rss = _kb("VmRSS:") if _reset_peak() else None
    signal.setitimer(signal.ITIMER_PROF, HANG_SECONDS)
    t0 = time.perf_counter()
    try:
        outcome, trace = run_case(seeds, base, case), ""
    except CeraError as err:
        outcome, trace = type(err).__name__, ""
    except (Exception, Hang) as err:   # an escape
        outcome, trace = f"ESCAPE {type(err).__name__}", traceback.format_exc(limit=-6)[-3000:]
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
    seconds = time.perf_counter() - t0
    peak = (_kb("VmHWM:") - rss) * 1024 if rss is not None else 0
    return outcome, seconds, max(peak, 0), trace


# ---- the campaign --------------------------------------------------------------------------------

TOP = 12   # slowest cases kept per kind


@dataclass
class Figures:
    """One kind's results."""
    cases: int = 0
    outcomes: dict = field(default_factory=lambda: defaultdict(int))
    escapes: list = field(default_factory=list)      # (index, outcome, seed name)
    slowest: list = field(default_factory=list)      # (seconds, index, seed name), slowest first
    peak: tuple = (0, -1, "")                        # (bytes, index, seed name)

    def add(self, index: int, name: str, outcome: str, seconds: float, peak: int) -> None:
        self.cases += 1
        self.outcomes[outcome.split()[0]] += 1
        if outcome.startswith("ESCAPE"):
            self.escapes.append((index, outcome, name))
        if len(self.slowest) < TOP or seconds > self.slowest[-1][0]:
            self.slowest = sorted(self.slowest + [(seconds, index, name)], reverse=True)[:TOP]
        if peak > self.peak[0]:
            self.peak = (peak, index, name)

    def merge(self, other: "Figures") -> None:
        self.cases += other.cases
        for k, v in other.outcomes.items():
            self.outcomes[k] += v
        self.escapes += other.escapes
        self.slowest = sorted(self.slowest + other.slowest, reverse=True)[:TOP]
        self.peak = max(self.peak, other.peak)


_SEEDS: Seeds | None = None


def seeds() -> Seeds:
    """This process's seeds, made once (workers forked after that share them)."""
    global _SEEDS
    if _SEEDS is None:
        _SEEDS = make_seeds(Path(tempfile.mkdtemp(prefix="cera-fuzz-")))
        signal.signal(signal.SIGPROF, _on_alarm)
    return _SEEDS


def cases_of(kind: str, start: int, stop: int):
    """(kind, index) of cases start..stop-1: `all` takes the kinds in turn."""
    for i in range(start, stop):
        yield (KINDS[i % len(KINDS)] if kind == "all" else kind), i


def run_chunk(args) -> dict:
    """Run cases start..stop-1 of (seed, kind): figures by kind; escapes saved under `out`."""
    seed, kind, start, stop, out = args
    s, figures = seeds(), defaultdict(Figures)
    for k, i in cases_of(kind, start, stop):
        base, case = make_case(s, seed, k, i)
        outcome, seconds, peak, trace = measure(s, base, case)
        name = base.name if base else "generated"
        figures[k].add(i, name, outcome, seconds, peak)
        if trace:
            save_reproducer(out, seed, k, i, name, case, outcome, trace)
    return dict(figures)


def save_reproducer(out: str, seed: int, kind: str, index: int, name: str, case, outcome: str, trace: str) -> None:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"{kind}-{seed}-{index}"
    if kind == "templates":
        stem.with_suffix(".jinja").write_text(case, errors="surrogateescape")
    else:   # the mutated header; the file is it followed by the seed's bytes after its header
        stem.with_suffix(".head").write_bytes(case[0])
    stem.with_suffix(".json").write_text(json.dumps({"seed": seed, "kind": kind, "index": index, "base": name,
                                                     "size": None if kind == "templates" else case[1],
                                                     "outcome": outcome, "traceback": trace}, indent=1))


def rerun_slowest(figures: Figures, seed: int, kind: str, reruns: int) -> list:
    """The slowest cases, each run `reruns` more times: (fastest seconds, index, seed name, the
    fastest of as many loads of that seed unmutated or None), slowest first."""
    s, timed = seeds(), []
    by_name = {b.name: b for b in s.headers + s.loras}
    for _, index, name in figures.slowest:
        base, case = make_case(s, seed, kind, index)
        fastest = min(measure(s, base, case)[1] for _ in range(reruns))
        unmutated = (min(measure(s, by_name[name], (by_name[name].head, by_name[name].size))[1] for _ in range(reruns))
                     if name in by_name else None)
        timed.append((fastest, index, name, unmutated))
    return sorted(timed, reverse=True)


@dataclass
class Report:
    by_kind: dict            # kind -> Figures
    slowest: dict            # kind -> [(fastest of reruns, index, seed name)]
    seconds: float

    @property
    def escapes(self) -> list:
        return [(k, *e) for k, f in self.by_kind.items() for e in f.escapes]

    def slowest_case(self) -> tuple:
        """(seconds, kind, index, seed name) of the slowest case, its fastest rerun."""
        return max((t[0], k, t[1], t[2]) for k, ts in self.slowest.items() for t in ts[:1])

    def slowest_over_unmutated(self) -> float:
        """The most any of the slowest cases costs over its seed file unmutated (headers, adapters)."""
        return max((t[0] / t[3] for ts in self.slowest.values() for t in ts if t[3]), default=0.0)

    def peak(self) -> tuple:
        """(bytes, kind, index, seed name) of the case that added most to peak memory."""
        return max((f.peak[0], k, f.peak[1], f.peak[2]) for k, f in self.by_kind.items())

    def print(self, out=sys.stdout) -> None:
        total = sum(f.cases for f in self.by_kind.values())
        load = os.getloadavg()[0]
        print(f"{total} cases in {self.seconds:.0f} s ({load:.1f} load average now); escapes: {len(self.escapes)}",
              file=out)
        for k, f in sorted(self.by_kind.items()):
            first = self.slowest[k][0]
            print(f"{k:9s} {f.cases:8d} cases, {len(f.escapes)} escapes; outcomes "
                  + ", ".join(f"{n} {c}" for n, c in sorted(f.outcomes.items(), key=lambda x: -x[1])), file=out)
            seed_file = f", {first[3] * 1e3:.1f} ms unmutated" if first[3] else ""
            print(f"{'':9s} slowest case {first[1]} ({first[2]}{seed_file}): {first[0] * 1e3:.1f} ms, the fastest "
                  f"of {RERUNS} reruns (slowest first run: {f.slowest[0][0] * 1e3:.1f} ms); peak memory "
                  f"+{f.peak[0] / 2**20:.1f} MiB, case {f.peak[1]} ({f.peak[2]})", file=out)
        if self.slowest_over_unmutated():
            print(f"the slowest cases cost at most {self.slowest_over_unmutated():.2f}x their seed file unmutated",
                  file=out)
        for kind, index, outcome, name in self.escapes[:20]:
            print(f"ESCAPE {kind} case {index} ({name}): {outcome}", file=out)


def campaign(cases: int, seed: int = 0, kind: str = "all", workers: int = 1, out: str = "fuzz-escapes",
             chunk: int = 2000, progress=None, host: str = "native") -> Report:
    """Run cases 0..cases-1 of (seed, kind) on `workers` processes (1: this one), tokenizers built
    as `host` builds them."""
    global _host, _SEEDS
    t0 = time.perf_counter()
    if HOSTS[host] is not _host:
        _host, _SEEDS = HOSTS[host], None
    seeds()
    chunks = [(seed, kind, a, min(a + chunk, cases), out) for a in range(0, cases, chunk)]
    by_kind = defaultdict(Figures)
    if workers > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            results = pool.imap_unordered(run_chunk, chunks)
            for done, figures in enumerate(results, 1):
                for k, f in figures.items():
                    by_kind[k].merge(f)
                if progress:
                    progress(done, len(chunks), by_kind)
    else:
        for done, args in enumerate(chunks, 1):
            for k, f in run_chunk(args).items():
                by_kind[k].merge(f)
            if progress:
                progress(done, len(chunks), by_kind)
    slowest = {k: rerun_slowest(f, seed, k, RERUNS) for k, f in by_kind.items()}
    return Report(dict(by_kind), slowest, time.perf_counter() - t0)


def replay(path: str) -> None:
    """Run one saved case again, printing its traceback."""
    info = json.loads(Path(path).read_text())
    s = seeds()
    base, case = make_case(s, info["seed"], info["kind"], info["index"])
    outcome, seconds, peak, trace = measure(s, base, case)
    print(f"{info['kind']} case {info['index']} ({info['base']}): {outcome} in {seconds * 1e3:.1f} ms, "
          f"peak +{peak / 2**20:.1f} MiB\n{trace}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=10_000, help="cases to run (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="the campaign's seed (default: %(default)s)")
    ap.add_argument("--kind", choices=KINDS + ("all",), default="all", help="what to fuzz (default: %(default)s)")
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="processes (default: %(default)s)")
    ap.add_argument("--out", default="fuzz-escapes", help="folder for escapes' reproducers (default: %(default)s)")
    ap.add_argument("--chunk", type=int, default=2000, help="cases a worker takes at once (default: %(default)s)")
    ap.add_argument("--host", choices=HOSTS, default="native",
                    help="build tokenizers as this host does (default: %(default)s)")
    ap.add_argument("--replay", metavar="FILE.json", help="run one saved escape again and print its traceback")
    args = ap.parse_args(argv)
    if args.replay:
        global _host
        _host = HOSTS[args.host]
        return replay(args.replay)

    def progress(done, total, by_kind):
        n = sum(f.cases for f in by_kind.values())
        escapes = sum(len(f.escapes) for f in by_kind.values())
        print(f"[{done}/{total}] {n} cases, {escapes} escapes", file=sys.stderr, flush=True)

    campaign(args.cases, args.seed, args.kind, args.workers, args.out, args.chunk, progress, args.host).print()


if __name__ == "__main__":
    main()
