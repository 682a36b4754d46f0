// out[r] = SCALE * dot(W[r, :], x) (+ bias[r]) for r < M; W is a raw GGUF matrix (M, K).
//
// Defines: a weight type flag and K (see quant_blocks.wgsl), M, ROWS, TPR (threads per row, a
// power of two; ROWS * TPR <= 256), RPT (rows per thread, 1 or 2: a workgroup sums ROWS * RPT
// rows, a thread's second row ROWS past its first, in the same loop: each x word it reads serves
// both, and two rows' weights are in flight), optional SCALE (f32), flags:
//   X_VEC4      x bound as array<vec4<f32>> (K a multiple of 4)
//   BIAS        out[r] = SCALE * dot + bias[r]      (binding after `out`)
//   ACCUMULATE  out[r] += result                    (adds into the residual stream)
//   GLU         out[r] = SCALE * silu(Wg[r]·x) * (Wu[r]·x), Wu bound as `w_up`
//   GELU        with GLU: gelu_tanh instead of silu (GeGLU; glu.wgsl)
//   NORM        x is first RMS-normalized and scaled by `norm_w` (K,), with EPS: the
//               block's RMSNorm fused in, so it costs no dispatch of its own. Every
//               workgroup recomputes the (cheap) sum of squares of x.
//   SUBGROUPS   reduce with subgroup operations (the device has the `subgroups` feature)
//   X_STAGED    with NORM or MERGE (which implies it): each workgroup first stages x as the
//               dot products see it (normalized, or merged) in workgroup memory, XS_LEN vec4s
//               (cera.gpu.matvec.x_staging): no storage loads of x or norm_w in the row loop.
//   MERGE       x is decode attention's output, merged by each workgroup from the per-split
//               partials attention.wgsl left (bound in x's place as `scratch`, with `step`
//               at @binding(STEP_BINDING); attention_merge.wgsl) into xs (X_STAGED): the
//               output projection with attention's combine folded in. K = N_HEADS * HEAD_DIM,
//               HEAD_DIM a multiple of 4; not with GLU or NORM.
// (x in integers: matvec_int.wgsl; what the two share: matvec_io.wgsl.)
// Bindings: w, [w_up], x, out, [bias], then [norm_w] at @binding(NORM_BINDING).
//
// The TPR threads of a row stride over its units (adjacent threads, adjacent bytes), then
// each row's partial sums are added (`row_sum`): in workgroup memory, log2(TPR) barriers;
// with SUBGROUPS by a butterfly of subgroup shuffles, plus one barrier where a row spans
// several subgroups. Workgroup ids may be 2-D (more than 65535 workgroups): they are
// flattened row-major.
//
// Every loop counts up by one to a constant (strides are multiplied out in the body, shorter
// trips break out): Chromium's shader compiler (Tint, as of Chromium 156) proves such loops
// finite and leaves them alone, and guards every other loop with a 64-bit iteration counter,
// which cost the page's decode kernels a measurable share of their time (docs/PERFORMANCE.md).
#include "matvec_io.wgsl"
#include "quant_units.wgsl"

// dot(W[row, unit u], x[the unit's elements]); with UNIT_AFFINE (and X_STAGED) factored as
// quant_units.wgsl's UnitAffine says, with the pairs' sums of x staged in xsums.
#ifdef UNIT_AFFINE
fn unit_dot(src: u32, row_byte: u32, u: u32) -> f32 {
    let v = unit_affine(src, row_byte, u);
    let lo = group_elem(u, 0u);
    let hi = group_elem(u, 2u);
    let fx = vec2<f32>(dot(v.f[0], x4(lo)) + dot(v.f[1], x4(lo + 4u)), dot(v.f[2], x4(hi)) + dot(v.f[3], x4(hi + 4u)));
    let sums = vec2<f32>(dot(xsums[lo / 8u], vec2<f32>(1.0)), dot(xsums[hi / 8u], vec2<f32>(1.0)));
    return dot(v.a, fx) + dot(v.b, sums);
}
#else
fn unit_dot(src: u32, row_byte: u32, u: u32) -> f32 {
    let v = unit_values(src, row_byte, u);
    return group_dot(v[0], group_elem(u, 0u)) + group_dot(v[1], group_elem(u, 1u))
         + group_dot(v[2], group_elem(u, 2u)) + group_dot(v[3], group_elem(u, 3u));
}
#endif

// The work items a row's threads stride over: quant_units.wgsl's units (matvec_int.wgsl: its integer
// items), nothing staged for them beyond x
const ITEMS_PER_ROW = UNITS_PER_ROW;

fn item_dot(src: u32, row_byte: u32, u: u32) -> f32 {
    return unit_dot(src, row_byte, u);
}

fn stage_items(lid: u32) {
}
