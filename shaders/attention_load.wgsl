// Loads for the attention kernels: a vec4 of q or of a cache row, and (flag ROPE) stores to a
// cache row. The including shader declares q (not with ROPE: array<Elem>), k_cache (array<KWord>),
// v_cache (array<VWord>) and HEAD_DIM. Elem: vec4<f32> with flag VEC4, else f32; a cache's word
// is an Elem, or with flag K_F16 / V_F16 Halves of half.wgsl (HEAD_DIM even: a row is whole
// words), with K_Q8 / V_Q8 a u32 of q8_cache.wgsl's blocks (HEAD_DIM % 32 == 0, so VEC4 too).

#ifdef VEC4
alias Elem = vec4<f32>;
#else
alias Elem = f32;
#endif
#ifdef K_F16
#include "half.wgsl"
alias KWord = Halves;
#else
#ifdef K_Q8
#include "q8_cache.wgsl"
alias KWord = u32;
#else
alias KWord = Elem;
#endif
#endif
#ifdef V_F16
#include "half.wgsl"
alias VWord = Halves;
#else
#ifdef V_Q8
#include "q8_cache.wgsl"
alias VWord = u32;
#else
alias VWord = Elem;
#endif
#endif

#ifndef ROPE
// Columns 4c..4c+3 of a head starting at float `base` (zero past HEAD_DIM).
fn load_q(base: u32, c: u32) -> vec4<f32> {
#ifdef VEC4
    return q[base / 4u + c];
#else
    var v = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        if (4u * c + i < HEAD_DIM) {
            v[i] = q[base + 4u * c + i];
        }
    }
    return v;
#endif
}
#endif

fn load_cache(is_v: bool, base: u32, c: u32) -> vec4<f32> {
#ifdef VEC4
    if (is_v) {
#ifdef V_F16
        return unpack_half4(v_cache[base / 4u + c]);
#else
#ifdef V_Q8
        return q8_unpack4(v_cache[q8_scale_word(base + 4u * c)], v_cache[q8_word(base + 4u * c)]);
#else
        return v_cache[base / 4u + c];
#endif
#endif
    }
#ifdef K_F16
    return unpack_half4(k_cache[base / 4u + c]);
#else
#ifdef K_Q8
    return q8_unpack4(k_cache[q8_scale_word(base + 4u * c)], k_cache[q8_word(base + 4u * c)]);
#else
    return k_cache[base / 4u + c];
#endif
#endif
#else
    var v = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        if (4u * c + i < HEAD_DIM) {
            if (is_v) {
#ifdef V_F16
                v[i] = unpack2x16float(v_cache[(base + 4u * c + i) / 2u])[i % 2u];
#else
                v[i] = v_cache[base + 4u * c + i];
#endif
            } else {
#ifdef K_F16
                v[i] = unpack2x16float(k_cache[(base + 4u * c + i) / 2u])[i % 2u];
#else
                v[i] = k_cache[base + 4u * c + i];
#endif
            }
        }
    }
    return v;
#endif
}
#ifdef ROPE

// Columns 4c..4c+3 of the cache row starting at float `base` (those below HEAD_DIM); amax: the
// max |x| of their q8_0 block (32 values), which a q8_0 cache's scale is made of.
fn store_cache(is_v: bool, base: u32, c: u32, value: vec4<f32>, amax: f32) {
#ifdef VEC4
    let i = base + 4u * c;
    if (is_v) {
#ifdef V_F16
        v_cache[base / 4u + c] = pack_half4(value);
#else
#ifdef V_Q8
        let scale = q8_scale(amax);
        v_cache[q8_word(i)] = q8_pack4(value, scale.inv);
        if (i % Q8_VALUES == 0u) {
            v_cache[q8_scale_word(i)] = scale.word;
        }
#else
        v_cache[base / 4u + c] = value;
#endif
#endif
    } else {
#ifdef K_F16
        k_cache[base / 4u + c] = pack_half4(value);
#else
#ifdef K_Q8
        let scale = q8_scale(amax);
        k_cache[q8_word(i)] = q8_pack4(value, scale.inv);
        if (i % Q8_VALUES == 0u) {
            k_cache[q8_scale_word(i)] = scale.word;
        }
#else
        k_cache[base / 4u + c] = value;
#endif
#endif
    }
#else
    for (var i = 0u; i < 4u; i++) {
        if (4u * c + i < HEAD_DIM) {
            if (is_v) {
#ifdef V_F16
                if (i % 2u == 0u) {   // a word: columns i and i + 1 (HEAD_DIM is even)
                    v_cache[(base + 4u * c + i) / 2u] = pack_half2(vec2<f32>(value[i], value[i + 1u]));
                }
#else
                v_cache[base + 4u * c + i] = value[i];
#endif
            } else {
#ifdef K_F16
                if (i % 2u == 0u) {
                    k_cache[(base + 4u * c + i) / 2u] = pack_half2(vec2<f32>(value[i], value[i + 1u]));
                }
#else
                k_cache[base + 4u * c + i] = value[i];
#endif
            }
        }
    }
#endif
}
#endif
