// A row of x in integers as quantize_x.wgsl writes it and matmul_int.wgsl reads it: X_STRIDE
// u32 words (a multiple of 4, so that rows start at 16-byte boundaries) holding, for K
// elements in 256-element blocks (x_int.wgsl),
//   [p * K / 4 + i]      plane p of elements 4i .. 4i+3, packed low byte first
//   [X_SUMS + j]         the sum of the integers of sub-block j (elements 32j .. 32j+31; with flag
//                        SUMS16, 16j .. 16j+15: the decode matvecs' groups), an i32
//   [X_STEPS + b]        block b's step, an f32
// Defines: K, X_PLANES, X_STRIDE (cera.gpu.matmul.x_int_stride); flag SUMS16.
#ifdef SUMS16
const X_SUM_ELEMS = 16u;
#else
const X_SUM_ELEMS = 32u;
#endif
const X_SUMS = X_PLANES * K / 4u;
const X_STEPS = X_SUMS + K / X_SUM_ELEMS;
