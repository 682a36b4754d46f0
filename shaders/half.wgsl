// f16 values packed two to a u32, low half first: the KV cache's f16 type (cera.gpu.numerics),
// which needs no shader-f16. Reads unpack with unpack2x16float (exact); writes round to nearest,
// ties to even, by integer operations (half_bits), because WGSL leaves pack2x16float's rounding
// to the implementation and the cache must hold what numpy's float16 cast gives (the reference's).
//
// Halves: what a cache of halves is bound as, with flag VEC4 four halves (a vec4 column of a
// row: one 8-byte load), else two.

#ifdef VEC4
alias Halves = vec2<u32>;
#else
alias Halves = u32;
#endif

// The f16 bits of x, rounded to nearest even: overflow to infinity, NaN to a quiet NaN,
// subnormals exact.
fn half_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if (a >= 0x477ff000u) {   // >= 65520 (rounds past 65504), infinity or NaN
        return sign | select(0x7c00u, 0x7e00u, a > 0x7f800000u);
    }
    var q: u32;      // the result's bits before rounding (exponent and mantissa)
    var rest: u32;   // the bits dropped, and half their weight
    var half: u32;
    if (a >= 0x38800000u) {   // normal: rebias the exponent (127 -> 15), drop 13 mantissa bits
        q = (a - 0x38000000u) >> 13u;
        rest = a & 0x1fffu;
        half = 0x1000u;
    } else {                  // subnormal (or zero): 24-bit significand in units of 2^-24
        let e = a >> 23u;
        if (e < 102u) {       // below 2^-25: 0 (2^-25 itself is a tie, and 0 is even)
            return sign;
        }
        let shift = 126u - e;   // 14..24
        let m = (a & 0x7fffffu) | 0x800000u;
        q = m >> shift;
        rest = m & ((1u << shift) - 1u);
        half = 1u << (shift - 1u);
    }
    // a carry out of the mantissa moves the exponent up, as it should
    return sign | (q + select(0u, 1u, rest > half || (rest == half && (q & 1u) == 1u)));
}

fn pack_half2(v: vec2<f32>) -> u32 {
    return half_bits(v.x) | (half_bits(v.y) << 16u);
}

fn pack_half4(v: vec4<f32>) -> vec2<u32> {
    return vec2<u32>(pack_half2(v.xy), pack_half2(v.zw));
}

fn unpack_half4(w: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}
