// Decode attention, split-KV, pass 2 of 2: merge the partials attention.wgsl left per split
// into the normalized output (attention_merge.wgsl says how).
//
// Dispatch (N_HEADS, max rows, 1). Invocation (part, c) = (lid / D4, lid % D4) merges the
// splits part, part + CP, ... of vec4 column c with an online rescale; the CP partial merges
// are combined through workgroup memory by the invocations of part 0.
//
// With flag X_RECORD the output is also written in integers, as quantize_x.wgsl would write
// it from `out` (x_int_record.wgsl), for the output projection to read: a workgroup then takes a
// 256-element block of the output (256 / HEAD_DIM heads), each of its (head, vec4 column) pairs
// merged by 4 invocations (CP = 4), and 64 invocations quantize the block (x_int_block.wgsl).
//
// Defines: HEAD_DIM (<= 256), N_HEADS, SPLIT, N_SPLITS, MAX_WG (invocations), optional WINDOW;
// flag VEC4 (HEAD_DIM % 4 == 0: out moves as vec4); with X_RECORD (HEAD_DIM dividing 256), K
// (N_HEADS * HEAD_DIM), X_PLANES, X_STRIDE, flag SUMS16. Bindings: scratch (rows, N_SPLITS,
// N_HEADS, 1 + D4) vec4 as attention.wgsl wrote it, out (rows, N_HEADS*HEAD_DIM), step; with
// X_RECORD xi (rows, X_STRIDE) u32. Dispatch (N_HEADS, max rows, 1); with X_RECORD (K / 256,
// max rows, 1).
#include "common.wgsl"
#include "attention_merge.wgsl"
#include "attention_out.wgsl"

#ifdef X_RECORD
#include "x_int.wgsl"
#include "x_int_record.wgsl"
const PAIRS = 64u;                   // (head, vec4 column) pairs of a 256-element block
const CP = 4u;                       // split stripes
#else
const PAIRS = D4;                    // a head's vec4 columns
const CP = min(16u, MAX_WG / D4);    // split stripes
#endif
const WG = CP * PAIRS;

@group(0) @binding(0) var<storage, read> scratch: array<vec4<f32>>;
#ifdef VEC4
@group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>;
#else
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
#endif
@group(0) @binding(2) var<uniform> step: Step;
#ifdef X_RECORD
@group(0) @binding(3) var<storage, read_write> xi: array<u32>;
#include "x_int_block.wgsl"
#endif

var<workgroup> part_m: array<f32, WG>;           // each stripe's running max ...
var<workgroup> part_l: array<f32, WG>;           // ... sum of exp(score - max) ...
var<workgroup> part_o: array<vec4<f32>, WG>;     // ... and its output column, relative to it

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.y;
    if (t >= step.n_tokens) {
        return;   // uniform: whole workgroup
    }
    let pair = lid % PAIRS;
#ifdef X_RECORD
    let h = wid.x * (256u / HEAD_DIM) + pair / D4;
#else
    let h = wid.x;
#endif
    let c = pair % D4;
    let live = split_range(t);
    let mine = merge_splits(t, h, c, live.x + lid / PAIRS, CP, live.y);
    part_m[lid] = mine.m;
    part_l[lid] = mine.l;
    part_o[lid] = mine.o;
    workgroupBarrier();
    var y = vec4<f32>(0.0);
    if (lid < PAIRS) {
        var m_all = NEG_BIG;
        for (var s = 0u; s < CP; s++) {
            m_all = max(m_all, part_m[s * PAIRS + lid]);
        }
        var l_all = 0.0;
        var o_all = vec4<f32>(0.0);
        for (var s = 0u; s < CP; s++) {
            let e = exp(part_m[s * PAIRS + lid] - m_all);   // 0 for a stripe without splits
            l_all += part_l[s * PAIRS + lid] * e;
            o_all += part_o[s * PAIRS + lid] * e;
        }
        y = o_all / l_all;
        store_out((t * N_HEADS + h) * HEAD_DIM, c, y);
    }
#ifdef X_RECORD
    // invocation lid < 64 holds elements 4 lid .. of the block (its heads' columns in order)
    quantize_blocks(lid, y, t * X_STRIDE, select(K / 256u, wid.x, lid < PAIRS));
#endif
}
