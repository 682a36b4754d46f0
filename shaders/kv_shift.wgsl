// Context shift of one layer's KV cache, pass 1 of 2: the cached positions keep + discard + j
// (j < shift.n) go to rows j of the scratch buffers, each key re-rotated by -discard positions
// (RoPE composes: R(p - d) = R(-d) R(p)), each value as it is. The plan then copies the
// scratch to cache rows keep.. (WebGPU copies no buffer onto itself). One workgroup per
// (kv head, row j): dispatch (N_KV_HEADS, max rows, 1); rows j >= shift.n do nothing.
//
// Defines: HEAD_DIM, N_KV_HEADS, N_ROT, THETA; flags NEOX, FREQ_FACTORS (see rope_rotate.wgsl);
// K_F16, V_F16: that cache and its scratch hold f16 halves (half.wgsl; HEAD_DIM even): values
// move as words, keys are turned in workgroup memory and rounded again.
// Bindings: k_cache, v_cache (max_ctx, N_KV_HEADS, HEAD_DIM), k_out, v_out (rows, N_KV_HEADS,
// HEAD_DIM), shift, then [freq_factors].
// Loops count up by one to a constant (matvec.wgsl says why).

struct Shift {
    keep: u32,      // positions 0..keep-1 stay where they are
    dropped: u32,   // positions keep..keep+dropped-1 are dropped
    n: u32,         // positions keep+dropped..keep+dropped+n-1 move down by dropped
    _pad: u32,
}

const WG = 64u;
const SLOT = N_KV_HEADS * HEAD_DIM;   // floats per cache row

#ifdef K_F16
#include "half.wgsl"
@group(0) @binding(0) var<storage, read> k_cache: array<u32>;
#else
@group(0) @binding(0) var<storage, read> k_cache: array<f32>;
#endif
#ifdef V_F16
#include "half.wgsl"
@group(0) @binding(1) var<storage, read> v_cache: array<u32>;
#else
@group(0) @binding(1) var<storage, read> v_cache: array<f32>;
#endif
#ifdef K_F16
@group(0) @binding(2) var<storage, read_write> k_out: array<u32>;
#else
@group(0) @binding(2) var<storage, read_write> k_out: array<f32>;
#endif
#ifdef V_F16
@group(0) @binding(3) var<storage, read_write> v_out: array<u32>;
#else
@group(0) @binding(3) var<storage, read_write> v_out: array<f32>;
#endif
@group(0) @binding(4) var<uniform> shift: Shift;
#ifdef FREQ_FACTORS
@group(0) @binding(5) var<storage, read> freq_factors: array<f32>;   // (N_ROT/2,)
#endif

#include "rope_rotate.wgsl"
#ifdef K_F16

var<workgroup> row: array<f32, HEAD_DIM>;   // the key being turned
#endif

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let j = wid.y;
    if (j >= shift.n) {
        return;
    }
    let src = (shift.keep + shift.dropped + j) * SLOT + wid.x * HEAD_DIM;
    let dst = j * SLOT + wid.x * HEAD_DIM;
#ifdef V_F16
    for (var n = 0u; n < (HEAD_DIM / 2u + WG - 1u) / WG; n++) {
        let w = n * WG + lid;
        if (w >= HEAD_DIM / 2u) {
            break;
        }
        v_out[dst / 2u + w] = v_cache[src / 2u + w];
    }
#else
    for (var n = 0u; n < (HEAD_DIM + WG - 1u) / WG; n++) {
        let i = n * WG + lid;
        if (i >= HEAD_DIM) {
            break;
        }
        v_out[dst + i] = v_cache[src + i];
    }
#endif
#ifdef K_F16
    for (var n = 0u; n < (HEAD_DIM / 2u + WG - 1u) / WG; n++) {
        let w = n * WG + lid;
        if (w >= HEAD_DIM / 2u) {
            break;
        }
        let x = unpack2x16float(k_cache[src / 2u + w]);
        row[2u * w] = x.x;
        row[2u * w + 1u] = x.y;
    }
    workgroupBarrier();
    for (var n = 0u; n < (N_ROT / 2u + WG - 1u) / WG; n++) {
        let i = n * WG + lid;
        if (i >= N_ROT / 2u) {
            break;
        }
        let pair = rope_pair(i);
        let cs = rope_cos_sin(i, -f32(shift.dropped));
        let y = rope_turn(vec2<f32>(row[pair.x], row[pair.y]), cs);
        row[pair.x] = y.x;
        row[pair.y] = y.y;
    }
    workgroupBarrier();   // NEOX pairs straddle words
    for (var n = 0u; n < (HEAD_DIM / 2u + WG - 1u) / WG; n++) {
        let w = n * WG + lid;
        if (w >= HEAD_DIM / 2u) {
            break;
        }
        k_out[dst / 2u + w] = pack_half2(vec2<f32>(row[2u * w], row[2u * w + 1u]));
    }
#else
    for (var n = 0u; n < (N_ROT / 2u + WG - 1u) / WG; n++) {
        let i = n * WG + lid;
        if (i >= N_ROT / 2u) {
            break;
        }
        let pair = rope_pair(i);
        let cs = rope_cos_sin(i, -f32(shift.dropped));
        let y = rope_turn(vec2<f32>(k_cache[src + pair.x], k_cache[src + pair.y]), cs);
        k_out[dst + pair.x] = y.x;
        k_out[dst + pair.y] = y.y;
    }
    for (var n = 0u; n < (HEAD_DIM - N_ROT + WG - 1u) / WG; n++) {
        let i = N_ROT + n * WG + lid;
        if (i >= HEAD_DIM) {
            break;
        }
        k_out[dst + i] = k_cache[src + i];
    }
#endif
}
