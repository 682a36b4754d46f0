// One KV cache's word type, loads and (flag ROPE) stores, written once for both caches:
// attention_load.wgsl includes it with C=k T=K and with C=v T=V, for ${C}_cache, an
// array<${T}Word> in the type its flags give: ${T}_F16 f16 halves (half.wgsl; HEAD_DIM even: a row
// is whole words), ${T}_Q8 a u32 of q8_cache.wgsl's blocks (HEAD_DIM % 32 == 0, so VEC4 too),
// else an Elem of f32.
#ifdef ${T}_F16
#include "half.wgsl"
alias ${T}Word = Halves;
#else
#ifdef ${T}_Q8
#include "q8_cache.wgsl"
alias ${T}Word = u32;
#else
alias ${T}Word = Elem;
#endif
#endif

// Columns 4c..4c+3 of the cache row starting at float `base` (zero past HEAD_DIM).
fn ${C}_load4(base: u32, c: u32) -> vec4<f32> {
#ifdef VEC4
#ifdef ${T}_F16
    return unpack_half4(${C}_cache[base / 4u + c]);
#else
#ifdef ${T}_Q8
    return q8_unpack4(${C}_cache[q8_scale_word(base + 4u * c)], ${C}_cache[q8_word(base + 4u * c)]);
#else
    return ${C}_cache[base / 4u + c];
#endif
#endif
#else
    var v = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        if (4u * c + i < HEAD_DIM) {
#ifdef ${T}_F16
            v[i] = unpack2x16float(${C}_cache[(base + 4u * c + i) / 2u])[i % 2u];
#else
            v[i] = ${C}_cache[base + 4u * c + i];
#endif
        }
    }
    return v;
#endif
}
#ifdef ROPE

// Columns 4c..4c+3 of the cache row starting at float `base` (those below HEAD_DIM); amax: the
// max |x| of their q8_0 block (32 values), which a q8_0 cache's scale is made of.
fn ${C}_store4(base: u32, c: u32, value: vec4<f32>, amax: f32) {
#ifdef VEC4
#ifdef ${T}_F16
    ${C}_cache[base / 4u + c] = pack_half4(value);
#else
#ifdef ${T}_Q8
    let i = base + 4u * c;
    let scale = q8_scale(amax);
    ${C}_cache[q8_word(i)] = q8_pack4(value, scale.inv);
    if (i % Q8_VALUES == 0u) {
        ${C}_cache[q8_scale_word(i)] = scale.word;
    }
#else
    ${C}_cache[base / 4u + c] = value;
#endif
#endif
#else
    for (var i = 0u; i < 4u; i++) {
        if (4u * c + i < HEAD_DIM) {
#ifdef ${T}_F16
            if (i % 2u == 0u) {   // a word: columns i and i + 1 (HEAD_DIM is even)
                ${C}_cache[(base + 4u * c + i) / 2u] = pack_half2(vec2<f32>(value[i], value[i + 1u]));
            }
#else
            ${C}_cache[base + 4u * c + i] = value[i];
#endif
        }
    }
#endif
}
#endif
