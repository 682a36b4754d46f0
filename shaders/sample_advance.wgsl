// The end of a sampled step (cera.gpu.sample): the token the sampler chose (result[0]) becomes
// tokens[0], the next step's input, and is appended to the batch's tokens at step.chain; the Step
// moves to the next position, chain index and draw. With PENALTIES, the token also enters the
// penalty window: its count goes up and, once the window is full, the count of the token that
// leaves it goes down. One invocation.
// Bindings: result, tokens, chain_tokens, step (bound as storage), and with PENALTIES params,
// counts, ring.
#include "common.wgsl"

const NONE = 0xFFFFFFFFu;
const WINDOW_ALL = 0xFFFFFFFFu;

@group(0) @binding(0) var<storage, read> result: array<u32>;             // (2,) token, kept count
@group(0) @binding(1) var<storage, read_write> tokens: array<u32>;       // tokens[0]: the next step's input
@group(0) @binding(2) var<storage, read_write> chain_tokens: array<u32>;  // (batch,)
@group(0) @binding(3) var<storage, read_write> step: Step;
#ifdef PENALTIES
@group(0) @binding(4) var<uniform> params: Sampling;
@group(0) @binding(5) var<storage, read_write> counts: array<u32>;       // (vocab,)
@group(0) @binding(6) var<storage, read_write> ring: array<u32>;         // tokens pushed, then a ring of params.window of them
#endif

@compute @workgroup_size(1)
fn main() {
    let t = result[0];
    tokens[0] = t;
    chain_tokens[step.chain] = t;
    step.pos += 1u;
    step.chain += 1u;
    step.draw += 1u;
#ifdef PENALTIES
    if (t == NONE) {
        return;
    }
    let size = params.window;
    if (size != WINDOW_ALL) {   // the ring's slot for the n-th token pushed is n % size, its oldest when full
        let n = ring[0];
        let slot = 1u + n % size;
        if (n >= size) {
            counts[ring[slot]] -= 1u;
        }
        ring[slot] = t;
        ring[0] = n + 1u;
    }
    counts[t] += 1u;
#endif
}
