// x in integers, as the integer dot products take it (quant_items_int.wgsl, matmul_int.wgsl): per
// 256-element block a step d = max|x| / X_RANGE and integers q = round(x / d), ties to even, of
// at most X_RANGE, in X_PLANES signed bytes: plane p holds byte p of q's signed digits of base
// 256 (q = sum of 256^p times digit p). One plane is llama.cpp's CPU backend's Q8_K (the
// activations of its k-quant dot products); three are as precise as f32 x.
//
// Defines: X_PLANES (1, 2 or 3).
const X_RANGE = i32(127u * ((1u << (8u * X_PLANES)) - 1u) / 255u);   // 127 in every digit
const X_DIGIT_BIAS = u32(X_RANGE) + ((1u << (8u * X_PLANES)) - 1u) / 255u;  // 128 in every digit

// 1 / d for a block whose max |x| is m (0 for an all-zero block, which stays 0)
fn x_int_inv(m: f32) -> f32 {
    return select(0.0, f32(X_RANGE) / m, m > 0.0);
}

// The block's step d, from x_int_inv's
fn x_int_step(inv: f32) -> f32 {
    return select(0.0, 1.0 / inv, inv > 0.0);
}

// x[e .. e+3] as integers of step 1 / inv
fn x_int4(v: vec4<f32>, inv: f32) -> vec4<i32> {
    return vec4<i32>(clamp(round(v * inv), vec4<f32>(-f32(X_RANGE)), vec4<f32>(f32(X_RANGE))));
}

// Plane p of four integers, packed low byte first: their digits p as signed bytes. With the
// bias every digit is 0..255 (the signed digit plus 128), so byte p of q + bias, minus 128
// (the top bit flipped), is digit p.
fn x_int_plane(q: vec4<i32>, p: u32) -> u32 {
    let biased = (bitcast<vec4<u32>>(q) + vec4<u32>(X_DIGIT_BIAS)) >> vec4<u32>(8u * p);
    return pack4xU8(biased & vec4<u32>(0xFFu)) ^ 0x80808080u;
}
