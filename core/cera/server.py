"""`python -m cera serve`: an OpenAI-compatible HTTP server on Starlette + uvicorn.

    GET  /v1/models, /v1/models/{id}
    POST /v1/completions, /v1/chat/completions   (server-sent events with "stream": true)
    POST /v1/embeddings

One engine serves every request (cera.runner): requests run one at a time, in arrival order;
past `max_queue` waiting requests the server answers 429. A client that disconnects stops its
generation within a token; Ctrl-C stops them all, then the server. Every error is OpenAI's
shape, {"error": {"message", "type", "param", "code"}}, never a traceback.
Native only: the browser never imports this module (nor Starlette).
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
from collections import Counter
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from cera.engine import Result
from cera.errors import CeraError, ContextFull
from cera.openai_shapes import (COMPLETION_MAX_TOKENS, ENCODINGS, TEMPERATURE, TOP_K, TOP_P, ChatCompletion,
                                TextCompletion, chat_job, completion_job, embeddings)
from cera.jobs import Job
from cera.runner import Runner

log = logging.getLogger("cera.server")


class ApiError(Exception):
    """An error answered in OpenAI's shape."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.type, self.param, self.code, self.headers = status, type, param, code, headers

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), self.status, headers=self.headers)


# ---- requests: the OpenAI fields cera honours; others are a 400 that names them, but for
# those that change nothing cera returns (IGNORED) ----

IGNORED = frozenset({"user", "metadata", "store", "service_tier", "parallel_tool_calls", "prompt_cache_key",
                     "safety_identifier", "cache_prompt", "id_slot"})   # the last two: llama.cpp's, always on here

class StreamOptions(BaseModel):
    include_usage: bool = False


class Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None   # None: the model being served
    temperature: float = Field(TEMPERATURE, ge=0, le=2)
    top_p: float = Field(TOP_P, gt=0, le=1)
    top_k: int = Field(TOP_K, ge=0, description="an extension (as llama.cpp's server): 0 keeps the whole vocabulary")
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    min_p: float = Field(0.0, ge=0, le=1, description="an extension (llama.cpp's server): drop tokens below min_p "
                                                        "times the best one's probability")
    repeat_penalty: float = Field(1.0, gt=0, description="an extension (llama.cpp's server)")
    penalty_last_n: int = Field(64, ge=-1, description="an extension (llama.cpp's server): -1 all, 0 none")
    seed: int | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = Field(
        None, description="token id (as a string) -> a bias from -100 to 100 added to its logit")
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1
    lora: list[str | int] | None = Field(None, description="an extension: the LoRA adapters this request applies, "
                                                           "by file name or index among those the server loaded "
                                                           "(--lora); absent: all of them, []: none")
    response_format: dict | None = None
    json_schema: dict | bool | None = Field(None, description="llama.cpp server's: the reply is JSON valid under it")
    grammar: str | None = Field(None, description="llama.cpp server's: the reply matches this GBNF (or Lark) grammar")

    def sampling(self) -> dict:
        _refuse_unknown(self)
        return self.model_dump(include={"temperature", "top_p", "top_k", "frequency_penalty", "presence_penalty",
                                        "min_p", "repeat_penalty", "penalty_last_n", "seed", "logit_bias", "stop",
                                        "lora", "response_format", "json_schema", "grammar", *self._fields})

    _fields = ()   # a request kind's own fields that go to its job


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Function(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: Function


class Message(BaseModel):
    role: str
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None   # an assistant's calls
    tool_call_id: str | None = None            # a tool's answer: to which call
    name: str | None = None


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    _fields = ("tools", "tool_choice", "logprobs", "top_logprobs")


class CompletionRequest(Sampling):
    prompt: str | list[int] | list[str]
    max_tokens: int = Field(COMPLETION_MAX_TOKENS, ge=1)
    logprobs: int | None = Field(None, ge=0, le=5)
    _fields = ("logprobs",)


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal[ENCODINGS] = "float"


def _refuse_unknown(request: BaseModel) -> None:
    unknown = sorted(set(request.model_extra or ()) - IGNORED)
    if unknown:
        raise ApiError(400, f"cera does not honour {', '.join(unknown)} (it takes "
                            f"{', '.join(sorted(type(request).model_fields))})", param=unknown[0],
                       code="unsupported_parameter")


# ---- the server ----

class Server:
    """The Starlette app around one Runner. `closing` (set on Ctrl-C) stops every generation."""

    def __init__(self, runner: Runner, model_id: str, max_queue: int = 16, api_key: str | None = None):
        self.runner, self.model_id, self.max_queue, self.api_key = runner, model_id, max_queue, api_key
        self.created = int(time.time())
        self.admitted = 0                # requests whose generation has not ended (running or waiting)
        self.closing = threading.Event()
        self.finished = Counter()        # stop reasons of the generations run, for logs and tests
        self.app = Starlette(routes=[
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", self.model, methods=["GET"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/embeddings", self.embeddings, methods=["POST"]),
        ], exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _internal_error})
        self.app.add_middleware(_RequireKey, server=self)

    def check_key(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):
            raise ApiError(401, "Incorrect API key provided (send it as `Authorization: Bearer KEY`)",
                           code="invalid_api_key")

    def _model_card(self) -> dict:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "cera"}

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> Response:
        self._check_model(request.path_params["model_id"])
        return JSONResponse(self._model_card())

    def _check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_id:
            raise ApiError(404, f"The model `{name}` does not exist; this server runs `{self.model_id}`",
                           param="model", code="model_not_found")

    async def completions(self, request: Request) -> Response:
        req = await _parse(request, CompletionRequest)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise ApiError(400, "one prompt per request (a batch of prompts is not supported)", param="prompt")
            prompt = prompt[0]
        return await self._answer(request, req, _job(completion_job, prompt, req.max_tokens, **req.sampling()),
                                  TextCompletion)

    async def chat_completions(self, request: Request) -> Response:
        req = await _parse(request, ChatRequest)
        job = _job(chat_job, [m.model_dump(exclude_none=True) for m in req.messages], self.runner.engine.ctx,
                   req.max_tokens,
                   req.max_completion_tokens, **req.sampling())
        return await self._answer(request, req, job, ChatCompletion)

    async def embeddings(self, request: Request) -> Response:
        req = await _parse(request, EmbeddingRequest)
        _refuse_unknown(req)
        self._admit(req.model)
        self.admitted += 1
        try:
            future = self.runner.queue(lambda engine: embeddings(engine, self.model_id, req.input, req.encoding_format))
            return JSONResponse(await asyncio.wrap_future(future))
        except Exception as err:   # noqa: BLE001 - the engine's refusals in OpenAI's shape
            raise _engine_error(err, "input") from None
        finally:
            self.admitted -= 1

    def _admit(self, model: str | None) -> None:
        """Refuse a request for another model, while shutting down, or past the queue's length."""
        self._check_model(model)
        if self.closing.is_set():
            raise ApiError(503, "the server is shutting down", "server_error", code="server_shutting_down")
        if self.admitted > self.max_queue:   # one running, max_queue waiting
            raise ApiError(429, f"{self.admitted} requests are ahead of this one (the server queues at most "
                                f"{self.max_queue} behind the one running); retry later",
                           "rate_limit_error", code="rate_limit_exceeded", headers={"Retry-After": "1"})

    async def _answer(self, request: Request, req: Sampling, job: Job, shape) -> Response:
        self._admit(req.model)
        call = _Call(self, request, job, shape(self.model_id, self.runner.engine.tokenizer))
        first = await call.next()   # before answering: a request the engine refuses gets its status
        if first[0] == "gone":
            return Response(status_code=204)   # nobody is listening
        if first[0] == "end":   # refused, failed or shut down before any text: answer with a status
            _result_or_raise(first[1], shape.param)
        if req.stream:
            usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(call.events_sse(first, usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await call.whole(first)

    def finish(self, call: "_Call", result: Result) -> None:
        self.finished[result.stop_reason] += 1
        log.info("%s: %d prompt + %d generated tokens, %s (limit %d)", call.id, len(result.prompt_tokens),
                 len(result.tokens), result.stop_reason, call.job.max_tokens)


class _Call:
    """One admitted request as the server's loop sees it: text pieces and the end arrive from
    the engine thread on `events`; a watcher marks the call gone when the client disconnects."""

    def __init__(self, server: Server, request: Request, job: Job, shape):
        self.server, self.job, self.shape, self.id = server, job, shape, shape.id
        self.gone = threading.Event()
        self.events: asyncio.Queue = asyncio.Queue()
        self._counted = True
        server.admitted += 1
        loop = asyncio.get_running_loop()
        future = server.runner.submit(
            job, on_text=lambda piece: loop.call_soon_threadsafe(self.events.put_nowait, ("text", piece)),
            should_stop=lambda: self.gone.is_set() or server.closing.is_set())
        future.add_done_callback(lambda f: loop.call_soon_threadsafe(self._ended, f))
        self.watcher = asyncio.create_task(self._watch(request))

    async def _watch(self, request: Request) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self.leave()
        self.events.put_nowait(("gone", None))

    def _ended(self, future) -> None:
        """On the server's loop, whether or not anyone still reads the events."""
        self.watcher.cancel()
        self._uncount()
        if future.exception() is None:
            self.server.finish(self, future.result())
        self.events.put_nowait(("end", future))

    def leave(self) -> None:
        """The client is gone: its generation stops, and it no longer counts against the queue."""
        self.gone.set()
        self._uncount()

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            self.server.admitted -= 1

    async def next(self) -> tuple:
        """("text", piece), ("end", the job's Future) or ("gone", None)."""
        return await self.events.get()

    async def whole(self, first) -> Response:
        pieces, event = [], first
        while event[0] == "text":
            pieces.append(event[1])
            event = await self.next()
        if event[0] == "gone":
            return Response(status_code=204)
        return JSONResponse(self.shape.whole(_result_or_raise(event[1], self.shape.param)))

    async def events_sse(self, first, usage: bool):
        """The SSE body: a chunk per text piece, a last chunk with finish_reason, optionally
        one with usage, then [DONE]; an error after the headers went out is an error event."""
        try:
            yield _sse(self.shape.start())
            event = first
            while event[0] == "text":
                yield _sse(self.shape.piece(event[1]))
                event = await self.next()
            if event[0] == "gone":
                return
            try:
                result = _result_or_raise(event[1], self.shape.param)
            except ApiError as err:
                yield _sse(err.body())
                return
            yield _sse(self.shape.end(result))
            if usage:
                yield _sse(self.shape.usage_chunk(result))
            yield "data: [DONE]\n\n"
        finally:
            self.leave()   # the stream was closed or abandoned: stop generating


def _result_or_raise(future, param: str) -> Result:
    if error := future.exception():
        raise _engine_error(error, param)
    result = future.result()
    if result.stop_reason == "cancelled":
        raise ApiError(503, "the server is shutting down", "server_error", code="server_shutting_down")
    return result


def _job(make, *args, **fields) -> Job:
    """make(*args, **fields): the request's job; fields the engine refuses (a logit_bias key that
    is no token id, ...) are a 400."""
    try:
        return make(*args, **fields)
    except ValueError as err:
        raise _engine_error(err, None) from None


def _engine_error(error: BaseException, param: str | None) -> ApiError:
    if isinstance(error, ContextFull):
        return ApiError(400, str(error), param=param, code="context_length_exceeded")
    if isinstance(error, ValueError):   # InvalidArgument, a chat template refusing the messages, ...
        return ApiError(400, str(error), param=param)
    if isinstance(error, CeraError):    # the GPU failed (device lost, ...)
        return ApiError(500, str(error), "server_error", code=error.type)
    log.error("generation failed", exc_info=error)
    return ApiError(500, f"internal error ({type(error).__name__}); see the server's log", "server_error")


# ---- server-sent events ----

def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


# ---- errors in OpenAI's shape ----

async def _parse(request: Request, model: type[BaseModel]):
    body = await request.body()
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ApiError(400, f"could not parse the JSON body of the request: {err}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        param = ".".join(str(p) for p in first["loc"])
        raise ApiError(400, f"{param}: {first['msg']}" if param else first["msg"], param=param or None,
                       code="invalid_value") from None


class _RequireKey:
    """ASGI middleware: every request needs the API key, if the server has one."""

    def __init__(self, app, server: Server):
        self.app, self.server = app, server

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            self.server.check_key(Request(scope))
        except ApiError as err:
            return await err.response()(scope, receive, send)
        await self.app(scope, receive, send)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=code).response()


async def _api_error(request: Request, exc: ApiError) -> Response:
    return exc.response()


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return ApiError(500, f"internal error ({type(exc).__name__}); see the server's log", "server_error").response()


# ---- running it ----

def serve(runner: Runner, model_id: str, host: str = "127.0.0.1", port: int = 8080, max_queue: int = 16,
          api_key: str | None = None) -> None:
    """Serve until Ctrl-C or SIGTERM: then every generation stops within a token, the open
    responses end, and this returns."""
    import copy

    import uvicorn

    server = Server(runner, model_id, max_queue, api_key)

    class Uvicorn(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            server.closing.set()   # so the streams end now rather than when their generations would
            super().handle_exit(sig, frame)

    log_config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    log_config["loggers"]["cera"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    if api_key is None and host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("listening on %s without --api-key: anyone who can reach it can use it", host)
    config = uvicorn.Config(server.app, host=host, port=port, lifespan="off", log_config=log_config,
                            timeout_graceful_shutdown=5)
    try:
        Uvicorn(config).run()
    except KeyboardInterrupt:   # uvicorn re-raises the Ctrl-C it handled, once it has shut down
        pass
