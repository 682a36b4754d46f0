// Shared by every kernel: the per-step uniform and byte helpers for raw GGUF data.

// What changes from one submission to the next. Packed by cera.gpu.step.pack_step.
struct Step {
    pos: u32,        // position of the first token of this step (decode: the current token)
    n_tokens: u32,   // rows in this step (decode: 1; prefill: the chunk's length)
    _pad0: u32,
    _pad1: u32,
}
