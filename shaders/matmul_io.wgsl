// What the prefill matmuls (matmul.wgsl, matmul_int.wgsl) share: their bindings, the entry point
// (the tile and part of K a workgroup owns, walked slice by slice with the next slice's loads in
// flight during this one's products) and the output stage of a 4 x 4 block of dot products
// (tokens x weight rows: scaled, activated (GLU), biased or added into `out`, as the includer's
// flags say). The includer defines M, TILE_T, TILE_M, WG, NM (invocations along M), N_SLICES,
// PART_SLICES and `alias XElem` (an element of x's binding), includes common.wgsl and a
// quant_*.wgsl first, and gives the slice's steps:
//   Fetched, fetch(lid, tile, slice)   an invocation's share of a slice's loads, into registers
//   stage(lid, fetched, m0, slice)     their decode into workgroup memory
//   Acc, products(acc, lid)            an invocation's accumulators, a staged slice's products added
//   store(acc, tile, lid)              the accumulated block into `out` (store_block)
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

// A workgroup's tile: this dispatch's token rows, the tile's first token and weight row (the M
// tile index is wid.y + wid.z * num_workgroups.y) and its part of K (0 unless SPLIT).
struct Tile {
    n_tokens: u32,
    t0: u32,
    m0: u32,
    part: u32,
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32,
        @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let token_tiles = nwg.x / SPLIT;
    let tile = Tile(max(step.n_tokens, ROW0) - ROW0, (wid.x % token_tiles) * TILE_T,
                    (wid.y + wid.z * nwg.y) * TILE_M, wid.x / token_tiles);
    if (tile.t0 >= tile.n_tokens || tile.m0 >= M) {
        return;   // uniform: whole workgroup
    }
    let s0 = tile.part * PART_SLICES;   // this workgroup's slices: s0 .. s0 + PART_SLICES - 1
    var acc = Acc();
    var fetched = fetch(lid, tile, s0);
    for (var i = 0u; i < PART_SLICES; i++) {
        let slice = s0 + i;
        if (slice >= N_SLICES) {
            break;   // the last part's end (uniform)
        }
        workgroupBarrier();   // the previous slice's reads are done
        stage(lid, fetched, tile.m0, slice);
        workgroupBarrier();
        if (i + 1u < PART_SLICES && slice + 1u < N_SLICES) {
            fetched = fetch(lid, tile, slice + 1u);   // in flight during the products below
        }
        acc = products(acc, lid);
    }
    store(acc, tile, lid);
}
