// The sampler's choice of a token (cera.sampling defines it; cera.gpu.sample builds the
// dispatches): from adjusted logits z of a vocabulary of VOCAB, the candidates (finite z) best
// first (ties: the lower id), the first n_kept of them kept by top-k, top-p and min-p, then the
// best kept one (temperature 0) or the kept one with the largest z / T + Gumbel noise of the
// random stream (seed, draw, id). One workgroup of WG invocations a draw, in one of three forms:
// - SELECT (the first dispatch): workgroup w takes the slice z[w N .. (w + 1) N) and writes its
//   top_k best keys (top_k 0 or past WG: its WG best, and its summary), best first, to
//   out[w WG ..] (the zero key after them): the k best of the vocabulary are among them;
// - CANDIDATES (the second): the elements are those keys (N of them), and the draw is made; for
//   top_k 0 it may leave the draw UNRESOLVED (settle_whole says when);
// - neither (top_k 0 or past WG, a third dispatch that returns at once unless the draw is
//   UNRESOLVED): the elements are z itself, all N = VOCAB of them.
// A drawing form writes result[2 w] = the token (NONE: no candidate), result[2 w + 1] = n_kept,
// for workgroup w, whose draw is step.draw + w (the decode plan runs one; the tests run many to
// see the distribution). Defines: N, VOCAB, WG, LOADS, IDX_DIGITS (bytes a token id needs), IDX_MASK
// (2^(8 IDX_DIGITS) - 1), flag SELECT or CANDIDATES.
// Bindings: z (f32 bits; CANDIDATES: the keys), params (struct Sampling), step, then SELECT:
// out, summary; CANDIDATES: result, summary; else result.
//
// Each candidate gets a unique 64-bit sort key, (order_key(z), IDX_MASK - id) as (hi, lo); a
// non-candidate the key 0, below every other.
// - top_k of 1..WG: the k best are found as a top-k selection and sorted in workgroup memory:
//   1. each invocation finds the best key of its elements; the k-th best of those WG is a
//      bound: at least k elements reach it, so the k best all do;
//   2. the elements that reach the bound (typically a few more than k) are gathered, and each is
//      placed among them; the first k are the sorted candidates;
//   3. if more than CAP reach it (many ties), a radix select finds exactly the k best first, a
//      byte of the key per pass from the top: a pass counts how many of the elements that share
//      the bytes picked so far take each value of the next byte, and picks the value where the
//      k-th best falls, until the value picked is taken whole.
//   top-p is then a scan of the sorted candidates' masses, min-p a compare with the best.
// - top_k 0 (or past WG), when the slices do not settle it: one workgroup finds the kept set over
//   the whole vocabulary, a prefix of the order each filter cuts: top-k by the radix select;
//   top-p by a bisection over the keys' high word for the largest value whose mass at and above
//   it reaches top_p (a pass each), then the tied elements at that value taken lowest id first as
//   far as the mass needs, by the radix select; min-p by a compare; then one pass draws.
#include "common.wgsl"

const NONE = 0xFFFFFFFFu;
const UNRESOLVED = 0xFFFFFFFFu;      // result[1] of a CANDIDATES draw that leaves top_k 0 to the last form
const UNKNOWN = 0xFFFFFFFFu;         // a count past the sorted candidates
const DIGITS = 4u + IDX_DIGITS;
const CAP = 1024u;                   // gathered elements held in workgroup memory
const LOG_WG = countTrailingZeros(WG);
// Loops count up by one to a constant (strides multiplied out, shorter trips break out):
// Chromium's compiler guards every other loop with an iteration counter (matvec.wgsl).
// A pass over the vocabulary is a loop of rounds, each loading LOADS keys at once (keys_of): one
// workgroup walks all of it, so the latency of its loads, not bandwidth, sets a pass's time, and
// independent loads in flight hide it (docs/PERFORMANCE.md, decisions). LOADS is a define
// (cera.gpu.sample.LOADS: a SELECT workgroup's slice is LOADS rounds of WG keys).
const ROUNDS = (N + LOADS * WG - 1u) / (LOADS * WG);   // elements (r LOADS + j) WG + lid, j < LOADS

@group(0) @binding(1) var<uniform> params: Sampling;
#ifdef CANDIDATES
@group(0) @binding(0) var<storage, read> z: array<vec2<u32>>;       // (N,) the SELECT dispatch's keys
#else
@group(0) @binding(0) var<storage, read> z: array<u32>;             // (VOCAB,) f32 bits
#endif
@group(0) @binding(2) var<uniform> step: Step;
#ifdef SELECT
@group(0) @binding(3) var<storage, read_write> out: array<vec2<u32>>;       // (slices, WG) keys
@group(0) @binding(4) var<storage, read_write> summary: array<vec4<u32>>;  // (slices,) Summary
var<private> base: u32;                        // the first element of this workgroup's slice
#else
@group(0) @binding(3) var<storage, read_write> result: array<u32>;  // (2 draws,)
#ifdef CANDIDATES
@group(0) @binding(4) var<storage, read> summary: array<vec4<u32>>;       // (slices,)
#endif
#endif
// A slice's summary for top_k 0 (SELECT writes it, CANDIDATES reads it): its candidates, their
// mass relative to its best, and the key of its best z / T + Gumbel noise of draw step.draw, as
// vec4<u32>(count, mass bits, winner.x, winner.y).

var<workgroup> cand_hi: array<u32, CAP>;       // keys of the gathered elements
var<workgroup> cand_lo: array<u32, CAP>;
var<workgroup> n_cand: atomic<u32>;
var<workgroup> shared_u32: u32;                // values every invocation reads (workgroupUniformLoad)
var<workgroup> shared_f32: f32;
var<workgroup> shared_key: vec2<u32>;
var<workgroup> best_hi: array<u32, WG>;        // each invocation's best key
var<workgroup> best_lo: array<u32, WG>;
var<workgroup> sums: array<f32, WG>;           // each invocation's part of a sum, then a scan
var<workgroup> sorted_z: array<f32, WG>;       // top_k <= WG: the candidates best first
var<workgroup> sorted_id: array<u32, WG>;
var<workgroup> bound: vec2<u32>;                // gather and radix_select take only keys at or above it
var<workgroup> hist: array<atomic<u32>, 256>;  // radix select: elements of the prefix per next byte
var<workgroup> pick: vec3<u32>;                // radix select: byte picked, k left to take, done

// Larger value -> larger key, from f32 bits (negatives flipped; -0 is 0, as numpy compares them).
fn order_key(bits: u32) -> u32 {
    let b = select(bits, 0u, bits == 0x80000000u);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

// The value whose order_key is k.
fn key_value(k: u32) -> f32 {
    return bitcast<f32>(select(~k, k & 0x7FFFFFFFu, (k & 0x80000000u) != 0u));
}

// The key of element i (the zero key past the elements).
fn key_at(i: u32) -> vec2<u32> {
#ifdef CANDIDATES
    return select(vec2<u32>(0u, 0u), z[min(i, N - 1u)], i < N);
#else
#ifdef SELECT
    let id = base + i;
    if (i >= N || id >= VOCAB) {
#else
    let id = i;
    if (i >= N) {
#endif
        return vec2<u32>(0u, 0u);
    }
    let bits = z[id];
    if ((bits & 0x7F800000u) == 0x7F800000u) {   // -inf (masked), inf or NaN: not a candidate
        return vec2<u32>(0u, 0u);
    }
    return vec2<u32>(order_key(bits), IDX_MASK - id);
#endif
}

// The keys of an invocation's elements in round r (the zero key past N).
fn keys_of(lid: u32, r: u32) -> array<vec2<u32>, LOADS> {
    var keys: array<vec2<u32>, LOADS>;
    for (var j = 0u; j < LOADS; j++) {
        keys[j] = key_at((r * LOADS + j) * WG + lid);
    }
    return keys;
}

// Whether key a comes before key b (is larger).
fn before(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x > b.x || (a.x == b.x && a.y > b.y);
}

// Whether key a is a candidate and, its bits under `mask`, at or above p.
fn reaches(a: vec2<u32>, p: vec2<u32>, mask: vec2<u32>) -> bool {
    return a.x != 0u && !before(p, a & mask);
}

// Jarzynski and Olano's pcg4d hash; cera.sampling.pcg4d step for step.
fn pcg4d(a: vec4<u32>) -> vec4<u32> {
    var v = a * 1664525u + 1013904223u;
    v.x += v.y * v.w;
    v.y += v.z * v.x;
    v.z += v.x * v.y;
    v.w += v.y * v.z;
    v ^= v >> vec4<u32>(16u);
    v.x += v.y * v.w;
    v.y += v.z * v.x;
    v.z += v.x * v.y;
    v.w += v.y * v.z;
    return v;
}

// z / T plus the Gumbel variate of token id in this draw, as a key (ties: the lower id).
fn perturbed_key(value: f32, id: u32, draw: u32) -> vec2<u32> {
    let h = pcg4d(vec4<u32>(params.seed_lo, params.seed_hi, draw, id)).x;
    let u = (f32(h >> 8u) + 0.5) * (1.0 / 16777216.0);
    return vec2<u32>(order_key(bitcast<u32>(value * params.inv_temperature - log(-log(u)))), IDX_MASK - id);
}

// Every invocation: n_cand = 0 and shared_u32 = value, seen by all after the barrier it ends with.
fn share(lid: u32, value: u32) -> u32 {
    if (lid == 0u) {
        atomicStore(&n_cand, 0u);
        shared_u32 = value;
    }
    return workgroupUniformLoad(&shared_u32);
}

// The sum of every invocation's v, seen by all.
fn total_f32(lid: u32, v: f32) -> f32 {
    sums[lid] = v;
    workgroupBarrier();
    for (var s = 0u; s < LOG_WG; s++) {
        let width = WG >> (s + 1u);
        if (lid < width) {
            sums[lid] += sums[lid + width];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        shared_f32 = sums[0];
    }
    return workgroupUniformLoad(&shared_f32);
}

// The sum of every invocation's v, seen by all.
fn total_u32(lid: u32, v: u32) -> u32 {
    share(lid, 0u);
    atomicAdd(&n_cand, v);
    workgroupBarrier();
    return share(lid, atomicLoad(&n_cand));
}

// The best of every invocation's key, seen by all.
fn best_key(lid: u32, key: vec2<u32>) -> vec2<u32> {
    best_hi[lid] = key.x;
    best_lo[lid] = key.y;
    workgroupBarrier();
    for (var s = 0u; s < LOG_WG; s++) {
        let width = WG >> (s + 1u);
        if (lid < width) {
            let other = vec2<u32>(best_hi[lid + width], best_lo[lid + width]);
            if (before(other, vec2<u32>(best_hi[lid], best_lo[lid]))) {
                best_hi[lid] = other.x;
                best_lo[lid] = other.y;
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        shared_key = vec2<u32>(best_hi[0], best_lo[0]);
    }
    return workgroupUniformLoad(&shared_key);
}

// Gather the elements whose key, under `mask`, reaches p, and that reach `bound`.
fn gather(lid: u32, p: vec2<u32>, mask: vec2<u32>) {
    let all_bits = vec2<u32>(0xFFFFFFFFu, 0xFFFFFFFFu);
    for (var r = 0u; r < ROUNDS; r++) {
        let keys = keys_of(lid, r);
        for (var j = 0u; j < LOADS; j++) {
            let key = keys[j];
            if (reaches(key, p, mask) && reaches(key, bound, all_bits)) {
                let slot = atomicAdd(&n_cand, 1u);
                if (slot < CAP) {
                    cand_hi[slot] = key.x;
                    cand_lo[slot] = key.y;
                }
            }
        }
    }
}

// The prefix of the k best keys among the candidates that reach `bound`: (prefix, mask).
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
            let keys = keys_of(lid, r);
            for (var j = 0u; j < LOADS; j++) {
                let key = keys[j];
                if (key.x != 0u && all((key & m) == p) && reaches(key, bound, all_bits)) {
                    atomicAdd(&hist[(select(key.y, key.x, in_hi) >> shift) & 0xFFu], 1u);
                }
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

// top_k of 1..WG: the k best candidates sorted into sorted_z/sorted_id -> how many there are.
fn sort_top_k(lid: u32, k: u32, mine: vec2<u32>) -> u32 {
    best_hi[lid] = mine.x;
    best_lo[lid] = mine.y;
    workgroupBarrier();
    var place = 0u;
    for (var j = 0u; j < WG; j++) {
        place += u32(before(vec2<u32>(best_hi[j], best_lo[j]), mine));
    }
    if (place == k - 1u) {   // the bound (no k-th best with a candidate: the zero key, every one)
        bound = mine;
    }
    share(lid, 0u);
    gather(lid, vec2<u32>(0u, 0u), vec2<u32>(0u, 0u));
    workgroupBarrier();
    var n = share(lid, atomicLoad(&n_cand));
    if (n > CAP) {   // too many reach the bound: only the k best
        let prefix = radix_select(lid, k);
        gather(lid, prefix[0], prefix[1]);
        n = k;
    }
    workgroupBarrier();
    for (var r = 0u; r < (CAP + WG - 1u) / WG; r++) {   // place each gathered element among the others
        let i = r * WG + lid;
        if (i >= n) {
            break;
        }
        let key = vec2<u32>(cand_hi[i], cand_lo[i]);
        var at = 0u;
        for (var j = 0u; j < CAP; j++) {
            if (j >= n) {
                break;
            }
            at += u32(before(vec2<u32>(cand_hi[j], cand_lo[j]), key));
        }
        if (at < k) {
            sorted_id[at] = IDX_MASK - key.y;
            sorted_z[at] = key_value(key.x);
        }
    }
    workgroupBarrier();
    return min(n, k);
}

// How many of the n sorted candidates top-p keeps (the goal top_p of `whole`, their mass relative
// to the best; 0: of their own) and min-p keeps: (by top-p, by min-p), each a prefix's length.
fn kept_counts(lid: u32, n: u32, whole: f32) -> vec2<u32> {
    let z0 = sorted_z[0];
    let e = select(0.0, exp(sorted_z[min(lid, n - 1u)] - z0), lid < n);
    sums[lid] = e;
    workgroupBarrier();
    for (var s = 0u; s < LOG_WG; s++) {   // inclusive scan
        let off = 1u << s;
        let add = select(0.0, sums[max(lid, off) - off], lid >= off);
        workgroupBarrier();
        sums[lid] += add;
        workgroupBarrier();
    }
    let before_mass = select(0.0, sums[max(lid, 1u) - 1u], lid > 0u);
    let by_p = params.top_p >= 1.0 || before_mass < params.top_p * select(whole, sums[WG - 1u], whole == 0.0);
    let by_min_p = sorted_z[min(lid, n - 1u)] >= z0 + params.log_min_p;
    return vec2<u32>(total_u32(lid, u32(lid < n && by_p)), total_u32(lid, u32(lid < n && by_min_p)));
}

// The draw among the first n_kept sorted candidates: the best (temperature 0), or the largest
// z / T + Gumbel noise.
fn draw_sorted(lid: u32, n_kept: u32, draw: u32) -> vec2<u32> {
    var key = select(vec2<u32>(0u, 0u), vec2<u32>(1u, IDX_MASK - sorted_id[0]), lid == 0u);
    if (params.inv_temperature > 0.0 && lid < n_kept) {
        key = perturbed_key(sorted_z[lid], sorted_id[lid], draw);
    }
    return best_key(lid, key);
}

// The mass (relative to the best, z_best) of the candidates in the set (p, m) whose key's high
// word is at least h.
fn mass_from(lid: u32, h: u32, p: vec2<u32>, m: vec2<u32>, z_best: f32) -> f32 {
    var mass = 0.0;
    for (var r = 0u; r < ROUNDS; r++) {
        let keys = keys_of(lid, r);
        for (var j = 0u; j < LOADS; j++) {
            let key = keys[j];
            if (reaches(key, p, m) && key.x >= h) {
                mass += exp(key_value(key.x) - z_best);
            }
        }
    }
    return total_f32(lid, mass);
}

// How many of the n_k best (the set (p, m)) top-p keeps, over the whole vocabulary.
fn top_p_count(lid: u32, n_k: u32, p: vec2<u32>, m: vec2<u32>, best: vec2<u32>) -> u32 {
    let z_best = key_value(best.x);
    let goal = params.top_p * mass_from(lid, 0u, p, m, z_best);
    // the largest high word lo whose mass at and above reaches the goal: mass(lo) >= goal > mass(hi)
    var lo = 0u;
    var hi = best.x + 1u;
    var mass_hi = 0.0;
    for (var it = 0u; it < 33u; it++) {
        if (hi - lo <= 1u) {
            break;
        }
        let mid = lo + (hi - lo) / 2u;
        let mass = mass_from(lid, mid, p, m, z_best);
        if (mass >= goal) {
            lo = mid;
        } else {
            hi = mid;
            mass_hi = mass;
        }
    }
    var above = 0u;
    var tied = 0u;
    for (var r = 0u; r < ROUNDS; r++) {
        let keys = keys_of(lid, r);
        for (var j = 0u; j < LOADS; j++) {
            let key = keys[j];
            above += u32(reaches(key, p, m) && key.x > lo);
            tied += u32(reaches(key, p, m) && key.x == lo);
        }
    }
    let n_above = total_u32(lid, above);
    let n_tied = total_u32(lid, tied);
    // the tied elements (each of the same mass) taken lowest id first until the goal is reached
    let each = exp(key_value(lo) - z_best);
    let need = clamp(u32(ceil((goal - mass_hi) / each)), 1u, max(n_tied, 1u));
    return min(n_above + need, n_k);
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let k = params.top_k;
    if (lid == 0u) {
        bound = vec2<u32>(0u, 0u);   // every candidate, until sort_top_k finds its bound (not every host zeroes workgroup memory)
    }
#ifdef SELECT
    base = wid.x * N;
#endif
#ifndef SELECT
#ifndef CANDIDATES
    if (share(lid, result[2u * wid.x + 1u]) != UNRESOLVED) {   // the CANDIDATES draw settled it
        return;
    }
#endif
#endif

    // each invocation's best key and count of candidates
    var mine = vec2<u32>(0u, 0u);
    var count = 0u;
    for (var r = 0u; r < ROUNDS; r++) {
        let keys = keys_of(lid, r);
        for (var j = 0u; j < LOADS; j++) {
            let key = keys[j];
            count += u32(key.x != 0u);
            if (before(key, mine)) {
                mine = key;
            }
        }
    }
    let n_valid = total_u32(lid, count);
#ifdef SELECT
    select_slice(lid, wid.x, k, mine, n_valid);
#else
    var chosen = vec2<u32>(0u, 0u);
    var n_kept = 0u;
    let draw = step.draw + wid.x;
    if (k != 0u && k <= WG) {
        // the k best, sorted: the kept ones are the first n_kept
        let n = sort_top_k(lid, k, mine);
        if (n > 0u) {
            let counts = kept_counts(lid, n, 0.0);
            n_kept = min(counts.x, counts.y);
            chosen = draw_sorted(lid, n_kept, draw);
        }
    } else {
#ifdef CANDIDATES
        let settled = settle_whole(lid, wid.x, mine, draw);
        chosen = settled.xy;
        n_kept = settled.z;
#else
        let drawn = draw_whole(lid, k, mine, n_valid, draw);
        chosen = drawn.xy;
        n_kept = drawn.z;
#endif
    }
    if (lid == 0u) {
        result[2u * wid.x] = select(NONE, IDX_MASK - chosen.y, chosen.x != 0u);
        result[2u * wid.x + 1u] = n_kept;
    }
#endif
}

#ifdef SELECT
// The slice's k best (for top_k 0 or past WG: its WG best and its Summary), best first, then
// zero keys, into its row of out.
fn select_slice(lid: u32, w: u32, k: u32, mine: vec2<u32>, n_valid: u32) {
    let whole = k == 0u || k > WG;
    let n = sort_top_k(lid, select(k, WG, whole), mine);
    var key = vec2<u32>(0u, 0u);
    if (lid < n) {
        key = vec2<u32>(order_key(bitcast<u32>(sorted_z[lid])), IDX_MASK - sorted_id[lid]);
    }
    out[w * WG + lid] = key;
    if (!whole) {
        return;
    }
    let z0 = sorted_z[0];   // the slice's best (no candidate: no term uses it)
    var mass = 0.0;
    var winner = vec2<u32>(0u, 0u);
    for (var r = 0u; r < ROUNDS; r++) {
        let keys = keys_of(lid, r);
        for (var j = 0u; j < LOADS; j++) {
            let key = keys[j];
            if (key.x != 0u) {
                let value = key_value(key.x);
                mass += exp(value - z0);
                let candidate = perturbed_key(value, IDX_MASK - key.y, step.draw);
                if (before(candidate, winner)) {
                    winner = candidate;
                }
            }
        }
    }
    let total = total_f32(lid, mass);
    let best = best_key(lid, winner);
    if (lid == 0u) {
        summary[w] = vec4<u32>(n_valid, bitcast<u32>(total), best);
    }
}
#endif

#ifdef CANDIDATES
// top_k 0 or past WG, from the slices' WG best and Summaries: the kept set is settled when it
// ends within the WG best (top-p's or min-p's cut there), or is every candidate (neither filter
// on: the best of the slices' winners) -> (chosen key, n_kept); else (and for a top_k past WG,
// or any draw but a batch's first) n_kept UNRESOLVED, for the last form.
fn settle_whole(lid: u32, w: u32, mine: vec2<u32>, draw: u32) -> vec3<u32> {
    let slices = N / WG;
    let z0 = key_value(best_key(lid, mine).x);   // the vocabulary's best
    var count = 0u;
    var mass = 0.0;
    var winner = vec2<u32>(0u, 0u);
    for (var r = 0u; r < (N / WG + WG - 1u) / WG; r++) {   // slices <= WG when VOCAB <= WG * SLICE
        let s = r * WG + lid;
        if (s >= slices) {
            break;
        }
        let summed = summary[s];
        let first = z[s * WG];   // the slice's best key
        count += summed.x;
        if (first.x != 0u) {
            mass += bitcast<f32>(summed.y) * exp(key_value(first.x) - z0);
        }
        if (before(summed.zw, winner)) {
            winner = summed.zw;
        }
    }
    let n_valid = total_u32(lid, count);
    let whole = total_f32(lid, mass);
    let best_winner = best_key(lid, winner);
    let n = sort_top_k(lid, WG, mine);
    if (n == 0u) {
        return vec3<u32>(0u, 0u, 0u);
    }
    let counts = kept_counts(lid, n, whole);
    let beyond = n < n_valid;   // candidates past the sorted ones
    let by_p = select(select(counts.x, UNKNOWN, counts.x == n && beyond), n_valid, params.top_p >= 1.0);
    let by_min_p = select(select(counts.y, UNKNOWN, counts.y == n && beyond), n_valid, params.log_min_p < -1e29);
    var n_kept = UNKNOWN;   // an unknown count is at least n: the other filter settles it if it cuts within n
    if (by_p != UNKNOWN && by_min_p != UNKNOWN) {
        n_kept = min(by_p, by_min_p);
    } else if (min(by_p, by_min_p) <= n) {
        n_kept = min(by_p, by_min_p);
    }
    if (params.top_k > WG || w > 0u || n_kept == UNKNOWN) {
        return vec3<u32>(0u, 0u, UNRESOLVED);
    }
    if (n_kept <= n) {
        return vec3<u32>(draw_sorted(lid, n_kept, draw), n_kept);
    }
    let first = vec2<u32>(1u, IDX_MASK - sorted_id[0]);
    return vec3<u32>(select(first, best_winner, params.inv_temperature > 0.0), n_kept);   // every candidate kept
}
#endif

#ifndef SELECT
#ifndef CANDIDATES
// top_k 0 or past WG over the whole vocabulary, one workgroup: the kept set is the set of keys
// reaching (p, m), first by top-k, then top-p; then min-p and the draw -> (chosen key, n_kept).
fn draw_whole(lid: u32, k: u32, mine: vec2<u32>, n_valid: u32, draw: u32) -> vec3<u32> {
    if (n_valid == 0u) {
        return vec3<u32>(0u, 0u, 0u);
    }
    let best = best_key(lid, mine);
    let n_k = select(min(k, n_valid), n_valid, k == 0u);
    var p = vec2<u32>(0u, 0u);
    var m = vec2<u32>(0u, 0u);
    if (n_k < n_valid) {
        let s = radix_select(lid, n_k);
        p = s[0];
        m = s[1];
    }
    if (params.top_p < 1.0) {
        let n_p = top_p_count(lid, n_k, p, m, best);
        if (n_p < n_valid) {
            let s = radix_select(lid, n_p);
            p = s[0];
            m = s[1];
        }
    }
    let cut = key_value(best.x) + params.log_min_p;
    let drawn = params.inv_temperature > 0.0;
    var kept = 0u;
    var winner = vec2<u32>(0u, 0u);
    for (var r = 0u; r < ROUNDS; r++) {
        let keys = keys_of(lid, r);
        for (var j = 0u; j < LOADS; j++) {
            let key = keys[j];
            let value = key_value(key.x);
            if (reaches(key, p, m) && value >= cut) {
                kept += 1u;
                let candidate = select(key, perturbed_key(value, IDX_MASK - key.y, draw), drawn);
                if (before(candidate, winner)) {
                    winner = candidate;
                }
            }
        }
    }
    return vec3<u32>(best_key(lid, winner), total_u32(lid, kept));
}
#endif
#endif
