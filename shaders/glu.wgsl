// The GLU's gate activation (flag GLU), per element: silu(g) = g / (1 + exp(-g)) for SwiGLU, or
// with flag GELU the tanh-approximated GELU of GeGLU (Gemma),
//   0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) = g / (1 + exp(-2 sqrt(2/pi) (g + 0.044715 g^3))),
// written as the sigmoid, which saturates to g or -0 where tanh's sinh / cosh would overflow.
fn glu_act(g: vec4<f32>) -> vec4<f32> {
#ifdef GELU
    return g / (1.0 + exp(-1.5957691216057308 * (g + 0.044715 * g * g * g)));
#else
    return g / (1.0 + exp(-g));
#endif
}
