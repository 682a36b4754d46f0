"""Chat templates: the GGUF's `tokenizer.chat_template` rendered with sandboxed jinja2,
as HF transformers and llama.cpp's jinja path do.

A template comes with the model file, from whoever made it, so its rendering is bounded as well as
sandboxed: jinja2's sandbox already refuses attribute tricks (`__class__`) and ranges past
100,000 items, but not a string or list multiplied a billion times, loops nested over such
ranges, or a macro that calls itself. `BoundedEnvironment` refuses each before it costs much:
a product's size is checked before it is made, the items all `range` calls yield are counted,
and the text rendered is counted as it is made. Any failure of the template itself is a
`BadFile` that says so; a template's own `raise_exception` (messages it refuses) stays an
`InvalidArgument`.
"""
from __future__ import annotations

import operator

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from cera.errors import BadFile, InvalidArgument

MAX_RENDERED = 1 << 20    # characters a template may add beyond the messages' own text
MAX_RANGE_ITEMS = 100_000  # items all of a rendering's `range` calls may yield together


class TemplateLimit(TemplateError):
    """A bounded template went past one of its limits."""


def _raise_exception(message):
    """The templates' own check of the messages (e.g. roles must alternate)."""
    raise InvalidArgument(f"the chat template refuses these messages: {message}")


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with the work a rendering may do bounded: `budget` characters of output and of
    any string or list one product makes, MAX_RANGE_ITEMS items from `range` in all."""
    intercepted_binops = frozenset({"*", "**"})

    def __init__(self, budget: int, **options):
        super().__init__(**options)
        self.budget, self.range_items = budget, 0
        self.globals["range"] = self._range
        self.globals["raise_exception"] = _raise_exception

    def call_binop(self, context, op: str, left, right):
        if op == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > self.budget:
                    raise TemplateLimit(f"it multiplies a sequence of {len(seq)} by {n}")
            return operator.mul(left, right)
        if op == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 64:
                raise TemplateLimit(f"it raises {left} to the power {right}")
            return operator.pow(left, right)
        return super().call_binop(context, op, left, right)

    def _range(self, *args):
        items = range(*args)
        self.range_items += len(items)
        if self.range_items > MAX_RANGE_ITEMS:
            raise TemplateLimit(f"its ranges yield more than {MAX_RANGE_ITEMS} items")
        return items


def render(template: str, messages: list[dict], add_generation_prompt: bool = True,
           bos_token: str = "", eos_token: str = "", tools: list[dict] | None = None) -> str:
    """The prompt text for `messages` ([{"role": ..., "content": ...}]) and `tools` (OpenAI's
    tool objects, as transformers passes them; None: none)."""
    text = sum(len(m.get("content") or "") for m in messages)
    env = BoundedEnvironment(text + MAX_RENDERED, trim_blocks=True, lstrip_blocks=True)
    try:
        pieces, size = [], 0
        for piece in env.from_string(template).generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                                        bos_token=bos_token, eos_token=eos_token, tools=tools):
            size += len(piece)
            if size > env.budget:
                raise TemplateLimit(f"it renders more than {env.budget} characters")
            pieces.append(piece)
        return "".join(pieces)
    except InvalidArgument:
        raise
    except (TemplateError, RecursionError, MemoryError, ArithmeticError, TypeError, ValueError, LookupError,
            AttributeError) as err:
        raise BadFile(f"the model's chat template fails: {type(err).__name__}: {err}"[:500]) from None
