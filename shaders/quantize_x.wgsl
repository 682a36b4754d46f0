// Rows of x in integers for the integer prefill matmul (matmul_int.wgsl): per 256-element block
// the step and integers of x_int.wgsl, as the decode matvecs' X_INT staging turns its x.
//
// Defines: K (a multiple of 256), X_PLANES, X_STRIDE (x_int_record.wgsl).
// Bindings: x (rows, K) f32 as vec4, xi (rows, X_STRIDE) u32 out, step.
// Dispatch: (K / 256, rows, 1), 64 invocations: a workgroup per block of a row, four elements
// an invocation. Rows at or past step.n_tokens exit at once.
#include "common.wgsl"
#include "x_int.wgsl"
#include "x_int_record.wgsl"

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> xi: array<u32>;
@group(0) @binding(2) var<uniform> step: Step;

var<workgroup> part: array<f32, 64>;    // the max |x| of each invocation's elements, then of pairs ...
var<workgroup> sums: array<i32, 64>;    // each invocation's sum of q

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let b = wid.x;
    let t = wid.y;
    if (t >= step.n_tokens) {
        return;   // uniform: whole workgroup
    }
    let v = x[(t * K + 256u * b) / 4u + lid];
    let a = abs(v);
    part[lid] = max(max(a.x, a.y), max(a.z, a.w));
    for (var n = 0u; n < 6u; n++) {   // a tree over the 64 invocations' maxima
        workgroupBarrier();
        let half = 32u >> n;
        if (lid < half) {
            part[lid] = max(part[lid], part[lid + half]);
        }
    }
    workgroupBarrier();
    let inv = x_int_inv(part[0]);
    let q = x_int4(v, inv);
    let record = t * X_STRIDE;
    for (var p = 0u; p < X_PLANES; p++) {
        xi[record + p * (K / 4u) + 64u * b + lid] = x_int_plane(q, p);
    }
    sums[lid] = q.x + q.y + q.z + q.w;
    workgroupBarrier();
    if (lid % 8u == 0u) {   // each 32-element sub-block's sum: 8 invocations'
        var s = 0;
        for (var i = 0u; i < 8u; i++) {
            s += sums[lid + i];
        }
        xi[record + X_SUMS + 8u * b + lid / 8u] = bitcast<u32>(s);
    }
    if (lid == 0u) {
        xi[record + X_STEPS + b] = bitcast<u32>(x_int_step(inv));
    }
}
