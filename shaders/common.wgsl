// The per-step uniform every batch-aware kernel reads, and the sampler's settings (the byte
// helpers for raw GGUF data live in quant_blocks.wgsl and weights.wgsl).

// What changes from one submission to the next. Packed by cera.gpu.state.pack_step.
struct Step {
    pos: u32,        // position of the first token of this step (decode: the current token)
    n_tokens: u32,   // rows in this step (decode: 1; prefill: the chunk's length)
    chain: u32,      // a greedy batch's step: the index of its token in the batch (greedy_advance.wgsl)
    draw: u32,       // a sampled step: the index of its token in the reply, the random stream's counter
}

// A generation's sampler settings (cera.sampling), packed by cera.gpu.sample.pack_sampling.
struct Sampling {
    top_k: u32,             // 0: every candidate
    top_p: f32,             // 1: off
    log_min_p: f32,         // log(min_p); MIN_P_OFF (-1e30) when off
    inv_temperature: f32,   // 1 / temperature; 0: greedy
    seed_lo: u32,
    seed_hi: u32,
    repeat_penalty: f32,    // a seen token's logit times this where it is <= 0,
    repeat_inv: f32,        //   times this (1 / repeat_penalty) where it is > 0
    frequency: f32,         // then minus count * frequency + presence
    presence: f32,
    window: u32,            // penalty_last_n; WINDOW_ALL: the whole sequence; 0: no penalty
    _pad: u32,
}
