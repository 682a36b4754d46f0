// out[t, :] = SCALE * E[tokens[t], :] for t < step.n_tokens; E is a raw GGUF table (rows, K).
//
// Defines: a weight type flag and K (see quant.wgsl), ROW0 and N_ROWS (the table rows bound
// at `w`: a tile of a table too big for one binding; tokens outside it are left alone),
// optional SCALE (f32). Bindings: w, tokens, out, step.
// Dispatch: x covers the row's units (WG per workgroup), y the largest n_tokens.
#include "common.wgsl"
#include "quant.wgsl"

#ifndef SCALE
const SCALE = 1.0f;
#endif

const WG = 64u;

@group(0) @binding(0) var<storage, read> w: array<u32>;              // (N_ROWS, ROW_BYTES) raw
@group(0) @binding(1) var<storage, read> tokens: array<u32>;         // (max_rows,)
@group(0) @binding(2) var<storage, read_write> out: array<f32>;      // (max_rows, K)
@group(0) @binding(3) var<uniform> step_info: Step;

fn wword(src: u32, i: u32) -> u32 {
    return w[i];
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
    var v = unit_values(0u, (token - ROW0) * ROW_BYTES, u);
    for (var g = 0u; g < UNIT_GROUPS; g++) {
        let e = group_elem(u, g);
        for (var c = 0u; c < 4u; c++) {
            if (!ROW_TAIL || e + c < K) {
                out[t * K + e + c] = SCALE * v[g][c];
            }
        }
    }
}
