// Gemma 2's soft-capping of attention scores and of the final logits (define SOFTCAP, the cap):
//   soft_cap(x) = SOFTCAP * tanh(x / SOFTCAP),
// tanh written as 1 - 2 / (exp(2y) + 1), which saturates to +-1 where sinh / cosh would overflow.
fn soft_cap(x: f32) -> f32 {
    return SOFTCAP * (1.0 - 2.0 / (exp(2.0 * (x * (1.0 / SOFTCAP))) + 1.0));
}
