// gate[t, j] = act(gate[t, j]) * up[t, j] for t < step.n_tokens, j < FF, in place: the GLU of
// an FFN whose gate and up projections ran as plain projections (cera.gpu.plan: a LoRA delta
// has to join them before the activation, which the fused GLU matvec/matmul cannot do). act is
// glu.wgsl's: silu, or with flag GELU the tanh GELU. Flag UNGATED: gate[t, j] = act(gate[t, j])
// alone, no up (an FFN without a gate: bert's GELU after its up projection).
// Defines: FF, WG; flags GELU, UNGATED. Bindings: gate, [up], step.
// Dispatch: (ceil(FF / WG), max tokens, 1).
#include "common.wgsl"
#include "glu.wgsl"

@group(0) @binding(0) var<storage, read_write> gate: array<f32>;  // (rows, FF) -> the FFN hidden
#ifdef UNGATED
@group(0) @binding(1) var<uniform> step: Step;
#else
@group(0) @binding(1) var<storage, read> up: array<f32>;          // (rows, FF)
@group(0) @binding(2) var<uniform> step: Step;
#endif

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= FF || gid.y >= step.n_tokens) {
        return;
    }
    let i = gid.y * FF + gid.x;
#ifdef UNGATED
    gate[i] = glu_act(vec4<f32>(gate[i])).x;
#else
    gate[i] = glu_act(vec4<f32>(gate[i])).x * up[i];
#endif
}
