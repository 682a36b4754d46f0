// gate[t, j] = silu(gate[t, j]) * up[t, j] for t < step.n_tokens, j < FF, in place: the SwiGLU
// of an FFN whose gate and up projections ran as plain projections (cera.gpu.plan: a LoRA
// delta has to join them before the activation, which the fused GLU matvec/matmul cannot do).
// Defines: FF, WG. Bindings: gate, up, step. Dispatch: (ceil(FF / WG), max tokens, 1).
#include "common.wgsl"

@group(0) @binding(0) var<storage, read_write> gate: array<f32>;  // (rows, FF) -> the FFN hidden
@group(0) @binding(1) var<storage, read> up: array<f32>;          // (rows, FF)
@group(0) @binding(2) var<uniform> step: Step;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= FF || gid.y >= step.n_tokens) {
        return;
    }
    let i = gid.y * FF + gid.x;
    let g = gate[i];
    gate[i] = g / (1.0 + exp(-g)) * up[i];
}
