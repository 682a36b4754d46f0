// out[0] = the index of the largest of logits[0..N) (the first one on ties, as numpy's
// argmax; with NaNs the result is unspecified). One workgroup. Defines: N, flag VEC4
// (logits bound as array<vec4<f32>>, N a multiple of 4: a quarter of the loads).
// Bindings: logits, out.

const WG = 256u;
const NONE = 0xFFFFFFFFu;   // no candidate yet (a thread with no elements)

#ifdef VEC4
@group(0) @binding(0) var<storage, read> logits: array<vec4<f32>>;   // (N / 4,)
#else
@group(0) @binding(0) var<storage, read> logits: array<f32>;         // (N,)
#endif
@group(0) @binding(1) var<storage, read_write> out: array<u32>;      // (1,)

var<workgroup> best_value: array<f32, WG>;
var<workgroup> best_index: array<u32, WG>;

// Whether candidate (v, i) beats the current best (bv, bi).
fn beats(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    return i != NONE && (bi == NONE || v > bv || (v == bv && i < bi));
}

// The best of (bv, bi) and v's lanes at indices i.. i + 3, all above bi: strict > keeps the first.
fn take4(v: vec4<f32>, i: u32, bv: ptr<function, f32>, bi: ptr<function, u32>) {
    if (v.x > *bv) { *bv = v.x; *bi = i; }
    if (v.y > *bv) { *bv = v.y; *bi = i + 1u; }
    if (v.z > *bv) { *bv = v.z; *bi = i + 2u; }
    if (v.w > *bv) { *bv = v.w; *bi = i + 3u; }
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32) {
    // each thread scans lid, lid + WG, ...: increasing indices, so strict > keeps the first;
    // four independent loads in flight a round, since one workgroup scans the whole vocabulary
    // and a thread's scan is a chain of loads whose latency, not bandwidth, sets the time.
    // Loops count up by one to a constant (matvec.wgsl says why).
    var bv = 0.0;
    var bi = NONE;
#ifdef VEC4
    let mine = (N / 4u + WG - 1u - lid) / WG;   // the thread's vec4s: lid + k * WG for k < mine
    let rounds = mine / 4u;
    for (var r = 0u; r < (N / 4u + WG - 1u) / WG / 4u; r++) {   // thread 0's rounds, the most
        if (r >= rounds) {
            break;
        }
        let j = lid + 4u * r * WG;
        let a = logits[j];
        let b = logits[j + WG];
        let c = logits[j + 2u * WG];
        let d = logits[j + 3u * WG];
        if (bi == NONE) { bv = a.x; bi = 4u * j; }
        take4(a, 4u * j, &bv, &bi);
        take4(b, 4u * (j + WG), &bv, &bi);
        take4(c, 4u * (j + 2u * WG), &bv, &bi);
        take4(d, 4u * (j + 3u * WG), &bv, &bi);
    }
    for (var tail = 0u; tail < 3u; tail++) {
        let k = 4u * rounds + tail;
        if (k >= mine) {
            break;
        }
        let j = lid + k * WG;
        let a = logits[j];
        if (bi == NONE) { bv = a.x; bi = 4u * j; }
        take4(a, 4u * j, &bv, &bi);
    }
#else
    let mine = (N + WG - 1u - lid) / WG;        // the thread's elements: lid + k * WG for k < mine
    let rounds = mine / 4u;
    for (var r = 0u; r < (N + WG - 1u) / WG / 4u; r++) {
        if (r >= rounds) {
            break;
        }
        let i = lid + 4u * r * WG;
        let a = logits[i];
        let b = logits[i + WG];
        let c = logits[i + 2u * WG];
        let d = logits[i + 3u * WG];
        if (bi == NONE || a > bv) { bv = a; bi = i; }
        if (b > bv) { bv = b; bi = i + WG; }
        if (c > bv) { bv = c; bi = i + 2u * WG; }
        if (d > bv) { bv = d; bi = i + 3u * WG; }
    }
    for (var tail = 0u; tail < 3u; tail++) {
        let k = 4u * rounds + tail;
        if (k >= mine) {
            break;
        }
        let i = lid + k * WG;
        let a = logits[i];
        if (bi == NONE || a > bv) { bv = a; bi = i; }
    }
#endif

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
