"""The GPU kernels' numerics: the precision the KV cache stores K and V in, and the opt-ins that
round the activations more coarsely, for speed.

The KV cache (`cache_type_k`, `cache_type_v`, llama.cpp's --cache-type-k/-v names) holds f16 by
default, as llama.cpp's does: half the memory and half the bytes attention reads of f32, packed
two to a u32 (the kernels need no shader-f16) and rounded to nearest even on the way in, as numpy
casts; `Reference(kv_dtype=...)` stores its cache the same way (CACHE_TYPES), so the GPU's results
equal the reference's with the matching cache to f32 precision. f32 is kept on request, and
llama.cpp's q8_0 too: blocks of 32 values of a head's row quantized to int8 with an f16 scale,
exactly as llama.cpp's quantize_row_q8_0_ref rounds them, in 36 bytes a block (llama.cpp's are
34: the GPU's blocks are word-aligned, cera.ops.Q8_0_BLOCK, shaders/q8_cache.wgsl), 1.125 bytes a
value; its head_dim must be a multiple of 32.

By default every kernel computes as precisely as f32: results stay within the f32 tolerances of
the numpy reference, and prefill equals the per-token path to 1e-4 of the largest logit
(tests/test_prefill.py). Each opt-in gives that up where the weights are quantized:

- `int8`: the matrices of Q4_K and Q6_K weights take x quantized per 256-element block to 8 bits,
  as llama.cpp's CPU backend quantizes the activations of its k-quant dot products (Q8_K), and
  sum integer products: prefill through shaders/matmul_int.wgsl (cera.gpu.matmul.matmul_int),
  decode through matvec_int.wgsl in 8 bits instead of 24: prefill and decode are
  faster (docs/PERFORMANCE.md has the figures); the synthetic k-quant models' logits then equal llama.cpp's to ~1e-12 NMSE, but
  the real Qwen2.5-Coder-1.5B's perplexity moves 0.58% off the exact path's (to the other side of
  llama.cpp's) and depends on the prefill chunk by 0.1%.
- `f16`: prefill tiles staged in f16 (cera.gpu.matmul.half_tiles) where the device has
  shader-f16 (Chromium withholds it on NVIDIA/Linux): faster than the f32 tiles, less precise.

The numpy reference ignores the opt-ins: it is the exact oracle.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cera.errors import InvalidArgument, Unsupported
from cera.kernels import flags
from cera.ops import Q8_0, Q8_0_BLOCK

# The KV cache's types, by llama.cpp's names -> the numpy type holding it as the cache does: one
# value (f32, f16), or one block of Q8_0 values (q8_0: cera.ops.to_cache, from_cache)
CACHE_TYPES = {"f32": np.float32, "f16": np.float16, "q8_0": Q8_0_BLOCK}
DEFAULT_CACHE_TYPE = "f16"
# llama.cpp's other cache types, refused by name
LLAMA_CACHE_TYPES = ("bf16", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
# values of a head's row each cache type's unit holds, and the head_dim it needs a multiple of
_UNIT_VALUES = {"f32": 1, "f16": 1, "q8_0": Q8_0}
_HEAD_DIM_MULTIPLE = {"f32": 1, "f16": 2, "q8_0": Q8_0}


def check_head_dim(cache_type: str, head_dim: int) -> None:
    """A cache of `cache_type` holds whole words of each head's row: f16 an even head_dim, q8_0 a
    multiple of 32."""
    multiple = _HEAD_DIM_MULTIPLE[cache_type]
    if head_dim % multiple:
        need = "an even head_dim" if multiple == 2 else f"a head_dim that is a multiple of {multiple}"
        fits = [t for t in CACHE_TYPES if not head_dim % _HEAD_DIM_MULTIPLE[t]]
        raise Unsupported(f"a {cache_type} KV cache needs {need}, not {head_dim} (use the {' or '.join(fits)} cache: "
                          f"--cache-type-k/-v)")


def cache_row_bytes(cache_type: str, head_dim: int) -> int:
    """Bytes a cache of `cache_type` holds one head's row of head_dim values in (a cache slot of
    n_kv_heads heads: n_kv_heads times this): f32 4 a value, f16 2, q8_0 36 a block of 32."""
    check_head_dim(cache_type, head_dim)
    return np.dtype(CACHE_TYPES[cache_type]).itemsize * head_dim // _UNIT_VALUES[cache_type]


def check_cache_type(name: str, which: str) -> None:
    if name in CACHE_TYPES:
        return
    error = Unsupported if name in LLAMA_CACHE_TYPES else InvalidArgument
    *others, last = CACHE_TYPES
    raise error(f"{which} cache type {name!r}: the KV cache holds {', '.join(others)} or {last}")


@dataclass(frozen=True)
class Numerics:
    int8: bool = False   # Q4_K / Q6_K matrices on 8-bit x (Q8_K), prefill and decode
    f16: bool = False    # f16 prefill tiles where the device has shader-f16
    cache_type_k: str = DEFAULT_CACHE_TYPE   # what the KV cache stores K in (CACHE_TYPES)
    cache_type_v: str = DEFAULT_CACHE_TYPE   # ... and V

    def __post_init__(self):
        check_cache_type(self.cache_type_k, "K")
        check_cache_type(self.cache_type_v, "V")

    @property
    def cache_types(self) -> tuple[str, str]:
        """(K's, V's) cache type."""
        return self.cache_type_k, self.cache_type_v

    @property
    def kv_dtypes(self) -> tuple[type, type]:
        """The numpy types of (K, V) as the cache holds them (cera.ops.to_cache): the reference's kv_dtype."""
        return CACHE_TYPES[self.cache_type_k], CACHE_TYPES[self.cache_type_v]

    @property
    def cache(self) -> str:
        """The cache types as a report names them: "f16", or "k f32, v f16" where they differ."""
        k, v = self.cache_types
        return k if k == v else f"k {k}, v {v}"

    @property
    def opt_ins(self) -> list[str]:
        return [name for name in ("int8", "f16") if getattr(self, name)]

    @property
    def tag(self) -> str:
        """The opt-ins and the cache types joined by "+" (e.g. "int8+kv-f16", "k-f32+v-f16"): what
        caches of computed state key on, since each changes it."""
        k, v = self.cache_types
        return "+".join(self.opt_ins + ([f"kv-{k}"] if k == v else [f"k-{k}", f"v-{v}"]))

    @property
    def label(self) -> str:
        """What a report calls the opt-ins: "exact", or those taken joined by "+"."""
        return "+".join(self.opt_ins) or "exact"


EXACT = Numerics()


F32_CACHE = ("f32", "f32")     # the builders' default cache types: K and V in f32


def cache_flags(cache_types: tuple[str, str], head_dim: int) -> dict:
    """The cache kernels' flags for (K's, V's) cache type: K_F16 / V_F16, that cache holds f16
    halves two to a u32 (shaders/half.wgsl); K_Q8 / V_Q8, q8_0 blocks (shaders/q8_cache.wgsl); so
    a head's row must be whole words (blocks)."""
    for t in cache_types:
        check_head_dim(t, head_dim)
    k, v = cache_types
    return flags(K_F16=k == "f16", V_F16=v == "f16", K_Q8=k == "q8_0", V_Q8=v == "q8_0")
