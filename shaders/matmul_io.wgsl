// What the prefill matmuls (matmul.wgsl, matmul_int.wgsl) share: their bindings, the output
// stage of a 4 x 4 block of dot products (tokens x weight rows: scaled, activated (GLU), biased
// or added into `out`, as the includer's flags say) and the tile and part of K a workgroup owns.
// The includer defines M, TILE_T, TILE_M and `alias XElem` (an element of x's binding), and
// includes common.wgsl and a quant_*.wgsl first.
//
// SPLIT (default 1) cuts K into SPLIT parts, each summed by workgroups of its own (workgroup x =
// part * token tiles + token tile), part p writing its dots into rows p * MAX_ROWS + t of `out`
// (batched.k_parts and matmul_tiled; split_sum.wgsl adds the parts up): a matrix with few rows
// and a long K (a down projection) then gives the GPU enough workgroups to hide each slice's
// staging.
#ifdef OUT_VEC4
alias OutElem = vec4<f32>;
#else
alias OutElem = f32;
#endif

@group(0) @binding(0) var<storage, read> w: array<WeightWords>;      // (M, ROW_BYTES) raw
#ifdef GLU
@group(0) @binding(1) var<storage, read> w_up: array<WeightWords>;   // (M, ROW_BYTES) raw
@group(0) @binding(2) var<storage, read> x: array<XElem>;
@group(0) @binding(3) var<storage, read_write> out: array<OutElem>;  // (rows, OUT_STRIDE)
@group(0) @binding(4) var<uniform> step: Step;
#else
@group(0) @binding(1) var<storage, read> x: array<XElem>;
@group(0) @binding(2) var<storage, read_write> out: array<OutElem>;
#ifdef BIAS
@group(0) @binding(3) var<storage, read> bias: array<OutElem>;       // (M,)
@group(0) @binding(4) var<uniform> step: Step;
#else
@group(0) @binding(3) var<uniform> step: Step;
#endif
#endif

#ifndef SCALE
const SCALE = 1.0f;
#endif
#ifndef OUT_STRIDE
const OUT_STRIDE = M;
#endif
#ifndef ROW0
const ROW0 = 0u;
#endif
#ifndef SPLIT
const SPLIT = 1u;
const MAX_ROWS = 0u;   // (unused)
#endif

// Outputs m..m+3 of token t from the accumulated dot products (gate and up for GLU), into row
// r + t of out.
fn store_col(r: u32, t: u32, m: u32, n_tokens: u32, dots: vec4<f32>, dots_up: vec4<f32>) {
    if (t >= n_tokens) {
        return;
    }
#ifdef GLU
    var y = SCALE * glu_act(dots) * dots_up;
#else
    var y = SCALE * dots;
#endif
#ifdef OUT_VEC4
    let o = ((r + t) * OUT_STRIDE + m) / 4u;
#ifdef BIAS
    y += bias[m / 4u];
#endif
#ifdef ACCUMULATE
    y += out[o];
#endif
    out[o] = y;
#else
    for (var c = 0u; c < 4u; c++) {
        if (m + c >= M) {
            break;
        }
        var yc = y[c];
#ifdef BIAS
        yc += bias[m + c];
#endif
#ifdef ACCUMULATE
        yc += out[(r + t) * OUT_STRIDE + m + c];
#endif
        out[(r + t) * OUT_STRIDE + m + c] = yc;
    }
#endif
}

// A 4 x 4 block of K part `part`: tokens t..t+3 (columns) x rows m..m+3.
fn store_block(part: u32, t: u32, m: u32, n_tokens: u32, acc: mat4x4<f32>, up: mat4x4<f32>) {
    if (m >= M) {
        return;
    }
    let r = part * MAX_ROWS;
    store_col(r, t, m, n_tokens, acc[0], up[0]);
    store_col(r, t + 1u, m, n_tokens, acc[1], up[1]);
    store_col(r, t + 2u, m, n_tokens, acc[2], up[2]);
    store_col(r, t + 3u, m, n_tokens, acc[3], up[3]);
}

// A workgroup's tile: (rows of this dispatch's token block, its first token, its first weight
// row); the M tile index is wid.y + wid.z * num_workgroups.y. Past either end: nothing to do.
fn tile_origin(wid: vec3<u32>, nwg: vec3<u32>) -> vec3<u32> {
    let token_tile = wid.x % (nwg.x / SPLIT);
    return vec3<u32>(max(step.n_tokens, ROW0) - ROW0, token_tile * TILE_T, (wid.y + wid.z * nwg.y) * TILE_M);
}

// A workgroup's part of K (0 unless SPLIT)
fn tile_part(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x / (nwg.x / SPLIT);
}
