// Word i of weight matrix `src` for quant.wgsl: 0 is `w`, 1 is `w_up` (flag GLU, the SwiGLU's
// second matrix). The including shader declares both bindings under those names.
fn wword(src: u32, i: u32) -> u32 {
#ifdef GLU
    if (src == 1u) {
        return w_up[i];
    }
#endif
    return w[i];
}
