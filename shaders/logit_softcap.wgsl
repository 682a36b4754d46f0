// logits[t, j] = soft_cap(logits[t, j]) for t < step.n_tokens, j < N, in place: Gemma 2's final
// logit soft-capping, after the LM head (soft_cap.wgsl).
// Defines: N (logits per row), WG, SOFTCAP. Bindings: logits, step. Dispatch: (ceil(N / WG), max rows, 1).
#include "common.wgsl"
#include "soft_cap.wgsl"

@group(0) @binding(0) var<storage, read_write> logits: array<f32>;   // (rows, N)
@group(0) @binding(1) var<uniform> step: Step;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= N || gid.y >= step.n_tokens) {
        return;
    }
    let i = gid.y * N + gid.x;
    logits[i] = soft_cap(logits[i]);
}
