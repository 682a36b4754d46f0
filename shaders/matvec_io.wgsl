// What matvec.wgsl and matvec_int.wgsl share: x as the dot products see it (raw, normalized or
// merged; staged in workgroup memory with X_STAGED), the bindings, the row sums and the entry
// point, for the defines and flags matvec.wgsl lists. The including shader defines the work items
// a row's threads stride over: ITEMS_PER_ROW, fn item_dot(src, row_byte, i) -> f32 (W[row, item
// i] dotted with x, src 0 for w, 1 for w_up) and fn stage_items(lid) (what a workgroup prepares
// of x for its items once x is staged; called from uniform control flow).
#ifdef SUBGROUPS
enable subgroups;
#endif
#include "quant_blocks.wgsl"
#include "reduce.wgsl"
#ifdef GLU
#include "glu.wgsl"
#endif

#ifndef SCALE
const SCALE = 1.0f;
#endif

const WG = ROWS * TPR;

// x is read 4 elements at a time: as vec4 when K allows (one load, one bounds check)
#ifdef MERGE
#include "common.wgsl"
#include "attention_merge.wgsl"
#else
#ifdef X_RECORD
alias X_TYPE = vec4<u32>;   // x already in integers (matvec_int.wgsl)
#else
#ifdef X_VEC4
alias X_TYPE = vec4<f32>;

fn x_raw(e: u32) -> vec4<f32> {
    return x[e >> 2u];
}
#ifdef NORM

fn norm4(e: u32) -> vec4<f32> {
    return norm_w[e >> 2u];
}
#endif
#else
alias X_TYPE = f32;

fn x_raw(e: u32) -> vec4<f32> {
    return vec4<f32>(x[e], x[e + 1u], x[e + 2u], x[e + 3u]);
}
#ifdef NORM

fn norm4(e: u32) -> vec4<f32> {
    return vec4<f32>(norm_w[e], norm_w[e + 1u], norm_w[e + 2u], norm_w[e + 3u]);
}
#endif
#endif
#endif
#endif

#ifndef X_RECORD
// x[e .. e+3] as the dot products see it (times the norm weights with NORM; the 1/rms
// factor is applied once, to the row sums). With X_STAGED each workgroup first stages it in
// workgroup memory, zero past K: the row loops then read no x, nor norm weights, from storage.
// The arrays' lengths come from cera.gpu.matvec.x_staging (XS_LEN: 4 a unit, XSUMS_LEN: 2).
#ifdef X_STAGED
var<workgroup> xs: array<vec4<f32>, XS_LEN>;
#ifdef UNIT_AFFINE
var<workgroup> xsums: array<vec2<f32>, XSUMS_LEN>;   // sums of x[4i .. 4i+3] at [i / 2][i % 2]
#endif

fn x4(e: u32) -> vec4<f32> {
    return xs[e >> 2u];
}
#else
fn x4(e: u32) -> vec4<f32> {
#ifdef NORM
    return x_raw(e) * norm4(e);
#else
    return x_raw(e);
#endif
}
#endif
#endif

@group(0) @binding(0) var<storage, read> w: array<WeightWords>;      // (M, ROW_BYTES) raw
#ifdef GLU
@group(0) @binding(1) var<storage, read> w_up: array<WeightWords>;   // (M, ROW_BYTES) raw
@group(0) @binding(2) var<storage, read> x: array<X_TYPE>;           // (K,)
@group(0) @binding(3) var<storage, read_write> out: array<f32>;      // (M,)
#else
#ifdef MERGE
@group(0) @binding(1) var<storage, read> scratch: array<vec4<f32>>;  // attention's partials
@group(0) @binding(STEP_BINDING) var<uniform> step: Step;
#else
@group(0) @binding(1) var<storage, read> x: array<X_TYPE>;           // (K,)
#endif
@group(0) @binding(2) var<storage, read_write> out: array<f32>;      // (M,)
#ifdef BIAS
@group(0) @binding(3) var<storage, read> bias: array<f32>;           // (M,)
#endif
#endif

#ifdef NORM
@group(0) @binding(NORM_BINDING) var<storage, read> norm_w: array<X_TYPE>;  // (K,)
#endif

#include "weights.wgsl"

#ifndef X_RECORD
// Which of elements e .. e+3 lie inside the row (all but a float row's tail)
fn in_row(e: u32) -> vec4<bool> {
    return vec4<u32>(e) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(K);
}

// dot of 4 weights with x[e .. e+3], elements past the row masked (float rows of any length)
fn group_dot(wv: vec4<f32>, e: u32) -> f32 {
    if (ROW_TAIL) {
        let inside = in_row(e);
        return dot(select(vec4<f32>(0.0), wv, inside), select(vec4<f32>(0.0), x4(e), inside));
    }
    return dot(wv, x4(e));
}
#endif

const LANE_ITEMS = (ITEMS_PER_ROW + TPR - 1u) / TPR;   // items of a row's lane 0, the most a lane has

// What a thread sums for its row: the dot product, or the GLU's (gate, up) pair side by side
#ifdef GLU
alias Sums = vec2<f32>;

fn item_sums(row_byte: u32, u: u32) -> Sums {
    return Sums(item_dot(0u, row_byte, u), item_dot(1u, row_byte, u));
}
#else
alias Sums = f32;

fn item_sums(row_byte: u32, u: u32) -> Sums {
    return item_dot(0u, row_byte, u);
}
#endif

// row_sum(value): the sum of `value` over the TPR threads of lid's row, in the row's lane 0
// (with SUBGROUPS in every lane). Call from uniform control flow.
#ifdef SUBGROUPS
// A row's lanes are an aligned run of TPR invocations, and subgroups are aligned runs of
// sg_size (reduce.wgsl): a butterfly over xor offsets below min(TPR, sg_size) adds within
// one row, never across the rows sharing a subgroup. A row wider than a subgroup then adds
// its TPR / sg_size subgroup sums through workgroup memory.
var<workgroup> row_partial: array<Sums, WG / 4u>;   // one per subgroup (of 4 or more)

fn row_sum(lid: u32, sg_size: u32, value: Sums) -> Sums {
    var sum = value;
    for (var k = 0u; k < countTrailingZeros(TPR); k++) {
        if ((1u << k) >= sg_size) {
            break;
        }
        sum += subgroupShuffleXor(sum, 1u << k);
    }
    if (TPR > sg_size) {
        if (lid % sg_size == 0u) {
            row_partial[lid / sg_size] = sum;
        }
        workgroupBarrier();
        let parts = TPR / sg_size;
        let first = lid / TPR * parts;
        sum = row_partial[first];
        for (var i = 1u; i < TPR / 4u; i++) {   // subgroups have at least 4 invocations
            if (i >= parts) {
                break;
            }
            sum += row_partial[first + i];
        }
    }
    return sum;
}
#else
var<workgroup> row_partial: array<Sums, WG>;
#include "tree_sum.wgsl" P=row_partial T=Sums N=TPR

fn row_sum(lid: u32, value: Sums) -> Sums {
    row_partial_halvings(lid, value);
    return row_partial[lid];
}
#endif

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32,
#ifdef SUBGROUPS
        @builtin(subgroup_size) sg_size: u32,
#endif
        @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let lane = lid % TPR;
    let r = (wid.x + wid.y * nwg.x) * ROWS * RPT + lid / TPR;   // the thread's row (RPT 2: and r + ROWS)
    let r2 = min(r + ROWS, M - 1u);   // RPT 2: the second row (past M the last one again, not stored)

    var inv_rms = 1.0;
#ifdef X_STAGED
#ifdef MERGE
    let live = split_range(0u);
#endif
    var squares = 0.0;
    for (var n = 0u; n < (XS_LEN + WG - 1u) / WG; n++) {
        let i = n * WG + lid;   // xs[i]: elements 4i .. 4i+3
        if (i >= XS_LEN) {
            break;
        }
#ifdef MERGE
        var v = vec4<f32>(0.0);
        if (i < K / 4u) {   // head i / D4, vec4 column i % D4
            let merged = merge_splits(0u, i / D4, i % D4, live.x, 1u, live.y);
            v = merged.o / merged.l;
        }
        let staged = v;
#else
        let v = select(vec4<f32>(0.0), x_raw(4u * i), in_row(4u * i));   // with NORM (X_STAGED's other case)
        squares += dot(v, v);
        let staged = v * norm4(4u * i);
#endif
        xs[i] = staged;
#ifdef UNIT_AFFINE
        xsums[i / 2u][i % 2u] = dot(staged, vec4<f32>(1.0));
#endif
    }
    workgroupBarrier();
#endif
#ifdef NORM
#ifndef X_STAGED
    var squares = 0.0;
    for (var n = 0u; n < (K + 4u * WG - 1u) / (4u * WG); n++) {
        let e = 4u * (n * WG + lid);
        if (e >= K) {
            break;
        }
        let v = select(vec4<f32>(0.0), x_raw(e), in_row(e));
        squares += dot(v, v);
    }
#endif
#ifdef SUBGROUPS
    inv_rms = inverseSqrt(workgroup_sum(lid, sg_size, squares) / f32(K) + EPS);
#else
    inv_rms = inverseSqrt(workgroup_sum(lid, squares) / f32(K) + EPS);
#endif
#endif

    stage_items(lid);

    var acc = Sums(0.0);
    var acc2 = Sums(0.0);
    if (r < M) {
        let items = (ITEMS_PER_ROW + TPR - 1u - lane) / TPR;   // the lane's: lane, lane + TPR, ...
        for (var n = 0u; n < LANE_ITEMS; n++) {
            if (n >= items) {
                break;
            }
            acc += item_sums(r * ROW_BYTES, lane + n * TPR);
            if (RPT == 2u) {
                acc2 += item_sums(r2 * ROW_BYTES, lane + n * TPR);   // the same x as row r's, read once
            }
        }
    }
#ifdef SUBGROUPS
    let sums = row_sum(lid, sg_size, acc) * inv_rms;
#else
    let sums = row_sum(lid, acc) * inv_rms;
#endif
    if (lane == 0u && r < M) {
        out[r] = row_result(r, sums);
    }
    if (RPT == 2u) {
        workgroupBarrier();   // row_sum's workgroup memory is read before it is written again
#ifdef SUBGROUPS
        let sums2 = row_sum(lid, sg_size, acc2) * inv_rms;
#else
        let sums2 = row_sum(lid, acc2) * inv_rms;
#endif
        if (lane == 0u && r + ROWS < M) {
            out[r + ROWS] = row_result(r + ROWS, sums2);
        }
    }
}

// Row r's output from its dot products (the GLU's pair): scaled, activated, biased or added
fn row_result(r: u32, sums: Sums) -> f32 {
#ifdef GLU
    var y = SCALE * glu_act(vec4<f32>(sums.x)).x * sums.y;
#else
    var y = SCALE * sums;
#endif
#ifdef BIAS
    y += bias[r];
#endif
#ifdef ACCUMULATE
    y += out[r];
#endif
    return y;
}
