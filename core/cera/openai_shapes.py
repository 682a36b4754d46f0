"""OpenAI's API shapes around cera's generations, in one place for both hosts that speak it:
the native server (cera.server) and the browser module (web/cera.js, through web/cera_web).

Requests: OpenAI's fields, as plain values the caller has type-checked, become a Job.
Responses: a Job's text pieces and Result become chat.completion / text_completion objects and
their streamed chunks: ids, `created`, `choices[0].message` or `delta`, `finish_reason`, `usage`.
Pure Python: no HTTP, no pydantic, no js.
"""
from __future__ import annotations

import time
import uuid

from cera.engine import Result
from cera.errors import InvalidArgument
from cera.runner import Job
from cera.sampling import Sampler

# OpenAI's defaults for the sampling fields cera honours; top_k is an extension (as in llama.cpp's
# server) whose 0 keeps the whole vocabulary
TEMPERATURE, TOP_P, TOP_K = 1.0, 1.0, 0
SAMPLING_EXTENSIONS = ("min_p", "repeat_penalty", "penalty_last_n")   # not OpenAI's: llama.cpp server's names
COMPLETION_MAX_TOKENS = 16   # a text completion's default; a chat completion runs until the context is full
FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "max_tokens": "length", "context_full": "length",
                  "cancelled": "stop",         # interrupted by the caller (cera.js's interrupt())
                  "no_allowed_token": "stop"}  # the logit bias (or a mask) left no token to choose


def chat_job(messages: list[dict], ctx: int, max_tokens: int | None = None,
             max_completion_tokens: int | None = None, **sampling) -> Job:
    """A chat completion request: `messages` ({"role", "content"}, content a string or OpenAI's
    text parts) rendered with the model's chat template; without a limit, up to `ctx` tokens."""
    plain = [{"role": m["role"], "content": _text(m.get("content"))} for m in messages]
    return _job(max_completion_tokens or max_tokens or ctx, messages=plain, **sampling)


def completion_job(prompt: str | list[int], max_tokens: int = COMPLETION_MAX_TOKENS, **sampling) -> Job:
    """A text completion request: `prompt` is text or token ids."""
    return _job(max_tokens, prompt=prompt, **sampling)


def _text(content: str | list[dict] | None) -> str:
    return content if isinstance(content, str) else "".join(part["text"] for part in content or [])


def _job(max_tokens: int, temperature: float = TEMPERATURE, top_p: float = TOP_P, top_k: int = TOP_K,
         frequency_penalty: float = 0.0, presence_penalty: float = 0.0, seed: int | None = None,
         stop: str | list[str] | None = None, lora: list[str | int] | None = None,
         logit_bias: dict | None = None, **extensions) -> Job:
    """lora: the adapters to apply, by name or index (None: every one loaded; []: none);
    logit_bias: OpenAI's {token id (a string of digits): bias}, added to those logits.
    extensions: the prompt or messages, and llama.cpp server's sampling fields (SAMPLING_EXTENSIONS)."""
    stops = [stop] if isinstance(stop, str) else stop or []
    sampling = {k: extensions.pop(k) for k in SAMPLING_EXTENSIONS if k in extensions}
    return Job(**extensions, max_tokens=max_tokens, stop=tuple(stops),
               sampler=Sampler(temperature=temperature, top_k=top_k, top_p=top_p, frequency_penalty=frequency_penalty,
                               presence_penalty=presence_penalty, seed=seed, logit_bias=_bias(logit_bias),
                               **sampling),
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
    errors about the prompt point at."""
    prefix = chunk_object = param = ""

    def __init__(self, model: str):
        self.model, self.created = model, int(time.time())
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"

    def _object(self, kind: str, choice: dict, **extra) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "choices": [{"index": 0, **choice, "logprobs": None}] if choice else [], **extra}

    def usage_chunk(self, result: Result) -> dict:
        return self._object(self.chunk_object, {}, usage=usage(result))


class ChatCompletion(Shape):
    prefix, chunk_object, param = "chatcmpl", "chat.completion.chunk", "messages"

    def whole(self, result: Result) -> dict:
        return self._object("chat.completion", {"message": {"role": "assistant", "content": result.text},
                                                "finish_reason": FINISH_REASONS[result.stop_reason]},
                            usage=usage(result))

    def start(self) -> dict:
        return self._object(self.chunk_object, {"delta": {"role": "assistant", "content": ""}, "finish_reason": None})

    def piece(self, text: str) -> dict:
        return self._object(self.chunk_object, {"delta": {"content": text}, "finish_reason": None})

    def end(self, result: Result) -> dict:
        return self._object(self.chunk_object, {"delta": {}, "finish_reason": FINISH_REASONS[result.stop_reason]})


class TextCompletion(Shape):
    prefix, chunk_object, param = "cmpl", "text_completion", "prompt"

    def whole(self, result: Result) -> dict:
        return self._object("text_completion", {"text": result.text,
                                                "finish_reason": FINISH_REASONS[result.stop_reason]},
                            usage=usage(result))

    def start(self) -> dict:
        return self.piece("")

    def piece(self, text: str) -> dict:
        return self._object(self.chunk_object, {"text": text, "finish_reason": None})

    def end(self, result: Result) -> dict:
        return self._object(self.chunk_object, {"text": "", "finish_reason": FINISH_REASONS[result.stop_reason]})
