// Decode attention, split-KV ("flash-decoding"), pass 1 of 2: the causal GQA attention of a
// step's query rows over one split of SPLIT cache slots, left unnormalized in a scratch buffer;
// attention_combine.wgsl merges the splits into the output.
//
// Row t of the step is the token at position p = step.pos + t; it attends to cache slots 0..p,
// or with WINDOW (a local layer) to slots first_key(p) = p - WINDOW + 1 .. p (rope.wgsl has
// already written the step's slots, or with ROPE this dispatch does). Head h reads kv head h / GROUP. Split s covers keys
// J = [s*SPLIT, (s+1)*SPLIT) ∩ [first_key(p), p] and writes, for each query head h,
//   score_j = SCALE * q[t, h, :] . k_cache[j, kh, :]   (with SOFTCAP: soft_cap of it, soft_cap.wgsl)
//   m = max_J score_j,   l = sum_J exp(score_j - m),   o = sum_J exp(score_j - m) v_cache[j, kh, :]
//
// Dispatch (N_HEADS / HPW, N_SPLITS, max rows): a workgroup takes HPW query heads of one kv head
// (HPW divides GROUP, so they share every K/V load), one split, one row. Splits past p return
// at once (the combine never reads them), as do splits wholly before the window and rows past
// step.n_tokens.
//   1. stage the HPW query rows, pre-scaled, in qs;                                  barrier
//      with ROPE the rows come raw from the step's q | k | v: [QK-normed and] rotated to p in
//      `rot`, and the split holding p also turns the step's key and writes key and value to
//      slot p, which its own later loads see (storageBarrier). Workgroups of other splits never
//      read slot p; workgroups sharing a kv head in that split write the same values.
//   2. SCORE_LANES invocations score each key, a stripe of its vec4 columns each (so that
//      neighbours load neighbouring bytes of a key), against all HPW heads (each load of the
//      key serves them all), and their sums go to sc, added by shuffles with SUBGROUPS (a
//      key's lanes are an aligned run of a subgroup), else through workgroup memory;  barriers
//   3. the invocation of each score reads its head's SPLIT scores for their max m and writes
//      exp(score - m) to prob (a loop in place of a tree of log2(SPLIT) barriers);  barrier
//   4. invocation (part, vec4 column c) sums p_j * v_j and p_j over the split's keys part,
//      part + PARTS, ... for all HPW heads (each load of a value serving them all); the parts are
//      then added up through workgroup memory, a head at a time (a butterfly of subgroup
//      shuffles over a column's parts measured slower: docs/PERFORMANCE.md, tried).  barriers
// Keys past p, and before the window, are never read (those slots may hold anything).
// Loops count up by one to a constant (matvec.wgsl says why).
//
// Defines: HEAD_DIM (<= 256), N_HEADS, N_KV_HEADS, SCALE, SPLIT (a power of two), N_SPLITS, MAX_WG,
// HPW, SCORE_LANES, optional WINDOW, optional SOFTCAP (gemma2); flag SUBGROUPS (the device has
// the feature, and LANES is a power of two); flag VEC4 (HEAD_DIM % 4 == 0: q and the caches move as vec4);
// flags K_F16, V_F16: that cache holds f16 halves (half.wgsl); K_Q8, V_Q8: q8_0 blocks
// (q8_cache.wgsl; HEAD_DIM % 32 == 0); else f32.
// With flag ROPE (one row: decode), rope_rotate.wgsl's defines, K_OFF and V_OFF (floats from q
// to k and to v in the first binding), optional flag QK_NORM with EPS, and ROPE_BINDING, the
// first of [freq_factors] then [qk_norm] (Rope.bindings).
// Bindings: q (rows, N_HEADS*HEAD_DIM) or with ROPE the raw q | k | v of the step's row,
// k_cache, v_cache (max_ctx, N_KV_HEADS, HEAD_DIM),
// scratch (rows, N_SPLITS, N_HEADS, 1 + D4) vec4: per (row, split, head) a record of
// (m, l, 0, 0) then o as D4 vec4 (zero past HEAD_DIM); step.
#ifdef SUBGROUPS
enable subgroups;
#endif
#include "common.wgsl"

const WG = MAX_WG;
const GROUP = N_HEADS / N_KV_HEADS;            // query heads per kv head
const D4 = (HEAD_DIM + 3u) / 4u;               // vec4 columns of a head
const REC = 1u + D4;                           // vec4 per scratch record
const SLOT = N_KV_HEADS * HEAD_DIM;            // floats per cache slot
const OUT4 = HPW * D4;                         // vec4 outputs of a workgroup
const PARTS = WG / D4;                         // key stripes of the value pass (HEAD_DIM <= 256: >= 4)
const KEY_TRIPS = (SPLIT + PARTS - 1u) / PARTS;       // keys one invocation of the value pass takes at most
const NEG_BIG = -3.0e38;

#include "attention_load.wgsl"
#ifdef SOFTCAP
#include "soft_cap.wgsl"
#endif
#ifdef ROPE
@group(0) @binding(0) var<storage, read> qkv: array<f32>;
@group(0) @binding(1) var<storage, read_write> k_cache: array<KWord>;
@group(0) @binding(2) var<storage, read_write> v_cache: array<VWord>;
#ifdef FREQ_FACTORS
@group(0) @binding(ROPE_BINDING) var<storage, read> freq_factors: array<f32>;   // (N_ROT/2,)
const NORM_BINDING = ROPE_BINDING + 1u;
#else
const NORM_BINDING = ROPE_BINDING;
#endif
#ifdef QK_NORM
@group(0) @binding(NORM_BINDING) var<storage, read> qk_norm: array<f32>;       // q's (HEAD_DIM,) then k's
#endif
#else
@group(0) @binding(0) var<storage, read> q: array<Elem>;
@group(0) @binding(1) var<storage, read> k_cache: array<KWord>;
@group(0) @binding(2) var<storage, read> v_cache: array<VWord>;
#endif
@group(0) @binding(3) var<storage, read_write> scratch: array<vec4<f32>>;
@group(0) @binding(4) var<uniform> step: Step;

var<workgroup> qs: array<vec4<f32>, OUT4>;         // the HPW query rows * SCALE, zero-padded
var<workgroup> sc: array<f32, HPW * SPLIT>;        // scores
var<workgroup> prob: array<f32, HPW * SPLIT>;      // exp(score - m)
var<workgroup> head_max: array<f32, HPW>;          // m of each head
const LANES = min(D4, SCORE_LANES);                // invocations a key's score takes
#ifndef SUBGROUPS
var<workgroup> score_part: array<f32, HPW * SPLIT * LANES>;   // their partial sums
#endif
var<workgroup> part_o: array<vec4<f32>, PARTS * D4>;   // per-part sums of p_j * v_j, a head at a time ...
var<workgroup> part_l: array<f32, PARTS * HPW>;        // ... and of p_j
#ifdef ROPE
var<workgroup> rot: array<f32, (HPW + 1u) * HEAD_DIM>;   // the HPW query heads, then the step's key
var<workgroup> inv_rms: array<f32, HPW + 1u>;            // their QK-norm factors

#include "rope_rotate.wgsl"
#include "head_vec4.wgsl" A=rot
#include "head_vec4.wgsl" A=qkv
#endif

#include "attention_window.wgsl"

// A key's score as the softmax takes it: soft-capped with SOFTCAP.
fn capped(s: f32) -> f32 {
#ifdef SOFTCAP
    return soft_cap(s);
#else
    return s;
#endif
}

#ifdef ROPE
const ELEM_ROUNDS = ((HPW + 1u) * HEAD_DIM + WG - 1u) / WG;   // rounds over the most rows staged

// Step 1 with ROPE for the one row at position p: qs <- the HPW query heads from h0, [normed,]
// rotated, pre-scaled; the split holding p writes the step's rotated key and its value to slot p.
fn stage_rope(lid: u32, p: u32, split: u32, h0: u32) {
    let own = p / SPLIT == split;                     // uniform: the whole workgroup
    let rows = HPW + select(0u, 1u, own);
    let kv_off = (h0 / GROUP) * HEAD_DIM;
    let elems = rows * HEAD_DIM;
    for (var n = 0u; n < ELEM_ROUNDS; n++) {
        let i = n * WG + lid;
        if (i >= elems) {
            break;
        }
        let r = i / HEAD_DIM;
        rot[i] = qkv[select((h0 + r) * HEAD_DIM, K_OFF + kv_off, r == HPW) + i % HEAD_DIM];
    }
    workgroupBarrier();
#ifdef QK_NORM
    if (lid < rows) {
        var squares = 0.0;
        for (var e = 0u; e < HEAD_DIM; e++) {
            squares += rot[lid * HEAD_DIM + e] * rot[lid * HEAD_DIM + e];
        }
        inv_rms[lid] = inverseSqrt(squares / f32(HEAD_DIM) + EPS);
    }
    workgroupBarrier();
    for (var n = 0u; n < ELEM_ROUNDS; n++) {
        let i = n * WG + lid;
        if (i >= elems) {
            break;
        }
        let e = i % HEAD_DIM;
        rot[i] *= inv_rms[i / HEAD_DIM] * qk_norm[e + select(0u, HEAD_DIM, i / HEAD_DIM == HPW)];
    }
    workgroupBarrier();
#endif
    let pairs = rows * (N_ROT / 2u);
    for (var n = 0u; n < ((HPW + 1u) * (N_ROT / 2u) + WG - 1u) / WG; n++) {   // each invocation turns one pair
        let i = n * WG + lid;
        if (i >= pairs) {
            break;
        }
        let pair = rope_pair(i % (N_ROT / 2u)) + vec2<u32>((i / (N_ROT / 2u)) * HEAD_DIM);
        let cs = rope_cos_sin(i % (N_ROT / 2u), f32(p));
        let y = rope_turn(vec2<f32>(rot[pair.x], rot[pair.y]), cs);
        rot[pair.x] = y.x;
        rot[pair.y] = y.y;
    }
    workgroupBarrier();
    for (var n = 0u; n < (OUT4 + WG - 1u) / WG; n++) {
        let i = n * WG + lid;
        if (i >= OUT4) {
            break;
        }
        qs[i] = rot_vec4(i / D4 * HEAD_DIM, i % D4) * SCALE;
    }
    if (own) {
        let slot = p * SLOT + kv_off;
        for (var n = 0u; n < (D4 + WG - 1u) / WG; n++) {
            let c = n * WG + lid;
            if (c >= D4) {
                break;
            }
            k_store4(slot, c, rot_vec4(HPW * HEAD_DIM, c), block_amax_rot(HPW, c));
            v_store4(slot, c, qkv_vec4(V_OFF + kv_off, c), block_amax_raw(V_OFF + kv_off, c));
        }
    }
    storageBarrier();     // slot p as written, for this workgroup's loads
    workgroupBarrier();   // qs
}

// max |x| of the q8_0 block (32 values) holding column 4c of staged row r (the key), and of the
// head at float `base` of qkv (the value): what a q8_0 cache's scale is made of (0 for the other
// types, which never read it).
fn block_amax_rot(r: u32, c: u32) -> f32 {
    var m = 0.0;
#ifdef K_Q8
    for (var e = 0u; e < Q8_VALUES; e++) {
        m = max(m, abs(rot[r * HEAD_DIM + (4u * c) / Q8_VALUES * Q8_VALUES + e]));
    }
#endif
    return m;
}

fn block_amax_raw(base: u32, c: u32) -> f32 {
    var m = 0.0;
#ifdef V_Q8
    for (var e = 0u; e < Q8_VALUES; e++) {
        m = max(m, abs(qkv[base + (4u * c) / Q8_VALUES * Q8_VALUES + e]));
    }
#endif
    return m;
}
#endif

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.z;
    let n_keys = step.pos + t + 1u;     // row t sees keys first .. n_keys-1
    let first = first_key(step.pos + t);
    let k0 = wid.y * SPLIT;             // this split's first key
    if (t >= step.n_tokens || k0 >= n_keys || k0 + SPLIT <= first) {
        return;   // uniform: whole workgroup
    }
    let n_live = min(SPLIT, n_keys - k0);
    let lo = max(k0, first) - k0;       // keys lo .. n_live-1 of the split are seen
    let h0 = wid.x * HPW;               // first query head of the workgroup
    let kv_off = (h0 / GROUP) * HEAD_DIM;   // its kv head's offset inside a cache slot
    let c = lid % D4;                   // the value pass's vec4 column ...
    let part = lid / D4;                // ... and key stripe

    // 1. The query rows, pre-scaled.
#ifdef ROPE
    stage_rope(lid, step.pos, wid.y, h0);
#else
    for (var n = 0u; n < (OUT4 + WG - 1u) / WG; n++) {
        let i = n * WG + lid;
        if (i >= OUT4) {
            break;
        }
        qs[i] = load_q((t * N_HEADS + h0 + i / D4) * HEAD_DIM, i % D4) * SCALE;
    }
    workgroupBarrier();
#endif

    // 2. Scores of key k0 + j against every head: LANES invocations a key, columns lane,
    // lane + LANES, ..., each column of the key loaded once for the HPW heads; their sums are
    // added up by shuffles with SUBGROUPS (a key's lanes are an aligned run, and subgroups have
    // 4 or more), else through workgroup memory.
    for (var n = 0u; n < (SPLIT * LANES + WG - 1u) / WG; n++) {
        let i = n * WG + lid;
#ifndef SUBGROUPS
        if (i >= SPLIT * LANES) {
            break;
        }
#endif
        let j = i / LANES;
        var s4: array<vec4<f32>, HPW>;
        for (var hh = 0u; hh < HPW; hh++) {
            s4[hh] = vec4<f32>(0.0);   // each trip (naga declares the array once, at the entry)
        }
        if (j >= lo && j < n_live) {
            let base = (k0 + j) * SLOT + kv_off;
            for (var col = 0u; col < (D4 + LANES - 1u) / LANES; col++) {   // columns i % LANES, + LANES, ...
                let kc = i % LANES + col * LANES;
                if (kc >= D4) {
                    break;
                }
                let k = k_load4(base, kc);
                for (var hh = 0u; hh < HPW; hh++) {
                    s4[hh] = fma(qs[hh * D4 + kc], k, s4[hh]);
                }
            }
        }
        for (var hh = 0u; hh < HPW; hh++) {
            var s = s4[hh].x + s4[hh].y + s4[hh].z + s4[hh].w;
#ifdef SUBGROUPS
            for (var b = 0u; b < countTrailingZeros(LANES); b++) {   // every lane, past the split's too
                s += subgroupShuffleXor(s, 1u << b);
            }
            if (i % LANES == 0u && j < SPLIT) {
                sc[hh * SPLIT + j] = select(NEG_BIG, capped(s), j >= lo && j < n_live);
            }
#else
            score_part[(hh * SPLIT + j) * LANES + i % LANES] = s;
#endif
        }
    }
#ifndef SUBGROUPS
    workgroupBarrier();
    for (var n = 0u; n < (HPW * SPLIT + WG - 1u) / WG; n++) {
        let i = n * WG + lid;
        if (i >= HPW * SPLIT) {
            break;
        }
        let j = i % SPLIT;
        var s = 0.0;
        for (var l = 0u; l < LANES; l++) {
            s += score_part[i * LANES + l];
        }
        sc[i] = select(NEG_BIG, capped(s), j >= lo && j < n_live);
    }
#endif
    workgroupBarrier();

    // 3. Probabilities relative to the head's max over the split (unseen keys: exp(-huge) = 0,
    // unread); every invocation of a head reads the same scores, which workgroup memory serves
    // to all of them at once.
    for (var n = 0u; n < (HPW * SPLIT + WG - 1u) / WG; n++) {
        let i = n * WG + lid;
        if (i >= HPW * SPLIT) {
            break;
        }
        let head = i - i % SPLIT;
        var m = NEG_BIG;
        for (var j = 0u; j < SPLIT; j++) {
            m = max(m, sc[head + j]);
        }
        prob[i] = exp(sc[i] - m);
        if (i == head) {
            head_max[i / SPLIT] = m;
        }
    }
    workgroupBarrier();

    // 4. o and l of every head's vec4 column c over keys part, part + PARTS, ..., each value
    // column loaded once for the HPW heads; then the parts are added up through workgroup
    // memory, a head at a time.
    var acc: array<vec4<f32>, HPW>;
    var l: array<f32, HPW>;
    if (part < PARTS) {
        // keys lo + part, + PARTS, ... below n_live, in a fixed number of trips (so the compiler
        // can unroll them and issue their loads together): a trip past n_live reads key lo
        // with weight 0, which adds exactly nothing
        for (var trip = 0u; trip < KEY_TRIPS; trip++) {
            let j = lo + part + trip * PARTS;
            let live = j < n_live;
            let key = select(lo, j, live);
            let v = v_load4((k0 + key) * SLOT + kv_off, c);
            for (var hh = 0u; hh < HPW; hh++) {
                let p = select(0.0, prob[hh * SPLIT + key], live);
                acc[hh] = fma(vec4<f32>(p), v, acc[hh]);
                l[hh] += p;
            }
        }
        if (c == 0u) {
            for (var hh = 0u; hh < HPW; hh++) {
                part_l[part * HPW + hh] = l[hh];
            }
        }
    }
    let rec0 = (t * N_SPLITS + wid.y) * N_HEADS + h0;   // record of head h0
    for (var hh = 0u; hh < HPW; hh++) {
        if (hh > 0u) {
            workgroupBarrier();   // the last head's parts read before part_o is written again
        }
        if (part < PARTS) {
            part_o[part * D4 + c] = acc[hh];
        }
        workgroupBarrier();
        if (lid < D4) {
            var o = vec4<f32>(0.0);
            var sum_l = 0.0;
            for (var pp = 0u; pp < PARTS; pp++) {
                o += part_o[pp * D4 + lid];
                sum_l += part_l[pp * HPW + hh];
            }
            let rec = (rec0 + hh) * REC;
            scratch[rec + 1u + lid] = o;
            if (lid == 0u) {
                scratch[rec] = vec4<f32>(head_max[hh], sum_l, 0.0, 0.0);
            }
        }
    }
}
