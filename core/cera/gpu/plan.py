"""The plan: every dispatch of a decode step or a prefill chunk, in order, as data.

`decode_plan`, `chain_plan` (decode steps chained, greedy or sampled), `prefill_plan` and `embed_plan` return a
`Plan`; they walk the model with the same per-layer builders (`Builder.layer`: attention or
short conv, then the FFN) and differ only in how a step runs for their row count, which their
`Builder` subclass says:
  decode (one row)    a projection is a matvec with the block's RMSNorm fused in (for a wide x,
                      matvec.uses_record: the norm apart, writing x's integers once for every
                      matvec of it, as quantize_x does for an x not normed); q, k, v of one
                      type are one stacked matvec; attention is split-KV, its pass turning
                      q and k (RoPE, QK-norm) and writing the cache itself; a narrow
                      attention's output projection merges its splits (no combine dispatch:
                      5 dispatches a layer), a wide one's reads a combine's output (with
                      records, the combine writes the output's integers too)
  prefill (a chunk)   the RMSNorm runs once into `xb`, then register-tiled matmuls; RoPE and
                      the cache write, then one flash-style attention dispatch over the chunk's rows
With LoRA adapters (cera.lora), a builder is made per adapter set: every adapted projection
gains two steps per adapter, t = A x' and out += s * B t (x' the input the projection read,
normed), and an FFN with an adapted gate or up runs its GLU apart (`Builder.glu_apart`).
A new fusion goes in the builder it applies to; a new kernel gets its dispatch builder in the
module of its family, as in shaders/: `matvec.py` (decode projections), `matmul.py` (prefill
projections), `attention.py` (decode and prefill) or `ops.py` (the rest); weight-type facts are
in `quant.py`; new per-sequence state goes in `state.py`.

A Plan knows what each dispatch moves (`cera.device.Dispatch.reads` ...), so `table()` and
`totals()` say how many bytes a token costs at a given KV length (`python -m cera plan`).
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property

from cera.config import ATTENTION, ModelConfig
from cera.device import PACKED_DOT, Binding, Copy, Dispatch, Flush, Step
from cera.errors import InvalidArgument, TooLarge, Unsupported
from cera.gpu import attention, matmul, matvec, ops
from cera.gpu.numerics import EXACT, Numerics, cache_row_bytes
from cera.gpu.residency import Matrix, Weights
from cera.gpu.state import Activations, GreedyChain, State
from cera.kernels import Kernels

# A prefill chunk's submission is flushed (cera.device.Flush) after these layers, so the GPU
# starts on the first layers while the host still encodes the rest (encoding a chunk takes the
# page's host about one layer's GPU time; docs/PERFORMANCE.md, decisions). Doubling gaps keep the
# GPU fed with few submissions.
FLUSH_LAYERS = frozenset({0, 1, 3, 7, 15})


@dataclass(frozen=True)
class Plan:
    """The steps of one submission, for `rows` tokens per step."""
    name: str
    rows: int
    steps: tuple[Step, ...]

    @property
    def dispatches(self) -> int:
        return sum(isinstance(s, Dispatch) for s in self.steps)

    def table(self, positions: int) -> list[dict]:
        """One row per step at `positions` cached KV positions: kernel, workgroups, bindings
        (buffer labels), bytes read and written."""
        rows = []
        for s in self.steps:
            if isinstance(s, Flush):
                continue
            if isinstance(s, Copy):
                rows.append(dict(kernel="copy", workgroups=None, bindings=[s.src.label, s.dst.label],
                                 bytes_read=s.size, bytes_written=s.size))
            else:
                rows.append(dict(kernel=s.label, workgroups=list(s.groups),
                                 bindings=[b.buffer.label for b in s.bindings],
                                 bytes_read=s.reads + positions * s.reads_per_position, bytes_written=s.writes))
        return rows

    def totals(self, positions: int) -> dict:
        rows = self.table(positions)
        return dict(dispatches=self.dispatches, bytes_read=sum(r["bytes_read"] for r in rows),
                    bytes_written=sum(r["bytes_written"] for r in rows))


Adapters = dict[str, list[tuple[Matrix, Matrix, float]]]   # target tensor -> (A, B, s) per adapter, in order


@dataclass(frozen=True)
class Recorded:
    """A plain x whose integers the dispatch that wrote it wrote too (decode attention's combine):
    the matvecs of x read `ints`, as quantize_x would have written them."""
    x: Binding
    ints: Binding


class Builder:
    """The per-layer builders, for steps of `act.rows` tokens. Subclasses say how a projection,
    the q/k/v projections and attention run for their row count. `adapters`: the LoRA pairs
    this builder's plans apply (act then needs `with_lora`'s scratch); `numerics`: the kernels'
    opt-ins (cera.gpu.numerics; int8 prefill needs act.xi)."""

    def __init__(self, cfg: ModelConfig, ctx: int, weights: Weights, state: State, act: Activations,
                 kernels: Kernels, adapters: Adapters | None = None, numerics: Numerics = EXACT):
        self.cfg, self.ctx, self.weights, self.state, self.act = cfg, ctx, weights, state, act
        self.kernels, self.device = kernels, kernels.device
        self.rows = act.rows
        self.adapters = adapters or {}
        self.numerics = numerics

    # --- what differs by row count ---------------------------------------------------------
    def proj(self, out: Binding, m: Matrix, x: Binding, *, norm: str | None = None, **kw) -> list[Step]:
        """out = m x (after RMSNorm with weight `norm`); kw: the rest of its cera.gpu.spec.Projection
        (scale, bias, accumulate, w_up, act)."""
        raise NotImplementedError

    def normed(self, x: Binding, norm: str | None) -> tuple[list[Step], Binding, str | None]:
        """For projections of x after RMSNorm `norm`: the steps to run first, and the input and
        norm the projections then take."""
        raise NotImplementedError

    def qkv(self, i: int) -> tuple[list[Step], Binding, Binding, Binding]:
        """q, k, v = Wq, Wk, Wv (+ biases) applied to attn_norm(x): (steps, q, k, v)."""
        raise NotImplementedError

    def attend(self, i: int, q: Binding, k: Binding, v: Binding) \
            -> tuple[list[Step], Binding | attention.Partials | Recorded]:
        """Causal attention of rope(q) over layer i's cache, after rope(k) and v are written to
        it at the step's positions: (steps, what the output projection reads: act.att, or the
        partials it merges itself)."""
        raise NotImplementedError

    # --- shared --------------------------------------------------------------------------
    def adapt(self, out: Binding, target: str, x: Binding, *, norm: str | None = None,
              scale: float | None = None) -> list[Step]:
        """out += scale * s * B (A x') for each adapter's pair on tensor `target`, x' = x after
        RMSNorm `norm`: the input the projection of `target` read. The projection's own scale
        (Granite's residual scale) multiplies the delta as it does W x."""
        steps = []
        for a, b, s in self.adapters.get(target, ()):
            t = Binding(self.act.lora_t.buffer, 0, 4 * self.rows * a.rows)   # (rows, rank)
            steps += self.proj(t, a, x, norm=norm)
            steps += self.proj(out, b, t, accumulate=True, scale=s * (1.0 if scale is None else scale))
        return steps

    def embed(self) -> list[Step]:
        """act.x = the embeddings of tokens[0..rows) (times Granite's embedding_scale)."""
        cfg, name = self.cfg, "token_embd.weight"
        table = self.weights.matrix(name)
        tokens = Binding(self.state.tokens.buffer, 0, 4 * self.rows)
        with _naming(name):
            return ops.embed_tiled(self.kernels, self.device, self.act.x, table.binding, tokens, self.state.step,
                                      wtype=table.wtype, k=cfg.hidden, rows=cfg.embedding_rows, max_rows=self.rows,
                                      scale=cfg.embedding_scale)

    @cached_property
    def body(self) -> tuple[Step, ...]:
        """Embedding and every layer: what every plan of this row count starts with."""
        steps = self.embed()
        for i in range(self.cfg.n_layers):
            steps += self.layer(i)
        return tuple(steps)

    def layer(self, i: int) -> list[Step]:
        mixer = self.attention if self.cfg.block_kinds[i] == ATTENTION else self.shortconv
        return mixer(i) + self.ffn(i)

    def attention(self, i: int) -> list[Step]:
        """x += residual_scale * [post_norm] Wo attention(rope(q), rope(k), v), writing k and v to
        the cache; rope with the layer's base and scale, attention within its window."""
        b = f"blk.{i}."
        steps, q, k, v = self.qkv(i)
        attend, att = self.attend(i, q, k, v)
        return steps + attend + self.residual(self.weights.matrix(b + "attn_output.weight"), att,
                                              b + "post_attention_norm.weight")

    def rope(self, i: int, shift: bool = False) -> ops.Rope:
        """Layer i's RoPE, with the QK-norm before it where the model has one and the rotated
        pairs scaled by rope_attn_factor; for a context shift (re-rotating cached keys), neither."""
        cfg, b, w = self.cfg, f"blk.{i}.", self.weights
        norms = dict(qk_norm=w.vectors(b + "attn_q_norm.weight", b + "attn_k_norm.weight"),
                     eps=cfg.eps) if cfg.qk_norm and not shift else {}
        factors = cfg.rope_factors(self.ctx)
        return ops.Rope(cfg.layer_rope_theta[i], cfg.rope_neox, cfg.n_rot, cfg.layer_rope_freq_scale[i],
                           w.vector(factors) if factors else None, **norms,
                           attn_factor=1.0 if shift else cfg.rope_attn_factor)

    def rope_kv(self, i: int, q: Binding, k: Binding, v: Binding, in_stride: int | None = None) -> Dispatch:
        """act.q_rot = rope(q); rope(k) and v into layer i's cache at the step's positions
        (in_stride: ops.rope_kv's)."""
        cfg = self.cfg
        return ops.rope_kv(self.kernels, self.device, self.act.q_rot, self.state.key_cache[i],
                              self.state.value_cache[i], q, k, v, self.state.step, head_dim=cfg.head_dim,
                              n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads[i], rope=self.rope(i),
                              max_tokens=self.rows, in_stride=in_stride, cache_types=self.numerics.cache_types,
                              label=f"blk.{i}.rope")

    def shortconv(self, i: int) -> list[Step]:
        """LFM2: x += residual_scale * W_out (C * conv(B * x')), (B, C, x') = W_in attn_norm(x)."""
        cfg, b, w, a = self.cfg, f"blk.{i}.", self.weights, self.act
        steps = self.proj(a.bcx, w.matrix(b + "shortconv.in_proj.weight"), a.x, norm=b + "attn_norm.weight")
        steps.append(ops.shortconv(self.kernels, self.device, a.conv_out, a.bcx, w.vector(b + "shortconv.conv.weight"),
                                      self.state.conv_state[i], self.state.step, hidden=cfg.hidden,
                                      kernel=cfg.conv_kernel, label=f"{b}shortconv"))
        return steps + self.proj(a.x, w.matrix(b + "shortconv.out_proj.weight"), a.conv_out, accumulate=True,
                                 scale=cfg.residual_scale)

    def ffn(self, i: int) -> list[Step]:
        """x += residual_scale * [post_norm] W_down (act(W_gate h) * (W_up h)), h = ffn_norm(x),
        act silu (SwiGLU) or tanh GELU (GeGLU)."""
        b, w, a = f"blk.{i}.", self.weights, self.act
        gate, up = w.matrix(b + "ffn_gate.weight"), w.matrix(b + "ffn_up.weight")
        if gate.name in self.adapters or up.name in self.adapters:
            steps = self.glu_apart(gate, up, b + "ffn_norm.weight")
        elif gate.wtype != up.wtype:
            raise Unsupported(f"{gate.name} and {up.name} differ in type: the fused GLU kernels need one type")
        else:
            steps = self.proj(a.hb, gate, a.x, norm=b + "ffn_norm.weight", w_up=up.binding, act=self.cfg.ffn_act)
        return steps + self.residual(w.matrix(b + "ffn_down.weight"), a.hb, b + "post_ffw_norm.weight")

    def residual(self, m: Matrix, y: Binding | attention.Partials | Recorded, post_norm: str) -> list[Step]:
        """x += residual_scale * m y; with post-norms (gemma), m y goes to xb and
        x += rms_norm(xb) * weight `post_norm` is a dispatch of its own."""
        cfg, a = self.cfg, self.act
        if not cfg.post_norms:
            return self.proj(a.x, m, y, accumulate=True, scale=cfg.residual_scale)
        return self.proj(a.xb, m, y) + [ops.rms_norm(
            self.kernels, self.device, a.x, a.xb, self.weights.vector(post_norm), self.state.step, n=cfg.hidden,
            eps=cfg.eps, max_tokens=self.rows, accumulate=True, label=post_norm)]

    def glu_apart(self, gate: Matrix, up: Matrix, norm: str) -> list[Step]:
        """act.hb = act(W_gate h) * (W_up h), h = RMSNorm `norm` of x, as two projections and
        glu_act: a LoRA delta on gate or up joins the projection before the activation, and the
        fused GLU kernels compute act(W_gate h) * (W_up h) in one pass, with no room for it."""
        a = self.act
        steps, h, norm = self.normed(a.x, norm)
        steps += self.proj(a.hb, gate, h, norm=norm) + self.proj(a.up, up, h, norm=norm)
        return steps + [ops.glu_act(self.kernels, self.device, a.hb, a.up, self.state.step, ff=self.cfg.ff,
                                       act=self.cfg.ffn_act, max_tokens=self.rows, label=f"{gate.name} glu")]

    def head(self, out: Binding, x: Binding) -> list[Step]:
        """out = W_head rms_norm(x) / logit_scale for the builder's rows, then soft-capped in
        place where the model caps its logits (gemma2)."""
        cfg = self.cfg
        steps = self.proj(out, self.weights.matrix(cfg.lm_head), x, norm=cfg.final_norm, scale=1.0 / cfg.logit_scale)
        if cfg.final_softcap:
            steps.append(ops.logit_softcap(self.kernels, self.device, out, self.state.step, n=cfg.vocab_size,
                                              softcap=cfg.final_softcap, max_tokens=self.rows))
        return steps

    def norm(self, x: Binding, norm: str) -> Dispatch:
        """act.xb = rms_norm(x) * weight `norm`, for the builder's rows."""
        return ops.rms_norm(self.kernels, self.device, self.act.xb, x, self.weights.vector(norm), self.state.step,
                               n=self.cfg.hidden, eps=self.cfg.eps, max_tokens=self.rows, label=norm)

    def argmax(self) -> Dispatch:
        """tokens[0] = argmax(logits)."""
        return ops.argmax(self.kernels, self.device, self.state.tokens, self.state.logits, n=self.cfg.vocab_size)


class DecodeBuilder(Builder):
    """One token per step: fused-norm matvecs, stacked q/k/v, split-KV attention with RoPE fused,
    its splits merged by a narrow model's output projection."""

    def normed(self, x, norm):
        """Each matvec fuses the norm; where x's integers are made once (`x_ints`), the norm runs
        apart into xb and writes them too."""
        if norm is None or self.x_ints is None:
            return [], x, norm
        layout = matvec.record_layout(matvec.int_bits(self.numerics.int8))
        return [matmul.rms_norm_x_int(self.kernels, self.act.xb, self.x_ints, x, self.weights.vector(norm),
                                      self.state.step, n=self.cfg.hidden, eps=self.cfg.eps, max_rows=1, **layout,
                                      label=norm)], self.act.xb, None

    @cached_property
    def x_ints(self) -> Binding | None:
        """act.xbi, where the decode matvecs read a normed x's integers from a record its norm
        writes (matvec.uses_record)."""
        return self.act.xbi if self.act.xbi is not None and matvec.uses_record(self.device, self.cfg.hidden) else None

    def proj(self, out, m, x, *, norm=None, **kw):
        steps, x, norm = self.normed(x, norm)
        fused = dict(norm=self.weights.vector(norm), eps=self.cfg.eps) if norm else {}
        p = m.projection(**kw)
        ints = self.x_ints if x is self.act.xb else None   # xb is written by `normed` alone
        if isinstance(x, Recorded):
            x, ints = x.x, x.ints
        elif ints is None and norm is None and isinstance(x, Binding) and (bits := self.plain_bits(m)):
            ints = self.plain_ints(p.k, bits)
            steps.append(matmul.quantize_x(self.kernels, ints, x, self.state.step, k=p.k, max_rows=1,
                                           **matvec.record_layout(bits), label=f"{m.name} x"))
        with _naming(m.name):
            steps += matvec.matvec_tiled(self.kernels, self.device, out, p, x, x_ints=ints,
                                         int8=self.numerics.int8, **fused)
        return steps + self.adapt(out, m.name, x, norm=norm, scale=kw.get("scale"))

    def plain_bits(self, m: Matrix) -> int:
        """The bits of the record a matvec of m reads a plain x (the down projection's,
        attention's output) from, in a model whose normed x has records; 0: it reads x."""
        return matvec.record_bits(self.device, m.projection(), self.numerics.int8) if self.x_ints is not None else 0

    def plain_ints(self, k: int, bits: int) -> Binding:
        """act.xi as the record of a plain x of k elements in `bits`-bit integers."""
        return Binding(self.act.xi.buffer, 0, 4 * matvec.record_words(k, bits))

    def qkv(self, i):
        cfg, b, a = self.cfg, f"blk.{i}.", self.act
        steps, x, norm = self.normed(a.x, b + "attn_norm.weight")   # once, for every run
        kv = cfg.kv_dim(i)
        offset = {"q": 0, "k": 4 * cfg.q_dim, "v": 4 * (cfg.q_dim + kv)}
        size = {"q": 4 * cfg.q_dim, "k": 4 * kv, "v": 4 * kv}
        runs = self.weights.qkv_runs(i)
        if runs is None:   # q, k, v cannot share a buffer at aligned offsets: one matvec each
            runs, out = ["q", "k", "v"], {"q": a.q, "k": a.k, "v": a.v}
        else:              # q | k | v in one buffer, a matvec per run of one type
            out = {p: Binding(a.qkv.buffer, offset[p], size[p]) for p in "qkv"}
        for run in runs:
            m, bias = self.weights.stacked(i, run)
            part = Binding(out[run[0]].buffer, out[run[0]].offset, sum(size[p] for p in run))
            steps += self.proj(part, m, x, norm=norm, bias=bias)
            if len(run) > 1:   # a stacked matrix has no adapters: each projection in it brings its own
                for p in run:
                    steps += self.adapt(out[p], f"{b}attn_{p}.weight", x, norm=norm)
        return (steps, *(out[p] for p in "qkv"))

    def attend(self, i, q, k, v):
        """Split-KV attention's first pass, its partials left for the output projection to
        merge (no combine dispatch) where attention.merge_in_projection says so, else both
        passes, the combine writing the output's integers too where the projection reads them
        from a record (`plain_bits`: a Recorded output). Where q, k, v are ranges of one buffer
        (the stacked matvec's), the first pass turns q and k itself and writes the cache
        (attention.attention's rope); else rope_kv first."""
        cfg = self.cfg
        shape = dict(head_dim=cfg.head_dim, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads[i], max_ctx=self.ctx,
                     scratch=self.state.attention_scratch, scale=cfg.attention_scale, window=cfg.layer_window[i],
                     softcap=cfg.attn_softcap, cache_types=self.numerics.cache_types, label=f"blk.{i}.attention")
        caches = self.state.key_cache[i], self.state.value_cache[i], self.state.step
        steps, q_in = [], self.act.q_rot
        if q.buffer is k.buffer is v.buffer:
            q_in = Binding(q.buffer, q.offset, v.offset + v.size - q.offset)
            shape.update(rope=self.rope(i), kv_offsets=((k.offset - q.offset) // 4, (v.offset - q.offset) // 4))
        else:
            steps.append(self.rope_kv(i, q, k, v))
        if not attention.merge_in_projection(self.device, cfg.head_dim, cfg.q_dim):
            bits = self.plain_bits(self.weights.matrix(f"blk.{i}.attn_output.weight"))
            if bits and attention.record_fits(cfg.head_dim, cfg.q_dim):   # the combine writes its integers too
                ints = self.plain_ints(cfg.q_dim, bits)
                return steps + attention.attention(self.kernels, self.device, self.act.att, q_in, *caches, xi=ints,
                                                   **matvec.record_layout(bits), **shape), Recorded(self.act.att, ints)
            return steps + attention.attention(self.kernels, self.device, self.act.att, q_in, *caches, **shape), \
                self.act.att
        first, partials = attention.attention_partials(self.kernels, self.device, q_in, *caches, **shape)
        return steps + [first], partials


class PrefillBuilder(Builder):
    """A chunk of rows per step: RMSNorm into xb, then tiled matmuls; flash-style attention.
    The chunk's submission is flushed after the layers in FLUSH_LAYERS."""

    def layer(self, i):
        return super().layer(i) + ([Flush()] if i in FLUSH_LAYERS else [])

    def normed(self, x, norm):
        return ([self.norm(x, norm)], self.act.xb, None) if norm else ([], x, None)

    def norm(self, x, norm):
        """act.xb = rms_norm(x) * weight `norm`, and with int8 numerics its integers into act.xbi
        in the same dispatch (`xb_ints`)."""
        if self.xb_ints is None:
            return super().norm(x, norm)
        return matmul.rms_norm_x_int(self.kernels, self.act.xb, self.xb_ints, x, self.weights.vector(norm),
                                      self.state.step, n=self.cfg.hidden, eps=self.cfg.eps, max_rows=self.rows,
                                      label=norm)

    @cached_property
    def xb_ints(self) -> Binding | None:
        """act.xbi, where the norms write xb's integers for the integer matmuls that read xb (every
        matmul of xb follows the norm that wrote it): int8 numerics, a hidden size of whole
        256-element blocks, packed dot products."""
        return self.act.xbi if self.numerics.int8 and PACKED_DOT in self.device.features else None

    def proj(self, out, m, x, *, norm=None, out_stride=None, **kw):
        steps, x, _ = self.normed(x, norm)
        ready = x is self.act.xb and self.xb_ints is not None   # its integers are in xbi
        xi = self.xb_ints if ready else self.act.xi if self.numerics.int8 else None
        with _naming(m.name):
            half = self.numerics.f16 and matmul.half_tiles(self.device, m.wtype)
            steps += matmul.matmul_tiled(self.kernels, self.device, out, m.projection(**kw), x, self.state.step,
                                          max_rows=self.rows, out_stride=out_stride, xi=xi, x_ready=ready, half=half,
                                          parts=self.act.parts)
        return steps + self.adapt(out, m.name, x, scale=kw.get("scale"))

    def qkv(self, i):
        """The three projections of the normed rows: a matmul per run of one type (as decode's
        stacked matvecs) writing its columns of the rows q | k | v of act.qkv; one matmul
        each, into act.q, k, v, where the runs cannot be bound there or an adapter applies."""
        cfg, b, w, a = self.cfg, f"blk.{i}.", self.weights, self.act
        kv = cfg.kv_dim(i)
        steps = [self.norm(a.x, b + "attn_norm.weight")]   # once, for the three projections
        runs = w.qkv_runs(i)
        if runs is None or any(f"{b}attn_{p}.weight" in self.adapters for p in "qkv"):
            q, k, v = a.q, Binding(a.k.buffer, 0, 4 * self.rows * kv), Binding(a.v.buffer, 0, 4 * self.rows * kv)
            for p, out in zip("qkv", (q, k, v)):
                bias = w.vector(f"{b}attn_{p}.bias") if cfg.qkv_bias else None
                steps += self.proj(out, w.matrix(f"{b}attn_{p}.weight"), a.xb, bias=bias)
            return steps, q, k, v
        width, column = cfg.q_dim + 2 * kv, {"q": 0, "k": cfg.q_dim, "v": cfg.q_dim + kv}
        out = {p: Binding(a.qkv.buffer, 4 * column[p], 4 * (width * self.rows - column[p]))
               for p in "qkv"}   # from row 0's part to the last row's end
        for run in runs:
            m, bias = w.stacked(i, run)
            steps += self.proj(out[run[0]], m, a.xb, bias=bias, out_stride=width)
        return (steps, *(out[p] for p in "qkv"))

    def attend(self, i, q, k, v):
        cfg = self.cfg
        stride = cfg.q_dim + 2 * cfg.kv_dim(i) if q.buffer is k.buffer else None   # the rows of act.qkv
        return [self.rope_kv(i, q, k, v, stride),
                attention.prefill_attention(self.kernels, self.device, self.act.att, self.act.q_rot,
                                          self.state.key_cache[i], self.state.value_cache[i], self.state.step,
                                          head_dim=cfg.head_dim, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads[i],
                                          scale=cfg.attention_scale, max_rows=self.rows, window=cfg.layer_window[i],
                                          softcap=cfg.attn_softcap, cache_types=self.numerics.cache_types,
                                          label=f"blk.{i}.prefill_attention")], self.act.att


def decode_steps(decode: DecodeBuilder) -> tuple[Step, ...]:
    """One token's forward pass: embed tokens[0], every layer, the LM head -> state.logits."""
    return decode.body + tuple(decode.head(decode.state.logits, decode.act.x))


def decode_plan(decode: DecodeBuilder) -> Plan:
    """One token: its forward pass, then argmax -> tokens[0]."""
    return Plan("decode", 1, decode_steps(decode) + (decode.argmax(),))


def chain_plan(decode: DecodeBuilder, n: int, chain: GreedyChain, half: int = 0,
               choose: Sequence[Step] | None = None) -> Plan:
    """n decode steps chained in one submission, the chain of tokens kept on the GPU. The host
    writes the Step of the first (its position, chain index 0, draw); each decode step embeds
    tokens[0] (the previous step's choice) and runs the layers and head; then `choose` picks the
    next token into tokens[0], appends it to `chain.tokens` at the step's chain index and moves
    the Step on by one position: greedy's argmax and greedy_advance by default, a sampler's
    dispatches (cera.gpu.sample.choose) otherwise, all in one compute pass (copies into the Step
    and out of tokens between passes cost more: docs/PERFORMANCE.md, decisions). Each conv state
    is copied to its record `half` * chain.batch + j (so a stop mid-batch can rewind it; batches
    alternate halves, so the one submitted ahead never overwrites the records of the one being
    read)."""
    if not 1 <= n <= chain.batch:
        raise InvalidArgument(f"a chain of {n} steps: its buffers hold 1..{chain.batch}")
    state, kind = decode.state, "greedy" if choose is None else "sampled"
    if choose is None:
        choose = (decode.argmax(), ops.greedy_advance(decode.kernels, decode.device, state.tokens, chain.tokens,
                                                         state.step))
    step = decode_steps(decode) + tuple(choose)
    steps = []
    for j in range(n):
        steps += step
        for i, saved in chain.conv.items():
            size = state.conv_state[i].nbytes
            steps.append(Copy(state.conv_state[i].buffer, 0, saved.buffer, (half * chain.batch + j) * size, size))
    return Plan(f"{kind} {n}" + (f" (records {half})" if chain.conv else ""), 1, tuple(steps))


def prefill_plan(prefill: PrefillBuilder, decode: DecodeBuilder, n: int, logits_all: Binding | None = None) -> Plan:
    """A chunk of n <= prefill.rows tokens: every layer over the chunk, then either row n-1
    through the decode head (its logits and argmax), or, given `logits_all` (chunk, vocab),
    every row through a batched head (scoring) and row n-1's logits copied for the argmax."""
    cfg, state, x = prefill.cfg, prefill.state, prefill.act.x
    vocab, h = cfg.vocab_size, cfg.hidden
    if logits_all is None:
        tail = [Copy(x.buffer, 4 * (n - 1) * h, decode.act.x.buffer, 0, 4 * h)]
        tail += decode.head(state.logits, decode.act.x)
    else:
        tail = prefill.head(logits_all, x)
        tail.append(Copy(logits_all.buffer, 4 * (n - 1) * vocab, state.logits.buffer, 0, 4 * vocab))
    return Plan(f"prefill {n} of {prefill.rows}" + (" scoring" if logits_all else ""), prefill.rows,
                prefill.body + tuple(tail) + (prefill.argmax(),))


def embed_plan(builder: Builder) -> Plan:
    """Hidden states instead of logits: every layer over the step's rows, then the final norm of
    each row into act.xb (rows, hidden); no LM head, no argmax."""
    return Plan(f"embed {builder.rows}", builder.rows,
                builder.body + (builder.norm(builder.act.x, builder.cfg.final_norm),))


def shift_plan(decode: DecodeBuilder, keep: int, n: int, scratch: tuple[Binding, Binding], shift: Binding) -> Plan:
    """Context shift: in every attention layer, cache rows keep+discard.. move to rows keep..
    (n of them), keys re-rotated (ops.kv_shift into the scratch, in the caches' types, then a
    copy back each)."""
    cfg, state, (k_out, v_out), steps = decode.cfg, decode.state, scratch, []
    types = decode.numerics.cache_types
    for i in cfg.attention_layers:
        k_row, v_row = (cache_row_bytes(t, cfg.head_dim) * cfg.n_kv_heads[i] for t in types)   # a slot's
        k_cache, v_cache = state.key_cache[i], state.value_cache[i]
        steps.append(ops.kv_shift(decode.kernels, decode.device, k_out, v_out, k_cache, v_cache, shift,
                                     head_dim=cfg.head_dim, n_kv_heads=cfg.n_kv_heads[i],
                                     rope=decode.rope(i, shift=True), max_rows=n, cache_types=types,
                                     label=f"blk.{i}.kv_shift"))
        steps += [Copy(k_out.buffer, 0, k_cache.buffer, keep * k_row, n * k_row),
                  Copy(v_out.buffer, 0, v_cache.buffer, keep * v_row, n * v_row)]
    return Plan(f"shift {n} rows to {keep}", n, tuple(steps))


@contextmanager
def _naming(tensor: str):
    """Re-raise TooLarge naming the tensor whose dispatches did not fit."""
    try:
        yield
    except TooLarge as err:
        raise TooLarge(f"tensor {tensor}: {err}") from None
