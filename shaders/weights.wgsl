// The weight fetches quant_*.wgsl decode from: 0 is `w`, 1 is `w_up` (flag GLU, the SwiGLU's
// second matrix). The including shader declares both bindings under those names, as
// `array<WeightWords>` (quant_blocks.wgsl): u32 words, or with WEIGHT_QUADS (blocks of a multiple of
// 16 bytes: Q4_K, Q5_K) vec4<u32>, so that a block's fields arrive in 16-byte loads, one
// storage access (and one bounds check) for four words.
#ifdef WEIGHT_QUADS
fn wquad(src: u32, q: u32) -> vec4<u32> {   // words 4q .. 4q+3
#ifdef GLU
    if (src == 1u) {
        return w_up[q];
    }
#endif
    return w[q];
}

fn wword(src: u32, i: u32) -> u32 {
    return wquad(src, i >> 2u)[i & 3u];
}
#else
fn wword(src: u32, i: u32) -> u32 {
#ifdef GLU
    if (src == 1u) {
        return w_up[i];
    }
#endif
    return w[i];
}

fn wquad(src: u32, q: u32) -> vec4<u32> {
    let i = 4u * q;
    return vec4<u32>(wword(src, i), wword(src, i + 1u), wword(src, i + 2u), wword(src, i + 3u));
}
#endif
