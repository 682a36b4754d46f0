// RMSNorm of rows: out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + EPS) * w.
//
// Rows: ROWS_PER_TOKEN per token, step.n_tokens tokens (row r = t * ROWS_PER_TOKEN + i), each
// N long. Hidden-state norm: ROWS_PER_TOKEN = 1, N = hidden. Per-head QK-norm: ROWS_PER_TOKEN =
// n_heads, N = head_dim. One workgroup per row: dispatch (ROWS_PER_TOKEN, max tokens, 1).
//
// Flag ADD (the fused residual add): x is the residual stream, updated in place first,
//   x[r, :] += delta[r, :] * DELTA_SCALE, and the sum is normed (Granite's residual_scale is
//   DELTA_SCALE; 1.0 otherwise).
// Defines: N, ROWS_PER_TOKEN, EPS, WG (a power of two <= 256), [DELTA_SCALE].
// Bindings: x, w, out, step [, delta].
#include "common.wgsl"
#include "reduce.wgsl"

#ifdef ADD
@group(0) @binding(0) var<storage, read_write> x: array<f32>;   // (rows, N) residual, updated
#else
@group(0) @binding(0) var<storage, read> x: array<f32>;         // (rows, N)
#endif
@group(0) @binding(1) var<storage, read> w: array<f32>;         // (N,)
@group(0) @binding(2) var<storage, read_write> out: array<f32>; // (rows, N)
@group(0) @binding(3) var<uniform> step: Step;
#ifdef ADD
@group(0) @binding(4) var<storage, read> delta: array<f32>;     // (rows, N)
#endif

var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    if (wid.y >= step.n_tokens) {
        return;   // uniform: whole workgroup
    }
    let base = (wid.y * ROWS_PER_TOKEN + wid.x) * N;

    var sum = 0.0;
    for (var i = lid; i < N; i += WG) {
#ifdef ADD
        let v = x[base + i] + delta[base + i] * DELTA_SCALE;
        x[base + i] = v;
#else
        let v = x[base + i];
#endif
        sum += v * v;
    }
    let scale = inverseSqrt(workgroup_sum(lid, sum) / f32(N) + EPS);

    // Each invocation re-reads only the elements it wrote, so the in-place ADD needs no barrier.
    for (var i = lid; i < N; i += WG) {
        out[base + i] = x[base + i] * scale * w[i];
    }
}
