// The per-step uniform every batch-aware kernel reads (the byte helpers for raw GGUF data
// live in quant.wgsl and weights.wgsl).

// What changes from one submission to the next. Packed by cera.gpu.state.pack_step.
struct Step {
    pos: u32,        // position of the first token of this step (decode: the current token)
    n_tokens: u32,   // rows in this step (decode: 1; prefill: the chunk's length)
    chain: u32,      // a greedy batch's step: the index of its token in the batch (greedy_advance.wgsl)
    _pad: u32,
}
