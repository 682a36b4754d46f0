// RMSNorm of rows: out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + EPS) * w, or with flag
// ACCUMULATE out[r, :] += ... (a post-norm added into the residual stream; gemma3).
//
// Rows: ROWS_PER_TOKEN per token, step.n_tokens tokens (row r = t * ROWS_PER_TOKEN + i), each
// N long. Hidden-state norm: ROWS_PER_TOKEN = 1, N = hidden. Per-head QK-norm: ROWS_PER_TOKEN =
// n_heads, N = head_dim. One workgroup per row: dispatch (ROWS_PER_TOKEN, max tokens, 1).
// Defines: N, ROWS_PER_TOKEN, EPS, WG (a power of two <= 256); flag ACCUMULATE.
// Bindings: x, w, out, step.
#include "common.wgsl"
#include "reduce.wgsl"

@group(0) @binding(0) var<storage, read> x: array<f32>;         // (rows, N)
@group(0) @binding(1) var<storage, read> w: array<f32>;         // (N,)
@group(0) @binding(2) var<storage, read_write> out: array<f32>; // (rows, N)
@group(0) @binding(3) var<uniform> step: Step;

const ROUNDS = (N + WG - 1u) / WG;   // loops count up by one to a constant (matvec.wgsl says why)

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    if (wid.y >= step.n_tokens) {
        return;   // uniform: whole workgroup
    }
    let base = (wid.y * ROWS_PER_TOKEN + wid.x) * N;

    var sum = 0.0;
    for (var n = 0u; n < ROUNDS; n++) {
        let i = n * WG + lid;
        if (i >= N) {
            break;
        }
        let v = x[base + i];
        sum += v * v;
    }
    let scale = inverseSqrt(workgroup_sum(lid, sum) / f32(N) + EPS);

    for (var n = 0u; n < ROUNDS; n++) {
        let i = n * WG + lid;
        if (i >= N) {
            break;
        }
#ifdef ACCUMULATE
        out[base + i] += x[base + i] * scale * w[i];
#else
        out[base + i] = x[base + i] * scale * w[i];
#endif
    }
}
