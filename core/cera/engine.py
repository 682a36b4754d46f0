"""The generation loop, shared by every backend and host: prompt -> tokens -> text.

A backend runs the model: `GpuModel` (the WGSL kernels on a Device, native or browser) or
`ReferenceBackend` (the numpy reference). Both answer `forward(tokens, pos0, logits)`
with the greedy next token and, when asked, logits; the engine owns tokenizing, chat
templates, sampling, stopping, streaming text, timing and scoring.
"""
from __future__ import annotations

import time
from contextlib import aclosing
from dataclasses import dataclass, field

import numpy as np

from cera.chat import render
from cera.config import ModelConfig
from cera.errors import ContextFull, InvalidArgument
from cera.gpu.model import DEFAULT_CHUNK, GpuModel
from cera.reference import Reference
from cera.tokenizer import Tokenizer

LOGITS_NONE, LOGITS_LAST, LOGITS_ALL = None, "last", "all"
DEFAULT_CTX = 2048          # positions the KV cache is allocated for, unless asked otherwise
DEFAULT_MAX_TOKENS = 128    # tokens generated, unless asked otherwise
PPL_ROWS = 64               # logit rows per float64 log-softmax block in perplexity


class ReferenceBackend:
    """The numpy reference (or a subclass of it) behind the backend interface."""
    dispatches_per_token = 0
    submits_per_prefill = 0

    def __init__(self, model: Reference):
        self.model = model
        self.ctx = model.ctx

    def reset(self) -> None:
        self.model.reset()

    async def forward(self, tokens: list[int], pos0: int, logits=LOGITS_NONE):
        out = self.model.forward(tokens, pos0)                          # (T, vocab)
        return int(np.argmax(out[-1])), {LOGITS_NONE: None, LOGITS_LAST: out[-1], LOGITS_ALL: out}[logits]

    async def greedy(self, token: int, pos: int, n: int):
        """The n greedy tokens that follow `token` at `pos`, one forward step each."""
        for i in range(n):
            token, _ = await self.forward([token], pos + i)
            yield token


@dataclass
class Sampler:
    """temperature 0 is greedy (the argmax the GPU already computed); else top-k / top-p."""
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    seed: int | None = None
    rng: np.random.Generator = field(init=False)

    def __post_init__(self):
        if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise InvalidArgument("sampling needs temperature >= 0, top_k >= 0 and 0 < top_p <= 1")
        self.rng = np.random.default_rng(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def sample(self, logits: np.ndarray) -> int:
        logits = logits.astype(np.float64) / self.temperature
        order = np.argsort(-logits)
        if self.top_k:
            order = order[: self.top_k]
        probs = np.exp(logits[order] - logits[order[0]])
        probs /= probs.sum()
        # the smallest set reaching top_p (all of them when rounding keeps the sum below top_p = 1)
        keep = min(int(np.searchsorted(np.cumsum(probs), self.top_p) + 1), len(order))
        probs = probs[:keep] / probs[:keep].sum()
        return int(order[self.rng.choice(keep, p=probs)])


@dataclass
class Result:
    text: str
    tokens: list[int]                 # generated ids
    prompt_tokens: list[int]
    stop_reason: str                  # "eos", "max_tokens", "context_full" or "stopped"
    prefill_s: float
    decode_s: float
    logits: np.ndarray | None = None  # (vocab,) of the last position run, when asked for

    @property
    def prefill_tokens_per_s(self) -> float:
        return len(self.prompt_tokens) / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        # the first generated token comes out of prefill; decode timing covers the rest
        n = len(self.tokens) - 1
        return n / self.decode_s if n > 0 and self.decode_s else 0.0


class Engine:
    def __init__(self, gguf_file, backend, tokenizer: Tokenizer | None = None, cfg: ModelConfig | None = None):
        self.gguf = gguf_file
        self.cfg = cfg or ModelConfig.from_gguf(gguf_file)
        self.backend = backend
        self.tokenizer = tokenizer or Tokenizer.from_metadata(gguf_file.metadata)

    @classmethod
    async def load(cls, gguf_file, device=None, ctx: int | None = None, progress=None,
                   prefill_chunk: int = DEFAULT_CHUNK) -> "Engine":
        """A ready engine: on `device` through the GPU kernels, or the numpy reference if None.
        Prompts go through the GPU in chunks of up to `prefill_chunk` tokens."""
        cfg = ModelConfig.from_gguf(gguf_file)
        tokenizer = Tokenizer.from_metadata(gguf_file.metadata)   # fail on a bad vocab before uploading
        if device is None:
            return cls(gguf_file, ReferenceBackend(Reference(gguf_file, ctx)), tokenizer, cfg)
        model = GpuModel(cfg, gguf_file, device, cfg.context(ctx), prefill_chunk)
        await model.load(progress)
        return cls(gguf_file, model, tokenizer, cfg)

    @property
    def ctx(self) -> int:
        return self.backend.ctx

    def prompt_tokens(self, prompt: str, chat: bool = False, system: str | None = None) -> list[int]:
        """Tokenize a prompt; with `chat`, first render it with the model's chat template."""
        if chat:
            return self.chat_tokens(([{"role": "system", "content": system}] if system else []) +
                                    [{"role": "user", "content": prompt}])
        return self.tokenizer.encode(prompt, add_special=True, parse_special=True)

    def chat_tokens(self, messages: list[dict]) -> list[int]:
        """Tokenize a whole conversation ([{"role": ..., "content": ...}, ...]) rendered with the
        model's chat template, ending where the assistant speaks next."""
        template = self.gguf.metadata.get("tokenizer.chat_template")
        if not template:
            raise InvalidArgument("this model has no chat template (tokenizer.chat_template); "
                                  "use plain completion (no --chat)")
        tok = self.tokenizer
        text = render(template, messages, bos_token=tok.token_text(tok.bos_id), eos_token=tok.token_text(tok.eos_id))
        return tok.encode(text, add_special=True, parse_special=True)

    async def generate(self, prompt: str | list[int], max_tokens: int = DEFAULT_MAX_TOKENS, chat: bool = False,
                       on_text=None, sampler: Sampler | None = None, stop_at_eos: bool = True,
                       keep_logits: bool = False, should_stop=None) -> Result:
        """Generate up to `max_tokens` after `prompt` (text, or token ids), calling on_text(piece)
        as text becomes complete. keep_logits: read back and return the last position's logits.
        should_stop: called before each new token; True ends generation ("stopped")."""
        sampler = sampler or Sampler()
        ids = list(prompt) if not isinstance(prompt, str) else self.prompt_tokens(prompt, chat)
        if not ids:
            raise InvalidArgument("empty prompt: nothing to condition on")
        self.cfg.check_tokens(ids)
        if len(ids) >= self.ctx:
            raise ContextFull(f"prompt has {len(ids)} tokens; the context holds {self.ctx} (raise --ctx)")
        detok = self.tokenizer.detokenizer()
        want = LOGITS_NONE if sampler.greedy and not keep_logits else LOGITS_LAST

        self.backend.reset()
        t0 = time.perf_counter()
        token, logits = await self.backend.forward(ids, 0, want)
        t1 = time.perf_counter()
        budget = min(max_tokens, self.ctx - len(ids) + 1)   # token i > 0 is run at position len(ids)+i-1
        out, pieces, stop = [], [], "max_tokens" if budget == max_tokens else "context_full"
        emit = on_text or (lambda piece: None)
        async with aclosing(self._continue(token, logits, len(ids), budget, sampler, want)) as steps:
            async for token, logits in steps:
                if stop_at_eos and self.tokenizer.is_eog(token):
                    stop = "eos"
                    break
                if should_stop and should_stop():
                    stop = "stopped"
                    break
                out.append(token)
                if piece := detok.push(token):
                    pieces.append(piece)
                    emit(piece)
        if tail := detok.flush():
            pieces.append(tail)
            emit(tail)
        return Result("".join(pieces), out, ids, stop, t1 - t0, time.perf_counter() - t1, logits)

    async def _continue(self, token: int, logits, pos: int, n: int, sampler: Sampler, want):
        """The n tokens that follow the prompt, each with the logits it was picked from (None
        unless asked for): the first from the prefill, then one forward step each. Greedy runs
        without logits go through the backend's own loop (the GPU's is pipelined)."""
        if want is LOGITS_NONE:
            if n > 0:
                yield token, None
                async with aclosing(self.backend.greedy(token, pos, n - 1)) as steps:
                    async for token in steps:
                        yield token, None
            return
        for i in range(n):
            if not sampler.greedy:
                token = sampler.sample(logits)
            yield token, logits
            if i + 1 < n:
                token, logits = await self.backend.forward([token], pos + i, want)

    async def logits(self, tokens: list[int]) -> np.ndarray:
        """Logits (T, vocab) for every position of `tokens`, from position 0."""
        self.cfg.check_tokens(tokens)
        if len(tokens) > self.ctx:
            raise ContextFull(f"{len(tokens)} tokens do not fit the context of {self.ctx} (raise --ctx)")
        self.backend.reset()
        return (await self.backend.forward(tokens, 0, LOGITS_ALL))[1]

    async def perplexity(self, tokens: list[int]) -> float:
        """exp(mean NLL) of positions 0..n-2 predicting 1..n-1, in one window (DESIGN.md)."""
        if len(tokens) < 2:
            raise InvalidArgument("perplexity needs at least 2 tokens")
        logits = await self.logits(tokens[:-1])                         # (n-1, vocab)
        targets = np.asarray(tokens[1:])                                # (n-1,)
        nll = 0.0
        for r in range(0, len(targets), PPL_ROWS):   # float64 a block at a time (262k-token vocabs)
            rows = logits[r: r + PPL_ROWS].astype(np.float64)           # (<=PPL_ROWS, vocab)
            top = rows.max(axis=-1)                                     # (<=PPL_ROWS,)
            log_z = top + np.log(np.exp(rows - top[:, None]).sum(axis=-1))
            nll += float((log_z - rows[np.arange(len(rows)), targets[r: r + PPL_ROWS]]).sum())
        return float(np.exp(nll / len(targets)))
