// The sampler's adjusted logits (cera.sampling.Sampler.adjusted): z[i] = logits[i] after the
// penalties of its count in the penalty window, plus its logit bias; -inf (not a candidate)
// where the step's mask leaves token i out or its bias is -inf. Written as f32 bits, so -inf
// survives compilers that may assume finite floats. One invocation a token. Defines: N.
// Bindings: logits, params (struct Sampling), counts, bias, mask, z.
#include "common.wgsl"

const NEG_INF = 0xFF800000u;

@group(0) @binding(0) var<storage, read> logits: array<f32>;       // (N,)
@group(0) @binding(1) var<uniform> params: Sampling;
@group(0) @binding(2) var<storage, read> counts: array<u32>;       // (N,) occurrences in the penalty window
@group(0) @binding(3) var<storage, read> bias: array<u32>;         // (N,) f32 bits
@group(0) @binding(4) var<storage, read> mask: array<u32>;         // (ceil(N / 32),) bit i % 32 of word i / 32: i allowed
@group(0) @binding(5) var<storage, read_write> z: array<u32>;      // (N,) f32 bits

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= N) {
        return;
    }
    var v = logits[i];
    let c = counts[i];
    if (c > 0u) {
        v = select(v * params.repeat_inv, v * params.repeat_penalty, v <= 0.0);
        v -= f32(c) * params.frequency + params.presence;
    }
    let b = bias[i];
    let allowed = ((mask[i / 32u] >> (i % 32u)) & 1u) == 1u && b != NEG_INF;
    z[i] = select(NEG_INF, bitcast<u32>(v + bitcast<f32>(b)), allowed);
}
