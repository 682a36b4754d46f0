"""LoRA adapters in llama.cpp's GGUF form, read and checked against the model they adapt.

An adapter file (llama.cpp's convert_lora_to_gguf.py writes them) has `general.type = adapter`,
`adapter.type = lora`, `adapter.lora.alpha` and the model's `general.architecture`; for each
adapted matrix W (out, in) it holds `<W's tensor name>.lora_a` (rank, in) and `.lora_b`
(out, rank), numpy shapes. The adapted projection is

    W x + s * B (A x),   s = alpha / rank * scale   (scale alone when alpha is 0 or absent)

with `scale` the user's and rank read from lora_b (llama.cpp: llama_adapter_lora_weight::
get_scale). The delta joins the matmul's result before anything else happens to it: a bias,
the GLU's activation, Granite's residual scale (llama-graph.cpp: build_lora_mm).

cera adapts the projections of attention (q, k, v, output), of the FFN (gate, up, down) and of
LFM2's short conv (in_proj, out_proj); a pair on Phi-3's fused attn_qkv or gate|up ffn_up
adapts each part with its rows of lora_b. The checks and their messages follow llama.cpp's
(llama-adapter.cpp), each naming the tensor.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from cera import weights
from cera.config import unfused_adapter
from cera.errors import BadFile, InvalidArgument, Unsupported
from cera.gguf_file import GGUFFile

TARGETS = re.compile(r"blk\.\d+\.(attn_[qkv]|attn_output|ffn_gate|ffn_up|ffn_down|shortconv\.in_proj"
                     r"|shortconv\.out_proj)\.weight")


@dataclass(frozen=True)
class LoraPair:
    """The A and B of one adapted matrix."""
    target: str      # the model tensor it adapts, e.g. blk.0.attn_q.weight
    rank: int
    scale: float     # s: B (A x) is multiplied by it

    @property
    def a(self) -> str:
        return f"{self.target}.lora_a"

    @property
    def b(self) -> str:
        return f"{self.target}.lora_b"


@dataclass
class LoraAdapter:
    """A checked adapter: its pairs by target tensor name, and where their bytes are."""
    name: str
    gguf: GGUFFile
    scale: float                     # the user's
    alpha: float                     # adapter.lora.alpha (0: absent)
    pairs: dict[str, LoraPair]
    _arrays: dict = field(default_factory=dict, repr=False)

    @classmethod
    def read(cls, gguf_file: GGUFFile, model: GGUFFile, name: str, scale: float = 1.0) -> "LoraAdapter":
        """The adapter in `gguf_file` (called `name`), checked against `model`, the base model's GGUF."""
        if not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise InvalidArgument(f"LoRA scale {scale!r} must be a finite number")
        md = gguf_file.metadata
        if md.get("general.type") != "adapter":
            raise BadFile(f"expect general.type to be 'adapter', but got: {md.get('general.type', '')!s:.80} "
                          "(not a LoRA adapter file)")
        if gguf_file.arch != model.arch:
            raise BadFile(f"model arch and LoRA arch mismatch: the adapter is for {gguf_file.arch or '(none)'!s:.80}, "
                          f"the model is {model.arch}")
        if md.get("adapter.type") != "lora":
            raise Unsupported(f"expect adapter.type to be 'lora', but got: {md.get('adapter.type', '')!s:.80}")
        if "adapter.alora.invocation_tokens" in md:
            raise Unsupported("activated LoRA (adapter.alora.invocation_tokens) is not supported")
        alpha = md.get("adapter.lora.alpha", 0.0)
        if type(alpha) not in (int, float) or not math.isfinite(alpha):
            raise BadFile(f"adapter.lora.alpha is {alpha!r:.80}, not a finite number")
        alpha = float(alpha)
        # a pair on a fused matrix (Phi-3's attn_qkv, ffn_up) becomes a pair per part, as the model's
        # fused matrices read as their parts (cera.config.unfused)
        gguf_file.tensors = unfused_adapter(gguf_file.tensors, model.fused, model.tensors)
        halves: dict[str, dict[str, object]] = {}
        for tensor in gguf_file.tensors.values():
            base, dot, half = tensor.name.rpartition(".")
            if half in ("lora_a", "lora_b"):
                halves.setdefault(base, {})[half] = tensor
            elif not tensor.name.endswith("_norm.weight"):   # llama.cpp skips norm vectors too
                raise BadFile(f"LoRA tensor '{tensor.name}' has unexpected suffix")
        pairs = {}
        for target, half in halves.items():
            if len(half) != 2:
                raise BadFile(f"LoRA tensor pair for '{target}' is missing one component")
            if target not in model.tensors:
                raise BadFile(f"LoRA tensor '{target}' does not exist in base model (hint: maybe wrong base model?)")
            if not TARGETS.fullmatch(target):
                raise Unsupported(f"LoRA tensor '{target}': cera adapts only the attention, FFN and short-conv "
                                  "projections")
            if len(half["lora_a"].shape) != 2 or len(half["lora_b"].shape) != 2:
                raise BadFile(f"tensor '{target}': lora_a {half['lora_a'].shape} and lora_b {half['lora_b'].shape} "
                              "must be matrices")
            (rank, n_in), (n_out, rank_b) = half["lora_a"].shape, half["lora_b"].shape
            rows, cols = model.tensors[target].shape
            if (n_in, n_out) != (cols, rows):
                raise BadFile(f"tensor '{target}' has incorrect shape: lora_a {half['lora_a'].shape} and lora_b "
                              f"{half['lora_b'].shape} for a {rows}x{cols} matrix (hint: maybe wrong base model?)")
            if rank != rank_b:
                raise BadFile(f"tensor '{target}': lora_a tensor is not transposed (lora_a {half['lora_a'].shape}, "
                              f"lora_b {half['lora_b'].shape})")
            if rank == 0:
                raise BadFile(f"tensor '{target}': rank 0 (lora_a {half['lora_a'].shape})")
            pairs[target] = LoraPair(target, rank_b, scale * alpha / rank_b if alpha else scale)
        if not pairs:
            raise BadFile("the LoRA adapter has no lora_a/lora_b tensor pairs")
        return cls(name, gguf_file, float(scale), alpha, pairs)

    @property
    def key(self) -> str:
        """What tells this adapter's states apart from others' (prefix cache): file name, size, scale."""
        return f"{self.name}-{self.gguf.source.size}x{self.scale:g}"

    @property
    def max_rank(self) -> int:
        return max(p.rank for p in self.pairs.values())

    def arrays(self, target: str) -> tuple[np.ndarray, np.ndarray]:
        """(A (rank, in), B (out, rank)) of `target` as float32, dequantized once."""
        if target not in self._arrays:
            pair = self.pairs[target]
            self._arrays[target] = weights.tensor(self.gguf, pair.a), weights.tensor(self.gguf, pair.b)
        return self._arrays[target]
