// The batched (prefill) matmul of matmul.wgsl, out[t, m] = SCALE * dot(W[m, :], x[t, :])
// (+ bias[m]) for t < step.n_tokens, m < M, with x in 8-bit integers per 256-element block, as
// llama.cpp's CPU backend quantizes the activations of its k-quant dot products (Q8_K;
// x_int.wgsl with X_PLANES 1, written by quantize_x.wgsl), and the weights as 8-bit quants
// (quant_subs_int.wgsl): every product of quants exact, four a dot4I8Packed.
//
// A workgroup owns TILE_T tokens x TILE_M weight rows and walks K in slices of BK elements
// (within one 256-element block: x's integers share its step there, the weights their d). It
// stages the slice's quants of its rows and x's integers of its tokens in workgroup memory,
// both k-major in words of 4 consecutive elements, so for each 4 elements of K an invocation
// reads a vec4 of 4 rows' words and a vec4 of 4 tokens' words: 16 dot4I8Packed (64 products)
// for two loads, where the f32 tile's 16 FMAs take the same two: that inner loop runs several
// times the f32 one's rate (docs/PERFORMANCE.md). Integer sums: per
// scale (32 elements of Q4_K, 16 of Q6_K: SUB_SCALES) the 4x4 dots, times the rows' scales, into
// the slice's sums (an i32 per output; the gate's and up's dots share each load of x);
// per slice the rows' mins times x's sub-block sums; then into the f32 accumulators, times d,
// dmin and x's step. The next slice's loads are issued before the current slice's products and
// stored after them, as in matmul.wgsl.
//
// Defines: a type flag (cera.gpu.quant.INT_TILE_TYPES) with SUB_SCALES (quant_subs_int.wgsl), K (a
// multiple of 256), M, TILE_M, TILE_T (multiples of 4), BK (32, 64, 128 or 256), the workgroup
// arrays' lengths (WS_LEN ..: cera.gpu.matmul.IntTiles.arrays), X_PLANES (1), X_STRIDE
// (x_int_record.wgsl), OUT_STRIDE, SCALE, SPLIT and MAX_ROWS as matmul.wgsl, ROW0 (out bound from
// token row ROW0 on, as matmul.wgsl's; x whole, token t's record at row ROW0 + t); flags BIAS
// ACCUMULATE GLU GELU OUT_VEC4 as matmul.wgsl.
// Bindings: w, [w_up], x (rows, X_STRIDE) u32 as vec4 (as quantize_x wrote it), out, [bias], step.
// Dispatch: as matmul.wgsl.
#include "common.wgsl"
#include "quant_subs_int.wgsl"
#include "x_int_record.wgsl"
#ifdef GLU
#include "glu.wgsl"
#endif

const NM = TILE_M / 4u;        // invocations along M
const NT = TILE_T / 4u;        // invocations along tokens
const WG = NM * NT;
const M4 = TILE_M / 4u;
const T4 = TILE_T / 4u;
const K4 = BK / 4u;            // words of 4 elements in a slice of a row
const SUBS = BK / 32u;         // 32-element sub-blocks in a slice
const SCALES = SUBS * SUB_SCALES;   // scale groups in a slice
const GROUP_WORDS = K4 / SCALES;    // words of 4 elements a scale covers
const N_SLICES = K / BK;
const PART_SLICES = (N_SLICES + SPLIT - 1u) / SPLIT;   // slices a workgroup sums (matmul_io.wgsl SPLIT)
#ifdef GLU
const N_MATS = 2u;
#else
const N_MATS = 1u;
#endif

alias XElem = vec4<u32>;   // x: (rows, X_STRIDE) records of integers (x_int_record.wgsl)

// The staged slice; [.. m / 4][m % 4] is row m's (t / 4, t % 4: token t's). The lengths (those
// in the comments) come from cera.gpu.matmul.IntTiles.arrays.
var<workgroup> ws: array<vec4<u32>, WS_LEN>;         // N_MATS * K4 * M4 [mat][word][m]: 4 signed quants
var<workgroup> wsc: array<vec4<i32>, WSC_LEN>;       // N_MATS * SCALES * M4 [mat][scale group][m]: scale
var<workgroup> wmin: array<vec4<i32>, WMIN_LEN>;     // N_MATS * SUBS * M4 [mat][sub-block][m]: min
var<workgroup> wd: array<vec4<u32>, WD_LEN>;         // N_MATS * M4 [mat][m]: d | dmin, f16
var<workgroup> xs: array<vec4<u32>, XS_LEN>;         // K4 * T4 [word][t]: 4 integers
var<workgroup> xsub: array<vec4<i32>, XSUB_LEN>;     // SUBS * T4 [sub-block][t]: sum of integers
var<workgroup> xstep: array<vec4<f32>, XSTEP_LEN>;   // T4 [t]: the block's step

#include "weights.wgsl"
#include "matmul_io.wgsl"

// ---- staging ------------------------------------------------------------------------------

// What an invocation stages of a slice: sub-blocks lid + p * WG (p < W_PER) of the slice's
// N_MATS * TILE_M * SUBS, x's vec4 lid + p * WG of its TILE_T * K4 / 4, and its
// sums and step lid + p * WG of TILE_T * (SUBS + 1).
const W_ITEMS = N_MATS * TILE_M * SUBS;
const X_ITEMS = TILE_T * (K4 / 4u);
const S_ITEMS = TILE_T * (SUBS + 1u);
const W_PER = (W_ITEMS + WG - 1u) / WG;
const X_PER = (X_ITEMS + WG - 1u) / WG;
const S_PER = (S_ITEMS + WG - 1u) / WG;

struct Fetched {
    w: array<SubWords, W_PER>,
    x: array<vec4<u32>, X_PER>,
    s: array<u32, S_PER>,
}

// Sub-block item i of a slice: its matrix, tile row and sub-block of the slice (adjacent
// invocations: adjacent rows)
fn slice_sub(i: u32) -> vec3<u32> {
    return vec3<u32>(i / (TILE_M * SUBS), i % TILE_M, (i / TILE_M) % SUBS);
}

// x item i: its tile token and vec4 of the slice's words
fn slice_x(i: u32) -> vec2<u32> {
    return vec2<u32>(i % TILE_T, i / TILE_T);
}

// vec4 v of token row t's record
fn record4(t: u32, v: u32) -> vec4<u32> {
    return x[(ROW0 + t) * (X_STRIDE / 4u) + v];
}

fn fetch(lid: u32, m0: u32, t0: u32, n_tokens: u32, slice: u32) -> Fetched {
    var f: Fetched;
    for (var p = 0u; p < W_PER; p++) {
        let it = slice_sub(lid + p * WG);
        if (lid + p * WG < W_ITEMS && m0 + it.y < M) {
            f.w[p] = sub_words(it.x, (m0 + it.y) * ROW_BYTES, slice * SUBS + it.z);
        }
    }
    for (var p = 0u; p < X_PER; p++) {
        let it = slice_x(lid + p * WG);
        if (lid + p * WG < X_ITEMS && t0 + it.x < n_tokens) {
            f.x[p] = record4(t0 + it.x, slice * BK / 16u + it.y);
        }
    }
    for (var p = 0u; p < S_PER; p++) {
        let i = lid + p * WG;
        let t = i % TILE_T;
        let j = i / TILE_T;   // a sub-block's sum, or (j == SUBS) the step
        let word = select(X_SUMS + slice * SUBS + j, X_STEPS + slice * BK / 256u, j == SUBS);
        if (i < S_ITEMS && t0 + t < n_tokens) {
            f.s[p] = record4(t0 + t, word / 4u)[word % 4u];
        }
    }
    return f;
}

fn stage(lid: u32, f: Fetched, m0: u32, slice: u32) {
    for (var p = 0u; p < W_PER; p++) {
        let it = slice_sub(lid + p * WG);
        if (lid + p * WG < W_ITEMS) {
            var v = SubInt();   // zero past M (explicitly: naga may hoist a bare var out of the loop)
            if (m0 + it.y < M) {
                v = sub_decode(f.w[p], slice * SUBS + it.z);
            }
            let m = it.y / 4u;
            let lane = it.y % 4u;
            let word = (it.x * K4 + 8u * it.z) * M4 + m;
            for (var c = 0u; c < 4u; c++) {
                ws[word + c * M4][lane] = v.q[0][c];
                ws[word + (4u + c) * M4][lane] = v.q[1][c];
            }
            let group = (it.x * SUBS + it.z) * SUB_SCALES;
            wsc[group * M4 + m][lane] = v.sc.x;
            if (SUB_SCALES == 2u) {
                wsc[(group + 1u) * M4 + m][lane] = v.sc.y;
            }
            wmin[(it.x * SUBS + it.z) * M4 + m][lane] = v.m;
            if (it.z == 0u) {
                wd[it.x * M4 + m][lane] = pack2x16float(v.d);   // f16 in the weights: exact
            }
        }
    }
    for (var p = 0u; p < X_PER; p++) {
        let it = slice_x(lid + p * WG);
        if (lid + p * WG < X_ITEMS) {
            let base = 4u * it.y * T4 + it.x / 4u;
            for (var c = 0u; c < 4u; c++) {
                xs[base + c * T4][it.x % 4u] = f.x[p][c];
            }
        }
    }
    for (var p = 0u; p < S_PER; p++) {
        let i = lid + p * WG;
        let t = i % TILE_T;
        let j = i / TILE_T;
        if (i < S_ITEMS) {
            if (j < SUBS) {
                xsub[j * T4 + t / 4u][t % 4u] = bitcast<i32>(f.s[p]);
            } else {
                xstep[t / 4u][t % 4u] = bitcast<f32>(f.s[p]);
            }
        }
    }
}

// ---- the register block -------------------------------------------------------------------

// Column c of a block: 4 rows' words against token c's word of x
fn dots4(w: vec4<u32>, x: u32) -> vec4<i32> {
    return vec4<i32>(dot4I8Packed(w.x, x), dot4I8Packed(w.y, x), dot4I8Packed(w.z, x), dot4I8Packed(w.w, x));
}

// A 4 x 4 block's integer sums (column c: 4 rows of token c)
struct Sums {
    c0: vec4<i32>,
    c1: vec4<i32>,
    c2: vec4<i32>,
    c3: vec4<i32>,
}

fn add_dots(s: Sums, w: vec4<u32>, x: vec4<u32>) -> Sums {
    return Sums(s.c0 + dots4(w, x.x), s.c1 + dots4(w, x.y), s.c2 + dots4(w, x.z), s.c3 + dots4(w, x.w));
}

fn scaled(s: Sums, sc: vec4<i32>) -> Sums {
    return Sums(s.c0 * sc, s.c1 * sc, s.c2 * sc, s.c3 * sc);
}

fn plus(a: Sums, b: Sums) -> Sums {
    return Sums(a.c0 + b.c0, a.c1 + b.c1, a.c2 + b.c2, a.c3 + b.c3);
}

fn as_f32(s: Sums) -> mat4x4<f32> {
    return mat4x4<f32>(vec4<f32>(s.c0), vec4<f32>(s.c1), vec4<f32>(s.c2), vec4<f32>(s.c3));
}

// acc + the slice's dot products of matrix `mat` from its sums: d * sums - dmin * (mins . x's
// sub-block sums), times x's step
fn slice_result(acc: mat4x4<f32>, mat: u32, s: Sums, tm: u32, tt: u32) -> mat4x4<f32> {
    let q = as_f32(s);
    var mins = Sums();
    for (var j = 0u; j < SUBS; j++) {
        let mn = wmin[(mat * SUBS + j) * M4 + tm];
        let xsum = xsub[j * T4 + tt];
        mins = plus(mins, Sums(mn * xsum.x, mn * xsum.y, mn * xsum.z, mn * xsum.w));
    }
    let m = as_f32(mins);
    let dd = wd[mat * M4 + tm];   // d | dmin of 4 rows, f16 pairs
    let d = vec4<f32>(unpack2x16float(dd.x).x, unpack2x16float(dd.y).x, unpack2x16float(dd.z).x,
                      unpack2x16float(dd.w).x);
    let dmin = vec4<f32>(unpack2x16float(dd.x).y, unpack2x16float(dd.y).y, unpack2x16float(dd.z).y,
                         unpack2x16float(dd.w).y);
    let step = xstep[tt];
    return mat4x4<f32>(fma(vec4<f32>(step.x), d * q[0] - dmin * m[0], acc[0]),
                       fma(vec4<f32>(step.y), d * q[1] - dmin * m[1], acc[1]),
                       fma(vec4<f32>(step.z), d * q[2] - dmin * m[2], acc[2]),
                       fma(vec4<f32>(step.w), d * q[3] - dmin * m[3], acc[3]));
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32,
        @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
#include "matmul_tile.wgsl"

    var acc: mat4x4<f32>;
    var acc_up: mat4x4<f32>;
    var fetched = fetch(lid, m0, t0, n_tokens, s0);
    for (var i = 0u; i < PART_SLICES; i++) {
#include "matmul_slice.wgsl"
        var sums = Sums();   // zero at every slice (explicitly, as above)
        var sums_up = Sums();
        for (var g = 0u; g < SCALES; g++) {   // the rows' scales times their dots, group by group
            var dots = Sums();
            var dots_up = Sums();
            for (var c = 0u; c < GROUP_WORDS; c++) {
                let word = GROUP_WORDS * g + c;
                let xw = xs[word * T4 + tt];
                dots = add_dots(dots, ws[word * M4 + tm], xw);
#ifdef GLU
                dots_up = add_dots(dots_up, ws[(K4 + word) * M4 + tm], xw);
#endif
            }
            sums = plus(sums, scaled(dots, wsc[g * M4 + tm]));
#ifdef GLU
            sums_up = plus(sums_up, scaled(dots_up, wsc[(SCALES + g) * M4 + tm]));
#endif
        }
        acc = slice_result(acc, 0u, sums, tm, tt);
#ifdef GLU
        acc_up = slice_result(acc_up, 1u, sums_up, tm, tt);
#endif
    }
    store_block(tile_part(wid, nwg), t0 + 4u * tt, m0 + 4u * tm, n_tokens, acc, acc_up);
}
