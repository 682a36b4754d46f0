// Fused per-token attention prologue: [per-head QK-norm] -> RoPE on q (into q_out) and k, and the
// KV-cache write. Row t of the step is the token at position p = step.pos + t:
//   q_out[t, h, :]        <- rope(norm(q[t, h, :]) * q_norm, p)     h < N_HEADS
//   k_cache[p, kh, :]     <- rope(norm(k[t, kh, :]) * k_norm, p)    kh < N_KV_HEADS
// where qk_norm holds q_norm then k_norm
//   v_cache[p, kh, :]     <- v[t, kh, :]
// (norm only with flag QK_NORM). One workgroup per head slot and row: dispatch
// (N_HEADS + N_KV_HEADS, max rows, 1); rows t >= step.n_tokens do nothing.
//
// RoPE as rope_rotate.wgsl turns pairs (rope_row.wgsl: in workgroup memory); dims >= N_ROT pass
// through.
//
// Defines: HEAD_DIM, N_HEADS, N_KV_HEADS, N_ROT, THETA, [FREQ_SCALE], [EPS with QK_NORM],
// [IN_STRIDE]; flags NEOX, FREQ_FACTORS, QK_NORM; K_F16, V_F16: that cache holds f16 halves
// (half.wgsl; HEAD_DIM even); K_Q8, V_Q8: q8_0 blocks (q8_cache.wgsl; HEAD_DIM % 32 == 0); each
// word written whole by one invocation, the key once the whole row is turned.
// Bindings: q, k, v, q_out, k_cache, v_cache, step, then [freq_factors] then [qk_norm]
// (at most 8 storage buffers: WebGPU's default limit).
// Layouts: q, q_out (rows, N_HEADS*HEAD_DIM); k, v (rows, N_KV_HEADS*HEAD_DIM). q, k, v are only
// read, so they may be ranges of one buffer (a stacked QKV projection's output); with IN_STRIDE,
// their rows are IN_STRIDE floats apart (rows of q | k | v: a stacked prefill matmul's);
// k_cache, v_cache (max_ctx, N_KV_HEADS, HEAD_DIM) in their types, bound as u32 words, one pair
// per layer.
// Loops count up by one to a constant (matvec.wgsl says why).
#include "common.wgsl"
#include "reduce.wgsl"

const WG = 64u;
#ifdef IN_STRIDE
const Q_STRIDE = IN_STRIDE;
const KV_STRIDE = IN_STRIDE;
#else
const Q_STRIDE = N_HEADS * HEAD_DIM;
const KV_STRIDE = N_KV_HEADS * HEAD_DIM;
#endif

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read_write> q_out: array<f32>;
#ifdef K_F16
#include "half.wgsl"
#endif
#ifdef K_Q8
#include "q8_cache.wgsl"
#endif
@group(0) @binding(4) var<storage, read_write> k_cache: array<u32>;   // f32 bits, halves or q8_0 blocks
#ifdef V_F16
#include "half.wgsl"
#endif
#ifdef V_Q8
#include "q8_cache.wgsl"
#endif
@group(0) @binding(5) var<storage, read_write> v_cache: array<u32>;
@group(0) @binding(6) var<uniform> step: Step;
#ifdef FREQ_FACTORS
@group(0) @binding(7) var<storage, read> freq_factors: array<f32>;   // (N_ROT/2,)
#ifdef QK_NORM
@group(0) @binding(8) var<storage, read> qk_norm: array<f32>;        // (2 * HEAD_DIM,)
#endif
#else
#ifdef QK_NORM
@group(0) @binding(7) var<storage, read> qk_norm: array<f32>;
#endif
#endif

#include "rope_row.wgsl"

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.y;
    if (t >= step.n_tokens) {
        return;   // uniform: whole workgroup
    }
    let p = step.pos + t;
    let is_q = wid.x < N_HEADS;
    let kh = wid.x - N_HEADS;                                   // kv head when !is_q
    let q_base = (t * N_HEADS + wid.x) * HEAD_DIM;          // in q_out
    let q_in = t * Q_STRIDE + wid.x * HEAD_DIM;
    let k_in = t * KV_STRIDE + kh * HEAD_DIM;
    let cache_base = (p * N_KV_HEADS + kh) * HEAD_DIM;

    var sum = 0.0;
    for (var n = 0u; n < (HEAD_DIM + WG - 1u) / WG; n++) {
        let i = n * WG + lid;
        if (i >= HEAD_DIM) {
            break;
        }
        var value: f32;
        if (is_q) {
            value = q[q_in + i];
        } else {
            value = k[k_in + i];
            store_value(cache_base, k_in, i);
        }
        row[i] = value;
        sum += value * value;
    }
#ifdef QK_NORM
    let scale = inverseSqrt(workgroup_sum(lid, sum) / f32(HEAD_DIM) + EPS);
    for (var n = 0u; n < (HEAD_DIM + WG - 1u) / WG; n++) {
        let i = n * WG + lid;
        if (i >= HEAD_DIM) {
            break;
        }
        row[i] = row[i] * scale * qk_norm[i + select(HEAD_DIM, 0u, is_q)];
    }
#endif
    workgroupBarrier();

    rope_row(lid, f32(p));
    // NEOX pairs straddle words and blocks: the row is stored once every pair is turned
    workgroupBarrier();
    if (is_q) {
        store_query(lid, q_base);
    } else {
        store_key(lid, cache_base);
    }
}

// The turned query in `row` to q_out at q_base.
fn store_query(lid: u32, q_base: u32) {
    for (var n = 0u; n < (HEAD_DIM + WG - 1u) / WG; n++) {
        let i = n * WG + lid;
        if (i >= HEAD_DIM) {
            break;
        }
        q_out[q_base + i] = row[i];
    }
}

// The value's element i at cache_base (f32, f16: the word starting there), read from v at k_in.
fn store_value(cache_base: u32, k_in: u32, i: u32) {
#ifdef V_F16
    if (i % 2u == 0u) {
        v_cache[(cache_base + i) / 2u] = pack_half2(vec2<f32>(v[k_in + i], v[k_in + i + 1u]));
    }
#else
#ifdef V_Q8
    if (i % 4u == 0u) {   // a word of quants: values i..i+3, and at a block's start its scale
        let b = k_in + i / Q8_VALUES * Q8_VALUES;
        var amax = 0.0;
        for (var e = 0u; e < Q8_VALUES; e++) {
            amax = max(amax, abs(v[b + e]));
        }
        let scale = q8_scale(amax);
        let x = vec4<f32>(v[k_in + i], v[k_in + i + 1u], v[k_in + i + 2u], v[k_in + i + 3u]);
        v_cache[q8_word(cache_base + i)] = q8_pack4(x, scale.inv);
        if (i % Q8_VALUES == 0u) {
            v_cache[q8_scale_word(cache_base + i)] = scale.word;
        }
    }
#else
    v_cache[cache_base + i] = bitcast<u32>(v[k_in + i]);
#endif
#endif
}

// The turned key in `row` to the cache at cache_base, a word an invocation.
fn store_key(lid: u32, cache_base: u32) {
#ifdef K_F16
    for (var n = 0u; n < (HEAD_DIM / 2u + WG - 1u) / WG; n++) {
        let w = n * WG + lid;
        if (w >= HEAD_DIM / 2u) {
            break;
        }
        k_cache[cache_base / 2u + w] = pack_half2(vec2<f32>(row[2u * w], row[2u * w + 1u]));
    }
#else
#ifdef K_Q8
    for (var n = 0u; n < (HEAD_DIM / 4u + WG - 1u) / WG; n++) {
        let i = 4u * (n * WG + lid);
        if (i >= HEAD_DIM) {
            break;
        }
        let b = i / Q8_VALUES * Q8_VALUES;
        var amax = 0.0;
        for (var e = 0u; e < Q8_VALUES; e++) {
            amax = max(amax, abs(row[b + e]));
        }
        let scale = q8_scale(amax);
        k_cache[q8_word(cache_base + i)] = q8_pack4(vec4<f32>(row[i], row[i + 1u], row[i + 2u], row[i + 3u]), scale.inv);
        if (i % Q8_VALUES == 0u) {
            k_cache[q8_scale_word(cache_base + i)] = scale.word;
        }
    }
#else
    for (var n = 0u; n < (HEAD_DIM + WG - 1u) / WG; n++) {
        let i = n * WG + lid;
        if (i >= HEAD_DIM) {
            break;
        }
        k_cache[cache_base + i] = bitcast<u32>(row[i]);
    }
#endif
#endif
}
