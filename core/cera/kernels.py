"""WGSL sources from `shaders/`, a tiny preprocessor, and a pipeline cache.

Shader files use `#include "file.wgsl"`, `#ifdef NAME` / `#ifndef NAME` /
`#else` / `#endif`. Every define with a value is also emitted as a WGSL
`const NAME = value;` at the top, so sizes can be used in `@workgroup_size`
and array lengths; a define whose value is True is a flag for `#ifdef` only.
`#include "file.wgsl" P=word ...` includes a file that is written once for several
arrays or flags (WGSL has no generics, and a function cannot take a storage array): each
`${P}` of its text, directives too, becomes `word`, once per distinct set of parameters.
`enable ...;` lines (e.g. `enable f16;` or `enable subgroups;` under a flag) move above those
consts, each once: WGSL wants its directives before any declaration.
"""
from __future__ import annotations

from importlib import resources

from cera.device import Binding, Dispatch
from cera.errors import TooLarge

_sources: dict[str, str] = {}


def source(name: str) -> str:
    """The raw text of shaders/{name} (cached)."""
    if name not in _sources:
        _sources[name] = resources.files("cera.shaders").joinpath(name).read_text()
    return _sources[name]


def override(sources: dict[str, str]) -> None:
    """Use these WGSL sources (by file name) instead of the shipped ones, for kernels compiled
    from now on (benchmarks trying a variant: scripts/h200/browser_bench.py)."""
    _sources.update(sources)


def wgsl_value(value) -> str:
    """A Python define value as WGSL: ints unsigned, floats as f32 literals."""
    if isinstance(value, bool):
        raise TypeError("flags are not values")
    if isinstance(value, int):
        return f"{value}u"
    if isinstance(value, float):
        return f"{value!r}f" if "e" not in repr(value) else f"{value:.9e}f"
    return str(value)


def preprocess(name: str, defines: dict) -> str:
    """Expand includes and conditionals of shaders/{name} for `defines`."""
    consts = [f"const {k} = {wgsl_value(v)};" for k, v in sorted(defines.items()) if v is not True]
    lines = _expand(name, defines, set())
    enables = list(dict.fromkeys(line for line in lines if line.startswith("enable ")))
    return "\n".join(enables + consts + [line for line in lines if not line.startswith("enable ")]) + "\n"


def _expand(name: str, defines: dict, seen: set, params: tuple = ()) -> list[str]:
    if (name, params) in seen:
        return []   # each include once (per set of parameters)
    seen.add((name, params))
    text = source(name)
    for param, word in params:
        text = text.replace("${" + param + "}", word)
    if "${" in text:
        raise ValueError(f"{name}: a parameter left unset: {text[text.index('${'):].split('}')[0]}}} ({dict(params)})")
    out, stack = [], []   # stack of (active, any_branch_taken)
    for lineno, line in enumerate(text.splitlines(), 1):
        word = line.strip().split(maxsplit=1)
        directive = word[0] if word and word[0].startswith("#") else None
        active = all(a for a, _ in stack)
        if directive in ("#ifdef", "#ifndef"):
            cond = (word[1].strip() in defines) == (directive == "#ifdef")
            stack.append((cond, cond))
        elif directive == "#else":
            if not stack:
                raise ValueError(f"{name}:{lineno}: #else without #ifdef")
            _, taken = stack.pop()
            stack.append((not taken, True))
        elif directive == "#endif":
            if not stack:
                raise ValueError(f"{name}:{lineno}: #endif without #ifdef")
            stack.pop()
        elif directive == "#include":
            if active:
                file, *args = word[1].split()
                out += _expand(file.strip('"'), defines, seen, tuple(tuple(a.split("=", 1)) for a in args))
        elif directive is not None:
            raise ValueError(f"{name}:{lineno}: unknown directive {directive}")
        elif active:
            out.append(line)
    if stack:
        raise ValueError(f"{name}: unterminated #ifdef")
    return out


def flags(**named) -> dict:
    """The names given True, as #ifdef flags: flags(GLU=True, BIAS=False) -> {"GLU": True}."""
    return {name: True for name, on in named.items() if on}


class Kernels:
    """Compiles each (shader, defines) variant once per device, and makes dispatches of them."""

    def __init__(self, device):
        self.device = device
        self._cache = {}

    def get(self, name: str, **defines):
        key = (name, tuple(sorted(defines.items())))
        if key not in self._cache:
            label = name + "".join(f" {k}={v}" for k, v in key[1])
            self._cache[key] = self.device.kernel(label, preprocess(name, defines))
        return self._cache[key]

    def dispatch(self, shader: str, bindings, groups: tuple[int, int, int], label: str, *,
                 reads: int = 0, writes: int = 0, reads_per_position: int = 0, **defines) -> Dispatch:
        """A dispatch of shaders/{shader} for `defines`: bindings[i] (a Binding or a whole
        buffer) at @binding(i), `groups` workgroups; reads/writes: the bytes it moves."""
        limit = self.device.limits.max_compute_workgroups_per_dimension
        if not all(1 <= n <= limit for n in groups):
            raise TooLarge(f"{label}: {groups} workgroups (this GPU allows 1..{limit} per dimension)")
        kernel = self.get(shader, **defines)
        bindings = tuple(b if isinstance(b, Binding) else Binding(b) for b in bindings)
        return Dispatch(kernel, self.device.bind(kernel, bindings, label), tuple(groups), label, bindings,
                        reads, writes, reads_per_position)
