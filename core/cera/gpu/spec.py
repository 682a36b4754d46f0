"""What a projection computes and how its kernel runs: the two things the projection builders
(cera.gpu.matvec's decode matvecs, cera.gpu.matmul's prefill matmuls) take besides their
output, input and device.

  Projection  out = scale * W x [+ bias] [+ out], or the gated act(W x) * (W_up x): the weights
              (raw GGUF rows of one type), their shape, and what joins the product
  Tuning      the builders' knobs, where a caller overrides their rules (benchmarks, tests;
              `scripts/bench_kernels.py` takes them from its command line): no plan sets one
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from cera.config import FFN_GELU, FFN_SILU
from cera.errors import InvalidArgument, Unsupported
from cera.gpu.ops import gelu_flag
from cera.gpu.quant import byte_range, row_bytes

if TYPE_CHECKING:
    from cera.gpu.matmul import IntTiles, MatmulTiles


@dataclass(frozen=True)
class Projection:
    """out (m,) = scale * W (m, k) @ x (k,) [+ bias] [+ out] (a row of x at a time in prefill);
    with w_up the GLU out = scale * act(W @ x) * (W_up @ x), act the SwiGLU's silu or
    (FFN_GELU) the GeGLU's tanh GELU. W and W_up: raw GGUF rows of `wtype`, bias (m,) f32; each
    a buffer or a Binding."""
    w: Any
    wtype: int
    k: int
    m: int
    w_up: Any = None
    bias: Any = None
    scale: float | None = None
    accumulate: bool = False   # out += the result (into the residual stream)
    act: str = FFN_SILU

    def __post_init__(self):
        gelu_flag(self.act, self.w_up)   # checks act
        if self.glu and self.bias is not None:
            raise Unsupported("a GLU with a bias is not supported")

    @property
    def glu(self) -> bool:
        return self.w_up is not None

    @property
    def gelu(self) -> bool:
        return self.act == FFN_GELU

    @property
    def weight_bytes(self) -> int:
        """The bytes of W (and W_up) a pass reads."""
        return self.m * row_bytes(self.wtype, self.k) * (2 if self.glu else 1)

    def tags(self) -> str:
        """What joins the product, as the labels say it: " glu", " gelu", " +="."""
        return (" glu" if self.glu else "") + (" gelu" if self.gelu else "") + (" +=" if self.accumulate else "")

    def rows(self, start: int, n: int, limits) -> Projection:
        """Rows start .. start+n of W (W_up, bias): a row tile (cera.gpu.quant.row_tiles), bound at
        aligned offsets."""
        rb = row_bytes(self.wtype, self.k)
        return replace(self, w=byte_range(self.w, start * rb, n * rb, limits), m=n,
                       w_up=byte_range(self.w_up, start * rb, n * rb, limits),
                       bias=byte_range(self.bias, 4 * start, 4 * n, limits))


@dataclass(frozen=True)
class Tuning:
    """A projection builder's knobs; None takes the builder's rule (documented there).

    The decode matvec (cera.gpu.matvec) reads:
      tpr        threads per row, a power of two <= workgroup (threads_per_row, x_int_threads_per_row)
      workgroup  invocations per workgroup, a power of two <= 256 (256): workgroup / tpr rows each
      rpt        rows per thread, 1 or 2: each workgroup sums rpt times as many rows (rows_per_thread)
      subgroups  the reduction: subgroup operations (True) or workgroup memory (False) (subgroups
                 where the device has them)
      x_bits     x in 8- or 24-bit integers per 256-element block and integer dot products, or 0:
                 f32 x (x_int_bits)
    The prefill matmuls (cera.gpu.matmul) read:
      tiles      the tiling: MatmulTiles for matmul, IntTiles for matmul_int (matmul_tiles,
                 int_tiles)
    Decode attention (cera.gpu.attention) reads:
      heads      query heads a workgroup takes, a divisor of the GQA group: they share every K/V
                 load (heads_per_workgroup)
      subgroups  a key's score lanes added up by subgroup shuffles (True) or through workgroup
                 memory (False) (shuffles where the device has subgroups)"""
    tpr: int | None = None
    rpt: int | None = None
    workgroup: int | None = None
    subgroups: bool | None = None
    x_bits: int | None = None
    tiles: MatmulTiles | IntTiles | None = None
    heads: int | None = None

    def check(self, kernel: str, *knobs: str) -> None:
        """Refuse the knobs set here that `kernel` does not read (it reads `knobs`)."""
        unread = [f.name for f in fields(self) if getattr(self, f.name) is not None and f.name not in knobs]
        if unread:
            raise InvalidArgument(f"{kernel}: no tuning knob {', '.join(unread)} (it reads {', '.join(knobs)})")


DEFAULT = Tuning()   # every rule's choice: what the plans run
