// Context shift of one layer's KV cache, pass 1 of 2: the cached positions keep + discard + j
// (j < shift.n) go to rows j of the scratch buffers, each key re-rotated by -discard positions
// (RoPE composes: R(p - d) = R(-d) R(p)), each value as it is. The plan then copies the
// scratch to cache rows keep.. (WebGPU copies no buffer onto itself). One workgroup per
// (kv head, row j): dispatch (N_KV_HEADS, max rows, 1); rows j >= shift.n do nothing.
//
// Defines: HEAD_DIM, N_KV_HEADS, N_ROT, THETA; flags NEOX, FREQ_FACTORS (see rope_rotate.wgsl);
// K_ROW, V_ROW: the u32 words of a head's key and value row in the caches
// (cera.gpu.numerics.cache_row_bytes / 4); K_F16: the key cache and its scratch hold f16 halves
// (half.wgsl; HEAD_DIM even); K_Q8: q8_0 blocks (q8_cache.wgsl; HEAD_DIM % 32 == 0). Values move
// as the cache's words, whatever their type; keys are read to f32 in workgroup memory, turned,
// and stored again in the cache's type (an f16 key rounded again, a q8_0 key requantized, as
// llama.cpp's context shift does).
// Bindings: k_cache, v_cache (max_ctx, N_KV_HEADS, HEAD_DIM), k_out, v_out (rows, N_KV_HEADS,
// HEAD_DIM), all as words (an f32 cache's floats as their bits), shift, then [freq_factors].
// Loops count up by one to a constant (matvec.wgsl says why).

struct Shift {
    keep: u32,      // positions 0..keep-1 stay where they are
    dropped: u32,   // positions keep..keep+dropped-1 are dropped
    n: u32,         // positions keep+dropped..keep+dropped+n-1 move down by dropped
    _pad: u32,
}

const WG = 64u;

#ifdef K_F16
#include "half.wgsl"
#endif
#ifdef K_Q8
#include "q8_cache.wgsl"
#endif
@group(0) @binding(0) var<storage, read> k_cache: array<u32>;
@group(0) @binding(1) var<storage, read> v_cache: array<u32>;
@group(0) @binding(2) var<storage, read_write> k_out: array<u32>;
@group(0) @binding(3) var<storage, read_write> v_out: array<u32>;
@group(0) @binding(4) var<uniform> shift: Shift;
#ifdef FREQ_FACTORS
@group(0) @binding(5) var<storage, read> freq_factors: array<f32>;   // (N_ROT/2,)
#endif

// `row`: the key being turned
#include "rope_row.wgsl"

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let j = wid.y;
    if (j >= shift.n) {
        return;
    }
    let src = (shift.keep + shift.dropped + j) * N_KV_HEADS + wid.x;   // head rows
    let dst = j * N_KV_HEADS + wid.x;
    for (var n = 0u; n < (V_ROW + WG - 1u) / WG; n++) {
        let w = n * WG + lid;
        if (w >= V_ROW) {
            break;
        }
        v_out[dst * V_ROW + w] = v_cache[src * V_ROW + w];
    }
    for (var n = 0u; n < (HEAD_DIM + WG - 1u) / WG; n++) {
        let i = n * WG + lid;
        if (i >= HEAD_DIM) {
            break;
        }
        row[i] = load_key(src * HEAD_DIM + i);
    }
    workgroupBarrier();
    rope_row(lid, -f32(shift.dropped));
    workgroupBarrier();   // NEOX pairs straddle words and blocks
    for (var n = 0u; n < (K_ROW + WG - 1u) / WG; n++) {
        let w = n * WG + lid;
        if (w >= K_ROW) {
            break;
        }
        k_out[dst * K_ROW + w] = key_word(w);
    }
}

// Element e (a float index) of the key cache, in f32.
fn load_key(e: u32) -> f32 {
#ifdef K_F16
    return unpack2x16float(k_cache[e / 2u])[e % 2u];
#else
#ifdef K_Q8
    return q8_unpack4(k_cache[q8_scale_word(e)], k_cache[q8_word(e)])[e % 4u];
#else
    return bitcast<f32>(k_cache[e]);
#endif
#endif
}

// Word w of the turned key's row (in `row`) as the cache holds it.
fn key_word(w: u32) -> u32 {
#ifdef K_F16
    return pack_half2(vec2<f32>(row[2u * w], row[2u * w + 1u]));
#else
#ifdef K_Q8
    let b = w / Q8_WORDS * Q8_VALUES;   // the block's first value
    var amax = 0.0;
    for (var e = 0u; e < Q8_VALUES; e++) {
        amax = max(amax, abs(row[b + e]));
    }
    let scale = q8_scale(amax);
    if (w % Q8_WORDS == 0u) {
        return scale.word;
    }
    let i = b + 4u * (w % Q8_WORDS - 1u);
    return q8_pack4(vec4<f32>(row[i], row[i + 1u], row[i + 2u], row[i + 3u]), scale.inv);
#else
    return bitcast<u32>(row[w]);
#endif
#endif
}
