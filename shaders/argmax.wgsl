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

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32) {
    // each thread scans lid, lid + WG, ...: increasing indices, so strict > keeps the first
    var bv = 0.0;
    var bi = NONE;
#ifdef VEC4
    for (var j = lid; j < N / 4u; j += WG) {
        let v = logits[j];
        let i = 4u * j;
        if (bi == NONE || v.x > bv) { bv = v.x; bi = i; }
        if (v.y > bv) { bv = v.y; bi = i + 1u; }
        if (v.z > bv) { bv = v.z; bi = i + 2u; }
        if (v.w > bv) { bv = v.w; bi = i + 3u; }
    }
#else
    var i = lid;
    for (; i + 3u * WG < N; i += 4u * WG) {
        let a = logits[i];
        let b = logits[i + WG];
        let c = logits[i + 2u * WG];
        let d = logits[i + 3u * WG];
        if (bi == NONE || a > bv) { bv = a; bi = i; }
        if (b > bv) { bv = b; bi = i + WG; }
        if (c > bv) { bv = c; bi = i + 2u * WG; }
        if (d > bv) { bv = d; bi = i + 3u * WG; }
    }
    for (; i < N; i += WG) {
        let a = logits[i];
        if (bi == NONE || a > bv) { bv = a; bi = i; }
    }
#endif

    best_value[lid] = bv;
    best_index[lid] = bi;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
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
