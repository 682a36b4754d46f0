// out[t, :] (+)= parts[0, t, :] + parts[1, t, :] + ... + parts[SPLIT - 1, t, :] for t <
// step.n_tokens: the K parts of a prefill matmul (matmul_io.wgsl SPLIT) summed in part order,
// added into out (flag ACCUMULATE: the residual stream) or stored.
// Defines: M (a row's floats), SPLIT, MAX_ROWS (the rows of a part); flag ACCUMULATE.
// Bindings: parts (SPLIT, MAX_ROWS, M), out (rows, M), step.
// Dispatch: (ceil(M / 256), max rows, 1).
#include "common.wgsl"

@group(0) @binding(0) var<storage, read> parts: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> step: Step;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    if (gid.x >= M || t >= step.n_tokens) {
        return;
    }
    var sum = parts[t * M + gid.x];
    for (var p = 1u; p < SPLIT; p++) {
        sum += parts[(p * MAX_ROWS + t) * M + gid.x];
    }
#ifdef ACCUMULATE
    sum += out[t * M + gid.x];
#endif
    out[t * M + gid.x] = sum;
}
