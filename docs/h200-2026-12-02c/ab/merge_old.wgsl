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
// with an online rescale.
fn merge_splits(t: u32, h: u32, c: u32, first: u32, stride: u32, end: u32) -> Merged {
    var r = Merged(NEG_BIG, 0.0, vec4<f32>(0.0));
    for (var s = first; s < end; s += stride) {
        let rec = ((t * N_SPLITS + s) * N_HEADS + h) * REC;
        let ml = scratch[rec];                  // (m_s, l_s, 0, 0)
        let m = max(r.m, ml.x);
        let a = exp(r.m - m);
        let b = exp(ml.x - m);
        r = Merged(m, r.l * a + ml.y * b, r.o * a + scratch[rec + 1u + c] * b);
    }
    return r;
}
