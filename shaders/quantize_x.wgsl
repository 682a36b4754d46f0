// Rows of x in integers for the integer prefill matmul (matmul_int.wgsl): per 256-element block
// the step and integers of x_int.wgsl, as the decode matvecs' X_INT staging turns its x.
//
// Defines: K (a multiple of 256), X_PLANES, X_STRIDE (x_int_record.wgsl).
// Bindings: x (rows, K) f32 as vec4, xi (rows, X_STRIDE) u32 out, step.
// Dispatch: (ceil(K / 1024), rows, 1), 256 invocations: four blocks of a row a workgroup, 64
// invocations a block, four elements an invocation (x_int_block.wgsl; four times fewer
// workgroups than one block each: even empty workgroups cost time, docs/PERFORMANCE.md). Rows at or past step.n_tokens exit at once.
#include "common.wgsl"
#include "x_int.wgsl"
#include "x_int_record.wgsl"

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> xi: array<u32>;
@group(0) @binding(2) var<uniform> step: Step;

#include "x_int_block.wgsl"

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = wid.y;
    if (t >= step.n_tokens) {
        return;   // uniform: whole workgroup
    }
    let b = 4u * wid.x + lid / 64u;   // this invocation's block; past K / 256 in the last workgroup
    var v = vec4<f32>(0.0);
    if (b < K / 256u) {
        v = x[(t * K + 256u * b) / 4u + lid % 64u];
    }
    quantize_blocks(lid, v, t * X_STRIDE, b);
}
