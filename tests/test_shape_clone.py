"""scripts/shape_clone.py synth: headers made up for well-known 7-8B models, read back through
the PrefixSource that `expand` uses (the 4-5 GB clones are never written here): the engine's
config, tokenizer and footprint accept them, with the models' dimensions and about the bytes of
their real Q4_K_M files. A tiny made-up shape is expanded whole, to show the clone opens."""
import subprocess
import sys

import pytest

from cera.config import ModelConfig
from cera.gguf_file import GGUFFile, PrefixSource
from cera.gpu.footprint import footprint
from cera.tokenizer import Tokenizer

from script_module import SCRIPTS, load

shape_clone = load("shape_clone")

# name -> (arch, layers, hidden, ff, heads, kv heads, vocab, context, rope theta, eps, qkv bias,
# rope_freqs, bytes of the real Q4_K_M file): written out apart from SHAPES, from the models' cards
EXPECTED = {
    "llama-3.1-8b": ("llama", 32, 4096, 14336, 32, 8, 128256, 131072, 500000.0, 1e-5, False, True, 4.92e9),
    "qwen2.5-7b": ("qwen2", 28, 3584, 18944, 28, 4, 152064, 32768, 1e6, 1e-6, True, False, 4.68e9),
    "mistral-7b": ("llama", 32, 4096, 14336, 32, 8, 32768, 32768, 1e6, 1e-5, False, False, 4.37e9),
}


@pytest.fixture(scope="module")
def synthed(tmp_path_factory):
    """shape name -> (header path, its GGUFFile over the header alone), written on first use."""
    folder, made = tmp_path_factory.mktemp("shape_clone"), {}

    def get(name: str):
        if name not in made:
            path = folder / f"{name}.hdr"
            shape_clone.synth(name, str(path))
            made[name] = path, GGUFFile(PrefixSource(path.read_bytes(), 1 << 62))
        return made[name]
    return get


@pytest.mark.parametrize("name", EXPECTED)
def test_config_has_the_models_dimensions(synthed, name):
    arch, layers, hidden, ff, heads, kv, vocab, ctx, theta, eps, bias, freqs, _ = EXPECTED[name]
    cfg = ModelConfig.from_gguf(synthed(name)[1])
    assert (cfg.arch, cfg.n_layers, cfg.hidden, cfg.ff, cfg.n_heads) == (arch, layers, hidden, ff, heads)
    assert cfg.n_kv_heads == (kv,) * layers and cfg.head_dim == 128 and cfg.n_rot == 128
    assert (cfg.vocab_size, cfg.embedding_rows, cfg.context_length) == (vocab, vocab, ctx)
    assert cfg.rope_theta == theta and cfg.eps == pytest.approx(eps, rel=1e-6)
    assert (cfg.qkv_bias, cfg.rope_freq_factors, cfg.tied_embeddings) == (bias, freqs, False)


@pytest.mark.parametrize("name", EXPECTED)
def test_tensor_bytes_match_the_real_q4_k_m_file(synthed, name):
    """Within 1% of the real file (whose header, with the real vocabulary, is a few MB more)."""
    g = synthed(name)[1]
    total = sum(t.nbytes for t in g.tensors.values())
    assert total == pytest.approx(EXPECTED[name][-1], rel=0.01)


@pytest.mark.parametrize("name", EXPECTED)
def test_q4_k_m_type_mix(synthed, name):
    """Vectors F32, output Q6_K, attn_v and ffn_down Q6_K in the use_more_bits layers (half of
    them, give or take), every other matrix Q4_K."""
    g, n = synthed(name)[1], EXPECTED[name][1]
    more = [i for i in range(n) if shape_clone.use_more_bits(i, n)]
    assert n // 2 - 2 <= len(more) <= n // 2 + 2
    for t in g.tensors.values():
        layer = int(t.name.split(".")[1]) if t.name.startswith("blk.") else None
        if len(t.ne) == 1:
            want = "F32"
        elif t.name == "output.weight" or (t.name.endswith(("attn_v.weight", "ffn_down.weight")) and layer in more):
            want = "Q6_K"
        else:
            want = "Q4_K"
        assert t.type_name == want, t.name


def test_use_more_bits_is_llama_cpps_rule():
    """Llama's 32 layers: 0-3, 28-31 and every third from 6 (llama.cpp's (i - n/8) % 3 == 2)."""
    assert [i for i in range(32) if shape_clone.use_more_bits(i, 32)] == \
        [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]


@pytest.mark.parametrize("name", EXPECTED)
def test_header_ends_where_the_data_begins(synthed, name):
    """As `header` cuts one: expand appends the tensor bytes right after it."""
    path, g = synthed(name)
    assert g.data_offset == path.stat().st_size
    assert min(t.offset for t in g.tensors.values()) == g.data_offset


@pytest.mark.parametrize("name", EXPECTED)
def test_tokenizer_parses_the_padded_vocabulary(synthed, name):
    g = synthed(name)[1]
    tok = Tokenizer.from_metadata(g.metadata)
    assert tok.vocab_size == EXPECTED[name][6]
    ids = tok.encode("<|im_start|>user\nHello, world!<|im_end|>")   # SmolLM2's BOS and EOS
    assert ids[0] == tok.bos_id == 1 and ids[-1] == tok.eos_id == 2 and tok.is_eog(2)
    assert tok.decode(ids[1:-1]) == "user\nHello, world!"
    if tok.vocab_size > 49152:
        assert tok.token_text(tok.vocab_size - 1).startswith("<|reserved_")


def test_a_cut_vocabulary_keeps_only_merges_of_its_tokens(synthed):
    """Mistral's 32,768 tokens are fewer than SmolLM2's 49,152: every merge left builds a token
    that is left, from tokens that are left."""
    md = synthed("mistral-7b")[1].metadata
    kept = set(md["tokenizer.ggml.tokens"])
    merges = md["tokenizer.ggml.merges"]
    assert len(merges) > 30000
    for m in merges:
        left, right = m.split(" ", 1)
        assert {left, right, left + right} <= kept, m


@pytest.mark.parametrize("name", EXPECTED)
def test_footprint_at_8k(synthed, name):
    g = synthed(name)[1]
    cfg = ModelConfig.from_gguf(g)
    fp = footprint(cfg, g, 8192, 512, None)
    assert sum(fp.weights.values()) == sum(t.nbytes for t in g.tensors.values())
    assert not fp.fallbacks
    kv_heads, layers = EXPECTED[name][5], EXPECTED[name][1]
    assert fp.kv_cache == 2 * layers * 8192 * kv_heads * 128 * 2   # K and V in f16, the default (as llama.cpp's)


def test_a_tiny_shape_expands_to_a_clone_that_opens(tmp_path, monkeypatch):
    """The whole path, header to clone, on a shape small enough to write (and a cut vocabulary)."""
    tiny = shape_clone.Shape("Tiny", "qwen2", 2, 256, 512, 2, 1, 1024, 4096, 1e6, 1e-6, qkv_bias=True)
    monkeypatch.setitem(shape_clone.SHAPES, "tiny", tiny)
    hdr, clone = tmp_path / "tiny.hdr", tmp_path / "tiny.gguf"
    shape_clone.synth("tiny", str(hdr))
    shape_clone.expand(str(hdr), str(clone))
    g = GGUFFile.open(clone)
    assert clone.stat().st_size == max(t.offset + t.nbytes for t in g.tensors.values())
    assert g.read("output.weight") == bytes([shape_clone.FILL]) * g.tensors["output.weight"].nbytes
    cfg = ModelConfig.from_gguf(g)
    assert (cfg.n_layers, cfg.hidden, cfg.vocab_size, cfg.qkv_bias) == (2, 256, 1024, True)
    assert Tokenizer.from_metadata(g.metadata).vocab_size == 1024


def test_cli(tmp_path):
    out = tmp_path / "m.hdr"
    run = subprocess.run([sys.executable, str(SCRIPTS / "shape_clone.py"), "synth", "mistral-7b", str(out)],
                         capture_output=True, text=True, check=True)
    assert "expands to" in run.stdout and out.stat().st_size > 1 << 20
    bad = subprocess.run([sys.executable, str(SCRIPTS / "shape_clone.py"), "synth", "gpt-5", str(out)],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown shape" in bad.stderr
