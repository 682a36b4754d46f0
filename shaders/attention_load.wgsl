// Loads for the attention kernels: a vec4 of q or of a cache row, and (flag ROPE) stores to a
// cache row. The including shader declares q (not with ROPE), k_cache, v_cache
// (array<vec4<f32>> with flag VEC4, else array<f32>) and HEAD_DIM.

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
        return v_cache[base / 4u + c];
    }
    return k_cache[base / 4u + c];
#else
    var v = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        if (4u * c + i < HEAD_DIM) {
            if (is_v) {
                v[i] = v_cache[base + 4u * c + i];
            } else {
                v[i] = k_cache[base + 4u * c + i];
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
        v_cache[base / 4u + c] = value;
    } else {
        k_cache[base / 4u + c] = value;
    }
#else
    for (var i = 0u; i < 4u; i++) {
        if (4u * c + i < HEAD_DIM) {
            if (is_v) {
                v_cache[base + 4u * c + i] = value[i];
            } else {
                k_cache[base + 4u * c + i] = value[i];
            }
        }
    }
#endif
}
#endif
