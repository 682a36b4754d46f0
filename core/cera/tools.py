"""Tool calls: OpenAI's `tools` into the model's own chat template, its calls out of the reply.

A model is told its tools by its chat template (the Jinja `tools` variable, as transformers
renders it) and writes a call in its family's format; cera knows two:

- "hermes" (Qwen2.5, Qwen3, Hermes and every template that writes `<tool_call>`):
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one block per call;
- "llama3" (Llama 3.1-3.3's JSON calls): the reply is `{"name": ..., "parameters": {...}}`.

A template that does not mention tools gets them as Hermes does: a system message that lists
them and says how to call, the earlier calls and results written into the conversation as text.

With tool_choice "required" or a named function, the call itself is constrained: the format's
opening is written for the model, then a JSON schema allows exactly a call to those tools, its
arguments by their JSON schema, whose
objects take no properties beyond those it names unless it says otherwise (llama.cpp's rule
too: a call's arguments are what the function declares, and a model cannot ramble on in them).
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from cera.constrain import Constraint, rewrite
from cera.errors import InvalidArgument

HERMES, LLAMA3 = "hermes", "llama3"
CHOICES = ("auto", "none", "required")
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_WHOLE_CALL = re.compile(r"\s*(?:<\|python_tag\|>|```(?:json)?)?\s*(\{.*\})\s*(?:```)?\s*", re.S)
_CALL_STARTS = ("{", "```", "<|python_tag|>")   # how a reply that is one call begins
_HERMES_SYSTEM = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n"
                  "</tools>\n\nFor each function call, return a json object with function name and arguments within "
                  "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
                  "<args-json-object>}}\n</tool_call>")


@dataclass(frozen=True)
class Tools:
    """A request's tools (OpenAI's [{"type": "function", "function": {name, description,
    parameters}}]) and its tool_choice ("auto", "none", "required" or
    {"type": "function", "function": {"name": ...}}), checked."""
    functions: tuple[dict, ...]
    choice: str | None = "auto"      # "auto", "required", or the name of the one function to call

    @classmethod
    def of(cls, tools: list[dict] | None, tool_choice=None) -> "Tools | None":
        """None when the request has no tools, or tool_choice "none" (the model is not told of them)."""
        if tool_choice is not None and tool_choice not in CHOICES and not isinstance(tool_choice, dict):
            raise InvalidArgument(f"tool_choice {tool_choice!r}: one of {', '.join(CHOICES)} or "
                                  '{"type": "function", "function": {"name": ...}}')
        if not tools or tool_choice == "none":
            if isinstance(tool_choice, dict) or tool_choice == "required":
                raise InvalidArgument("tool_choice asks for a tool call, but the request has no tools")
            return None
        functions = []
        for tool in tools:
            f = tool.get("function") if isinstance(tool, dict) and tool.get("type", "function") == "function" else None
            if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
                raise InvalidArgument('each tool is {"type": "function", "function": {"name": ..., "parameters": '
                                      '{...}}}')
            functions.append({"name": f["name"], "description": f.get("description", ""),
                              "parameters": f.get("parameters") or {"type": "object", "properties": {}}})
        names = [f["name"] for f in functions]
        choice = tool_choice or "auto"
        if isinstance(choice, dict):
            choice = (choice.get("function") or {}).get("name")
            if choice not in names:
                raise InvalidArgument(f"tool_choice names function {choice!r}; the tools are {', '.join(names)}")
        return cls(tuple(functions), choice)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(f["name"] for f in self.functions)

    @property
    def for_template(self) -> list[dict]:
        return [{"type": "function", "function": f} for f in self.functions]

    @property
    def forced(self) -> tuple[dict, ...]:
        """The functions a call must be to: none unless tool_choice asks for a call."""
        if self.choice == "auto":
            return ()
        return self.functions if self.choice == "required" else tuple(f for f in self.functions if f["name"] == self.choice)


def call_format(template: str) -> str:
    """The tool-call format a chat template teaches (module docstring)."""
    if "<|python_tag|>" in template or ("ipython" in template and '"parameters"' in template):
        return LLAMA3
    return HERMES


def knows_tools(template: str) -> bool:
    return "tools" in template


def messages_for(template: str, messages: list[dict], tools: Tools | None) -> list[dict]:
    """The conversation as the template reads it: the calls' arguments as objects (templates
    write them with `tojson`); for a template that knows no tools, Hermes' system message and
    the calls and results as text."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [_call_for_template(c) for c in m["tool_calls"]]
        out.append(m)
    if knows_tools(template):
        return out
    plain = []
    for m in out:
        if m.get("tool_calls"):
            calls = "\n".join(_hermes_text(c["function"]) for c in m["tool_calls"])
            m = {"role": "assistant", "content": ((m.get("content") or "") + "\n" + calls).strip()}
        elif m["role"] == "tool":
            m = {"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"}
        plain.append(m)
    if tools is not None:
        listing = _HERMES_SYSTEM.format(tools="\n".join(json.dumps(t) for t in tools.for_template))
        if plain and plain[0]["role"] == "system":
            plain[0] = {"role": "system", "content": plain[0]["content"] + "\n\n" + listing}
        else:
            plain.insert(0, {"role": "system", "content": listing})
    return plain


def _call_for_template(call: dict) -> dict:
    f = dict(call.get("function") or {})
    if isinstance(f.get("arguments"), str):
        try:
            f["arguments"] = json.loads(f["arguments"])
        except json.JSONDecodeError:
            raise InvalidArgument(f"tool call {f.get('name')!r}: its arguments are not JSON") from None
    return {**call, "function": f}


def _hermes_text(function: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": function["name"], "arguments": function["arguments"]}) + "\n</tool_call>"


@dataclass(frozen=True)
class ForcedCall:
    """A reply that must be a call: the format's `opening`, written for the model (appended to
    the prompt, so the grammar engine sees plain JSON), then JSON valid under `constraint`
    (a call to one of the functions, its arguments fitting that function's parameters), then
    `closing`, which the reply's text gets back when the JSON is complete."""
    opening: str
    constraint: Constraint
    closing: str


def forced_call(tools: Tools, fmt: str) -> ForcedCall | None:
    """What a forced call must be (Tools.forced), None where tool_choice forces none."""
    if not tools.forced:
        return None
    key = "parameters" if fmt == LLAMA3 else "arguments"
    calls = [{"type": "object", "properties": {"name": {"const": f["name"]}, key: closed(f["parameters"])},
              "required": ["name", key], "additionalProperties": False} for f in tools.forced]
    constraint = Constraint.json_schema(calls[0] if len(calls) == 1 else {"anyOf": calls})
    return ForcedCall("", constraint, "") if fmt == LLAMA3 else ForcedCall("<tool_call>\n", constraint,
                                                                          "\n</tool_call>")


def closed(schema):
    """`schema` with "additionalProperties": false on every object schema that does not set it."""
    def close(s: dict) -> dict:
        is_object = s.get("type") == "object" or isinstance(s.get("properties"), dict)
        return {**s, "additionalProperties": False} if is_object and "additionalProperties" not in s else s
    return rewrite(schema, close)


def parse(text: str, fmt: str, names) -> tuple[str | None, list[dict]]:
    """A reply's text -> (content, OpenAI tool_calls) for the functions `names`; text that holds
    no call is all content. Besides the format's own calls, a reply that is one call to a known
    function, bare or in a ``` block, is one (Hermes-style models write that too; llama.cpp's
    parser takes it)."""
    calls, key = [], "parameters" if fmt == LLAMA3 else "arguments"
    if fmt == HERMES:
        for match in list(_HERMES_CALL.finditer(text)):
            if found := _call(match.group(1), key, names):
                calls.append(found)
                text = text.replace(match.group(0), "", 1)
    if not calls and (whole := _WHOLE_CALL.fullmatch(text)) and (found := _call(whole.group(1), key, names)):
        calls, text = [found], ""
    return (text.strip() or None) if calls else text, calls


def _call(body: str, key: str, names) -> dict | None:
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or call.get("name") not in names:
        return None
    arguments = call.get(key, call.get("arguments", {}))
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(arguments)}}


class CallText:
    """A reply's text as it streams, when it may hold calls: push() returns what is safe to
    show as content; text that may begin a call (a reply that may be one call, from its start;
    the format's marker, from there) is held, and end() parses the whole reply (content,
    tool_calls), giving back held text that held no call."""

    def __init__(self, fmt: str, names):
        self.fmt, self.names, self.text, self.shown = fmt, names, "", 0

    def push(self, piece: str) -> str:
        self.text += piece
        safe = self._safe_end()
        out, self.shown = self.text[self.shown: safe], max(self.shown, safe)
        return out

    def _safe_end(self) -> int:
        """How much of the text cannot be part of a call."""
        head = self.text.lstrip()
        if any(head.startswith(s) or s.startswith(head) for s in _CALL_STARTS):
            return 0
        marker = "<tool_call>"
        if self.fmt == LLAMA3:
            return len(self.text)
        at = self.text.find(marker)
        if at >= 0:
            return at
        keep = max((n for n in range(min(len(marker) - 1, len(self.text)), 0, -1) if self.text.endswith(marker[:n])),
                   default=0)
        return len(self.text) - keep

    def end(self) -> tuple[str, str | None, list[dict]]:
        """(the held text to show as content, the whole content, tool_calls)."""
        content, calls = parse(self.text, self.fmt, self.names)
        return ("" if calls else self.text[self.shown:]), content, calls
