// Causal GQA attention of a step's query rows against the KV cache, with an online softmax.
//
// Row t of the step is the token at position p = step.pos + t; it attends to cache slots
// 0..p (rope.wgsl has already written slot p and, for earlier rows of the step, the slots
// before it). Head h reads kv head h / (N_HEADS / N_KV_HEADS).
//   out[t, h, :] = softmax(SCALE * k_cache[0..p, kh, :] @ q[t, h, :]) @ v_cache[0..p, kh, :]
//
// One workgroup per (head, row): dispatch (N_HEADS, max rows, 1). Keys go in chunks of WG:
// invocation j scores key c0 + j; the chunk max updates the running max m (and rescales the
// running sums); then invocation (d, part) = (lid % HEAD_DIM, lid / HEAD_DIM) accumulates
// value dim d over the chunk's keys part, part + PARTS, ...; the PARTS partial sums are
// combined at the end.
//
// Defines: HEAD_DIM (<= WG), N_HEADS, N_KV_HEADS, SCALE; flag VEC4 (HEAD_DIM % 4 == 0: the
// score pass reads keys as vec4).
// Bindings: q (rows, N_HEADS*HEAD_DIM), k_cache, v_cache (max_ctx, N_KV_HEADS, HEAD_DIM),
// out (rows, N_HEADS*HEAD_DIM), step.
#include "common.wgsl"

const WG = 256u;
const PARTS = WG / HEAD_DIM;         // key stripes in the value pass
const GROUP = N_HEADS / N_KV_HEADS;  // query heads per kv head
const NEG_BIG = -3.0e38;

@group(0) @binding(0) var<storage, read> q: array<f32>;
#ifdef VEC4
@group(0) @binding(1) var<storage, read> k_cache: array<vec4<f32>>;   // HEAD_DIM % 4 == 0
#else
@group(0) @binding(1) var<storage, read> k_cache: array<f32>;
#endif
@group(0) @binding(2) var<storage, read> v_cache: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> step: Step;

var<workgroup> q_row: array<f32, HEAD_DIM>;   // q[t, h, :] * SCALE
var<workgroup> probs: array<f32, WG>;         // exp(score - m) of the chunk's keys
var<workgroup> red: array<f32, WG>;           // max reduction, then per-part sums of probs
var<workgroup> acc_parts: array<f32, WG>;     // per-part value sums

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.y;
    if (t >= step.n_tokens) {
        return;   // uniform: whole workgroup
    }
    let h = wid.x;
    let kv_off = (h / GROUP) * HEAD_DIM;          // offset of this kv head inside a cache slot
    let n_keys = step.pos + t + 1u;
    let q_base = (t * N_HEADS + h) * HEAD_DIM;
    for (var i = lid; i < HEAD_DIM; i += WG) {
        q_row[i] = q[q_base + i] * SCALE;
    }
    workgroupBarrier();

    let d = lid % HEAD_DIM;
    let part = lid / HEAD_DIM;
    var acc = 0.0;      // sum over this part's keys of p_j * v[j, d]
    var l = 0.0;        // sum over this part's keys of p_j
    var m = NEG_BIG;    // running max score

    for (var c0 = 0u; c0 < n_keys; c0 += WG) {
        // Score of key c0 + lid.
        let j = c0 + lid;
        var s = NEG_BIG;
        if (j < n_keys) {
            let k_base = j * (N_KV_HEADS * HEAD_DIM) + kv_off;
#ifdef VEC4
            var score4 = vec4<f32>(0.0);
            for (var i = 0u; i < HEAD_DIM; i += 4u) {
                let qv = vec4<f32>(q_row[i], q_row[i + 1u], q_row[i + 2u], q_row[i + 3u]);
                score4 += qv * k_cache[(k_base + i) / 4u];
            }
            s = score4.x + score4.y + score4.z + score4.w;
#else
            var score = 0.0;
            for (var i = 0u; i < HEAD_DIM; i++) {
                score += q_row[i] * k_cache[k_base + i];
            }
            s = score;
#endif
        }
        red[lid] = s;
        workgroupBarrier();
        for (var w = WG / 2u; w > 0u; w >>= 1u) {
            if (lid < w) {
                red[lid] = max(red[lid], red[lid + w]);
            }
            workgroupBarrier();
        }
        let m_new = max(m, red[0]);
        let alpha = exp(m - m_new);
        probs[lid] = select(0.0, exp(s - m_new), j < n_keys);
        workgroupBarrier();

        // Value pass over the chunk.
        acc *= alpha;
        l *= alpha;
        if (part < PARTS) {
            let count = min(WG, n_keys - c0);
            for (var jj = part; jj < count; jj += PARTS) {
                let pj = probs[jj];
                acc += pj * v_cache[(c0 + jj) * (N_KV_HEADS * HEAD_DIM) + kv_off + d];
                l += pj;
            }
        }
        m = m_new;
        workgroupBarrier();   // probs and red are rewritten by the next chunk
    }

    // Combine the parts: out = sum(acc) / sum(l).
    acc_parts[lid] = select(0.0, acc, part < PARTS);
    red[lid] = select(0.0, l, part < PARTS);
    workgroupBarrier();
    if (lid < HEAD_DIM) {
        var total = 0.0;
        var norm = 0.0;
        for (var pt = 0u; pt < PARTS; pt++) {
            total += acc_parts[pt * HEAD_DIM + lid];
            norm += red[pt * HEAD_DIM];
        }
        out[q_base + lid] = total / norm;
    }
}
