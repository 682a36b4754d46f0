// LFM2's gated short convolution for the rows of a step, in order (llm_build_lfm2 shortconv):
//   B, C, x = bcx[t, 0:H], bcx[t, H:2H], bcx[t, 2H:3H]      (in_proj output, llama.cpp's order)
//   window  = the last KERNEL rows of concat(state, B*x)    (state: the KERNEL-1 previous B*x rows)
//   out[t, ch] = C[ch] * sum_j conv_w[ch, j] * window[j, ch]
// then the state keeps the last KERNEL-1 rows of B*x, updated in place for the next step.
// One invocation per channel (channels are independent), sequential over the step's rows:
// dispatch (ceil(HIDDEN / WG), 1, 1).
//
// Defines: HIDDEN, KERNEL (LFM2's conv L_cache, 3), WG (channels per workgroup).
// Bindings: bcx (rows, 3*HIDDEN), conv_w (HIDDEN, KERNEL) = GGUF blk.N.shortconv.conv.weight
// [KERNEL, HIDDEN], state (KERNEL-1, HIDDEN) oldest row first, out (rows, HIDDEN), step.
#include "common.wgsl"

@group(0) @binding(0) var<storage, read> bcx: array<f32>;
@group(0) @binding(1) var<storage, read> conv_w: array<f32>;
@group(0) @binding(2) var<storage, read_write> state: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> step: Step;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let ch = gid.x;
    if (ch >= HIDDEN) {
        return;
    }
    var window: array<f32, KERNEL>;   // window[KERNEL-1] is the current row's B*x
    var taps: array<f32, KERNEL>;
    for (var j = 0u; j < KERNEL; j++) {
        taps[j] = conv_w[ch * KERNEL + j];
    }
    for (var j = 0u; j < KERNEL - 1u; j++) {
        window[j] = state[j * HIDDEN + ch];
    }
    for (var t = 0u; t < step.n_tokens; t++) {
        let row = t * 3u * HIDDEN;
        window[KERNEL - 1u] = bcx[row + ch] * bcx[row + 2u * HIDDEN + ch];
        var conv = 0.0;
        for (var j = 0u; j < KERNEL; j++) {
            conv += taps[j] * window[j];
        }
        out[t * HIDDEN + ch] = bcx[row + HIDDEN + ch] * conv;
        for (var j = 0u; j < KERNEL - 1u; j++) {
            window[j] = window[j + 1u];
        }
    }
    for (var j = 0u; j < KERNEL - 1u; j++) {
        state[j * HIDDEN + ch] = window[j];
    }
}
