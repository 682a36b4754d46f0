// LayerNorm of rows in place, after an add (llama.cpp's LLM_NORM: ggml_norm, then * w + b):
//   s = out[t, :] (+ y[t, :]) (+ v);  out[t, :] = (s - mean(s)) / sqrt(var(s) + EPS) * w + b
// An encoder's post-norms (out the residual stream, y the block's output: flag ADD) and its
// embedding norm (out the token embeddings, v token type 0's row: flag VECTOR; bert's
// position rows as y: flag ADD).
// Rows: step.n_tokens, each N long. One workgroup per row: dispatch (1, max tokens, 1).
// Defines: N, EPS, WG (a power of two <= 256); flags ADD, VECTOR.
// Bindings: out, w, b, step, [y], [v].
#include "common.wgsl"
#include "norm_scale.wgsl"

// The rows as norm_scale.wgsl reads them: out, the sums written back
fn norm_input(e: u32) -> f32 {
    return out[e];
}

@group(0) @binding(0) var<storage, read_write> out: array<f32>;   // (rows, N)
@group(0) @binding(1) var<storage, read> w: array<f32>;           // (N,)
@group(0) @binding(2) var<storage, read> b: array<f32>;           // (N,)
@group(0) @binding(3) var<uniform> step: Step;
#ifdef ADD
@group(0) @binding(4) var<storage, read> y: array<f32>;           // (rows, N)
#ifdef VECTOR
@group(0) @binding(5) var<storage, read> v: array<f32>;           // (N,)
#endif
#else
#ifdef VECTOR
@group(0) @binding(4) var<storage, read> v: array<f32>;           // (N,)
#endif
#endif

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    if (wid.y >= step.n_tokens) {
        return;   // uniform: whole workgroup
    }
    let base = wid.y * N;

    // the sum, written back (each invocation rereads only its own elements)
    var sum = 0.0;
    for (var n = 0u; n < ROUNDS; n++) {
        let i = n * WG + lid;
        if (i >= N) {
            break;
        }
        var s = out[base + i];
#ifdef ADD
        s += y[base + i];
#endif
#ifdef VECTOR
        s += v[i];
#endif
        out[base + i] = s;
        sum += s;
    }
    let mean = workgroup_sum(lid, sum) / f32(N);

    let scale = norm_scale(lid, base, mean);

    for (var n = 0u; n < ROUNDS; n++) {
        let i = n * WG + lid;
        if (i >= N) {
            break;
        }
        out[base + i] = (out[base + i] - mean) * scale * w[i] + b[i];
    }
}
