// Merging decode attention's per-split partials (attention.wgsl's scratch), shared by
// attention_combine.wgsl and by a matvec that reads attention's output straight from them
// (matvec.wgsl's MERGE: the output projection with the combine folded in).
//
// For row t (position p = step.pos + t) and head h, the live splits are s = first_key(p) / SPLIT
// .. p / SPLIT (split_range); splits past p or wholly before the window hold stale records of
// earlier tokens or layers and are never read. With M = max_s m_s:
//   out[t, h, :] = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s
//
// Defines: HEAD_DIM, N_HEADS, SPLIT, N_SPLITS, optional WINDOW. The includer declares
// `scratch: array<vec4<f32>>` (rows, N_SPLITS, N_HEADS, 1 + D4), records (m_s, l_s, 0, 0) then
// o_s, and `step: Step`.
#include "attention_window.wgsl"

const D4 = (HEAD_DIM + 3u) / 4u;     // vec4 columns of a head
const REC = 1u + D4;                 // vec4 per scratch record
const NEG_BIG = -3.0e38;

// A running merge of some splits of one vec4 column: their max m, sum of exp(score - m), and
// output column relative to m. The empty merge is (NEG_BIG, 0, 0): exp(NEG_BIG - m) is 0.
struct Merged {
    m: f32,
    l: f32,
    o: vec4<f32>,
}

// (first live split, one past the last) of row t
fn split_range(t: u32) -> vec2<u32> {
    let p = step.pos + t;
    return vec2<u32>(first_key(p) / SPLIT, p / SPLIT + 1u);
}

// Splits first, first + stride, ... below end of row t, head h, vec4 column c, merged in order
// with an online rescale. They are read MERGE_AHEAD at a time, all their loads issued before the
// first is merged; the reads past `end` are not made, and their merges are exact identities.
const MERGE_AHEAD = 4u;
const MERGE_ROUNDS = (N_SPLITS + MERGE_AHEAD - 1u) / MERGE_AHEAD;   // the most, at stride 1

fn merge_splits(t: u32, h: u32, c: u32, first: u32, stride: u32, end: u32) -> Merged {
    var r = Merged(NEG_BIG, 0.0, vec4<f32>(0.0));
    for (var round = 0u; round < MERGE_ROUNDS; round++) {   // a constant bound (matvec.wgsl says why)
        let s0 = first + round * MERGE_AHEAD * stride;
        if (s0 >= end) {
            break;
        }
        var ml: array<vec4<f32>, MERGE_AHEAD>;
        var o: array<vec4<f32>, MERGE_AHEAD>;
        for (var i = 0u; i < MERGE_AHEAD; i++) {
            let s = s0 + i * stride;
            ml[i] = vec4<f32>(NEG_BIG, 0.0, 0.0, 0.0);
            o[i] = vec4<f32>(0.0);
            if (s < end) {
                let rec = ((t * N_SPLITS + s) * N_HEADS + h) * REC;
                ml[i] = scratch[rec];           // (m_s, l_s, 0, 0)
                o[i] = scratch[rec + 1u + c];
            }
        }
        for (var i = 0u; i < MERGE_AHEAD; i++) {
            let m = max(r.m, ml[i].x);
            let a = exp(r.m - m);
            let b = exp(ml[i].x - m);
            r = Merged(m, r.l * a + ml[i].y * b, r.o * a + o[i] * b);
        }
    }
    return r;
}
