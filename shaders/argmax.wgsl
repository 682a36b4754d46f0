// out[0] = the index of the largest of logits[0..N) (the first one on ties, as numpy's
// argmax; with NaNs the result is unspecified). One workgroup. Defines: N, flag VEC4
// (logits bound as array<vec4<f32>>, N a multiple of 4: a quarter of the loads).
// Bindings: logits, out.

const WG = 256u;
const NONE = 0xFFFFFFFFu;   // no candidate yet (a thread with no elements)

#ifdef VEC4
alias Item = vec4<f32>;   // what one load reads: PER consecutive logits
const PER = 4u;
#else
alias Item = f32;
const PER = 1u;
#endif
@group(0) @binding(0) var<storage, read> logits: array<Item>;      // (N / PER,)
@group(0) @binding(1) var<storage, read_write> out: array<u32>;    // (1,)

var<workgroup> best_value: array<f32, WG>;
var<workgroup> best_index: array<u32, WG>;

// Whether candidate (v, i) beats the current best (bv, bi).
fn beats(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    return i != NONE && (bi == NONE || v > bv || (v == bv && i < bi));
}

// The best of (bv, bi) and item j's logits (indices PER * j, ...), all above bi: strict > keeps
// the first.
fn take(v: Item, j: u32, bv: ptr<function, f32>, bi: ptr<function, u32>) {
    let i = PER * j;
#ifdef VEC4
    if (*bi == NONE || v.x > *bv) { *bv = v.x; *bi = i; }
    if (v.y > *bv) { *bv = v.y; *bi = i + 1u; }
    if (v.z > *bv) { *bv = v.z; *bi = i + 2u; }
    if (v.w > *bv) { *bv = v.w; *bi = i + 3u; }
#else
    if (*bi == NONE || v > *bv) { *bv = v; *bi = i; }
#endif
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32) {
    // each thread scans items lid, lid + WG, ...: increasing indices, so strict > keeps the first;
    // four independent loads in flight a round, since one workgroup scans the whole vocabulary
    // and a thread's scan is a chain of loads whose latency, not bandwidth, sets the time.
    // Loops count up by one to a constant (matvec.wgsl says why).
    var bv = 0.0;
    var bi = NONE;
    let mine = (N / PER + WG - 1u - lid) / WG;   // the thread's items: lid + k * WG for k < mine
    let rounds = mine / 4u;
    for (var r = 0u; r < (N / PER + WG - 1u) / WG / 4u; r++) {   // thread 0's rounds, the most
        if (r >= rounds) {
            break;
        }
        let j = lid + 4u * r * WG;
        let a = logits[j];
        let b = logits[j + WG];
        let c = logits[j + 2u * WG];
        let d = logits[j + 3u * WG];
        take(a, j, &bv, &bi);
        take(b, j + WG, &bv, &bi);
        take(c, j + 2u * WG, &bv, &bi);
        take(d, j + 3u * WG, &bv, &bi);
    }
    for (var tail = 0u; tail < 3u; tail++) {
        let k = 4u * rounds + tail;
        if (k >= mine) {
            break;
        }
        let j = lid + k * WG;
        take(logits[j], j, &bv, &bi);
    }

    best_value[lid] = bv;
    best_index[lid] = bi;
    workgroupBarrier();
    for (var k = 1u; k <= countTrailingZeros(WG); k++) {
        let s = WG >> k;
        if (lid < s && beats(best_value[lid + s], best_index[lid + s], best_value[lid], best_index[lid])) {
            best_value[lid] = best_value[lid + s];
            best_index[lid] = best_index[lid + s];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        out[0] = select(best_index[0], 0u, best_index[0] == NONE);
    }
}
