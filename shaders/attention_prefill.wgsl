// Causal GQA attention of a chunk of query rows against the KV cache, flash-attention style:
// key/value tiles go through workgroup memory once for a block of query rows, with an online
// softmax; the score matrix is never materialized beyond one BQ x BKV tile.
//
// Row t of the step is the token at position p = step.pos + t; it attends to cache slots 0..p,
// or with WINDOW (a local layer) to slots f = first_key(p) = p - WINDOW + 1 .. p (rope.wgsl has
// already written the step's slots). Head h reads kv head h / GROUP.
//   out[t, h, :] = softmax(SCALE * k_cache[f..p, kh, :] @ q[t, h, :]) @ v_cache[f..p, kh, :]
// (with SOFTCAP, the scaled scores soft-capped before the softmax: soft_cap.wgsl).
//
// The GROUP query heads of one kv head read the same keys, so a workgroup's BQ query rows are
// (token, head) pairs r = t * GROUP + g of one kv head kh: dispatch (N_KV_HEADS,
// ceil(max rows * GROUP / BQ), 1), the last rows' block (the most keys) first, so that the
// longest workgroups start first and the short ones fill in behind them. Per key tile of BKV
// keys, from the tile holding the first row's first key (keys before it are never read):
//   1. stage K[j0 .. j0+BKV) into ks and V into vs;          barrier
//   2. score the BQ x BKV tile (all invocations) into sc;    barrier
//   3. each invocation takes its row's tile max and rescales its running output, sum and max
//      (the TPQ invocations of a row hold the same m and l), then (row, s) adds p_j * V[j, :]
//      to its vec4 columns s, s + TPQ, ...;                  barrier (before the next staging)
//
// Flag BIDIRECTIONAL (an encoder's attention): every row sees every key of the step, slots
// 0 .. step.pos + step.n_tokens - 1, instead of those up to its own position.
// Defines: HEAD_DIM (<= 256), N_HEADS, N_KV_HEADS, SCALE, BQ, BKV, optional WINDOW, optional SOFTCAP, TPQ (invocations per query
// row; BQ * TPQ <= 256, TPQ * 16 >= HEAD_DIM: an invocation holds at most 4 vec4 of output,
// named o0..o3, never a dynamically indexed array, which NVIDIA puts in local memory);
// flag VEC4 (HEAD_DIM % 4 == 0: q, the caches and out move as vec4); flags K_F16, V_F16: that
// cache holds f16 halves (half.wgsl); K_Q8, V_Q8: q8_0 blocks (q8_cache.wgsl); else f32.
// Loops count up by one to a constant (matvec.wgsl says why), but the one over key tiles.
// Bindings: q (rows, N_HEADS*HEAD_DIM), k_cache, v_cache (max_ctx, N_KV_HEADS, HEAD_DIM),
// out (rows, N_HEADS*HEAD_DIM), step.
#include "common.wgsl"

const WG = BQ * TPQ;
const GROUP = N_HEADS / N_KV_HEADS;     // query heads per kv head
const D4 = (HEAD_DIM + 3u) / 4u;        // vec4 columns of a head
const KS4 = D4 + 1u;                    // K/V tile row stride: one vec4 of padding spreads banks
const OC = (D4 + TPQ - 1u) / TPQ;       // vec4 output columns per invocation, at most 4
const SLOT = N_KV_HEADS * HEAD_DIM;     // floats per cache slot
const NEG_BIG = -3.0e38;

#include "attention_load.wgsl"
@group(0) @binding(0) var<storage, read> q: array<Elem>;
@group(0) @binding(1) var<storage, read> k_cache: array<KWord>;
@group(0) @binding(2) var<storage, read> v_cache: array<VWord>;
@group(0) @binding(3) var<storage, read_write> out: array<Elem>;
@group(0) @binding(4) var<uniform> step: Step;

var<workgroup> qs: array<vec4<f32>, BQ * D4>;     // q rows * SCALE, zero-padded to D4 vec4
var<workgroup> ks: array<vec4<f32>, BKV * KS4>;   // the key tile
var<workgroup> vs: array<vec4<f32>, BKV * KS4>;   // the value tile
var<workgroup> sc: array<f32, BQ * BKV>;          // the tile's scores

#include "attention_out.wgsl"
#include "attention_window.wgsl"
#ifdef SOFTCAP
#include "soft_cap.wgsl"
#endif

// The last key the row at position p sees: p (causal), or the step's last (BIDIRECTIONAL).
fn last_key_of(p: u32) -> u32 {
#ifdef BIDIRECTIONAL
    return step.pos + step.n_tokens - 1u;
#else
    return p;
#endif
}

// Keys and values j0 .. j0+BKV-1 of kv head kh (zero before key `lo` and from n_keys on) into
// ks and vs.
fn stage_kv(lid: u32, kh: u32, j0: u32, lo: u32, n_keys: u32) {
    for (var n = 0u; n < (BKV * D4 + WG - 1u) / WG; n++) {
        let i = n * WG + lid;
        if (i >= BKV * D4) {
            break;
        }
        let j = i / D4;
        let c = i % D4;
        var key = vec4<f32>(0.0);
        var value = vec4<f32>(0.0);
        if (j0 + j >= lo && j0 + j < n_keys) {
            let base = (j0 + j) * SLOT + kh * HEAD_DIM;
            key = k_load4(base, c);
            value = v_load4(base, c);
        }
        ks[j * KS4 + c] = key;
        vs[j * KS4 + c] = value;
    }
}

// Score (qr, j) of the tile: q row r0 + qr (pre-scaled) . key j0 + j [soft-capped], or NEG_BIG
// where that row does not see that key.
fn tile_score(r0: u32, qr: u32, j0: u32, j: u32) -> f32 {
    var s4 = vec4<f32>(0.0);
    for (var c = 0u; c < D4; c++) {
        s4 = fma(qs[qr * D4 + c], ks[j * KS4 + c], s4);
    }
    let p = step.pos + (r0 + qr) / GROUP;
    let visible = j0 + j <= last_key_of(p) && j0 + j >= first_key(p);
#ifdef SOFTCAP
    return select(NEG_BIG, soft_cap(s4.x + s4.y + s4.z + s4.w), visible);
#else
    return select(NEG_BIG, s4.x + s4.y + s4.z + s4.w, visible);
#endif
}

// o + p * V[j, vec4 column s + TPQ * i] (no-op past the head).
fn add_value(o: vec4<f32>, i: u32, s: u32, p: f32, j: u32) -> vec4<f32> {
    let c = s + TPQ * i;
    if (c < D4) {
        return fma(vec4<f32>(p), vs[j * KS4 + c], o);
    }
    return o;
}

// vec4 column s + TPQ * i of the output head starting at float `base` (no-op past the head).
fn store_column(base: u32, s: u32, i: u32, y: vec4<f32>) {
    let c = s + TPQ * i;
    if (c < D4) {
        store_out(base, c, y);
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let n_rows = step.n_tokens * GROUP;
    let r0 = (nwg.y - 1u - wid.y) * BQ;   // first (token, head) row of this workgroup: the last first
    if (r0 >= n_rows) {
        return;   // uniform: whole workgroup
    }
    let kh = wid.x;
    let r_last = min(r0 + BQ, n_rows) - 1u;
    let n_keys = last_key_of(step.pos + r_last / GROUP) + 1u;   // keys the tile's last row sees
    let lo = first_key(step.pos + r0 / GROUP);     // the first key its first row sees

    // Stage the query rows, pre-scaled.
    for (var n = 0u; n < (BQ * D4 + WG - 1u) / WG; n++) {
        let i = n * WG + lid;
        if (i >= BQ * D4) {
            break;
        }
        let r = r0 + i / D4;
        var v = vec4<f32>(0.0);
        if (r < n_rows) {
            let h = kh * GROUP + r % GROUP;
            v = load_q(((r / GROUP) * N_HEADS + h) * HEAD_DIM, i % D4);
        }
        qs[i] = v * SCALE;
    }

    let row = lid / TPQ;                  // this invocation's query row in the tile
    let s = lid % TPQ;                    // ... and its column stripe
    let r = r0 + row;
    let last_key = last_key_of(step.pos + r / GROUP);   // the row sees keys first..last_key
    let first = first_key(last_key);
    var o0 = vec4<f32>(0.0);              // oi: vec4 column s + TPQ * i of sum_j p_j * V[j]
    var o1 = vec4<f32>(0.0);
    var o2 = vec4<f32>(0.0);
    var o3 = vec4<f32>(0.0);
    var l = 0.0;                          // sum_j p_j
    var m = NEG_BIG;                      // running max score

    for (var j0 = lo / BKV * BKV; j0 < n_keys; j0 += BKV) {
        workgroupBarrier();               // qs staged / the previous tiles consumed
        stage_kv(lid, kh, j0, lo, n_keys);
        workgroupBarrier();

        for (var n = 0u; n < (BQ * BKV + WG - 1u) / WG; n++) {
            let i = n * WG + lid;
            if (i >= BQ * BKV) {
                break;
            }
            sc[i] = tile_score(r0, i / BKV, j0, i % BKV);
        }
        workgroupBarrier();

        var m_new = m;
        for (var j = 0u; j < BKV; j++) {
            m_new = max(m_new, sc[row * BKV + j]);
        }
        let alpha = exp(m - m_new);
        l *= alpha;
        o0 *= alpha;
        o1 *= alpha;
        o2 *= alpha;
        o3 *= alpha;
        m = m_new;
        for (var j = 0u; j < BKV; j++) {
            let p = select(0.0, exp(sc[row * BKV + j] - m), j0 + j <= last_key && j0 + j >= first);
            l += p;
            o0 = add_value(o0, 0u, s, p, j);
            if (OC > 1u) {
                o1 = add_value(o1, 1u, s, p, j);
            }
            if (OC > 2u) {
                o2 = add_value(o2, 2u, s, p, j);
            }
            if (OC > 3u) {
                o3 = add_value(o3, 3u, s, p, j);
            }
        }
    }

    if (r >= n_rows) {
        return;
    }
    let base = ((r / GROUP) * N_HEADS + kh * GROUP + r % GROUP) * HEAD_DIM;
    store_column(base, s, 0u, o0 / l);
    if (OC > 1u) {
        store_column(base, s, 1u, o1 / l);
    }
    if (OC > 2u) {
        store_column(base, s, 2u, o2 / l);
    }
    if (OC > 3u) {
        store_column(base, s, 3u, o3 / l);
    }
}
