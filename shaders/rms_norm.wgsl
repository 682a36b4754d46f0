// RMSNorm of rows: out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + EPS) * w, or with flag
// ACCUMULATE out[r, :] += ... (a post-norm added into the residual stream; gemma3).
//
// Rows: ROWS_PER_TOKEN per token, step.n_tokens tokens (row r = t * ROWS_PER_TOKEN + i), each
// N long. Hidden-state norm: ROWS_PER_TOKEN = 1, N = hidden. Per-head QK-norm: ROWS_PER_TOKEN =
// n_heads, N = head_dim. One workgroup per row: dispatch (ROWS_PER_TOKEN, max tokens, 1).
// Flag X_INT (a hidden-state norm, N = K a multiple of 256, WG 256, not with ACCUMULATE): each
// row also goes into xi in integers, as quantize_x.wgsl would write them from out (the integer
// prefill matmul's x; x_int_block.wgsl), with X_PLANES, X_STRIDE, flag SUMS16 (x_int_record.wgsl),
// by X_SPLIT workgroups a row (dispatch (X_SPLIT, rows, 1)), each normalizing its share of the
// row's 1024-element rounds: a decode step's one row in parallel.
// Defines: N, ROWS_PER_TOKEN, EPS, WG (a power of two <= 256); flag ACCUMULATE.
// Bindings: x, w, out, step, [xi].
#include "common.wgsl"
#include "norm_scale.wgsl"

// The rows as norm_scale.wgsl reads them
fn norm_input(e: u32) -> f32 {
    return x[e];
}

#ifdef X_INT
#include "x_int.wgsl"
#include "x_int_record.wgsl"

@group(0) @binding(4) var<storage, read_write> xi: array<u32>;   // (rows, X_STRIDE)

#include "x_int_block.wgsl"
#endif

@group(0) @binding(0) var<storage, read> x: array<f32>;         // (rows, N)
@group(0) @binding(1) var<storage, read> w: array<f32>;         // (N,)
@group(0) @binding(2) var<storage, read_write> out: array<f32>; // (rows, N)
@group(0) @binding(3) var<uniform> step: Step;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    if (wid.y >= step.n_tokens) {
        return;   // uniform: whole workgroup
    }
#ifdef X_INT
    let base = wid.y * N;
#else
    let base = (wid.y * ROWS_PER_TOKEN + wid.x) * N;
#endif

    let scale = norm_scale(lid, base, 0.0);

#ifdef X_INT
    for (var j = 0u; j < ((N + 1023u) / 1024u + X_SPLIT - 1u) / X_SPLIT; j++) {   // four 256-element blocks a round
        let b = 4u * (j * X_SPLIT + wid.x) + lid / 64u;
        let i = 256u * b + 4u * (lid % 64u);
        var v = vec4<f32>(0.0);
        if (i < N) {
            for (var c = 0u; c < 4u; c++) {
                v[c] = x[base + i + c] * scale * w[i + c];
                out[base + i + c] = v[c];
            }
        }
        quantize_blocks(lid, v, wid.y * X_STRIDE, b);
    }
#else
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
#endif
}
