// The k best of logits[0..N) with their indices, best first (ties: the lower index first), then
// the logits at the watched ids: out = (index, logit bits) x k, then logit bits x n_watch.
// k (1..WG) and the watched ids are read from `params` at run time, so one pipeline serves every
// sampler. One workgroup of WG invocations. Defines: N, WG, IDX_DIGITS (bytes an index needs),
// IDX_MASK (2^(8 IDX_DIGITS) - 1).
// Bindings: logits, params, out.
//
// Each element gets a unique 64-bit sort key, (order_key(logit), IDX_MASK - index) as (hi, lo),
// so an element's place is the number of keys larger than its own.
//   1. Each invocation finds the best key of its elements; the k-th best of those WG is a bound:
//      at least k elements reach it, so the k best all do.
//   2. The elements that reach the bound (typically a few more than k) are gathered into
//      workgroup memory, and each is placed among them; the first k are written out.
//   3. If more than CAP reach it (many ties, or k near WG on a small vocabulary), a radix select
//      over the logits finds exactly the k best first, a byte of the key per pass from the top:
//      a pass counts how many of the elements that share the bytes picked so far take each value
//      of the next byte, and picks the value where the k-th best falls, until the value picked is
//      taken whole; the elements at or above the prefix picked are the ones gathered.

const DIGITS = 4u + IDX_DIGITS;
const CAP = 1024u;   // gathered elements held in workgroup memory
// Loops count up by one to a constant (strides multiplied out, shorter trips break out):
// Chromium's compiler guards every other loop with an iteration counter (matvec.wgsl).
const ROUNDS = (N + WG - 1u) / WG;   // an invocation's elements: lid + r * WG for r < ROUNDS

// struct TopK params, packed by cera.gpu.layers.pack_top_k: k, n_watch, then n_watch ids
@group(0) @binding(0) var<storage, read> logits: array<f32>;        // (N,)
@group(0) @binding(1) var<storage, read> params: array<u32>;        // (2 + n_watch,)
@group(0) @binding(2) var<storage, read_write> out: array<u32>;     // (2 k + n_watch,)

var<workgroup> cand_hi: array<u32, CAP>;       // keys of the gathered elements
var<workgroup> cand_lo: array<u32, CAP>;
var<workgroup> n_cand: atomic<u32>;
var<workgroup> shared_u32: u32;                // a value every invocation reads (workgroupUniformLoad)
var<workgroup> best_hi: array<u32, WG>;        // each invocation's best key
var<workgroup> best_lo: array<u32, WG>;
var<workgroup> bound: vec2<u32>;
var<workgroup> hist: array<atomic<u32>, 256>;  // radix select: elements of the prefix per next byte
var<workgroup> pick: vec3<u32>;                // radix select: byte picked, k left to take, done

// Larger logit -> larger key (IEEE bits, negatives flipped; -0 is 0, as numpy compares them).
fn order_key(v: f32) -> u32 {
    let b = select(bitcast<u32>(v), 0u, v == 0.0);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn key_at(i: u32) -> vec2<u32> {
    return vec2<u32>(order_key(logits[i]), IDX_MASK - i);
}

// Whether key a comes before key b (is larger).
fn before(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x > b.x || (a.x == b.x && a.y > b.y);
}

// Whether key a, its bits under `mask`, is at or above p.
fn reaches(a: vec2<u32>, p: vec2<u32>, mask: vec2<u32>) -> bool {
    return !before(p, a & mask);
}

// Every invocation: n_cand = 0 and shared_u32 = value, seen by all after the barrier it ends with.
fn share(lid: u32, value: u32) -> u32 {
    if (lid == 0u) {
        atomicStore(&n_cand, 0u);
        shared_u32 = value;
    }
    return workgroupUniformLoad(&shared_u32);
}

// Gather the elements whose key, under `mask`, reaches p, and that reach `bound`.
fn gather(lid: u32, p: vec2<u32>, mask: vec2<u32>) {
    let all_bits = vec2<u32>(0xFFFFFFFFu, 0xFFFFFFFFu);
    for (var r = 0u; r < ROUNDS; r++) {
        let i = r * WG + lid;
        if (i >= N) {
            break;
        }
        let key = key_at(i);
        if (reaches(key, p, mask) && reaches(key, bound, all_bits)) {
            let slot = atomicAdd(&n_cand, 1u);
            if (slot < CAP) {
                cand_hi[slot] = key.x;
                cand_lo[slot] = key.y;
            }
        }
    }
}

// The prefix of the k best keys among those that reach `bound`: (prefix, mask).
fn radix_select(lid: u32, k: u32) -> array<vec2<u32>, 2> {
    let all_bits = vec2<u32>(0xFFFFFFFFu, 0xFFFFFFFFu);
    var p = vec2<u32>(0u, 0u);
    var m = vec2<u32>(0u, 0u);
    var need = k;
    for (var d = 0u; d < DIGITS; d++) {
        for (var r = 0u; r < (256u + WG - 1u) / WG; r++) {
            let b = r * WG + lid;
            if (b >= 256u) {
                break;
            }
            atomicStore(&hist[b], 0u);
        }
        workgroupBarrier();
        let in_hi = d < 4u;
        let shift = select(8u * (DIGITS - 1u - d), 24u - 8u * d, in_hi);
        for (var r = 0u; r < ROUNDS; r++) {
            let i = r * WG + lid;
            if (i >= N) {
                break;
            }
            let key = key_at(i);
            if (all((key & m) == p) && reaches(key, bound, all_bits)) {
                atomicAdd(&hist[(select(key.y, key.x, in_hi) >> shift) & 0xFFu], 1u);
            }
        }
        workgroupBarrier();
        if (lid == 0u) {   // walk the byte values from the top until the k-th best is reached
            var taken = 0u;
            for (var down = 0u; down < 256u; down++) {
                let b = 255u - down;
                let count = atomicLoad(&hist[b]);
                if (taken + count >= need) {
                    pick = vec3<u32>(b, need - taken, u32(taken + count == need));
                    break;
                }
                taken += count;
            }
        }
        let picked = workgroupUniformLoad(&pick);
        let byte = 0xFFu << shift;
        m |= select(vec2<u32>(0u, byte), vec2<u32>(byte, 0u), in_hi);
        p |= select(vec2<u32>(0u, picked.x << shift), vec2<u32>(picked.x << shift, 0u), in_hi);
        need = picked.y;
        if (picked.z == 1u) {
            break;
        }
    }
    return array<vec2<u32>, 2>(p, m);
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32) {
    let k = params[0];
    let all_bits = vec2<u32>(0xFFFFFFFFu, 0xFFFFFFFFu);

    // 1. the bound: the k-th best of the invocations' best keys (an invocation without elements: 0)
    var mine = vec2<u32>(0u, 0u);
    for (var r = 0u; r < ROUNDS; r++) {
        let i = r * WG + lid;
        if (i >= N) {
            break;
        }
        let key = key_at(i);
        if (before(key, mine)) {
            mine = key;
        }
    }
    best_hi[lid] = mine.x;
    best_lo[lid] = mine.y;
    workgroupBarrier();
    var place = 0u;
    for (var j = 0u; j < WG; j++) {
        place += u32(before(vec2<u32>(best_hi[j], best_lo[j]), mine));
    }
    if (place == k - 1u) {
        bound = mine;
    }
    share(lid, 0u);

    // 2. gather the elements that reach it; 3. too many: only the k best
    gather(lid, vec2<u32>(0u, 0u), vec2<u32>(0u, 0u));
    workgroupBarrier();
    var n = share(lid, atomicLoad(&n_cand));
    if (n > CAP) {
        let prefix = radix_select(lid, k);
        gather(lid, prefix[0], prefix[1]);
        n = k;
    }
    workgroupBarrier();

    // place each gathered element among the others; the first k are the answer
    for (var r = 0u; r < (CAP + WG - 1u) / WG; r++) {   // n <= CAP
        let i = r * WG + lid;
        if (i >= n) {
            break;
        }
        let key = vec2<u32>(cand_hi[i], cand_lo[i]);
        var place = 0u;
        for (var j = 0u; j < CAP; j++) {
            if (j >= n) {
                break;
            }
            place += u32(before(vec2<u32>(cand_hi[j], cand_lo[j]), key));
        }
        if (place < k) {
            let index = IDX_MASK - key.y;
            out[2u * place] = index;
            out[2u * place + 1u] = bitcast<u32>(logits[index]);
        }
    }
    let n_watch = params[1];
    for (var j = lid; j < n_watch; j += WG) {
        let id = params[2u + j];
        out[2u * k + j] = select(0u, bitcast<u32>(logits[min(id, N - 1u)]), id < N);
    }
}
