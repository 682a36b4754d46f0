"""A generation request (`Job`) and how it runs on an engine (`run_job`): stop strings cut the
streamed text (`StopText`), tool calls are parsed out of it (cera.tools), LoRA adapters are
picked. The native host runs jobs on the engine thread (cera.runner's `Runner`); the browser,
which has no threads, runs them on its worker's loop (web/cera_web).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from cera.engine import DEFAULT_MAX_TOKENS, Engine, Result
from cera.errors import InvalidArgument
from cera.sampling import Sampler
from cera.tools import CallText, Tools, call_format, forced_call


@dataclass
class Job:
    """One generation. `prompt` is text or token ids, sent as is; `messages` (instead of a
    prompt) is a conversation, rendered with the model's chat template. Generation ends at
    the first of `stop` (that text and what follows are left out), EOS, or `max_tokens`."""
    prompt: str | list[int] | None = None
    messages: list[dict] | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    sampler: Sampler = field(default_factory=Sampler)
    stop: tuple[str, ...] = ()
    adapters: tuple[str | int, ...] | None = None   # LoRA adapters by name or index; None: every one loaded
    tools: Tools | None = None   # the functions a chat reply may call (cera.tools)
    logprobs: int | None = None  # report each token's log-probability and this many alternatives' (Engine.generate)

    @property
    def constrained(self) -> bool:
        """Whether the reply is constrained (a grammar engine is needed)."""
        return self.sampler.constraint is not None or bool(self.tools and self.tools.forced)

    def prompt_ids(self, engine: Engine) -> list[int]:
        if (self.prompt is None) == (self.messages is None):
            raise InvalidArgument("a Job takes a prompt or messages, not both")
        if self.tools is not None and self.messages is None:
            raise InvalidArgument("tools go with a conversation (messages), not a plain prompt")
        if self.messages is not None:
            return engine.chat_tokens(self.messages, self.tools)
        return engine.prompt_tokens(self.prompt) if isinstance(self.prompt, str) else list(self.prompt)


class StopText:
    """Cuts streamed text at the first stop string. push() returns the text that is safe to
    show: a tail that could still grow into a stop string is held back until it cannot."""

    def __init__(self, stops):
        self.stops = [s for s in stops if s]
        self.held = ""
        self.hit = False

    def push(self, piece: str) -> str:
        if self.hit:
            return ""
        text = self.held + piece
        found = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if found:
            self.hit, self.held = True, ""
            return text[:min(found)]
        keep = max((n for s in self.stops for n in range(min(len(s) - 1, len(text)), 0, -1)
                    if text.endswith(s[:n])), default=0)
        self.held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held


async def run_job(engine: Engine, job: Job, on_text=None, should_stop=None) -> Result:
    """Run `job` on the caller's event loop. Text goes to on_text(piece) cut at the first stop
    string (a tail that may still become one is held back), and with tools, up to where a call
    may begin (the calls come back parsed in the Result's tool_calls; cera.tools). should_stop(),
    asked before the job starts and before each token, ends it early. stop_reason: the engine's,
    or "stop_string", "cancelled" (should_stop said so) or "tool_calls"."""
    on_text = on_text or (lambda piece: None)
    should_stop = should_stop or (lambda: False)
    if should_stop():   # left while waiting its turn: nothing to run
        return Result("", [], [], "cancelled", 0.0, 0.0)
    stops = StopText(job.stop)
    fmt = call_format(engine.chat_template) if job.tools is not None else None
    calls = CallText(fmt, job.tools.names) if fmt else None
    shown = []

    def show(piece: str) -> None:
        if text := stops.push(piece):
            shown.append(text)
            if calls is not None:
                text = calls.push(text)
            if text:
                on_text(text)

    adapters = range(len(engine.loras)) if job.adapters is None else job.adapters
    sampler, ids = job.sampler, job.prompt_ids(engine)
    call = forced_call(job.tools, fmt) if fmt else None
    if call is not None:
        if sampler.constraint is not None:
            raise InvalidArgument("a reply is a tool call (tool_choice) or fits a response_format, not both")
        sampler = replace(sampler, constraint=call.constraint)
        ids += engine.tokenizer.encode(call.opening, add_special=False, parse_special=True)
        calls.push(call.opening)
    result = await engine.generate(ids, job.max_tokens, on_text=show, sampler=sampler,
                                   should_stop=lambda: stops.hit or should_stop(), adapters=adapters,
                                   logprobs=job.logprobs)
    if tail := stops.flush():
        shown.append(tail)
        on_text(calls.push(tail) if calls else tail)
    reason = "stop_string" if stops.hit else "cancelled" if result.stop_reason == "stopped" \
        else result.stop_reason
    text, found = "".join(shown), []
    if calls is not None:
        if call is not None and result.stop_reason == "eos":
            calls.push(call.closing)
        held, text, found = calls.end()
        if held:
            on_text(held)
        reason = "tool_calls" if found else reason
    return replace(result, text=text or "", stop_reason=reason, tool_calls=found)
