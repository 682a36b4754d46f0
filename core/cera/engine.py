"""The generation loop, shared by every backend and host: prompt -> tokens -> text.

A backend runs the model (cera.backend's `Backend`, which says what the engine asks of it):
`GpuModel` (the WGSL kernels on a Device, native or browser), `GpuEncoder` (embeddings only) or
`ReferenceBackend` (the numpy reference, cera.reference_backend). It answers
`forward(tokens, pos0, logits, sampled)` with the next token (greedy, or drawn) and, when
asked, logits (the last row or every row); `decode(token, pos, n, draw)` with the n tokens that
follow, greedy or drawn by the sampler given to `sample_start` (cera.sampling), which
`choose(draw)` also draws from after a forward; and `embed(tokens)` with hidden states, computed
apart from the sequence they hold. The GPU chooses its tokens itself, sampled or not; the
engine owns tokenizing, chat templates, stopping, streaming text, timing, scoring and pooling.

LoRA adapters (cera.lora) are loaded once (`load_lora`) and picked per request (`adapters=`).
State made under one set of adapters is never resumed under another: the live sequence and
the prefix cache are keyed by the set.
"""
from __future__ import annotations

import time
from contextlib import aclosing
from dataclasses import dataclass, field

import numpy as np

from cera.backend import LOGITS_ALL, LOGITS_LAST, LOGITS_NONE, Backend
from cera.chat import render
from cera.config import ModelConfig
from cera.constrain import Grammars, LLGuidance, Matcher
from cera.errors import ContextFull, InvalidArgument, Unsupported
from cera.gpu.encoder import GpuEncoder
from cera.gpu.model import DEFAULT_CHUNK, GpuModel
from cera.gpu.numerics import EXACT, Numerics
from cera.lora import LoraAdapter
from cera.prefix import PrefixCache
from cera.reference import Reference
from cera.reference_backend import ReferenceBackend
from cera.sampling import NO_TOKEN, Sampler
from cera.tokenizer import Tokenizer
from cera.tools import Tools, knows_tools, messages_for

POOLINGS = ("none", "mean", "last")   # embed(): a row per token, their mean, the last one
POOLINGS += ("cls",)                  # the first row (an encoder's [CLS] token)
DEFAULT_CTX = 2048          # positions the KV cache is allocated for, unless asked otherwise
DEFAULT_MAX_TOKENS = 128    # tokens generated, unless asked otherwise
PPL_ROWS = 64               # logit rows per float64 log-softmax block in perplexity


@dataclass
class Result:
    text: str
    tokens: list[int]                 # generated ids
    prompt_tokens: list[int]
    stop_reason: str                  # "eos", "max_tokens", "context_full", "stopped", "no_allowed_token"
                                      # (a constraint or bias left none), or a runner's (cera.jobs.run_job)
    prefill_s: float
    decode_s: float
    logits: np.ndarray | None = None  # (vocab,) of the last position run, when asked for
    reused: int = 0                   # prompt tokens whose state was already cached (not prefilled)
    tool_calls: list[dict] = field(default_factory=list)   # OpenAI tool_calls parsed from the reply (cera.tools)
    logprobs: list[TokenLogprobs] | None = None   # per generated token, when asked for (generate's logprobs)

    @property
    def prefilled(self) -> int:
        """Prompt tokens that went through prefill (the rest came from cached state)."""
        return len(self.prompt_tokens) - self.reused

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefilled / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        # the first generated token comes out of prefill; decode timing covers the rest
        n = len(self.tokens) - 1
        return n / self.decode_s if n > 0 and self.decode_s else 0.0


@dataclass(frozen=True)
class TokenLogprobs:
    """A generated token's log-probability under the model, and the most likely tokens' there."""
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]   # (id, logprob), most likely first


def log_softmax(rows: np.ndarray) -> np.ndarray:
    """log softmax along the last axis, in float64."""
    rows = rows.astype(np.float64)
    top = rows.max(axis=-1, keepdims=True)
    return rows - (top + np.log(np.exp(rows - top).sum(axis=-1, keepdims=True)))


def token_logprobs(logits: np.ndarray, token: int, top: int) -> TokenLogprobs:
    """The log-softmax of one step's logits at `token`, and its `top` best."""
    log_p = log_softmax(logits)
    best = np.argsort(-log_p, kind="stable")[:top]
    return TokenLogprobs(token, float(log_p[token]), tuple((int(i), float(log_p[i])) for i in best))


class Engine:
    """Generation over one backend. The sequence in the backend is remembered (`history`), so a
    prompt that extends it prefills only the new tokens (a conversation's next turn); with a
    `prefix_cache`, the states after earlier prompts are saved and resumed likewise."""

    def __init__(self, gguf_file, backend: Backend, tokenizer: Tokenizer | None = None, cfg: ModelConfig | None = None,
                 prefix_cache: PrefixCache | None = None):
        self.gguf = gguf_file
        self.cfg = cfg or ModelConfig.from_gguf(gguf_file)
        self.backend = backend
        self.tokenizer = tokenizer or Tokenizer.from_metadata(gguf_file.metadata)
        self.prefix_cache = prefix_cache
        self.history: list[int] = []   # the sequence's tokens; the first backend.n_past of them are cached
        self.loras: list[LoraAdapter] = []     # loaded adapters, in load order
        self._history_loras: tuple[int, ...] = ()   # the adapter set the cached sequence was run with
        self._grammars: Grammars | None = None   # the host's grammar engine (cera.constrain), made on first use

    @property
    def grammars(self) -> Grammars:
        """The grammar engine that compiles a sampler's constraint: natively llguidance, unless
        the host set another (the page sets XGrammar's)."""
        if self._grammars is None:
            self._grammars = LLGuidance(self.tokenizer, self.cfg.vocab_size)
        return self._grammars

    @grammars.setter
    def grammars(self, grammars: Grammars) -> None:
        self._grammars = grammars

    @classmethod
    async def load(cls, gguf_file, device=None, ctx: int | None = None, progress=None,
                   prefill_chunk: int = DEFAULT_CHUNK, prefix_cache: PrefixCache | None = None,
                   numerics: Numerics = EXACT) -> "Engine":
        """A ready engine: on `device` through the GPU kernels, or the numpy reference if None.
        Prompts go through the GPU in chunks of up to `prefill_chunk` tokens. `numerics`
        (cera.gpu.numerics): the KV cache's types, which the reference's cache takes too, and the
        kernels' opt-ins for speed, which the reference ignores."""
        cfg = ModelConfig.from_gguf(gguf_file)
        tokenizer = Tokenizer.from_metadata(gguf_file.metadata)   # fail on a bad vocab before uploading
        if device is None:
            backend = ReferenceBackend(Reference(gguf_file, ctx, numerics.kv_dtypes))
        elif cfg.encoder:   # embeddings only: a whole text a step, nothing kept between texts
            backend = GpuEncoder(cfg, gguf_file, device, cfg.context(ctx), numerics)
            await backend.load(progress)
        else:
            backend = GpuModel(cfg, gguf_file, device, cfg.context(ctx), prefill_chunk, numerics)
            await backend.load(progress)
        return cls(gguf_file, backend, tokenizer, cfg, prefix_cache)

    @property
    def ctx(self) -> int:
        return self.backend.ctx

    async def load_lora(self, gguf_file, name: str, scale: float = 1.0, progress=None) -> LoraAdapter:
        """Load the LoRA adapter in `gguf_file` under `name` (requests pick it by that name or by
        its index in `loras`), its delta multiplied by `scale`; progress(done, total) in bytes."""
        if any(lora.name == name for lora in self.loras):
            raise InvalidArgument(f"a LoRA adapter named {name!r} is already loaded")
        adapter = LoraAdapter.read(gguf_file, self.gguf, name, scale)
        await self.backend.add_lora(adapter, progress)
        self.loras.append(adapter)
        return adapter

    def lora_set(self, adapters) -> tuple[int, ...]:
        """Loaded adapters given by name or index -> their indices, sorted (the set's key)."""
        names = {lora.name: i for i, lora in enumerate(self.loras)}
        key = set()
        for a in adapters:
            i = names.get(a) if isinstance(a, str) else a
            if type(i) is not int or not 0 <= i < len(self.loras):
                raise InvalidArgument(f"LoRA adapter {a!r} is not loaded (loaded: {', '.join(names) or 'none'})")
            if i in key:
                raise InvalidArgument(f"LoRA adapter {a!r} is given twice")
            key.add(i)
        return tuple(sorted(key))

    def prompt_tokens(self, prompt: str, chat: bool = False, system: str | None = None) -> list[int]:
        """Tokenize a prompt; with `chat`, first render it with the model's chat template."""
        if chat:
            return self.chat_tokens(([{"role": "system", "content": system}] if system else []) +
                                    [{"role": "user", "content": prompt}])
        return self._encode(prompt)

    def _encode(self, text: str) -> list[int]:
        """A prompt's tokens; one whose bytes cannot fit the context in any tokenization is
        refused before it is tokenized (a token stands for at most max_token_bytes of them)."""
        size, most = len(text.encode("utf-8", "surrogatepass")), self.tokenizer.max_token_bytes
        if size > (self.ctx - 1) * most:
            raise ContextFull(f"the prompt's {size} bytes are at least {-(-size // most)} tokens; the context holds "
                              f"{self.ctx} (raise --ctx)")
        return self.tokenizer.encode(text, add_special=True, parse_special=True)

    @property
    def chat_template(self) -> str:
        template = self.gguf.metadata.get("tokenizer.chat_template")
        if not template:
            raise InvalidArgument("this model has no chat template (tokenizer.chat_template); "
                                  "use plain completion (no --chat)")
        return template

    def chat_tokens(self, messages: list[dict], tools: Tools | None = None) -> list[int]:
        """Tokenize a whole conversation ([{"role": ..., "content": ...}, ...]) rendered with the
        model's chat template, ending where the assistant speaks next; with the `tools` it may
        call (cera.tools)."""
        template, tok = self.chat_template, self.tokenizer
        listed = tools.for_template if tools is not None and knows_tools(template) else None
        text = render(template, messages_for(template, messages, tools), bos_token=tok.token_text(tok.bos_id),
                      eos_token=tok.token_text(tok.eos_id), tools=listed)
        return self._encode(text)

    async def generate(self, prompt: str | list[int], max_tokens: int = DEFAULT_MAX_TOKENS, chat: bool = False,
                       on_text=None, sampler: Sampler | None = None, stop_at_eos: bool = True,
                       keep_logits: bool = False, should_stop=None, context_shift: bool = True,
                       keep: int | None = None, adapters=(), logprobs: int | None = None) -> Result:
        """Generate up to `max_tokens` after `prompt` (text, or token ids), calling on_text(piece)
        as text becomes complete, with the LoRA `adapters` given (names or indices of loaded ones;
        none: the base model). keep_logits: read back and return the last position's logits.
        logprobs: each token's log-probability under the model (its logits' log-softmax) and the
        `logprobs` most likely tokens' (0: none), in the Result's logprobs; the logits of every
        step are read back for them.
        should_stop: called before each new token; True ends generation ("stopped").
        context_shift: when the context fills, keep its first `keep` positions (default: the BOS
        token, if the model adds one), drop half of the rest and go on; without it generation
        stops there ("context_full")."""
        self._check_lm_head()
        sampler = sampler or Sampler()
        sampler.check(self.cfg.vocab_size)
        ids = list(prompt) if not isinstance(prompt, str) else self.prompt_tokens(prompt, chat)
        if not ids:
            raise InvalidArgument("empty prompt: nothing to condition on")
        self.cfg.check_tokens(ids)
        if len(ids) >= self.ctx:
            raise ContextFull(f"prompt has {len(ids)} tokens; the context holds {self.ctx} (raise --ctx)")
        keep = int(self.tokenizer.add_bos and ids[0] == self.tokenizer.bos_id) if keep is None else keep
        if context_shift and not 0 <= keep <= self.ctx - 2:
            raise InvalidArgument(f"keep {keep}: a context shift needs 0 <= keep <= {self.ctx - 2} (the context "
                                  f"holds {self.ctx})")
        detok = self.tokenizer.detokenizer()
        loras = self.lora_set(adapters)
        matcher = self.grammars.matcher(sampler.constraint) if sampler.constraint is not None else None

        t0 = time.perf_counter()
        self.backend.use_loras(loras)
        reused = await self._resume(ids, loras)
        if not sampler.greedy:
            self.backend.sample_start(sampler, ids, matcher)
        keep_logits = keep_logits or logprobs is not None
        token, logits = await self.backend.forward(ids[reused:], reused, LOGITS_LAST if keep_logits else LOGITS_NONE,
                                                   not sampler.greedy)
        if self.prefix_cache is not None and reused < len(ids):
            self.prefix_cache.store(await self.backend.snapshot(ids), self._lora_tag(loras))
        self.history, self._history_loras = list(ids), loras
        t1 = time.perf_counter()
        budget = max_tokens if context_shift else min(max_tokens, self.ctx - len(ids) + 1)   # token i > 0 runs at len(ids)+i-1
        out, pieces, probs, stop = [], [], [], "max_tokens" if budget == max_tokens else "context_full"
        emit = on_text or (lambda piece: None)
        async with aclosing(self._continue(token, logits, len(ids), budget, sampler, matcher, keep_logits,
                                           keep)) as steps:
            async for token, logits in steps:
                if token == NO_TOKEN:
                    stop = "no_allowed_token"
                    break
                if stop_at_eos and self.tokenizer.is_eog(token):
                    stop = "eos"
                    break
                if should_stop and should_stop():
                    stop = "stopped"
                    break
                out.append(token)
                if logprobs is not None:
                    probs.append(token_logprobs(logits, token, logprobs))
                if piece := detok.push(token):
                    pieces.append(piece)
                    emit(piece)
        if tail := detok.flush():
            pieces.append(tail)
            emit(tail)
        return Result("".join(pieces), out, ids, stop, t1 - t0, time.perf_counter() - t1,
                      logits if keep_logits else None, reused, logprobs=probs if logprobs is not None else None)

    def reset(self) -> None:
        """Forget the sequence: the next prompt is prefilled whole (unless the prefix cache has it)."""
        self.history = []
        self.backend.reset()

    async def bench(self, prompt_tokens: int, gen_tokens: int, repeat: int, sampler: Sampler | None = None
                    ) -> list[Result]:
        """`python -m cera bench`'s timed runs: a seeded random prompt of prompt_tokens ids, then
        gen_tokens tokens chosen by `sampler` (greedy by default; EOS ignored), each run from
        reset() so it prefills the whole prompt; `repeat` runs after one that warms up pipelines
        and caches."""
        if prompt_tokens + gen_tokens > self.ctx:
            raise ContextFull(f"a {prompt_tokens}-token prompt and {gen_tokens} generated tokens exceed the "
                              f"context of {self.ctx} (raise --ctx)")
        ids = np.random.default_rng(0).integers(0, self.cfg.vocab_size, prompt_tokens).tolist()
        runs = []
        for _ in range(repeat + 1):
            self.reset()
            runs.append(await self.generate(ids, gen_tokens, stop_at_eos=False, sampler=sampler))
        return runs[1:]

    def _lora_tag(self, loras: tuple[int, ...]) -> str:
        """The prefix cache's name for the adapter set `loras` ("" for the base model)."""
        return "+".join(self.loras[i].key for i in loras)

    async def _resume(self, ids: list[int], loras: tuple[int, ...]) -> int:
        """Make the backend hold the longest prefix of ids it can without running it (at most
        len(ids) - 1 tokens: the last one must run for its logits) under the adapter set
        `loras` -> that prefix's length. The live sequence serves when it was run with the same
        adapters and agrees with ids (a model with conv state only from its very end: that
        state cannot rewind); else the prefix cache, else nothing (reset)."""
        live = self.history[: self.backend.n_past] if loras == self._history_loras else []
        n = 0
        while n < min(len(live), len(ids) - 1) and live[n] == ids[n]:
            n += 1
        if n and (not self.cfg.conv_layers or n == len(live)):
            return n
        snapshot = self.prefix_cache.lookup(ids, self._lora_tag(loras)) if self.prefix_cache is not None else None
        if snapshot is not None:
            self.backend.restore(snapshot)
            return len(snapshot.tokens)
        self.backend.reset()
        return 0

    async def _continue(self, token: int, logits, pos: int, n: int, sampler: Sampler, matcher: Matcher | None,
                        keep_logits: bool, keep: int):
        """The n tokens that follow the prompt, each with the logits it was chosen from (None
        unless the caller asks for them): the first from the prefill, then one forward step
        each, at positions pos, pos+1, ... They come from the backend's own loop (the GPU's is
        pipelined, its choice greedy or drawn on the GPU), or, when the logits are asked for,
        a forward step and a choice at a time. Token i of the reply is the sampler's draw i. When
        the context is full, the cache shifts (see generate) and the sampler restarts from the
        shortened sequence, its matcher where the reply had taken it."""
        sampled = not sampler.greedy
        self._append(token)
        yield token, logits
        done = 1
        while done < n:
            if pos == self.ctx:
                discard = (pos - keep) // 2
                await self.backend.shift(keep, discard, pos)
                del self.history[keep: keep + discard]
                pos -= discard
                if sampled:
                    self.backend.sample_start(sampler, self.history, matcher)
            steps = min(n - done, self.ctx - pos)
            if not keep_logits:
                async with aclosing(self.backend.decode(token, pos, steps, done if sampled else None)) as run:
                    async for token in run:
                        self._append(token)
                        yield token, None
            else:
                for i in range(steps):
                    token, logits = await self.backend.forward([token], pos + i, LOGITS_LAST)
                    if sampled:
                        token = await self.backend.choose(done + i)
                    self._append(token)
                    yield token, logits
            pos, done = pos + steps, done + steps

    def _append(self, token: int) -> None:
        if token != NO_TOKEN:
            self.history.append(token)

    async def logits(self, tokens: list[int], adapters=()) -> np.ndarray:
        """Logits (T, vocab) for every position of `tokens`, from position 0, with the LoRA
        `adapters` given (as in generate)."""
        self._check_lm_head()
        self.cfg.check_tokens(tokens)
        if len(tokens) > self.ctx:
            raise ContextFull(f"{len(tokens)} tokens do not fit the context of {self.ctx} (raise --ctx)")
        loras = self.lora_set(adapters)
        self.backend.use_loras(loras)
        self.backend.reset()
        self.history, self._history_loras = list(tokens), loras
        return (await self.backend.forward(tokens, 0, LOGITS_ALL))[1]

    def embed_tokens(self, text: str) -> list[int]:
        """Token ids of a text to embed, as llama.cpp's embedding reads it: BOS as the model's
        flags say, special tokens as plain text."""
        return self.tokenizer.encode(text, add_special=True, parse_special=False)

    def _check_lm_head(self) -> None:
        if self.cfg.encoder:
            raise Unsupported(f"{self.cfg.arch} is an embedding model (an encoder with no LM head): it cannot "
                              "generate or score text; use embed")

    @property
    def pooling(self) -> str:
        """The pooling the model's header names ({arch}.pooling_type; "none" if it names none)."""
        return self.cfg.pooling

    async def embed(self, text: str | list[int], pooling: str | None = None, normalize: bool = False) -> np.ndarray:
        """The hidden states after the final norm (embeddings; an encoder's output rows) of a
        text or token ids, from position 0: (T, hidden) for pooling "none", else one row
        (1, hidden), their mean, the last or the first ("cls"); None: the model's own pooling
        (`pooling`). normalize: each row divided by its Euclidean norm (llama.cpp's server
        default). The sequence the engine holds (`history`, the backend's cache) stays as it was."""
        pooling = self.pooling if pooling is None else pooling
        if pooling not in POOLINGS:
            raise InvalidArgument(f"pooling {pooling!r}: choose one of {', '.join(POOLINGS)}")
        ids = self.embed_tokens(text) if isinstance(text, str) else list(text)
        if not ids:
            raise InvalidArgument("empty text: nothing to embed")
        self.cfg.check_tokens(ids)
        if len(ids) > self.ctx:
            raise ContextFull(f"{len(ids)} tokens do not fit the context of {self.ctx} (raise --ctx)")
        rows = await self.backend.embed(ids)                             # (T, hidden)
        rows = {"none": rows, "mean": rows.mean(axis=0, keepdims=True), "last": rows[-1:], "cls": rows[:1]}[pooling]
        if normalize:
            norms = np.linalg.norm(rows, axis=1, keepdims=True)            # (rows, 1)
            rows = rows / np.where(norms > 0, norms, 1)
        return rows

    async def perplexity(self, tokens: list[int]) -> float:
        """exp(mean NLL) of positions 0..n-2 predicting 1..n-1, in one window (DESIGN.md)."""
        if len(tokens) < 2:
            raise InvalidArgument("perplexity needs at least 2 tokens")
        logits = await self.logits(tokens[:-1])                         # (n-1, vocab)
        targets = np.asarray(tokens[1:])                                # (n-1,)
        nll = 0.0
        for r in range(0, len(targets), PPL_ROWS):   # float64 a block at a time (262k-token vocabs)
            log_p = log_softmax(logits[r: r + PPL_ROWS])                # (<=PPL_ROWS, vocab)
            nll -= float(log_p[np.arange(len(log_p)), targets[r: r + PPL_ROWS]].sum())
        return float(np.exp(nll / len(targets)))
