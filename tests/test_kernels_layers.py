"""The non-matmul layer kernels (rms_norm, rope_kv, attention, shortconv) against the
numpy oracles in cera.ops, on the native device (lavapipe here)."""
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from cera import ops
from cera.config import FFN_GELU, FFN_SILU
from cera.device import Binding
from cera.errors import InvalidArgument, Unsupported
from cera.gpu import attention, matmul, matvec, ops as gpu_ops
from cera.gpu.spec import Projection, Tuning
from cera.gpu.state import STEP_BYTES, pack_step
from gpu_util import (CACHES, F16_CACHE, F32_CACHE, HALF_EDGES, MIXED_CACHES, Q8_CACHE, Q8_EDGES, Q8_MIXED_CACHES,
                      as_cached, assert_close, cache_tolerance, glu_act, read, read_cache, read_cache_raw, step_buffer,
                      submit, to_cache, upload, upload_cache, write_cache, zeros)
from quantdata import random_rows


rng = np.random.default_rng(1234)


def randn(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# --- rms_norm ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n,rows_per_token,accumulate", [(64, 1, False), (576, 1, False), (100, 1, False),
                                                         (80, 9, False), (128, 2, False), (640, 1, True),
                                                         (100, 1, True)])
def test_rms_norm(gpu, n, rows_per_token, accumulate):
    """out = rms_norm(x) * w, or with accumulate (a post-norm) out += rms_norm(x) * w."""
    device, kernels = gpu.device, gpu.kernels
    max_tokens, n_tokens, eps = 4, 3, 1e-5
    x = randn(max_tokens, rows_per_token, n, scale=3.0)
    w = randn(n)
    before = randn(*x.shape) if accumulate else np.zeros_like(x)
    xb, wb, out = upload(gpu, x), upload(gpu, w), upload(gpu, before)
    step = step_buffer(gpu, 7, n_tokens)
    submit(gpu, gpu_ops.rms_norm(kernels, device, out, xb, wb, step, n=n, eps=eps,
                                rows_per_token=rows_per_token, max_tokens=max_tokens, accumulate=accumulate))
    got = read(gpu, out, x.shape)
    assert_close(got[:n_tokens], before[:n_tokens] + ops.rms_norm(x[:n_tokens], w, eps), 1e-4, 1e-4, "rms_norm")
    assert_close(got[n_tokens:], before[n_tokens:], 0, 0, "rows past step.n_tokens must stay untouched")


@pytest.mark.parametrize("n,add,vector", [(64, True, False), (768, True, False), (100, False, True),
                                          (300, True, True), (37, False, False)])
def test_layer_norm(gpu, n, add, vector):
    """out = layer_norm(out [+ y] [+ v]) * w + b in place (an encoder's post-norms and embedding
    norm), rows past step.n_tokens untouched; an offset mean, as residual streams have."""
    device, kernels = gpu.device, gpu.kernels
    max_tokens, n_tokens, eps = 4, 3, 1e-12
    x, y, v = randn(max_tokens, n, scale=3.0) + 5.0, randn(max_tokens, n), randn(n)
    w, b = randn(n), randn(n)
    out, step = upload(gpu, x), step_buffer(gpu, 0, n_tokens)
    extra = dict(y=upload(gpu, y) if add else None, v=upload(gpu, v) if vector else None)
    submit(gpu, gpu_ops.layer_norm(kernels, device, out, upload(gpu, w), upload(gpu, b), step, n=n, eps=eps,
                                  max_tokens=max_tokens, **extra))
    got = read(gpu, out, x.shape)
    s = x[:n_tokens] + (y[:n_tokens] if add else 0) + (v if vector else 0)
    assert_close(got[:n_tokens], ops.layer_norm(s, w, b, eps), 1e-4, 1e-4, "layer_norm")
    assert_close(got[n_tokens:], x[n_tokens:], 0, 0, "rows past step.n_tokens must stay untouched")


@pytest.mark.parametrize("act", [FFN_SILU, FFN_GELU])
@pytest.mark.parametrize("gated", [True, False])
def test_glu_act(gpu, act, gated):
    """gate = act(gate) * up in place (a GLU whose projections ran apart), or act(gate) alone
    (bert's GELU after up); rows past step.n_tokens untouched; a ragged FF."""
    device, kernels = gpu.device, gpu.kernels
    max_tokens, n_tokens, ff = 4, 3, 100
    gate, up = randn(max_tokens, ff, scale=3.0), randn(max_tokens, ff)
    out, step = upload(gpu, gate), step_buffer(gpu, 0, n_tokens)
    submit(gpu, gpu_ops.glu_act(kernels, device, out, upload(gpu, up) if gated else None, step, ff=ff, act=act,
                               max_tokens=max_tokens))
    got = read(gpu, out, gate.shape)
    want = glu_act(gate[:n_tokens].astype(np.float64), act) * (up[:n_tokens] if gated else 1)
    assert_close(got[:n_tokens], want, 1e-5, 1e-5, f"glu_act {act}")
    assert_close(got[n_tokens:], gate[n_tokens:], 0, 0, "rows past step.n_tokens must stay untouched")


# --- rope_kv ----------------------------------------------------------------------------------

ROPE_CASES = [  # head_dim, n_heads, n_kv_heads, neox, n_rot, freq_factors, qk_norm, freq_scale, attn_factor
    (64, 9, 3, False, None, False, False, 1.0, 1.0),    # SmolLM2
    (64, 4, 2, False, None, True, False, 1.0, 1.0),     # Llama-3 rope_freqs
    (128, 12, 2, True, None, False, False, 1.0, 1.0),   # Qwen2.5
    (80, 6, 6, True, None, False, True, 1.0, 1.0),      # Qwen3 / LFM2 QK-norm
    (16, 4, 2, False, None, True, True, 1.0, 1.0),
    (256, 4, 2, True, 192, False, True, 1.0, 1.0),      # partial rotation
    (80, 9, 3, False, 48, True, False, 1.0, 1.0),
    (256, 4, 1, True, None, False, True, 0.125, 1.0),   # linear scaling (Gemma-3 4B+ global layers)
    (96, 4, 4, True, None, True, False, 1.0, 1.19),     # Phi-3.5-mini LongRoPE factors and attention factor
    (128, 6, 2, True, 96, True, False, 1.0, 1.19),      # Phi-4-mini: the factor scales the rotated dims only
    (128, 32, 8, False, None, True, False, 1.0, 1.0),   # Llama-3.1-8B: 4 heads a workgroup of decode attention
]


@pytest.mark.parametrize("head_dim,n_heads,n_kv_heads,neox,n_rot,with_ff,qk_norm,freq_scale,attn_factor,stacked,cache",
                         [(*case, False, F32_CACHE) for case in ROPE_CASES] +
                         [(*ROPE_CASES[0], True, F32_CACHE), (*ROPE_CASES[2], True, F32_CACHE)] +
                         [(*case, False, F16_CACHE) for case in ROPE_CASES] +
                         [(*case, False, Q8_CACHE) for case in ROPE_CASES if case[0] % 32 == 0] +
                         [(*ROPE_CASES[2], False, cache) for cache in MIXED_CACHES + Q8_MIXED_CACHES])
def test_rope_kv(gpu, head_dim, n_heads, n_kv_heads, neox, n_rot, with_ff, qk_norm, freq_scale, attn_factor, stacked,
                 cache):
    """stacked: q, k, v are ranges of one buffer of rows q | k | v (a stacked prefill matmul's
    output, in_stride apart). cache: (K's, V's) cache type; an f16 or q8_0 value equals numpy's cast
    or quantization bit for bit (v holds rounding edges of both), a key numpy's rounded within an
    ulp (a q8_0 step)."""
    device, kernels = gpu.device, gpu.kernels
    max_tokens, max_ctx, theta, eps = 4, 300, 10000.0, 1e-6
    rot = head_dim if n_rot is None else n_rot
    q, k, v = randn(max_tokens, n_heads, head_dim), randn(max_tokens, n_kv_heads, head_dim), randn(max_tokens, n_kv_heads, head_dim)
    v[0, 0, :len(HALF_EDGES)] = HALF_EDGES
    if head_dim % 32 == 0:
        edges = v.reshape(-1)[32: 32 + Q8_EDGES.size]
        edges[:] = Q8_EDGES.ravel()[:edges.size]
    ff = (1.0 + rng.random(rot // 2) * 7).astype(np.float32) if with_ff else None
    qn, kn = (randn(head_dim), randn(head_dim)) if qk_norm else (None, None)
    stride = None
    if stacked:
        rows = np.concatenate([a.reshape(max_tokens, -1) for a in (q, k, v)], axis=1)
        buf, stride, q_end, k_end = upload(gpu, rows), rows.shape[1], q[0].size, q[0].size + k[0].size
        qb, kb, vb = (Binding(buf, 4 * col, rows.nbytes - 4 * col) for col in (0, q_end, k_end))
    else:
        qb, kb, vb = upload(gpu, q), upload(gpu, k), upload(gpu, v)
    qo = zeros(gpu, q.shape)
    cache_shape = (max_ctx, n_kv_heads, head_dim)
    kc, vc = (upload_cache(gpu, np.zeros(cache_shape), t) for t in cache)
    step = device.buffer(STEP_BYTES, "step", uniform=True)
    rope = gpu_ops.Rope(theta, neox, n_rot, freq_scale, upload(gpu, ff) if with_ff else None,
                       upload(gpu, np.concatenate([qn, kn])) if qk_norm else None, eps if qk_norm else None,
                       attn_factor=attn_factor)
    dispatch = gpu_ops.rope_kv(kernels, device, qo, kc, vc, qb, kb, vb, step, head_dim=head_dim, n_heads=n_heads,
                              n_kv_heads=n_kv_heads, rope=rope, max_tokens=max_tokens, in_stride=stride,
                              cache_types=cache)
    for pos, n_tokens in [(0, 1), (261, 3), (296, 4)]:
        device.write(qo, bytes(q.nbytes))
        device.write(step, pack_step(pos, n_tokens))
        submit(gpu, dispatch)
        positions = np.arange(pos, pos + n_tokens)
        q_ref, k_ref = q[:n_tokens], k[:n_tokens]
        if qk_norm:
            q_ref, k_ref = ops.rms_norm(q_ref, qn, eps), ops.rms_norm(k_ref, kn, eps)
        q_ref = ops.rope(q_ref, positions * freq_scale, theta, neox, n_rot, ff, attn_factor)
        k_ref = ops.rope(k_ref, positions * freq_scale, theta, neox, n_rot, ff, attn_factor)
        q_got = read(gpu, qo, q.shape)
        assert_close(q_got[:n_tokens], q_ref, 1e-4, 1e-4, f"q pos {pos}")
        assert_close(q_got[n_tokens:], np.zeros_like(q[n_tokens:]), 0, 0, f"q rows past n_tokens pos {pos}")
        k_cache, v_cache = (read_cache(gpu, b, cache_shape, t) for b, t in zip((kc, vc), cache))
        assert_close(k_cache[positions], as_cached(k_ref, cache[0]), *cache_tolerance(cache[0]), f"k_cache pos {pos}")
        v_bytes = read_cache_raw(gpu, vc, cache_shape, cache[1])[positions].tobytes()
        assert v_bytes == to_cache(v[:n_tokens], cache[1]).tobytes(), f"v_cache pos {pos}: not the values as numpy casts"
    written = {0, *range(261, 264), *range(296, 300)}
    untouched = [s for s in range(max_ctx) if s not in written]
    assert not k_cache[untouched].any() and not v_cache[untouched].any(), "only slots pos..pos+n-1 are written"


# --- q8_0 cache: the scale's division ----------------------------------------------------------

# A kernel of the test's own: q8_cache.wgsl's q8_rounded on given quotients (WGSL's own division
# here is exact, an NVIDIA driver's need not be: the correction must hold wherever it starts).
Q8_ROUNDED_TEST = """#include "q8_cache.wgsl"
@group(0) @binding(0) var<storage, read> abc: array<vec4<f32>>;   // (a, b, a candidate quotient, 0)
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&out)) {
        let x = abc[id.x];
        out[id.x] = q8_rounded(x.x, x.y, x.z);
    }
}
"""


def test_q8_0_scale_quotients_are_rounded_as_f32_division(gpu):
    """d = amax / 127 and id = 1 / d as llama.cpp's f32 division rounds them, from candidates up to
    3 ulp off either way (WGSL allows its division 2.5 ulp): amax over 60 binades, d near powers of
    two and exact ones, and quotients just below a power of two started from it (the float below
    is half an ulp away there)."""
    from cera import kernels
    rng = np.random.default_rng(3)
    amax = np.exp(rng.uniform(-40, 40, 600)).astype(np.float32)
    d = np.concatenate([amax / np.float32(127),
                        np.float32(2.0) ** rng.integers(-30, 30, 200).astype(np.float32)
                        * (1 + rng.integers(-2, 3, 200) * np.float32(2 ** -23)).astype(np.float32)]).astype(np.float32)
    a = np.concatenate([amax, np.ones(len(d), np.float32)])
    b = np.concatenate([np.full(len(amax), 127, np.float32), d])
    want = (a / b).astype(np.float32)
    off = rng.integers(-3, 4, len(a)).astype(np.int64)
    start = (want.view(np.uint32).astype(np.int64) + off).astype(np.uint32).view(np.float32)
    # quotients just below a power of two, from the power of two: the float below is half an ulp away
    below = np.array([1 - 2 ** -24, 2 - 2 ** -23, 0.5 - 2 ** -25], np.float32)
    a, b = np.concatenate([a, below]), np.concatenate([b, np.ones(3, np.float32)])
    want = np.concatenate([want, below])
    start = np.concatenate([start, np.array([1.0, 2.0, 0.5], np.float32)])
    kernels.override({"q8_rounded_test.wgsl": Q8_ROUNDED_TEST})
    out = zeros(gpu, len(a))
    abc = upload(gpu, np.stack([a, b, start, np.zeros_like(a)], axis=1))
    submit(gpu, gpu.kernels.dispatch("q8_rounded_test.wgsl", [abc, out], (-(-len(a) // 64), 1, 1), "q8_rounded"))
    got = read(gpu, out, (len(a),))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), \
        f"{int((got != want).sum())} of {len(a)} quotients not rounded: first at {np.argmax(got != want)}"


# --- attention --------------------------------------------------------------------------------

ATTENTION_SHAPES = [  # head_dim, n_heads, n_kv_heads, scale (None: 1/sqrt(head_dim)), split, window
    (64, 9, 3, None, attention.ATTENTION_SPLIT, 0),      # SmolLM2
    (128, 12, 2, None, attention.ATTENTION_SPLIT, 0),    # Qwen2.5-1.5B
    (128, 32, 8, None, attention.ATTENTION_SPLIT, 0),    # Llama-3.1-8B: a workgroup takes 4 heads
    (80, 4, 4, 0.0078125, attention.ATTENTION_SPLIT, 0),  # a Granite-like attention.scale
    (256, 4, 2, None, attention.ATTENTION_SPLIT, 0),
    (18, 6, 2, None, attention.ATTENTION_SPLIT, 0),      # not a multiple of 4: the scalar path
    (128, 12, 2, None, 16, 0),    # other splits: a group per workgroup, one key stripe ...
    (256, 8, 1, None, 16, 0),     # ... more vec4 outputs than invocations ...
    (18, 4, 2, None, 256, 0),     # ... more (head, key) scores than invocations
    (256, 4, 1, 0.0625, attention.ATTENTION_SPLIT, 512),  # Gemma-3-270M's local layers
    (64, 9, 3, None, attention.ATTENTION_SPLIT, 70),     # windows across a split edge ...
    (18, 6, 2, None, 16, 5),      # ... inside one split
]
# (shape index, soft-cap): gemma2's soft-capped scores, with caps that bite on these scores (std ~2)
SOFTCAP_CASES = [
    ((256, 8, 4, 0.0625, attention.ATTENTION_SPLIT, 0), 2.0),   # Gemma-2-2B's heads (its cap: 50)
    ((18, 6, 2, None, 16, 5), 1.0),                          # the scalar path, a window in one split
]


@pytest.mark.parametrize("head_dim,n_heads,n_kv_heads,scale,split,window,cache,softcap",
                         [(*shape, F32_CACHE, 0.0) for shape in ATTENTION_SHAPES] +
                         [(*shape, F16_CACHE, 0.0) for shape in ATTENTION_SHAPES] +
                         [(*shape, Q8_CACHE, 0.0) for shape in ATTENTION_SHAPES if shape[0] % 32 == 0] +
                         [(*ATTENTION_SHAPES[i], cache, 0.0) for i in (0, 5) for cache in MIXED_CACHES] +
                         [(*ATTENTION_SHAPES[0], cache, 0.0) for cache in Q8_MIXED_CACHES] +
                         [(*shape, cache, cap) for shape, cap in SOFTCAP_CASES for cache in (F32_CACHE, F16_CACHE)] +
                         [(*SOFTCAP_CASES[0][0], Q8_CACHE, SOFTCAP_CASES[0][1])])
def test_attention(gpu, head_dim, n_heads, n_kv_heads, scale, split, window, cache, softcap):
    """Split-KV decode attention at KV lengths around the split edges, for one and several rows;
    cache slots past the live length (and, with a sliding window, before the first row's window)
    and unwritten scratch records hold NaN and must not count. cache: (K's, V's) cache type, the
    oracle reading the same rounded values; softcap: gemma2's soft-capped scores."""
    check_attention(gpu, head_dim, n_heads, n_kv_heads, scale, split, window, cache, softcap)


@pytest.mark.parametrize("heads,split", [(1, 64), (2, 64), (3, 128), (6, 32)])
def test_attention_heads_per_workgroup(gpu, heads, split):
    """Decode attention with the query heads a workgroup takes set (Tuning's heads; the rule
    gives Qwen2.5-1.5B's heads one each): the same results as numpy's for each divisor of the
    GQA group, with splits whose workgroup memory fits WebGPU's default 16 KiB."""
    check_attention(gpu, 128, 12, 2, None, split, 0, F16_CACHE, 0.0, Tuning(heads=heads))


@pytest.mark.parametrize("subgroups", [True, False])
@pytest.mark.parametrize("head_dim,n_heads,n_kv_heads", [(128, 32, 8), (64, 9, 3), (18, 6, 2)])
def test_attention_score_lanes_reduction(gpu, subgroups, head_dim, n_heads, n_kv_heads):
    """A key's score lanes added up by subgroup shuffles or through workgroup memory, each against
    numpy: the Llama-3.1-8B shape (4 heads a workgroup), SmolLM2's and the scalar path's heads of 18."""
    if subgroups and "subgroups" not in gpu.device.features:
        pytest.skip("this device has no subgroups")
    check_attention(gpu, head_dim, n_heads, n_kv_heads, None, attention.ATTENTION_SPLIT, 0, F16_CACHE, 0.0,
                    Tuning(subgroups=subgroups))


def test_heads_per_workgroup_rule():
    """A workgroup takes the most heads of a GQA group that leave a split 8 workgroups or more and
    fit 16 KiB of workgroup memory (the Llama-3.1-8B shape's 4), one head where none do:
    Qwen2.5-7B's group of 7 (28 heads: 4 a split), Qwen2.5-1.5B's of 6 and SmolLM2's of 3."""
    assert attention.heads_per_workgroup(128, 32, 4, 64, rope=True) == 4
    assert attention.heads_per_workgroup(128, 64, 8, 64, rope=True) == 4       # 8 need 25 KiB
    assert attention.heads_per_workgroup(128, 32, 4, 256, rope=True) == 1      # 4 of 256 keys need 33 KiB
    assert attention.heads_per_workgroup(128, 28, 7, 64, rope=True) == 1
    assert attention.heads_per_workgroup(128, 12, 6, 64, rope=True) == 1
    assert attention.heads_per_workgroup(64, 9, 3, 64, rope=True) == 1


def test_heads_per_workgroup_errors():
    with pytest.raises(InvalidArgument, match="5 heads a workgroup .expected a divisor of the GQA group, 6"):
        attention.heads_per_workgroup(128, 12, 6, 64, wanted=5)
    with pytest.raises(Unsupported, match=r"6 heads of 128 with split 256 need \d+ bytes of workgroup memory .the device has 32768"):
        attention.heads_per_workgroup(128, 12, 6, 256, wanted=6, storage=32768)


@pytest.mark.parametrize("head_dim,n_heads,n_kv_heads,bits", [(128, 8, 2, 24), (64, 12, 4, 24), (256, 4, 1, 8)])
def test_attention_combine_writes_x_record(gpu, head_dim, n_heads, n_kv_heads, bits):
    """Decode attention whose combine writes its output in integers too (attention.attention's xi, a
    block of 256 / head_dim heads a workgroup): the output as numpy's, and the record word for word
    what quantize_x writes of that output, for one and several rows; a head that does not tile
    256-element blocks is refused."""
    check_attention(gpu, head_dim, n_heads, n_kv_heads, None, attention.ATTENTION_SPLIT, 0, F16_CACHE, 0.0,
                    record_bits=bits)
    with pytest.raises(Unsupported, match="no integer record of 4 heads of 80"):
        attention.attention(gpu.kernels, gpu.device, *(zeros(gpu, 1) for _ in range(5)), head_dim=80, n_heads=4,
                            n_kv_heads=4, max_ctx=64, xi=zeros(gpu, 1))


def check_attention(gpu, head_dim, n_heads, n_kv_heads, scale, split, window, cache, softcap, tune=Tuning(),
                    record_bits=0):
    """test_attention's checks, with the builder's `tune`; with `record_bits`, the combine's record
    of the output in integers of that many bits checked against quantize_x's."""
    device, kernels = gpu.device, gpu.kernels
    max_tokens, max_ctx = 5, 1024
    scale = 1.0 / np.sqrt(head_dim) if scale is None else scale
    k_cache = as_cached(randn(max_ctx, n_kv_heads, head_dim), cache[0])
    v_cache = as_cached(randn(max_ctx, n_kv_heads, head_dim), cache[1])
    q = randn(max_tokens, n_heads, head_dim, scale=2.0)
    qb, kc, vc = upload(gpu, q), upload_cache(gpu, 0 * k_cache, cache[0]), upload_cache(gpu, 0 * v_cache, cache[1])
    out = zeros(gpu, q.shape)
    scratch_bytes = attention.attention_scratch_bytes(head_dim=head_dim, n_heads=n_heads, max_ctx=max_ctx,
                                                   max_tokens=max_tokens, split=split)
    scratch = upload(gpu, np.full(scratch_bytes // 4, np.nan, np.float32))
    step = device.buffer(STEP_BYTES, "step", uniform=True)
    q_dim = n_heads * head_dim
    words = max_tokens * matvec.record_words(q_dim, record_bits) if record_bits else 0
    xi, again = (upload(gpu, np.zeros(max(words, 1), np.uint32)) for _ in range(2))
    record = dict(xi=xi, **matvec.record_layout(record_bits)) if record_bits else {}
    dispatches = attention.attention(kernels, device, out, qb, kc, vc, step, head_dim=head_dim, n_heads=n_heads,
                                  n_kv_heads=n_kv_heads, scale=scale, max_tokens=max_tokens, max_ctx=max_ctx,
                                  split=split, scratch=scratch, window=window, cache_types=cache, softcap=softcap,
                                  tune=tune, **record)
    quantized = matmul.quantize_x(kernels, again, out, step, k=q_dim, max_rows=max_tokens,
                                  **matvec.record_layout(record_bits)) if record_bits else None
    # (pos, n_tokens): KV lengths 1000, 300, 1, 2, split-1, split, split+1; then several rows across a
    # split edge and up to the last slot. Long first, so shorter steps find stale records past them.
    cases = [(999, 1), (299, 1), (0, 1), (1, 1), (split - 2, 1), (split - 1, 1), (split, 1),
             (0, 5), (split - 3, 5), (max_ctx - 5, 5)]
    for pos, n_tokens in cases:
        n_keys = pos + n_tokens
        lo = max(0, pos - window + 1) if window else 0      # the first key the first row sees
        for buf, values, t in ((kc, k_cache, cache[0]), (vc, v_cache, cache[1])):
            live = np.full_like(values, np.nan)
            live[lo:n_keys] = values[lo:n_keys]
            write_cache(gpu, buf, live, t)
        device.write(out, np.zeros(q.shape, np.float32).tobytes())
        device.write(step, pack_step(pos, n_tokens))
        submit(gpu, dispatches)
        got = read(gpu, out, q.shape)
        ref = ops.attention(q[:n_tokens], k_cache[:n_keys], v_cache[:n_keys], np.arange(pos, n_keys), scale, window,
                            softcap)
        assert_close(got[:n_tokens], ref, 1e-4, 1e-4, f"attention pos {pos} n_tokens {n_tokens}")
        assert not got[n_tokens:].any(), "rows past step.n_tokens must stay untouched"
        if quantized is not None:
            live = n_tokens * words // max_tokens
            submit(gpu, [quantized])
            np.testing.assert_array_equal(read(gpu, xi, (words,), np.uint32)[:live],
                                          read(gpu, again, (words,), np.uint32)[:live], f"record pos {pos}")


@pytest.mark.parametrize("head_dim,n_heads,n_kv_heads,neox,n_rot,with_ff,qk_norm,freq_scale,attn_factor,cache",
                         [(*case, F32_CACHE) for case in ROPE_CASES] + [(*case, F16_CACHE) for case in ROPE_CASES] +
                         [(*case, Q8_CACHE) for case in ROPE_CASES if case[0] % 32 == 0] +
                         [(*ROPE_CASES[2], cache) for cache in MIXED_CACHES + Q8_MIXED_CACHES])
def test_attention_with_rope(gpu, head_dim, n_heads, n_kv_heads, neox, n_rot, with_ff, qk_norm, freq_scale, attn_factor,
                             cache):
    """Decode attention with RoPE fused (attention.attention's rope): one row's raw q | k | v in one
    buffer; the key and value of slot pos land in the cache, and the output equals rope + attention
    by numpy, at positions around the split edges (the slot's split reads what it just wrote).
    cache: (K's, V's) cache type; the oracle attends over the key the GPU rounded (within an f16
    ulp of numpy's) and the value as numpy casts it (bit for bit)."""
    device, kernels = gpu.device, gpu.kernels
    max_ctx, theta, eps, split = 300, 10000.0, 1e-6, 64
    rot = head_dim if n_rot is None else n_rot
    ff = (1.0 + rng.random(rot // 2) * 7).astype(np.float32) if with_ff else None
    qn, kn = (randn(head_dim), randn(head_dim)) if qk_norm else (None, None)
    rope = gpu_ops.Rope(theta, neox, n_rot, freq_scale, upload(gpu, ff) if with_ff else None,
                       upload(gpu, np.concatenate([qn, kn])) if qk_norm else None, eps if qk_norm else None,
                       attn_factor=attn_factor)
    q_dim, kv_dim = n_heads * head_dim, n_kv_heads * head_dim
    k_cache, v_cache = (as_cached(randn(max_ctx, n_kv_heads, head_dim), t) for t in cache)
    qkv, kc, vc = zeros(gpu, q_dim + 2 * kv_dim), upload_cache(gpu, k_cache, cache[0]), upload_cache(gpu, v_cache, cache[1])
    out, step = zeros(gpu, q_dim), device.buffer(STEP_BYTES, "step", uniform=True)
    dispatches = attention.attention(kernels, device, out, qkv, kc, vc, step, head_dim=head_dim, n_heads=n_heads,
                                  n_kv_heads=n_kv_heads, max_ctx=max_ctx, split=split, rope=rope,
                                  kv_offsets=(q_dim, q_dim + kv_dim), cache_types=cache)
    for pos in (0, split - 1, split, 299):
        q, k, v = randn(n_heads, head_dim), randn(n_kv_heads, head_dim), randn(n_kv_heads, head_dim)
        device.write(qkv, np.concatenate([q.ravel(), k.ravel(), v.ravel()]).tobytes())
        device.write(step, pack_step(pos, 1))
        submit(gpu, dispatches)
        positions = np.array([pos])
        q_ref, k_ref = (ops.rms_norm(q, qn, eps), ops.rms_norm(k, kn, eps)) if qk_norm else (q, k)
        q_ref = ops.rope(q_ref[None], positions * freq_scale, theta, neox, n_rot, ff, attn_factor)
        k_ref = ops.rope(k_ref[None], positions * freq_scale, theta, neox, n_rot, ff, attn_factor)[0]
        got_k, got_v = (read_cache(gpu, b, k_cache.shape, t) for b, t in zip((kc, vc), cache))
        assert_close(got_k[pos], as_cached(k_ref, cache[0]), *cache_tolerance(cache[0]), f"k_cache pos {pos}")
        assert_close(got_v[pos], as_cached(v, cache[1]), 0, 0, f"v_cache pos {pos}")
        k_cache[pos], v_cache[pos] = got_k[pos], got_v[pos]
        ref = ops.attention(q_ref, k_cache[:pos + 1], v_cache[:pos + 1], positions, 1.0 / np.sqrt(head_dim))
        assert_close(read(gpu, out, (1, n_heads, head_dim)), ref, 1e-4, 1e-4, f"attention pos {pos}")
    with pytest.raises(InvalidArgument, match="fused for one row"):
        attention.attention(kernels, device, out, qkv, kc, vc, step, head_dim=head_dim, n_heads=n_heads,
                         n_kv_heads=n_kv_heads, max_ctx=max_ctx, rope=rope, max_tokens=2)


@pytest.mark.parametrize("head_dim,n_heads,n_kv_heads,split,window,wtype", [
    (64, 9, 3, attention.ATTENTION_SPLIT, 0, "F32"),   # SmolLM2's heads
    (128, 12, 2, 16, 0, "Q4_K"),                     # Qwen2.5-1.5B's, more splits than merge threads
    (256, 4, 1, attention.ATTENTION_SPLIT, 70, "Q8_0"),  # a sliding window across a split edge
])
@pytest.mark.parametrize("subgroups", [True, False])
def test_output_projection_merges_attention_partials(gpu, head_dim, n_heads, n_kv_heads, split, window, wtype,
                                                     subgroups):
    """Decode's output projection reads attention's per-split partials (attention.Partials) and
    merges them itself: out = W @ attention(q), against numpy's attention and the dequantized W;
    unwritten scratch records and cache slots hold NaN and must not count."""
    device, kernels = gpu.device, gpu.kernels
    if subgroups and "subgroups" not in device.features:
        pytest.skip("this device has no subgroups")
    max_ctx, q_dim, m = 512, n_heads * head_dim, 96
    raw, w = random_rows(T[wtype], m, q_dim, rng)
    k_cache, v_cache = randn(max_ctx, n_kv_heads, head_dim), randn(max_ctx, n_kv_heads, head_dim)
    scratch_bytes = attention.attention_scratch_bytes(head_dim=head_dim, n_heads=n_heads, max_ctx=max_ctx, split=split)
    scratch = upload(gpu, np.full(scratch_bytes // 4, np.nan, np.float32))
    qb, kc, vc, wb = zeros(gpu, q_dim), zeros(gpu, k_cache.shape), zeros(gpu, v_cache.shape), upload(gpu, raw)
    out, step = zeros(gpu, m), device.buffer(STEP_BYTES, "step", uniform=True)
    first, partials = attention.attention_partials(kernels, device, qb, kc, vc, step, head_dim=head_dim, n_heads=n_heads,
                                                n_kv_heads=n_kv_heads, max_ctx=max_ctx, split=split,
                                                scratch=Binding(scratch, 0, scratch_bytes), window=window)
    project = matvec.matvec(kernels, device, out, Projection(wb, T[wtype], q_dim, m), partials,
                            tune=Tuning(subgroups=subgroups))
    assert "merge" in project.label.split()
    for pos in (400, 0, split - 1, split, 130):   # long first: shorter steps find stale records past them
        q = randn(1, n_heads, head_dim, scale=2.0)
        lo = max(0, pos - window + 1) if window else 0
        for buf, cache in ((kc, k_cache), (vc, v_cache)):
            live = np.full_like(cache, np.nan)
            live[lo:pos + 1] = cache[lo:pos + 1]
            device.write(buf, live.tobytes())
        device.write(qb, q.tobytes())
        device.write(step, pack_step(pos, 1))
        submit(gpu, [first, project])
        att = ops.attention(q, k_cache[:pos + 1], v_cache[:pos + 1], np.array([pos]), 1.0 / np.sqrt(head_dim), window)
        assert_close(read(gpu, out, (m,)), w @ att.ravel(), 1e-4, 1e-4, f"merged projection pos {pos}")
    with pytest.raises(ValueError, match="merging attention's partials"):
        matvec.matvec(kernels, device, out, Projection(wb, T[wtype], q_dim + 4, m), partials)


def test_attention_errors(gpu):
    device, kernels = gpu.device, gpu.kernels
    buf = device.buffer(4096, "x")
    shape = dict(n_heads=4, n_kv_heads=2, max_ctx=64)
    with pytest.raises(ValueError, match="head_dim 320 is above the kernel's maximum 256"):
        attention.attention(kernels, device, buf, buf, buf, buf, buf, head_dim=320, **shape)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        attention.attention(kernels, device, buf, buf, buf, buf, buf, head_dim=64, n_heads=6, n_kv_heads=4, max_ctx=64)
    with pytest.raises(Unsupported, match=r"subgroups need a power of two lanes a key, not 3 \(head_dim 12\)"):
        attention.attention(kernels, device, buf, buf, buf, buf, buf, head_dim=12, tune=Tuning(subgroups=True), **shape)
    with pytest.raises(ValueError, match="split 48 must be a power of two"):
        attention.attention(kernels, device, buf, buf, buf, buf, buf, head_dim=64, split=48, **shape)
    with pytest.raises(InvalidArgument, match="window -1 must be >= 0"):
        attention.attention(kernels, device, buf, buf, buf, buf, buf, head_dim=64, window=-1, **shape)
    with pytest.raises(ValueError, match="scratch of 4096 bytes, 4352 needed"):
        attention.attention(kernels, device, buf, buf, buf, buf, buf, head_dim=64, max_tokens=4,
                         scratch=Binding(buf, 0, 4096), **shape)


@pytest.mark.parametrize("cache", CACHES)
def test_rope_then_attention_over_steps(gpu, cache):
    """A prefill chunk then decode steps through rope_kv + attention, against the oracles, with
    each cache type: the keys within an ulp of numpy's rounding, the attention over what the
    cache holds."""
    device, kernels = gpu.device, gpu.kernels
    head_dim, n_heads, n_kv_heads, theta, eps, max_ctx, max_tokens = 64, 6, 2, 1e6, 1e-6, 40, 7
    qn, kn = randn(head_dim), randn(head_dim)
    qb, qo = zeros(gpu, (max_tokens, n_heads, head_dim)), zeros(gpu, (max_tokens, n_heads, head_dim))
    kb, vb = zeros(gpu, (max_tokens, n_kv_heads, head_dim)), zeros(gpu, (max_tokens, n_kv_heads, head_dim))
    cache_shape = (max_ctx, n_kv_heads, head_dim)
    kc, vc = (upload_cache(gpu, np.zeros(cache_shape), t) for t in cache)
    out, step = zeros(gpu, (max_tokens, n_heads, head_dim)), device.buffer(STEP_BYTES, "step", uniform=True)
    shape = dict(head_dim=head_dim, n_heads=n_heads, n_kv_heads=n_kv_heads, max_tokens=max_tokens, cache_types=cache)
    rope = gpu_ops.Rope(theta, True, qk_norm=upload(gpu, np.concatenate([qn, kn])), eps=eps)
    schedule = device.schedule([
        gpu_ops.rope_kv(kernels, device, qo, kc, vc, qb, kb, vb, step, rope=rope, **shape),
        *attention.attention(kernels, device, out, qo, kc, vc, step, max_ctx=max_ctx, **shape)])
    k_all, v_all = np.zeros((0, n_kv_heads, head_dim), np.float32), np.zeros((0, n_kv_heads, head_dim), np.float32)
    pos = 0
    for n_tokens in [7, 1, 1, 3]:
        q, k, v = randn(n_tokens, n_heads, head_dim), randn(n_tokens, n_kv_heads, head_dim), randn(n_tokens, n_kv_heads, head_dim)
        for buf, a in ((qb, q), (kb, k), (vb, v)):
            device.write(buf, a.tobytes())
        device.write(step, pack_step(pos, n_tokens))
        submit(gpu, schedule)
        positions = np.arange(pos, pos + n_tokens)
        q_ref = ops.rope(ops.rms_norm(q, qn, eps), positions, theta, True)
        k_all = np.concatenate([k_all, ops.rope(ops.rms_norm(k, kn, eps), positions, theta, True)])
        v_all = np.concatenate([v_all, v])
        k_got, v_got = (read_cache(gpu, b, cache_shape, t)[:pos + n_tokens] for b, t in zip((kc, vc), cache))
        assert_close(k_got, as_cached(k_all, cache[0]), *cache_tolerance(cache[0]), f"keys after step at pos {pos}")
        assert_close(v_got, as_cached(v_all, cache[1]), 0, 0, f"values after step at pos {pos}")
        ref = ops.attention(q_ref, k_got, v_got, positions, 1.0 / np.sqrt(head_dim))
        assert_close(read(gpu, out, (max_tokens, n_heads, head_dim))[:n_tokens], ref, 1e-4, 1e-4, f"attention after step at pos {pos}")
        pos += n_tokens


# --- shortconv ------------------------------------------------------------------------

@pytest.mark.parametrize("hidden,kernel", [(100, 3), (64, 3), (576, 4)])
def test_shortconv_over_steps(gpu, hidden, kernel):
    device, kernels = gpu.device, gpu.kernels
    max_tokens = 6
    conv_w = randn(hidden, kernel)
    bcx_b, out = zeros(gpu, (max_tokens, 3 * hidden)), zeros(gpu, (max_tokens, hidden))
    state_b, step = zeros(gpu, (kernel - 1, hidden)), device.buffer(STEP_BYTES, "step", uniform=True)
    dispatch = gpu_ops.shortconv(kernels, device, out, bcx_b, upload(gpu, conv_w), state_b, step,
                                hidden=hidden, kernel=kernel)
    state, pos = np.zeros((kernel - 1, hidden), np.float32), 0
    for n_tokens in [3, 1, 1, 6, 1]:
        bcx = randn(n_tokens, 3 * hidden)
        device.write(bcx_b, bcx.tobytes())
        device.write(step, pack_step(pos, n_tokens))
        submit(gpu, dispatch)
        y, state = ops.shortconv(bcx, conv_w, state)
        assert_close(read(gpu, out, (max_tokens, hidden))[:n_tokens], y, 1e-4, 1e-4, f"shortconv y at pos {pos}")
        assert_close(read(gpu, state_b, state.shape), state, 1e-6, 1e-6, f"shortconv state at pos {pos}")
        pos += n_tokens


# --- logit soft-cap -------------------------------------------------------------------------

@pytest.mark.parametrize("n,softcap", [(1000, 30.0), (333, 5.0)])
def test_logit_softcap(gpu, n, softcap):
    """gemma2's final soft-cap in place, softcap * tanh(x / softcap) against numpy's tanh in float64,
    for the step's rows only; saturating to +-softcap for huge and infinite logits (no NaN)."""
    device, kernels, max_tokens = gpu.device, gpu.kernels, 4
    logits = randn(max_tokens, n, scale=3 * softcap)
    logits[0, :4] = [1e30, -1e30, np.inf, -np.inf]
    logits[1, :3] = [0.0, 1e-6, -1e-3]
    buf, step = upload(gpu, logits), device.buffer(STEP_BYTES, "step", uniform=True)
    dispatch = gpu_ops.logit_softcap(kernels, device, buf, step, n=n, softcap=softcap, max_tokens=max_tokens)
    device.write(step, pack_step(0, 3))
    submit(gpu, dispatch)
    got = read(gpu, buf, logits.shape)
    want = softcap * np.tanh(logits[:3].astype(np.float64) / softcap)
    assert_close(got[:3], want, 1e-5 * softcap, 1e-5, "soft-capped logits")
    assert np.array_equal(got[3], logits[3]), "rows past step.n_tokens must stay untouched"
    with pytest.raises(InvalidArgument, match="must be positive"):
        gpu_ops.logit_softcap(kernels, device, buf, step, n=n, softcap=0.0)
