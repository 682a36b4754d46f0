"""Shape clones of GGUF files, for timing where the real files cannot be reached.

A clone keeps a model's whole header (metadata, vocabulary, tensor names, types and shapes)
and replaces the tensor bytes with a fill, so every kernel sees the real shapes and weight
types (the generated text is meaningless). The default fill is one constant byte; `--fill
random` writes seeded random bytes instead, for checking that the constant does not flatter
the timing (a GPU may compress memory that repeats one value, which random bytes defeat; some
random f16 scales are NaN or Inf, which costs the kernels nothing).

    python scripts/shape_clone.py header MODEL.gguf OUT.hdr                  # the header alone (a few MB)
    python scripts/shape_clone.py expand OUT.hdr CLONE.gguf [--fill random]  # header + filled tensor data
    python scripts/shape_clone.py synth llama-3.1-8b OUT.hdr                 # a header made up from SHAPES

`synth` writes a header for a model whose file is not at hand either: the dimensions, vocabulary
size and Q4_K_M tensor types of a well-known model (SHAPES), with SmolLM2's byte-level BPE
vocabulary padded with reserved control tokens (or cut) to that size, so the engine can tokenize
and chat with the clone. `expand` makes it a timing clone like any other header.
"""
import argparse
import math
import os
import sys
from dataclasses import dataclass

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

from cera import catalogue
from cera.gguf_file import GGUFFile, PrefixSource

FILL = 0x11   # as f16 a small normal number, as f32 a tiny one: no NaN or Inf anywhere
CHUNK = 64 << 20


def header(model: str, out: str) -> None:
    g = GGUFFile.open(model)
    with open(model, "rb") as f, open(out, "wb") as o:
        o.write(f.read(g.data_offset))
    print(f"{out}: {g.data_offset} header bytes of {g.source.size}")


def expand(hdr: str, out: str, fill: str = "constant") -> None:
    prefix = open(hdr, "rb").read()
    g = GGUFFile(PrefixSource(prefix, 1 << 62))
    size = max(t.offset + t.nbytes for t in g.tensors.values())
    rng = np.random.default_rng(0)
    constant = bytes([FILL]) * CHUNK
    with open(out, "wb") as o:
        o.write(prefix)
        while o.tell() < size:
            chunk = rng.bytes(CHUNK) if fill == "random" else constant
            o.write(chunk[: size - o.tell()])
    print(f"{out}: {size} bytes, {len(g.tensors)} tensors, {fill} fill")


@dataclass(frozen=True)
class Shape:
    """A model's hyperparameters, as its config.json gives them and its GGUF carries them."""
    title: str
    arch: str
    n_layers: int
    hidden: int
    ff: int
    n_heads: int
    n_kv_heads: int
    vocab: int
    context: int
    rope_theta: float
    eps: float
    head_dim: int = 128
    qkv_bias: bool = False     # qwen2's blk.N.attn_{q,k,v}.bias, F32
    rope_freqs: bool = False   # Llama 3.1's rope_freqs.weight: F32, head_dim / 2 factors


# Every one untied (an output.weight of its own), as their 7-8B releases are.
SHAPES = {
    "llama-3.1-8b": Shape("Llama-3.1-8B", "llama", 32, 4096, 14336, 32, 8, 128256, 131072,
                          500000.0, 1e-5, rope_freqs=True),
    "qwen2.5-7b": Shape("Qwen2.5-7B", "qwen2", 28, 3584, 18944, 28, 4, 152064, 32768,
                        1e6, 1e-6, qkv_bias=True),
    "mistral-7b": Shape("Mistral-7B-v0.3", "llama", 32, 4096, 14336, 32, 8, 32768, 32768,
                        1e6, 1e-5),
}
VOCAB_MODEL = "smollm2-135m-instruct"   # the catalogue model whose vocabulary a synth'd header takes
MOSTLY_Q4_K_M = 15                      # general.file_type, llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_M


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's rule (src/llama-quant.cpp) for the layers whose attn_v and ffn_down Q4_K_M
    keeps at Q6_K: the first and last eighth, and every third layer between."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def q4_k_m_type(name: str, shape: tuple[int, ...], layer: int, n_layers: int) -> T:
    """The type llama.cpp's quantize gives `name` in a Q4_K_M file of a dense model: vectors stay
    F32, output.weight goes to Q6_K, attn_v and ffn_down to Q6_K where use_more_bits says, the
    rest to Q4_K. (Its fallbacks for rows not a multiple of 256 never apply to these shapes.)"""
    if len(shape) == 1:
        return T.F32
    if name == "output.weight":
        return T.Q6_K
    if name.endswith(("attn_v.weight", "ffn_down.weight")) and use_more_bits(layer, n_layers):
        return T.Q6_K
    return T.Q4_K


def synth_tensors(s: Shape) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape) of every tensor, in the order llama.cpp's converter writes them."""
    q, kv, h = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim, s.hidden
    out = [("rope_freqs.weight", (s.head_dim // 2,))] if s.rope_freqs else []
    out.append(("token_embd.weight", (s.vocab, h)))
    for i in range(s.n_layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (h,)), (b + "attn_q.weight", (q, h)),
                (b + "attn_k.weight", (kv, h)), (b + "attn_v.weight", (kv, h))]
        if s.qkv_bias:
            out += [(b + "attn_q.bias", (q,)), (b + "attn_k.bias", (kv,)), (b + "attn_v.bias", (kv,))]
        out += [(b + "attn_output.weight", (h, q)), (b + "ffn_norm.weight", (h,)),
                (b + "ffn_gate.weight", (s.ff, h)), (b + "ffn_up.weight", (s.ff, h)),
                (b + "ffn_down.weight", (h, s.ff))]
    return out + [("output_norm.weight", (h,)), ("output.weight", (s.vocab, h))]


def tensor_nbytes(shape: tuple[int, ...], ggml_type: T) -> int:
    block, type_size = gguf.GGML_QUANT_SIZES[ggml_type]
    return math.prod(shape) // block * type_size


def synth_vocab(meta: dict, n: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of `meta`'s byte-level BPE vocabulary made `n` tokens long:
    padded with <|reserved_N|> control tokens (which no text tokenizes to unless it spells them
    and asks for special tokens), or cut to its first n, keeping only the merges that build
    tokens that are left (a BPE vocabulary lists a merge's parts before its result)."""
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    merges = meta["tokenizer.ggml.merges"]
    if n >= len(tokens):
        pad = n - len(tokens)
        return (tokens + [f"<|reserved_{i}|>" for i in range(pad)],
                types + [gguf.TokenType.CONTROL] * pad, merges)
    kept = set(tokens[:n])
    merges = [m for m in merges if m.replace(" ", "", 1) in kept and set(m.split(" ", 1)) <= kept]
    return tokens[:n], types[:n], merges


def add_shape(w: gguf.GGUFWriter, s: Shape) -> None:
    """The hyperparameter keys llama.cpp's converter writes, under the shape's arch."""
    w.add_name(f"{s.title} shape clone (Q4_K_M types, SmolLM2 vocabulary)")
    w.add_block_count(s.n_layers)
    w.add_context_length(s.context)
    w.add_embedding_length(s.hidden)
    w.add_feed_forward_length(s.ff)
    w.add_head_count(s.n_heads)
    w.add_head_count_kv(s.n_kv_heads)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_rope_dimension_count(s.head_dim)
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(s.eps)
    w.add_vocab_size(s.vocab)
    w.add_file_type(MOSTLY_Q4_K_M)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def add_vocab(w: gguf.GGUFWriter, meta: dict, n: int) -> None:
    """`meta`'s tokenizer at `n` tokens, with its pre-tokenizer, special ids, flags and chat
    template (its ids are below any n here, so they stay valid)."""
    tokens, types, merges = synth_vocab(meta, n)
    k = "tokenizer.ggml."
    w.add_tokenizer_model(meta[k + "model"])
    w.add_tokenizer_pre(meta[k + "pre"])
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(meta[k + "bos_token_id"])
    w.add_eos_token_id(meta[k + "eos_token_id"])
    if k + "unknown_token_id" in meta:
        w.add_unk_token_id(meta[k + "unknown_token_id"])
    if k + "padding_token_id" in meta:
        w.add_pad_token_id(meta[k + "padding_token_id"])
    w.add_add_bos_token(bool(meta.get(k + "add_bos_token", False)))
    w.add_add_space_prefix(bool(meta.get(k + "add_space_prefix", False)))
    if "tokenizer.chat_template" in meta:
        w.add_chat_template(meta["tokenizer.chat_template"])


def synth(name: str, out: str, vocab: str | None = None) -> None:
    """Write the header of SHAPES[name] in Q4_K_M, as `header` would cut it from a real file:
    metadata and tensor infos, padded to the alignment where the tensor data would begin."""
    s = SHAPES[name]
    meta = GGUFFile.open(vocab or catalogue.fetch(VOCAB_MODEL)).metadata
    w = gguf.GGUFWriter(out, s.arch)
    add_shape(w, s)
    add_vocab(w, meta, s.vocab)
    for tname, shape in synth_tensors(s):
        layer = int(tname.split(".")[1]) if tname.startswith("blk.") else -1
        ggml_type = q4_k_m_type(tname, shape, layer, s.n_layers)
        w.add_tensor_info(tname, shape, np.dtype(np.float32), tensor_nbytes(shape, ggml_type), raw_dtype=ggml_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    n = os.path.getsize(out)
    with open(out, "ab") as o:
        o.write(bytes(-n % w.data_alignment))
    g = GGUFFile(PrefixSource(open(out, "rb").read(), 1 << 62))
    size = max(t.offset + t.nbytes for t in g.tensors.values())
    print(f"{out}: {g.data_offset} header bytes; expands to {size} bytes, {len(g.tensors)} tensors")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["header", "expand", "synth"])
    ap.add_argument("src", help="header: a GGUF; expand: a header; synth: one of " + ", ".join(SHAPES))
    ap.add_argument("dst")
    ap.add_argument("--fill", choices=["constant", "random"], default="constant",
                    help="expand: the tensor bytes, one constant byte or seeded random bytes (default: constant)")
    ap.add_argument("--vocab", help=f"synth: the GGUF whose byte-level BPE vocabulary to take "
                                    f"(default: the catalogue's {VOCAB_MODEL})")
    a = ap.parse_args()
    if a.action == "header":
        header(a.src, a.dst)
    elif a.action == "synth":
        if a.src not in SHAPES:
            ap.error(f"synth: unknown shape {a.src!r}; known: {', '.join(SHAPES)}")
        synth(a.src, a.dst, a.vocab)
    else:
        expand(a.src, a.dst, a.fill)


if __name__ == "__main__":
    sys.exit(main())
