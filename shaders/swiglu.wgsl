// The SwiGLU gate of the FFN: out = silu(gate) * up, elementwise over a step's rows.
// Dispatch (ceil(N / WG), max rows, 1); rows t >= step.n_tokens do nothing.
// Defines: N (ffn length). Bindings: gate, up, out (rows, N), step.
#include "common.wgsl"

const WG = 256u;

@group(0) @binding(0) var<storage, read> gate: array<f32>;
@group(0) @binding(1) var<storage, read> up: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> step: Step;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= N || gid.y >= step.n_tokens) {
        return;
    }
    let i = gid.y * N + gid.x;
    let g = gate[i];
    out[i] = g / (1.0 + exp(-g)) * up[i];
}
