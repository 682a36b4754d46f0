"""OpenAI's API shapes around cera's generations, in one place for both hosts that speak it:
the native server (cera.server) and the browser module (web/cera.js, through web/cera_web).

Requests: OpenAI's fields, as plain values the caller has type-checked, become a Job.
Responses: a Job's text pieces and Result become chat.completion / text_completion objects and
their streamed chunks: ids, `created`, `choices[0].message` or `delta`, `finish_reason`, `usage`.
Embeddings: `embeddings` answers a whole request (an engine call, not a Job).
Pure Python: no HTTP, no pydantic, no js.
"""
from __future__ import annotations

import base64
import time
import uuid
from itertools import accumulate

import numpy as np

from cera.engine import Engine, Result
from cera.errors import InvalidArgument
from cera.jobs import Job
from cera.sampling import Sampler
from cera.constrain import Constraint
from cera.tokenizer import Tokenizer
from cera.tools import Tools

# OpenAI's defaults for the sampling fields cera honours; top_k is an extension (as in llama.cpp's
# server) whose 0 keeps the whole vocabulary
TEMPERATURE, TOP_P, TOP_K = 1.0, 1.0, 0
SAMPLING_EXTENSIONS = ("min_p", "repeat_penalty", "penalty_last_n")   # not OpenAI's: llama.cpp server's names
COMPLETION_MAX_TOKENS = 16   # a text completion's default; a chat completion runs until the context is full
FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "max_tokens": "length", "context_full": "length",
                  "cancelled": "stop",         # interrupted by the caller (cera.js's interrupt())
                  "no_allowed_token": "stop",  # the logit bias (or a constraint) left no token to choose
                  "tool_calls": "tool_calls"}
ENCODINGS = ("float", "base64")   # an embedding as a list of numbers, or its little-endian f32 bytes in base64
MAX_INPUTS = 2048                 # embeddings of one request, as OpenAI's limit
EMBEDDING_POOLING = "mean"        # what one embedding of a text is, where the model names no pooling


def chat_job(messages: list[dict], ctx: int, max_tokens: int | None = None,
             max_completion_tokens: int | None = None, tools: list[dict] | None = None, tool_choice=None,
             logprobs: bool = False, top_logprobs: int | None = None, **sampling) -> Job:
    """A chat completion request: `messages` ({"role", "content"}, content a string or OpenAI's
    text parts; an assistant's tool_calls, a tool's tool_call_id) rendered with the model's chat
    template, with the `tools` a reply may call (cera.tools); without a limit, up to `ctx` tokens."""
    if top_logprobs is not None and not logprobs:
        raise InvalidArgument("top_logprobs needs logprobs: true")
    conversation = [{**m, "content": _text(m.get("content"))} for m in messages]
    return _job(max_completion_tokens or max_tokens or ctx, messages=conversation, tools=Tools.of(tools, tool_choice),
                logprobs=(top_logprobs or 0) if logprobs else None, **sampling)


def completion_job(prompt: str | list[int], max_tokens: int = COMPLETION_MAX_TOKENS, logprobs: int | None = None,
                   **sampling) -> Job:
    """A text completion request: `prompt` is text or token ids; logprobs: how many of the most
    likely tokens to report beside each one chosen."""
    return _job(max_tokens, prompt=prompt, logprobs=logprobs, **sampling)


def _text(content: str | list[dict] | None) -> str | None:
    return content if isinstance(content, str) or content is None else "".join(part["text"] for part in content)


def _job(max_tokens: int, temperature: float = TEMPERATURE, top_p: float = TOP_P, top_k: int = TOP_K,
         frequency_penalty: float = 0.0, presence_penalty: float = 0.0, seed: int | None = None,
         stop: str | list[str] | None = None, lora: list[str | int] | None = None,
         logit_bias: dict | None = None, response_format: dict | None = None, json_schema=None,
         grammar: str | None = None, **extensions) -> Job:
    """lora: the adapters to apply, by name or index (None: every one loaded; []: none);
    logit_bias: OpenAI's {token id (a string of digits): bias}, added to those logits;
    response_format (OpenAI's), json_schema and grammar (llama.cpp server's): what the reply must
    match (cera.constrain). extensions: the prompt or messages, tools, logprobs, and llama.cpp
    server's sampling fields (SAMPLING_EXTENSIONS)."""
    stops = [stop] if isinstance(stop, str) else stop or []
    sampling = {k: extensions.pop(k) for k in SAMPLING_EXTENSIONS if k in extensions}
    constraint = Constraint.one_of(json_schema, None, grammar, response_format)
    return Job(**extensions, max_tokens=max_tokens, stop=tuple(stops),
               sampler=Sampler(temperature=temperature, top_k=top_k, top_p=top_p, frequency_penalty=frequency_penalty,
                               presence_penalty=presence_penalty, seed=seed, logit_bias=_bias(logit_bias),
                               constraint=constraint, **sampling),
               adapters=None if lora is None else tuple(lora))


def _bias(logit_bias: dict | None) -> dict[int, float]:
    """OpenAI's logit_bias, its keys token ids written as strings, -> {id: bias}."""
    try:
        return {int(token): bias for token, bias in (logit_bias or {}).items()}
    except (TypeError, ValueError):
        raise InvalidArgument("logit_bias maps token ids (strings of digits, e.g. \"50256\") to numbers") from None


def usage(result: Result) -> dict:
    prompt, completion = len(result.prompt_tokens), len(result.tokens)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": result.reused}}   # state reused, not prefilled


class Shape:
    """The objects of one response: `whole` (not streamed), or `start`, a `piece` per text
    piece, `end` and optionally `usage_chunk` (streamed). `param` names the request field that
    errors about the prompt point at. Streamed, the logprobs and tool calls come in the end chunk."""
    prefix = chunk_object = param = ""

    def __init__(self, model: str, tokenizer: Tokenizer):
        self.model, self.tokenizer, self.created = model, tokenizer, int(time.time())
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"

    def _object(self, kind: str, choice: dict, **extra) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "choices": [{"index": 0, "logprobs": None, **choice}] if choice else [], **extra}

    def usage_chunk(self, result: Result) -> dict:
        return self._object(self.chunk_object, {}, usage=usage(result))

    def _piece(self, token: int) -> tuple[str, bytes]:
        piece = self.tokenizer.token_to_piece(token)
        return piece.decode("utf-8", "replace"), piece


class ChatCompletion(Shape):
    prefix, chunk_object, param = "chatcmpl", "chat.completion.chunk", "messages"

    def whole(self, result: Result) -> dict:
        message = {"role": "assistant", "content": result.text if result.text or not result.tool_calls else None}
        if result.tool_calls:
            message["tool_calls"] = result.tool_calls
        return self._object("chat.completion", {"message": message, **self._logprobs(result),
                                                "finish_reason": FINISH_REASONS[result.stop_reason]},
                            usage=usage(result))

    def start(self) -> dict:
        return self._object(self.chunk_object, {"delta": {"role": "assistant", "content": ""}, "finish_reason": None})

    def piece(self, text: str) -> dict:
        return self._object(self.chunk_object, {"delta": {"content": text}, "finish_reason": None})

    def end(self, result: Result) -> dict:
        delta = {"tool_calls": [{"index": i, **call} for i, call in enumerate(result.tool_calls)]} \
            if result.tool_calls else {}
        return self._object(self.chunk_object, {"delta": delta, **self._logprobs(result),
                                                "finish_reason": FINISH_REASONS[result.stop_reason]})

    def _logprobs(self, result: Result) -> dict:
        """OpenAI's chat logprobs: {"content": [{token, logprob, bytes, top_logprobs}, ...]}."""
        if result.logprobs is None:
            return {}

        def entry(token: int, logprob: float) -> dict:
            text, piece = self._piece(token)
            return {"token": text, "logprob": logprob, "bytes": list(piece)}

        return {"logprobs": {"content": [{**entry(p.token, p.logprob), "top_logprobs": [entry(*t) for t in p.top]}
                                         for p in result.logprobs]}}


class TextCompletion(Shape):
    prefix, chunk_object, param = "cmpl", "text_completion", "prompt"

    def whole(self, result: Result) -> dict:
        return self._object("text_completion", {"text": result.text, **self._logprobs(result),
                                                "finish_reason": FINISH_REASONS[result.stop_reason]},
                            usage=usage(result))

    def start(self) -> dict:
        return self.piece("")

    def piece(self, text: str) -> dict:
        return self._object(self.chunk_object, {"text": text, "finish_reason": None})

    def end(self, result: Result) -> dict:
        return self._object(self.chunk_object, {"text": "", **self._logprobs(result),
                                                "finish_reason": FINISH_REASONS[result.stop_reason]})

    def _logprobs(self, result: Result) -> dict:
        """The legacy completions logprobs: tokens, token_logprobs, top_logprobs, text_offset."""
        if result.logprobs is None:
            return {}
        texts = [self._piece(p.token)[0] for p in result.logprobs]
        offsets = list(accumulate((len(t) for t in texts[:-1]), initial=0)) if texts else []
        return {"logprobs": {"tokens": texts, "token_logprobs": [p.logprob for p in result.logprobs],
                             "top_logprobs": [{self._piece(i)[0]: lp for i, lp in p.top} for p in result.logprobs],
                             "text_offset": offsets}}


# ---- embeddings ----

async def embeddings(engine: Engine, model: str, input, encoding_format: str = "float") -> dict:
    """OpenAI's embeddings response (`object: "list"`) for `input`: a string, token ids, or a list
    of either (at most MAX_INPUTS). Each is pooled to one row, as the model's header says (else
    EMBEDDING_POOLING), and scaled to unit length, as OpenAI's and llama.cpp server's are, so a
    dot product is their cosine. The engine's conversation stays as it was (Engine.embed)."""
    if encoding_format not in ENCODINGS:
        raise InvalidArgument(f"encoding_format {encoding_format!r}: choose one of {', '.join(ENCODINGS)}")
    inputs = _embedding_inputs(input)
    data, n_tokens = [], 0
    for i, item in enumerate(inputs):
        if not item:
            raise InvalidArgument(f"input[{i}] is empty: nothing to embed")
        ids = engine.embed_tokens(item) if isinstance(item, str) else item
        pooling = engine.pooling if engine.pooling != "none" else EMBEDDING_POOLING
        row = (await engine.embed(ids, pooling, normalize=True))[0].astype(np.float32)
        vector = base64.b64encode(row.astype("<f4").tobytes()).decode() if encoding_format == "base64" \
            else row.tolist()
        data.append({"object": "embedding", "index": i, "embedding": vector})
        n_tokens += len(ids)
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


def _embedding_inputs(input) -> list[str | list[int]]:
    """OpenAI's `input` (a string, token ids, or a list of strings or of token-id lists) as a list."""
    is_ids = lambda v: isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)
    if isinstance(input, str) or (is_ids(input) and input):
        return [input]
    if isinstance(input, list) and input and (all(isinstance(v, str) for v in input) or all(map(is_ids, input))):
        if len(input) > MAX_INPUTS:
            raise InvalidArgument(f"input holds {len(input)} items; at most {MAX_INPUTS} a request")
        return input
    raise InvalidArgument("input must be a string, an array of token ids, or a non-empty array of strings or "
                          "of token-id arrays")
