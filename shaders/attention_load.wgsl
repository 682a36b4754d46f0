// Loads for the attention kernels: a vec4 of q or of a cache row, and (flag ROPE) stores to a
// cache row. The including shader declares q (not with ROPE), k_cache, v_cache
// (array<vec4<f32>> with flag VEC4, else array<f32>; with flag K_F16 / V_F16 that cache holds
// halves, array<Halves> of half.wgsl) and HEAD_DIM (even with halves: a row is whole words).

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
        return v_cache[base / 4u + c];
#endif
    }
#ifdef K_F16
    return unpack_half4(k_cache[base / 4u + c]);
#else
    return k_cache[base / 4u + c];
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

// Columns 4c..4c+3 of the cache row starting at float `base` (those below HEAD_DIM).
fn store_cache(is_v: bool, base: u32, c: u32, value: vec4<f32>) {
#ifdef VEC4
    if (is_v) {
#ifdef V_F16
        v_cache[base / 4u + c] = pack_half4(value);
#else
        v_cache[base / 4u + c] = value;
#endif
    } else {
#ifdef K_F16
        k_cache[base / 4u + c] = pack_half4(value);
#else
        k_cache[base / 4u + c] = value;
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
