// The store of attention's normalized output, for attention_combine.wgsl and
// attention_prefill.wgsl. The includer declares `out` (rows, N_HEADS*HEAD_DIM): vec4 with flag
// VEC4 (HEAD_DIM % 4 == 0), else f32.

// Columns 4c..4c+3 of y into the head of out starting at float `base` (those below HEAD_DIM).
fn store_out(base: u32, c: u32, y: vec4<f32>) {
#ifdef VEC4
    out[base / 4u + c] = y;
#else
    for (var e = 0u; e < 4u; e++) {
        if (4u * c + e < HEAD_DIM) {
            out[base + 4u * c + e] = y[e];
        }
    }
#endif
}
