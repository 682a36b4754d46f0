// What rms_norm.wgsl and layer_norm.wgsl share: one row a workgroup, N long, and the factor a
// norm scales it by. The includer defines N, EPS, WG (a power of two <= 256) and
// `fn norm_input(e: u32) -> f32`, element e of its rows as the norm reads them.
#include "reduce.wgsl"

const ROUNDS = (N + WG - 1u) / WG;   // loops count up by one to a constant (matvec.wgsl says why)

// 1 / sqrt(mean((x - center)^2) + EPS) over the row x at `base`: RMSNorm's about 0, LayerNorm's
// about the row's mean. Call from uniform control flow.
fn norm_scale(lid: u32, base: u32, center: f32) -> f32 {
    var squares = 0.0;
    for (var n = 0u; n < ROUNDS; n++) {
        let i = n * WG + lid;
        if (i >= N) {
            break;
        }
        let c = norm_input(base + i) - center;
        squares += c * c;
    }
    return inverseSqrt(workgroup_sum(lid, squares) / f32(N) + EPS);
}
