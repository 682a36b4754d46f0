"""The GPU kernels' opt-in numerics: rounding the activations more coarsely, for speed.

By default every kernel computes as precisely as f32: results stay within the f32 tolerances of
the numpy reference, and prefill equals the per-token path to 1e-4 of the largest logit
(tests/test_prefill.py). Each opt-in gives that up where the weights are quantized:

- `int8`: the matrices of Q4_K and Q6_K weights take x quantized per 256-element block to 8 bits,
  as llama.cpp's CPU backend quantizes the activations of its k-quant dot products (Q8_K), and
  sum integer products: prefill through shaders/matmul_int.wgsl (cera.gpu.batched.matmul_int),
  decode through matvec.wgsl's X_INT in 8 bits instead of 24. On an H200 (Qwen2.5-1.5B Q4_K_M,
  docs/PERFORMANCE.md, fourteenth session) prefill 512 goes from 8,277 to 15,121 tok/s natively
  (8,285 to 14,884 in the page) and decode from 699 to 762; the synthetic k-quant models' logits then equal llama.cpp's to ~1e-12 NMSE, but
  the real Qwen2.5-Coder-1.5B's perplexity moves 0.58% off the exact path's (to the other side of
  llama.cpp's) and depends on the prefill chunk by 0.1%.
- `f16`: prefill tiles staged in f16 (cera.gpu.batched.half_tiles) where the device has
  shader-f16 (Chromium withholds it on NVIDIA/Linux): 1.13-1.16x the f32 tiles' speed.

The numpy reference ignores them: it is the exact oracle.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Numerics:
    int8: bool = False   # Q4_K / Q6_K matrices on 8-bit x (Q8_K), prefill and decode
    f16: bool = False    # f16 prefill tiles where the device has shader-f16

    @property
    def tag(self) -> str:
        """"" for the exact default, else the opt-ins joined by "+" (e.g. "int8+f16"): what
        caches of computed state key on, since the opt-ins change it."""
        return "+".join(name for name in ("int8", "f16") if getattr(self, name))

    @property
    def label(self) -> str:
        """What a report calls them: "exact", or the tag."""
        return self.tag or "exact"


EXACT = Numerics()
