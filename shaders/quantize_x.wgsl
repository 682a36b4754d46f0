// Rows of x in integers for the integer prefill matmul (matmul_int.wgsl): per 256-element block
// the step and integers of x_int.wgsl, as the decode matvecs' X_INT staging turns its x.
//
// Defines: K (a multiple of 256), X_PLANES, X_STRIDE (x_int_record.wgsl).
// Bindings: x (rows, K) f32 as vec4, xi (rows, X_STRIDE) u32 out, step.
// Dispatch: (ceil(K / 1024), rows, 1), 256 invocations: four blocks of a row a workgroup, 64
// invocations a block, four elements an invocation (four times fewer workgroups than one block
// each: on an H200 a dispatch of 17,920 workgroups that do nothing took 16 us). Rows at or past
// step.n_tokens exit at once.
#include "common.wgsl"
#include "x_int.wgsl"
#include "x_int_record.wgsl"

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> xi: array<u32>;
@group(0) @binding(2) var<uniform> step: Step;

var<workgroup> part: array<f32, 256>;   // per block (a quarter) the max |x| of each invocation's four, then of pairs ...
var<workgroup> sums: array<i32, 256>;   // each invocation's sum of q

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = wid.y;
    if (t >= step.n_tokens) {
        return;   // uniform: whole workgroup
    }
    let b = 4u * wid.x + lid / 64u;   // this invocation's block; past K / 256 in the last workgroup
    let l = lid % 64u;
    let inside = b < K / 256u;
    var v = vec4<f32>(0.0);
    if (inside) {
        v = x[(t * K + 256u * b) / 4u + l];
    }
    let a = abs(v);
    part[lid] = max(max(a.x, a.y), max(a.z, a.w));
    for (var n = 0u; n < 6u; n++) {   // a tree over the block's 64 invocations' maxima
        workgroupBarrier();
        let half = 32u >> n;
        if (l < half) {
            part[lid] = max(part[lid], part[lid + half]);
        }
    }
    workgroupBarrier();
    let inv = x_int_inv(part[lid - l]);
    let q = x_int4(v, inv);
    sums[lid] = q.x + q.y + q.z + q.w;
    workgroupBarrier();
    if (!inside) {
        return;   // after the last barrier
    }
    let record = t * X_STRIDE;
    for (var p = 0u; p < X_PLANES; p++) {
        xi[record + p * (K / 4u) + 64u * b + l] = x_int_plane(q, p);
    }
    if (l % 8u == 0u) {   // each 32-element sub-block's sum: 8 invocations'
        var s = 0;
        for (var i = 0u; i < 8u; i++) {
            s += sums[lid + i];
        }
        xi[record + X_SUMS + 8u * b + l / 8u] = bitcast<u32>(s);
    }
    if (l == 0u) {
        xi[record + X_STEPS + b] = bitcast<u32>(x_int_step(inv));
    }
}
