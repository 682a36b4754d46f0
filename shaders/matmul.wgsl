// out[t, m] = SCALE * dot(W[m, :], x[t, :]) (+ bias[m]) for t < step.n_tokens, m < M: the
// batched (prefill) matmul out (rows, M) = x (rows, K) @ W^T. W is a raw GGUF matrix (M, K).
//
// Register-tiled. A workgroup owns a tile of TILE_T tokens x TILE_M weight rows and walks K in
// slices of BK elements: it dequantizes the slice of its TILE_M rows into workgroup memory once
// (each invocation decodes whole quant_units.wgsl units), stages the matching slice of its TILE_T
// x rows next to it, and every invocation then accumulates an RT x RM block of outputs in
// registers. The next slice's loads (weights: quant_units.wgsl's unit_words; x) are issued into
// registers before the current slice's multiplications and stored after them (`fetch`,
// `stage`): their latency hides behind the FMAs instead of stalling the workgroup at each
// slice (staging without that overlap was a third of a 1.5B model's prefill: docs/PERFORMANCE.md).
// Both tiles are stored k-major, so for each k the inner loop reads RT/4 vec4 of
// tokens and RM/4 vec4 of rows (adjacent invocations, adjacent vec4: no bank conflicts) for
// RT*RM FMAs. The accumulators are mat4x4 values (column c: 4 rows of one token) named one
// by one, never a dynamically indexed array (which NVIDIA puts in local memory), so RM and
// RT are 4 or 8.
//
// A slice is a run of whole units (16 elements each), not of consecutive elements: a unit's
// elements are spread over its block or row (quant_blocks.wgsl group_elem), and since a dot product
// does not care about order, x is staged in the same order as W. So any BK that is a multiple
// of 16 works for every type; the last slice of a row may be partial (masked to zero).
//
// Defines: a weight type flag and K (see quant_blocks.wgsl), M, TILE_M, TILE_T, BK (a multiple of
// 16), RM, RT (4 or 8, dividing TILE_M, TILE_T), WS_LEN and XS_LEN (the staged tiles' vec4s:
// cera.gpu.matmul.MatmulTiles.arrays), OUT_STRIDE (floats between rows of out, default M:
// more when W is a row tile of a bigger matrix), ROW0 (default 0: x and out are bound from
// token row ROW0 of the step on, a row block of an output bigger than a binding), optional
// SCALE (f32), SPLIT and MAX_ROWS (K in parts, out (SPLIT, MAX_ROWS, M): matmul_io.wgsl); flags:
//   BIAS        out = SCALE * dot + bias[m]         (binding after `out`)
//   ACCUMULATE  out += result                       (adds into the residual stream)
//   GLU         out = SCALE * silu(Wg[m]·x) * (Wu[m]·x), Wu bound as `w_up`
//   GELU        with GLU: gelu_tanh instead of silu (GeGLU; glu.wgsl)
//   X_VEC4      K % 4 == 0: x is read as vec4
//   OUT_VEC4    M % 4 == 0 and OUT_STRIDE % 4 == 0: out (and bias) are accessed as vec4
//   HALF        (device feature shader-f16) the staged tiles hold f16 (half the workgroup
//               memory per element: twice the BK in the same bytes), and each K slice's
//               partial dots are f16 FMAs (packed 2-wide on NVIDIA) added into the f32
//               accumulators once per slice. Rounding: 2^-11 per weight, per x and per step
//               of a slice's sum (BK steps); x and each slice's partial dot must stay within
//               f16 range (65504).
// Bindings: w, [w_up], x, out, [bias], step.
// Dispatch: (ceil(max_rows / TILE_T), m tiles split over y and z); the M tile index is
// wid.y + wid.z * num_workgroups.y. Token tiles at or past step.n_tokens exit at once.
#ifdef HALF
enable f16;
#endif
#include "common.wgsl"
#include "quant_units.wgsl"
#ifdef GLU
#include "glu.wgsl"
#endif

const UPS = BK / 16u;                              // units per slice of a row
const N_SLICES = (UNITS_PER_ROW + UPS - 1u) / UPS;
const PART_SLICES = (N_SLICES + SPLIT - 1u) / SPLIT;   // slices a workgroup sums (matmul_io.wgsl SPLIT)
const NM = TILE_M / RM;                            // invocations along M
const NT = TILE_T / RT;                            // invocations along tokens
const WG = NM * NT;
const M4 = TILE_M / 4u;
const T4 = TILE_T / 4u;
#ifdef GLU
const N_MATS = 2u;
#else
const N_MATS = 1u;
#endif

#ifdef X_VEC4
alias XElem = vec4<f32>;   // x (rows, K)
#else
alias XElem = f32;
#endif

#ifdef HALF
alias tile_t = f16;   // the staged tiles and a slice's partial dots
#else
alias tile_t = f32;
#endif

// k-major tiles: ws[(mat * BK + kk) * M4 + m / 4][m % 4], xs[kk * T4 + t / 4][t % 4]; their
// lengths (N_MATS * BK * M4, BK * T4) from cera.gpu.matmul.MatmulTiles.arrays
var<workgroup> ws: array<vec4<tile_t>, WS_LEN>;
var<workgroup> xs: array<vec4<tile_t>, XS_LEN>;

#include "weights.wgsl"
#include "matmul_io.wgsl"

// ---- staging ------------------------------------------------------------------------------

// Zero the elements of group v (elements e..e+3) past the row.
fn mask_tail(v: vec4<f32>, e: u32) -> vec4<f32> {
    if (ROW_TAIL) {
        return select(vec4<f32>(0.0), v, vec4<u32>(e) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(K));
    }
    return v;
}

// Group g of a staged unit: 4 k positions of one weight row (component `lane` of its vec4).
fn store_w(base: u32, lane: u32, g: u32, v: vec4<f32>) {
    for (var c = 0u; c < 4u; c++) {
        ws[base + (g * 4u + c) * M4][lane] = tile_t(v[c]);
    }
}

// What an invocation stages of a slice: weight units lid + p * WG (p < W_PER) of the slice's
// N_MATS * TILE_M * UPS, x groups lid + p * WG of its TILE_T * UPS * 4.
const W_UNITS = N_MATS * TILE_M * UPS;
const X_GROUPS = TILE_T * UPS * 4u;
const W_PER = (W_UNITS + WG - 1u) / WG;
const X_PER = (X_GROUPS + WG - 1u) / WG;

// Fetched: the raw words of an invocation's share of a slice, in registers (arrays indexed
// only in constant-trip loops, which the compiler unrolls).
struct Fetched {
    w: array<UnitWords, W_PER>,
    x: array<vec4<f32>, X_PER>,
}

// Weight unit i of a slice: its matrix, tile row and unit of the row (adjacent invocations:
// adjacent rows, so the stores into ws do not conflict).
fn slice_unit(i: u32, slice: u32) -> vec3<u32> {
    return vec3<u32>(i / (TILE_M * UPS), i % TILE_M, slice * UPS + (i / TILE_M) % UPS);
}

fn unit_inside(m0: u32, unit: vec3<u32>) -> bool {
    return m0 + unit.y < M && unit.z < UNITS_PER_ROW;
}

// x group i of a slice: its tile token and (unit, group) of the slice.
fn slice_group(i: u32, slice: u32) -> vec3<u32> {
    let gi = i / TILE_T;                 // group gi % 4 of unit gi / 4 of the slice
    return vec3<u32>(i % TILE_T, gi, slice * UPS + gi / 4u);
}

// Elements e..e+3 of x row t (e % 4 == 0), zero past K.
fn x_group(t: u32, e: u32) -> vec4<f32> {
#ifdef X_VEC4
    return mask_tail(x[(t * K + e) / 4u], e);   // K % 4 == 0: a group is all in or all out
#else
    let base = t * K + e;
    var v = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if (e + c < K) {
            v[c] = x[base + c];
        }
    }
    return v;
#endif
}

// The loads of an invocation's share of a slice: no use of what they return.
fn fetch(lid: u32, m0: u32, t0: u32, n_tokens: u32, slice: u32) -> Fetched {
    var f: Fetched;
    for (var p = 0u; p < W_PER; p++) {
        let unit = slice_unit(lid + p * WG, slice);
        if (lid + p * WG < W_UNITS && unit_inside(m0, unit)) {
            f.w[p] = unit_words(unit.x, (m0 + unit.y) * ROW_BYTES, unit.z);
        }
    }
    for (var p = 0u; p < X_PER; p++) {
        let g = slice_group(lid + p * WG, slice);
        if (lid + p * WG < X_GROUPS && t0 + g.x < n_tokens && g.z < UNITS_PER_ROW) {
            f.x[p] = x_group(t0 + g.x, group_elem(g.z, g.y % 4u));
        }
    }
    return f;
}

// Decode a fetched share of a slice into ws and xs (zeros past M, n_tokens or the row).
fn stage(lid: u32, f: Fetched, m0: u32, slice: u32) {
    for (var p = 0u; p < W_PER; p++) {
        let unit = slice_unit(lid + p * WG, slice);
        if (lid + p * WG < W_UNITS) {
            var v: Unit;
            if (unit_inside(m0, unit)) {
                v = unit_decode(f.w[p], (m0 + unit.y) * ROW_BYTES, unit.z);
            }
            let base = (unit.x * BK + (unit.z - slice * UPS) * 16u) * M4 + unit.y / 4u;
            store_w(base, unit.y % 4u, 0u, mask_tail(v[0], group_elem(unit.z, 0u)));
            store_w(base, unit.y % 4u, 1u, mask_tail(v[1], group_elem(unit.z, 1u)));
            store_w(base, unit.y % 4u, 2u, mask_tail(v[2], group_elem(unit.z, 2u)));
            store_w(base, unit.y % 4u, 3u, mask_tail(v[3], group_elem(unit.z, 3u)));
        }
    }
    for (var p = 0u; p < X_PER; p++) {
        let g = slice_group(lid + p * WG, slice);
        if (lid + p * WG < X_GROUPS) {
            let base = g.y * 4u * T4 + g.x / 4u;
            for (var c = 0u; c < 4u; c++) {
                xs[base + c * T4][g.x % 4u] = tile_t(f.x[p][c]);
            }
        }
    }
}

// ---- the register block -------------------------------------------------------------------

// acc + (w outer x): column c gains w * x[c] (4 rows of token c).
fn outer_fma(acc: mat4x4<tile_t>, w: vec4<tile_t>, x: vec4<tile_t>) -> mat4x4<tile_t> {
    return mat4x4<tile_t>(fma(w, vec4<tile_t>(x.x), acc[0]), fma(w, vec4<tile_t>(x.y), acc[1]),
                          fma(w, vec4<tile_t>(x.z), acc[2]), fma(w, vec4<tile_t>(x.w), acc[3]));
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32,
        @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
#include "matmul_tile.wgsl"

    // a_ij: tokens 4 * (tt + i * NT) + 0..3 x rows 4 * (tm + j * NM) + 0..3; i < RT / 4, j < RM / 4
    // (u_ij: the same for w_up). HALF: a_ij, u_ij are one slice's f16 partial dots, summed
    // into the f32 s_ij, r_ij.
#ifdef HALF
    var s00: mat4x4<f32>;
    var s01: mat4x4<f32>;
    var s10: mat4x4<f32>;
    var s11: mat4x4<f32>;
    var r00: mat4x4<f32>;
    var r01: mat4x4<f32>;
    var r10: mat4x4<f32>;
    var r11: mat4x4<f32>;
#else
    var a00: mat4x4<f32>;
    var a01: mat4x4<f32>;
    var a10: mat4x4<f32>;
    var a11: mat4x4<f32>;
#ifdef GLU
    var u00: mat4x4<f32>;
    var u01: mat4x4<f32>;
    var u10: mat4x4<f32>;
    var u11: mat4x4<f32>;
#endif
#endif

    var fetched = fetch(lid, m0, t0, n_tokens, s0);
    for (var i = 0u; i < PART_SLICES; i++) {
#include "matmul_slice.wgsl"
#ifdef HALF
        var a00 = mat4x4<f16>();   // zero at every slice (explicitly: naga may hoist a bare var)
        var a01 = mat4x4<f16>();
        var a10 = mat4x4<f16>();
        var a11 = mat4x4<f16>();
#ifdef GLU
        var u00 = mat4x4<f16>();
        var u01 = mat4x4<f16>();
        var u10 = mat4x4<f16>();
        var u11 = mat4x4<f16>();
#endif
#endif
        for (var kk = 0u; kk < BK; kk++) {
            let x0 = xs[kk * T4 + tt];
            let x1 = xs[kk * T4 + tt + (RT / 4u - 1u) * NT];   // = x0 when RT == 4 (unused)
            let w0 = ws[kk * M4 + tm];
            let w1 = ws[kk * M4 + tm + (RM / 4u - 1u) * NM];
#include "matmul_block_fma.wgsl" A=a W=w
#ifdef GLU
            let v0 = ws[(BK + kk) * M4 + tm];
            let v1 = ws[(BK + kk) * M4 + tm + (RM / 4u - 1u) * NM];
#include "matmul_block_fma.wgsl" A=u W=v
#endif
        }
#ifdef HALF
#include "matmul_block_sum.wgsl" S=s A=a
#ifdef GLU
#include "matmul_block_sum.wgsl" S=r A=u
#endif
#endif
    }

#ifdef HALF
    let a00 = s00;
    let a01 = s01;
    let a10 = s10;
    let a11 = s11;
    let u00 = r00;   // unused without GLU
    let u01 = r01;
    let u10 = r10;
    let u11 = r11;
#else
#ifndef GLU
    let u00 = a00;   // unused
    let u01 = a01;
    let u10 = a10;
    let u11 = a11;
#endif
#endif
    let t_0 = t0 + 4u * tt;
    let t_1 = t0 + 4u * (tt + NT);
    let m_0 = m0 + 4u * tm;
    let m_1 = m0 + 4u * (tm + NM);
    store_block(tile_part(wid, nwg), t_0, m_0, n_tokens, a00, u00);
    if (RM == 8u) {
        store_block(tile_part(wid, nwg), t_0, m_1, n_tokens, a01, u01);
    }
    if (RT == 8u) {
        store_block(tile_part(wid, nwg), t_1, m_0, n_tokens, a10, u10);
    }
    if (RM == 8u && RT == 8u) {
        store_block(tile_part(wid, nwg), t_1, m_1, n_tokens, a11, u11);
    }
}
