// Decode attention, split-KV, pass 2 of 2: merge the partials attention.wgsl left per split
// into the normalized output (attention_merge.wgsl says how).
//
// Dispatch (N_HEADS, max rows, 1). Invocation (part, c) = (lid / D4, lid % D4) merges the
// splits part, part + CP, ... of vec4 column c with an online rescale; the CP partial merges
// are combined through workgroup memory by the invocations of part 0.
//
// Defines: HEAD_DIM (<= 256), N_HEADS, SPLIT, N_SPLITS, MAX_WG (invocations), optional WINDOW;
// flag VEC4 (HEAD_DIM % 4 == 0: out moves as vec4). Bindings: scratch (rows, N_SPLITS,
// N_HEADS, 1 + D4) vec4 as attention.wgsl wrote it, out (rows, N_HEADS*HEAD_DIM), step.
#include "common.wgsl"
#include "attention_merge.wgsl"
#include "attention_out.wgsl"

const CP = min(16u, MAX_WG / D4);    // split stripes
const WG = CP * D4;

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
    let c = lid % D4;
    let live = split_range(t);
    let mine = merge_splits(t, h, c, live.x + lid / D4, CP, live.y);
    part_m[lid] = mine.m;
    part_l[lid] = mine.l;
    part_o[lid] = mine.o;
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
    store_out((t * N_HEADS + h) * HEAD_DIM, c, o_all / l_all);
}
