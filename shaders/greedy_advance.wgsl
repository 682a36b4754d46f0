// The end of a greedy step (cera.gpu.plan.greedy_plan): append the token its argmax left in
// tokens[0] to the batch's tokens at step.chain, then move the Step to the next position, so the
// next step of the batch reads it as its uniform. One invocation; inside the batch's compute
// pass, where copies in and out of the Step would end the pass at every step.
// Bindings: tokens, chain_tokens, step (the Step buffer, bound as storage here).
#include "common.wgsl"

@group(0) @binding(0) var<storage, read> tokens: array<u32>;              // tokens[0]: the step's argmax
@group(0) @binding(1) var<storage, read_write> chain_tokens: array<u32>;  // (batch,)
@group(0) @binding(2) var<storage, read_write> step: Step;

@compute @workgroup_size(1)
fn main() {
    chain_tokens[step.chain] = tokens[0];
    step.pos += 1u;
    step.chain += 1u;
}
