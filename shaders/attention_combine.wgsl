// Decode attention, split-KV, pass 2 of 2: merge the partials attention.wgsl left per split
// into the normalized output. For row t (position p = step.pos + t) and head h, over the live
// splits s = first_key(p) / SPLIT .. p / SPLIT, with M = max_s m_s:
//   out[t, h, :] = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s
// Splits past p or wholly before the window (stale records of earlier tokens or layers) are
// never read.
//
// Dispatch (N_HEADS, max rows, 1). Invocation (part, c) = (lid / D4, lid % D4) merges the
// splits part, part + CP, ... of vec4 column c with an online rescale; the CP partial merges
// are combined through workgroup memory by the invocations of part 0.
//
// Defines: HEAD_DIM (<= 256), N_HEADS, SPLIT, N_SPLITS, MAX_WG (invocations), optional WINDOW;
// flag VEC4 (HEAD_DIM % 4 == 0: out moves as vec4). Bindings: scratch (rows, N_SPLITS,
// N_HEADS, 1 + D4) vec4 as attention.wgsl wrote it, out (rows, N_HEADS*HEAD_DIM), step.
#include "common.wgsl"
#include "attention_window.wgsl"

const D4 = (HEAD_DIM + 3u) / 4u;     // vec4 columns of a head
const REC = 1u + D4;                 // vec4 per scratch record
const CP = min(16u, MAX_WG / D4);      // split stripes
const WG = CP * D4;
const NEG_BIG = -3.0e38;

@group(0) @binding(0) var<storage, read> scratch: array<vec4<f32>>;
#ifdef VEC4
@group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>;
#else
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
#endif
@group(0) @binding(2) var<uniform> step: Step;

var<workgroup> part_m: array<f32, WG>;           // each stripe's running max ...
var<workgroup> part_l: array<f32, WG>;           // ... sum of exp(score - max) ...
var<workgroup> part_o: array<vec4<f32>, WG>;     // ... and its output column, relative to it

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.y;
    if (t >= step.n_tokens) {
        return;   // uniform: whole workgroup
    }
    let h = wid.x;
    let n_live = (step.pos + t) / SPLIT + 1u;   // splits holding keys 0..p ...
    let s0 = first_key(step.pos + t) / SPLIT;    // ... of which those from s0 on hold seen keys
    let c = lid % D4;
    var m = NEG_BIG;
    var l = 0.0;
    var acc = vec4<f32>(0.0);
    for (var s = s0 + lid / D4; s < n_live; s += CP) {
        let rec = ((t * N_SPLITS + s) * N_HEADS + h) * REC;
        let ml = scratch[rec];                  // (m_s, l_s, 0, 0)
        let m_new = max(m, ml.x);
        let a = exp(m - m_new);
        let b = exp(ml.x - m_new);
        acc = acc * a + scratch[rec + 1u + c] * b;
        l = l * a + ml.y * b;
        m = m_new;
    }
    part_m[lid] = m;
    part_l[lid] = l;
    part_o[lid] = acc;
    workgroupBarrier();
    if (lid >= D4) {
        return;
    }

    var m_all = NEG_BIG;
    for (var part = 0u; part < CP; part++) {
        m_all = max(m_all, part_m[part * D4 + c]);
    }
    var l_all = 0.0;
    var o_all = vec4<f32>(0.0);
    for (var part = 0u; part < CP; part++) {
        let e = exp(part_m[part * D4 + c] - m_all);   // 0 for a stripe without splits
        l_all += part_l[part * D4 + c] * e;
        o_all += part_o[part * D4 + c] * e;
    }
    let y = o_all / l_all;
    let base = (t * N_HEADS + h) * HEAD_DIM;
#ifdef VEC4
    out[base / 4u + c] = y;
#else
    for (var e = 0u; e < 4u; e++) {
        if (4u * c + e < HEAD_DIM) {
            out[base + 4u * c + e] = y[e];
        }
    }
#endif
}
