"""Chat templates: the GGUF's `tokenizer.chat_template` rendered with sandboxed jinja2,
as HF transformers and llama.cpp's jinja path do.

A template comes with the model file, from whoever made it, so its rendering is bounded as well as
sandboxed: jinja2's sandbox already refuses attribute tricks (`__class__`), but not a string
multiplied a billion times, a width of a billion in `center` or `'%1000000000d'`, loops nested
over long sequences, a macro that calls itself twice, a string doubled forty times. Every way the
rendering works or makes text is counted as it happens (`BoundedEnvironment`):
- size: no string a step makes, no value written out and no output may pass `budget` characters
  (the messages' own text and MAX_RENDERED more); a product, a padding width, a format's width,
  a join, a replace, `tojson` or `indent` is checked before it is made;
- work: a loop's items, calls, lookups, operations and what filters and methods are handed (their
  sizes, and their numbers: a `slice(10**6)` loops that often) are steps, MAX_WORK of them and one
  per character of the messages' text; `range` yields MAX_RANGE_ITEMS items at most in all.
Loops and `~` reach the counters because the template's syntax tree is rewritten to call them
before it is compiled. `lipsum` and `pprint`, which no chat template needs, are gone. Any failure
of the template itself is a `BadFile` that says so; a template's own `raise_exception` (messages
it refuses) stays an `InvalidArgument`.
"""
from __future__ import annotations

import operator
import re
from collections.abc import ItemsView, Iterator, KeysView, Mapping, Set, ValuesView
from numbers import Number

from jinja2 import TemplateError, nodes
from jinja2.runtime import LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer

from cera.errors import BadFile, InvalidArgument

MAX_RENDERED = 1 << 20    # characters a template may add beyond the messages' own text
MAX_WORK = 25_000         # steps a rendering may take, and STEPS_PER_MESSAGE a message or tool, one a character
MAX_RANGE_ITEMS = 100_000  # items all of a rendering's `range` calls may yield together
MAX_NESTING = 16          # blocks inside blocks (Python compiles 20 nested loops; jinja's compiler slows past)
MAX_INT_BITS = 4096       # the largest integer a product or power may make (its text: 1,234 digits)
CHARS_PER_STEP = 16       # characters a C string method handles in the time of one step
STEPS_PER_MESSAGE = 200
CALL_STEPS = 2            # a call; a macro's or a recursive loop's (a new context) MACRO_STEPS
MACRO_STEPS = 10
SLOW_FILTERS = frozenset({"wordwrap", "urlize", "int", "float", "striptags", "xmlattr"})  # a step per character
_PERCENT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?(.)", re.S)
_NUMBER = re.compile(r"\d+")


class TemplateLimit(TemplateError):
    """A bounded template went past one of its limits."""


def _raise_exception(message):
    """The templates' own check of the messages (e.g. roles must alternate)."""
    raise InvalidArgument(f"the chat template refuses these messages: {message}")


_BLOCKS = (nodes.For, nodes.If, nodes.Macro, nodes.CallBlock, nodes.FilterBlock, nodes.With, nodes.Block,
           nodes.AssignBlock, nodes.Scope, nodes.ScopedEvalContextModifier)


class _CountLoops(NodeTransformer):
    """Routes each loop's items and each `~` through the environment's counters, refusing blocks
    nested deeper than MAX_NESTING."""

    def __init__(self, environment):
        self.environment, self.depth = environment, 0

    def generic_visit(self, node, *args, **kwargs):
        block = isinstance(node, _BLOCKS)
        self.depth += block
        if self.depth > MAX_NESTING:
            raise TemplateLimit(f"it nests blocks deeper than {MAX_NESTING}")
        try:
            return super().generic_visit(node, *args, **kwargs)
        finally:
            self.depth -= block

    def _call(self, name: str, args: list, lineno: int) -> nodes.Call:
        call = nodes.Call(nodes.EnvironmentAttribute(name, lineno=lineno), args, [], None, None, lineno=lineno)
        return call.set_environment(self.environment)

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)
        node.iter = self._call("loop_items", [node.iter], node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Call:
        self.generic_visit(node)
        return self._call("concat", node.nodes, node.lineno)


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with the size of what a rendering makes (`budget` characters) and its work
    (`max_work` steps) bounded, as the module's docstring says."""
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, budget: int, max_work: int, **options):
        super().__init__(**options)
        self.budget, self.max_work = budget, max_work
        self.work = self.range_items = 0
        self.finalize = self._written
        del self.globals["lipsum"], self.filters["pprint"]
        self.globals["range"] = self._range
        self.globals["raise_exception"] = _raise_exception
        self.filters = {name: self._bounded_filter(name, f) for name, f in self.filters.items()}
        self.tests = {name: self._bounded_filter(name, f) for name, f in self.tests.items()}

    # ---- the counters -----------------------------------------------------------------
    def spend(self, steps: int) -> None:
        self.work += steps
        if self.work > self.max_work:
            raise TemplateLimit(f"it takes more than {self.max_work} steps")

    def fits(self, size: int, what: str) -> None:
        if size > self.budget:
            raise TemplateLimit(f"{what} would make {size} characters (at most {self.budget})")

    def _cost(self, args, kwargs, chars_per_step: int = CHARS_PER_STEP) -> int:
        """Steps for handing these values to a filter or method: items, characters, numbers."""
        steps = 1
        for value in (*args, *kwargs.values()):
            if isinstance(value, str):
                steps += len(value) // chars_per_step
            elif isinstance(value, (list, tuple, Mapping, Set, range)):
                steps += len(value)
            elif isinstance(value, int):
                if abs(value) > self.budget:
                    raise TemplateLimit(f"it passes the number {value} (at most {self.budget})")
                steps += abs(value)
        return steps

    def text_size(self, value) -> tuple[int, int, int]:
        """(at least the characters str(value) makes, the items in it, its depth), counting stops
        past `budget`; each container's items are steps."""
        if isinstance(value, str):
            return len(value), 1, 0
        seen: dict = {}

        def size(v, depth: int) -> tuple[int, int, int]:
            if isinstance(v, str):
                return len(v), 1, depth
            if isinstance(v, int):
                return v.bit_length() * 3 // 10 + 2, 1, depth
            if isinstance(v, Namespace):
                v = v._Namespace__attrs
            if not isinstance(v, (list, tuple, Mapping, Set, KeysView, ItemsView, ValuesView)):
                return 32, 1, depth   # None, a float, a macro, an undefined: short
            if id(v) in seen:
                return seen[id(v)]
            self.spend(len(v))
            total, items, deepest = 2, 1, depth
            for item in (v.items() if isinstance(v, Mapping) else v):
                n, k, d = size(item, depth + 1)
                total, items, deepest = total + n + 2, items + k, max(deepest, d)
                if total > self.budget:
                    break
            seen[id(v)] = total, items, deepest
            return seen[id(v)]
        return size(value, 0)

    # ---- the sandbox's hooks ----------------------------------------------------------
    def getattr(self, obj, attribute):
        self.spend(1)
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        self.spend(1)
        return super().getitem(obj, argument)

    def call(self, context, obj, /, *args, **kwargs):
        receiver = getattr(obj, "__self__", None)
        self.spend((MACRO_STEPS if isinstance(obj, (Macro, LoopContext)) else CALL_STEPS) + self._cost(args, kwargs)
                   + (self._cost((receiver,), {}) if isinstance(receiver, str) else 0))
        if isinstance(obj, LoopContext):    # a recursive loop's next level
            args = tuple(self.loop_items(a) for a in args)
        elif isinstance(receiver, str):
            self._check_str_method(receiver, obj.__name__, args)
        return super().call(context, obj, *args, **kwargs)

    def _check_str_method(self, s: str, name: str, args) -> None:
        """Refuse a str method whose result would pass the budget, before it runs."""
        if name == "replace" and len(args) >= 2:
            self.fits(_replaced_size(s, *args[:3]), "a replace")
        elif name == "join" and isinstance(args[0] if args else None, (list, tuple)):
            self.fits(self.text_size(args[0])[0] + len(s) * len(args[0]), "a join")
        elif name == "expandtabs":
            self.fits(len(s) + s.count("\t") * (args[0] if args and isinstance(args[0], int) else 8), "expandtabs")

    def call_binop(self, context, op: str, left, right):
        self.spend(1)
        if op == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                    self.fits(len(seq) * n, f"multiplying a sequence of {len(seq)} by {n}")
                    self.spend(len(seq) * max(n, 0) // CHARS_PER_STEP)
            if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise TemplateLimit(f"it multiplies numbers of {left.bit_length()} and {right.bit_length()} bits")
            return operator.mul(left, right)
        if op == "**":
            if (isinstance(left, int) and isinstance(right, int) and abs(left) > 1
                    and left.bit_length() * right > MAX_INT_BITS):
                raise TemplateLimit(f"it raises a number of {left.bit_length()} bits to the power {right}")
            return operator.pow(left, right)
        if op == "+":
            if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
                self.fits(len(left) + len(right), "a sum of sequences")
                self.spend((len(left) + len(right)) // CHARS_PER_STEP)
            return operator.add(left, right)
        if op == "%" and isinstance(left, str):
            self.fits(self._percent_size(left, right), "a % format")
        return operator.mod(left, right)

    def wrap_str_format(self, value):
        """str.format and format_map, their widths and fields checked before they run."""
        sandboxed = super().wrap_str_format(value)
        if sandboxed is None:
            return None
        fmt = value.__self__

        def bounded(*args, **kwargs):
            values = (*args, *kwargs.values(), *(args[0].values() if value.__name__ == "format_map" and args
                                                 and isinstance(args[0], Mapping) else ()))
            largest = max((self.text_size(v)[0] for v in values), default=0)
            widths = sum(int(w) for w in _NUMBER.findall(fmt))
            self.fits(len(fmt) + widths + fmt.count("{") * largest, "a str.format")
            return sandboxed(*args, **kwargs)
        return bounded

    def _percent_size(self, fmt: str, args) -> int:
        """At least the characters `fmt % args` makes, its widths checked."""
        specs = _PERCENT.findall(fmt)
        widths = 0
        for width, precision, _ in specs:
            for n in (width, precision):
                if n.isdigit():
                    if int(n) > self.budget:
                        raise TemplateLimit(f"a % format asks for a width of {n}")
                    widths += int(n)
        values = args.values() if isinstance(args, Mapping) else args if isinstance(args, tuple) else (args,)
        largest = max((self.text_size(v)[0] for v in values), default=0)
        return len(fmt) + widths + len(specs) * largest + sum(v for v in values if isinstance(v, int) and v > 0
                                                              and any(w == "*" or p == "*" for w, p, _ in specs))

    # ---- what the rewritten template calls ----------------------------------------------
    def loop_items(self, iterable):
        """The items of a loop, each a step."""
        for item in iterable:
            self.spend(1)
            yield item

    def concat(self, *values) -> str:
        """`a ~ b`, its size checked before it is made."""
        self.fits(sum(self.text_size(v)[0] for v in values), "a ~ concatenation")
        return "".join([str(v) for v in values])

    def _written(self, value):
        """What `{{ ... }}` writes out, its size checked before it becomes text."""
        self.spend(1)
        self.fits(self.text_size(value)[0], "a value written out")
        return value

    def _range(self, *args):
        items = range(*args)
        self.range_items += len(items)
        if self.range_items > MAX_RANGE_ITEMS:
            raise TemplateLimit(f"its ranges yield more than {MAX_RANGE_ITEMS} items")
        return items

    def _bounded_filter(self, name: str, f):
        """Filter (or test) `f` with its work counted and, where its result can outgrow its input, that
        result's size checked before it runs."""
        passes = getattr(f, "jinja_pass_arg", None)   # a context, eval context or environment first

        def bounded(*args, **kwargs):
            head, args = (args[:1], args[1:]) if passes else ((), args)
            if args and isinstance(args[0], Iterator):   # a generator (map, select...): its items, counted
                args = (list(self.loop_items(args[0])), *args[1:])
            self.spend(self._cost(args, kwargs, 1 if name in SLOW_FILTERS else CHARS_PER_STEP))
            self._check_filter(name, args, kwargs)
            return f(*head, *args, **kwargs)
        if passes:
            bounded.jinja_pass_arg = passes
        return bounded

    def _check_filter(self, name: str, args, kwargs) -> None:
        value, rest = (args[0] if args else None), args[1:]
        if name == "replace" and len(rest) >= 2 and isinstance(value, str):
            self.fits(_replaced_size(value, *rest[:3]), "a replace")
        elif name == "join":
            sep = rest[0] if rest else kwargs.get("d", "")
            n = len(value) if isinstance(value, (list, tuple)) else 1
            self.fits(self.text_size(value)[0] + len(str(sep)) * n, "a join")
        elif name == "indent" and isinstance(value, str):
            width = rest[0] if rest else kwargs.get("width", 4)
            self.fits(len(value) + (value.count("\n") + 1) * (width if isinstance(width, int) else len(str(width))),
                      "an indent")
        elif name == "format" and isinstance(value, str):
            self.fits(self._percent_size(value, kwargs or tuple(rest)), "a format")
        elif name == "tojson":
            indent = rest[0] if rest else kwargs.get("indent") or 0
            size, items, depth = self.text_size(value)
            self.fits(2 * size + items * (1 + depth * (indent if isinstance(indent, int) else 0)), "tojson")
        elif name in ("string", "list", "escape", "forceescape", "urlize", "xmlattr", "wordwrap", "striptags"):
            self.fits(6 * self.text_size(value)[0], name)   # escapes: at most 6 characters for one
        elif name == "sum" and not isinstance(kwargs.get("start", rest[1] if len(rest) > 1 else 0), Number):
            raise TemplateLimit("it sums sequences (a quadratic copy)")


def _replaced_size(s: str, old, new, count=-1) -> int:
    """The length of s.replace(old, new, count), counted before it is made."""
    if not isinstance(old, str) or not isinstance(new, str):
        return len(s)
    found = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    return len(s) + found * (len(new) - len(old))


def render(template: str, messages: list[dict], add_generation_prompt: bool = True,
           bos_token: str = "", eos_token: str = "", tools: list[dict] | None = None) -> str:
    """The prompt text for `messages` ([{"role": ..., "content": ...}]) and `tools` (OpenAI's
    tool objects, as transformers passes them; None: none)."""
    text = sum(len(m.get("content") or "") for m in messages)
    steps = MAX_WORK + text + STEPS_PER_MESSAGE * (len(messages) + len(tools or ()))
    env = BoundedEnvironment(text + MAX_RENDERED, steps, trim_blocks=True, lstrip_blocks=True)
    try:
        if not isinstance(template, str):
            raise TemplateLimit(f"it is a {type(template).__name__}, not text")
        compiled = env.from_string(_CountLoops(env).visit(env.parse(template)))
        pieces, size = [], 0
        for piece in compiled.generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                       bos_token=bos_token, eos_token=eos_token, tools=tools):
            size += len(piece)
            if size > env.budget:
                raise TemplateLimit(f"it renders more than {env.budget} characters")
            pieces.append(piece)
        return "".join(pieces)
    except InvalidArgument:
        raise
    except (TemplateError, RecursionError, MemoryError, ArithmeticError, TypeError, ValueError, LookupError,
            AttributeError, SyntaxError, AssertionError) as err:   # jinja2's truncate asserts its arguments
        raise BadFile(f"the model's chat template fails: {type(err).__name__}: {err}"[:500]) from None
