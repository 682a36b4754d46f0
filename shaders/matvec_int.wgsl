// matvec.wgsl with x in integers: out[r] = SCALE * dot(W[r, :], x) (+ bias[r]) for r < M, each
// workgroup first turning x (as the dot products see it, from xs with X_STAGED) into integers
// per 256-element block in workgroup memory, X_PLANES bytes an element (1: 8 bits, as llama.cpp's
// CPU backend quantizes its activations (Q8_K); 3: 24 bits, as precise as f32 x), and the rows
// taking quant_items_int.wgsl's integer dot products over items of ITEM_UNITS units
// (item_dot_int, K a multiple of 256; cera.gpu.quant.X_INT_TYPES).
//
// With flag X_RECORD, x comes in integers already, bound in x's place as a record of
// x_int_record.wgsl (flag SUMS16) that rms_norm.wgsl (X_INT) or quantize_x.wgsl wrote once for
// every matvec of the step that reads it: the rows read it from storage, and no workgroup
// prepares anything first.
//
// Defines: matvec.wgsl's, X_PLANES, ITEM_UNITS (cera.gpu.quant.X_INT_ITEM_UNITS), and the
// lengths of x's arrays (cera.gpu.matvec.x_staging); flag X_RECORD. Bindings, dispatch: as
// matvec.wgsl.
#include "matvec_io.wgsl"
#include "x_int.wgsl"
#include "quant_items_int.wgsl"

#ifdef X_RECORD
#include "x_int_record.wgsl"

fn x_group(p: u32, g: u32) -> vec4<u32> {
    return x[p * (K / 16u) + g];
}

fn x_sum(g: u32) -> i32 {
    return bitcast<i32>(x[X_SUMS / 4u + g / 4u][g % 4u]);
}

fn x_step(b: u32) -> f32 {
    return bitcast<f32>(x[X_STEPS / 4u + b / 4u][b % 4u]);
}

fn stage_items(lid: u32) {
}
#else
// x as quant_items_int.wgsl reads it (x_int.wgsl): per 256-element block b its step xd[b];
// plane p of the integers of elements 16g .. 16g+15 in xq[p * K / 16 + g]; xsum[g] holds the
// group's sum of q. Their lengths come from cera.gpu.matvec.x_staging.
var<workgroup> xq: array<vec4<u32>, XQ_LEN>;     // X_PLANES * K / 16
var<workgroup> xsum: array<i32, XSUM_LEN>;       // K / 16
var<workgroup> xd: array<f32, XD_LEN>;           // K / 256
var<workgroup> gmax: array<vec4<f32>, GMAX_LEN>;   // each 16-element group's max |x|, four to a vec4

fn x_group(p: u32, g: u32) -> vec4<u32> {
    return xq[p * (K / 16u) + g];
}

fn x_sum(g: u32) -> i32 {
    return xsum[g];
}

fn x_step(b: u32) -> f32 {
    return xd[b];
}

// Turn x (x4: as the dot products see it) into xq, xsum, xd, a thread per 16-element group: first
// each group's max |x|, then each group its block's step (the max of its 16 groups') and its
// integers. Call from uniform control flow.
const GROUP_ROUNDS = (K / 16u + WG - 1u) / WG;   // rounds of a thread per 16-element group

fn stage_items(lid: u32) {
    for (var n = 0u; n < GROUP_ROUNDS; n++) {
        let g = n * WG + lid;
        if (g >= K / 16u) {
            break;
        }
        let e = 16u * g;
        let m = max(max(abs(x4(e)), abs(x4(e + 4u))), max(abs(x4(e + 8u)), abs(x4(e + 12u))));
        gmax[g / 4u][g % 4u] = max(max(m.x, m.y), max(m.z, m.w));
    }
    workgroupBarrier();
    for (var n = 0u; n < GROUP_ROUNDS; n++) {
        let g = n * WG + lid;
        if (g >= K / 16u) {
            break;
        }
        let b = g / 16u;
        let m4 = max(max(gmax[4u * b], gmax[4u * b + 1u]), max(gmax[4u * b + 2u], gmax[4u * b + 3u]));
        let m = max(max(m4.x, m4.y), max(m4.z, m4.w));
        let inv = x_int_inv(m);   // llama.cpp's iscale (there of the signed max)
        if (g % 16u == 0u) {
            xd[b] = x_int_step(inv);
        }
        let e = 16u * g;
        let q = array<vec4<i32>, 4>(x_int4(x4(e), inv), x_int4(x4(e + 4u), inv), x_int4(x4(e + 8u), inv),
                                    x_int4(x4(e + 12u), inv));
        xsum[g] = dot(q[0] + q[1] + q[2] + q[3], vec4<i32>(1));
        for (var p = 0u; p < X_PLANES; p++) {
            xq[p * (K / 16u) + g] = vec4<u32>(x_int_plane(q[0], p), x_int_plane(q[1], p), x_int_plane(q[2], p),
                                               x_int_plane(q[3], p));
        }
    }
    workgroupBarrier();
}
#endif

const ITEMS_PER_ROW = UNITS_PER_ROW / ITEM_UNITS;

fn item_dot(src: u32, row_byte: u32, p: u32) -> f32 {
    return item_dot_int(src, row_byte, p);
}
