// The rotation RoPE (ggml_rope_ext, no YaRN) gives pair i < N_ROT/2 at position p: the
// pair's two element indices, and (cos, sin) of p [* FREQ_SCALE] * THETA^(-2i/N_ROT)
// [/ freq_factors[i] with flag FREQ_FACTORS, Llama-3's rope_freqs.weight, which the including
// shader binds]. FREQ_SCALE is linear scaling's 1 / rope.scaling.factor (1 when not defined).
// ATTN_FACTOR scales cos and sin (ggml's mscale; Phi-3's rope.scaling.attn_factor, 1 when not
// defined). Flag NEOX pairs (i, i + N_ROT/2), else NORM pairs (2i, 2i+1). Defines: N_ROT, THETA,
// [FREQ_SCALE], [ATTN_FACTOR].

const TWO_PI = 6.283185307179586;
#ifndef FREQ_SCALE
const FREQ_SCALE = 1.0f;
#endif
#ifndef ATTN_FACTOR
const ATTN_FACTOR = 1.0f;
#endif

fn rope_pair(i: u32) -> vec2<u32> {
#ifdef NEOX
    return vec2<u32>(i, i + N_ROT / 2u);
#else
    return vec2<u32>(2u * i, 2u * i + 1u);
#endif
}

fn rope_cos_sin(i: u32, p: f32) -> vec2<f32> {
    var inv_freq = pow(THETA, -2.0 * f32(i) / f32(N_ROT));
#ifdef FREQ_FACTORS
    inv_freq = inv_freq / freq_factors[i];
#endif
    var angle = p * FREQ_SCALE * inv_freq;
    angle = angle - TWO_PI * round(angle / TWO_PI);   // keep sin/cos in their accurate range
    return vec2<f32>(cos(angle), sin(angle)) * ATTN_FACTOR;
}

// The pair x turned by the angle whose (cos, sin) is cs.
fn rope_turn(x: vec2<f32>, cs: vec2<f32>) -> vec2<f32> {
    return vec2<f32>(x.x * cs.x - x.y * cs.y, x.x * cs.y + x.y * cs.x);
}
