// out[t, :] = SCALE * E[tokens[t], :] for t < step.n_tokens; E is a raw GGUF table (rows, K).
//
// Defines: a weight type flag, K (see quant_blocks.wgsl), WG (invocations), ROW0 and N_ROWS (the table rows bound
// at `w`: a tile of a table too big for one binding; tokens outside it are left alone),
// optional SCALE (f32). Bindings: w, tokens, out, step.
// Dispatch: x covers the row's units (WG per workgroup), y the largest n_tokens.
#include "common.wgsl"
#include "quant_units.wgsl"

#ifndef SCALE
const SCALE = 1.0f;
#endif

@group(0) @binding(0) var<storage, read> w: array<WeightWords>;      // (N_ROWS, ROW_BYTES) raw
@group(0) @binding(1) var<storage, read> tokens: array<u32>;         // (max_rows,)
@group(0) @binding(2) var<storage, read_write> out: array<f32>;      // (max_rows, K)
@group(0) @binding(3) var<uniform> step_info: Step;

#include "weights.wgsl"

// out[row + e .. row + e + 3] = SCALE * v, elements past the row (float rows) skipped
fn store4(row: u32, e: u32, v: vec4<f32>) {
    if (!ROW_TAIL || e + 3u < K) {
        out[row + e] = SCALE * v.x;
        out[row + e + 1u] = SCALE * v.y;
        out[row + e + 2u] = SCALE * v.z;
        out[row + e + 3u] = SCALE * v.w;
        return;
    }
    for (var c = 0u; c < 3u; c++) {   // at most 3 of the 4 are inside
        if (e + c >= K) {
            break;
        }
        out[row + e + c] = SCALE * v[c];
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let u = gid.x;
    if (t >= step_info.n_tokens || u >= UNITS_PER_ROW) {
        return;
    }
    let token = tokens[t];
    if (token < ROW0 || token - ROW0 >= N_ROWS) {
        return;
    }
    let v = unit_values(0u, (token - ROW0) * ROW_BYTES, u);
    store4(t * K, group_elem(u, 0u), v[0]);
    store4(t * K, group_elem(u, 1u), v[1]);
    store4(t * K, group_elem(u, 2u), v[2]);
    store4(t * K, group_elem(u, 3u), v[3]);
}
