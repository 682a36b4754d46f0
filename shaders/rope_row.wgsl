// A head's row in workgroup memory, turned in place by RoPE (rope_rotate.wgsl): what rope.wgsl
// and kv_shift.wgsl share. The includer declares `const WG` (its workgroup size) and
// [freq_factors]; defines HEAD_DIM and rope_rotate.wgsl's.
#include "rope_rotate.wgsl"

var<workgroup> row: array<f32, HEAD_DIM>;

// Turns `row`'s pairs to position p, each invocation only its pairs' two elements; dims >= N_ROT
// stay. The caller puts barriers around it: `row` whole before, every pair turned after.
fn rope_row(lid: u32, p: f32) {
    for (var n = 0u; n < (N_ROT / 2u + WG - 1u) / WG; n++) {
        let i = n * WG + lid;
        if (i >= N_ROT / 2u) {
            break;
        }
        let pair = rope_pair(i);
        let y = rope_turn(vec2<f32>(row[pair.x], row[pair.y]), rope_cos_sin(i, p));
        row[pair.x] = y.x;
        row[pair.y] = y.y;
    }
}
