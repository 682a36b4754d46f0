// Raw GGUF rows as floats, a 16-element unit at a time (the units of quant_blocks.wgsl, which has
// the layouts):
//     unit_values(src, row_byte, u)[g] = elements group_elem(u, g) .. +3 of the row
// for the decode matvec (matvec.wgsl), the prefill matmul (matmul.wgsl: it stages whole units)
// and the embedding lookup (embed.wgsl). Defines: quant_blocks.wgsl's, and UNIT_WORDS.
//
// Index a Unit with constants only: a dynamically indexed array goes to local memory on
// NVIDIA (measured: 30% slower). Everything that depends on the type stays in the quant_*.wgsl
// files.
//
// The loads of a unit and its arithmetic, apart, for a caller that issues a unit's loads long
// before it needs its values (the prefill matmul fetches its next K slice while it multiplies
// the current one):
//     unit_words(src, row_byte, u) -> UnitWords    the unit's storage loads, nothing else
//     unit_decode(w, row_byte, u) -> Unit          its arithmetic, no loads
// unit_values(src, row_byte, u) is unit_decode(unit_words(src, row_byte, u), row_byte, u).
// The types with flag UNIT_WORDS (cera.gpu.quant.weight_flags) define the two; for the
// others unit_words is unit_values itself (their loads are used as soon as they are made).
#include "quant_blocks.wgsl"

alias Unit = array<vec4<f32>, 4>;

// A unit as affine maps of exact floats, for the decode matvec's factored dot (unit_affine:
// Q4_K, cera.gpu.quant.UNIT_AFFINE_TYPES; flag UNIT_AFFINE): element c of group g is
// a[g / 2] * f[g][c] + b[g / 2], the groups of a pair (0-1, 2-3) being 8 consecutive elements,
// group_elem(u, 2p) a multiple of 8. The f are small integers in the mantissa of 1.0 (1 + n/16),
// so a dot with x needs no conversion or scaling per element:
// dot(unit, x) = a . (f . x) + b . (the pairs' sums of x).
struct UnitAffine {
    f: Unit,
    a: vec2<f32>,
    b: vec2<f32>,
}

// Words 2k, 2k+1 of a quad (k 0 or 1).
fn quad_pair(q: vec4<u32>, k: u32) -> vec2<u32> {
    return select(q.xy, q.zw, k != 0u);
}

// The low (high: hi_nibbles_f) nibbles n of a word's 4 bytes as the exact floats 1 + n/16: n
// moved into the top mantissa bits of 1.0 (a shift and a mask each, no subtraction).
fn lo_nibbles_f(q: u32) -> vec4<f32> {
    let at = vec4<u32>(q << 19u, q << 11u, q << 3u, q >> 5u) & vec4<u32>(0x780000u);
    return bitcast<vec4<f32>>(at | vec4<u32>(0x3F800000u));
}

fn hi_nibbles_f(q: u32) -> vec4<f32> {
    let at = vec4<u32>(q << 15u, q << 7u, q >> 1u, q >> 9u) & vec4<u32>(0x780000u);
    return bitcast<vec4<f32>>(at | vec4<u32>(0x3F800000u));
}

// The four bytes of a word, low to high, and their nibbles.
fn bytes4(q: u32) -> vec4<u32> {
    return (vec4<u32>(q) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFFu);
}

fn lo_nibbles(q: u32) -> vec4<u32> {
    return (vec4<u32>(q) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFu);
}

fn hi_nibbles(q: u32) -> vec4<u32> {
    return (vec4<u32>(q) >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(0xFu);
}

// Small integers (< 2^23) to f32 minus `bias`, exactly, without a conversion instruction
// (those run at a quarter of the FMA rate on NVIDIA): 2^23 + v has v in its mantissa.
fn to_f32(v: vec4<u32>, bias: f32) -> vec4<f32> {
    return bitcast<vec4<f32>>(v | vec4<u32>(0x4B000000u)) - (8388608.0 + bias);
}

// The four bytes of a word as signed int8, as f32 (offset by 128 to unsigned, then back).
fn i8x4(q: u32) -> vec4<f32> {
    return to_f32(bytes4(q ^ 0x80808080u), 128.0);
}

// Bits b, b+1, b+2, b+3 of a word, each as 0 or 1.
fn bits4(q: u32, b: u32) -> vec4<u32> {
    return (vec4<u32>(q) >> (vec4<u32>(b) + vec4<u32>(0u, 1u, 2u, 3u))) & vec4<u32>(1u);
}

// Q4_K / Q5_K: the scales d and mins m of unit u's two sub-blocks (its low nibbles' 2j, its high
// nibbles' 2j+1) from its block's first quad (d, dmin | 12 scale bytes)
struct SubScales {
    d: vec2<f32>,
    m: vec2<f32>,
}

fn sub_scales_k(head: vec4<u32>, u: u32) -> SubScales {
    let j = (u % 16u) / 4u;
    let dd = unpack2x16float(head.x);
    let sm_lo = vec2<f32>(scale_min_k4(2u * j, head.y, head.z, head.w));
    let sm_hi = vec2<f32>(scale_min_k4(2u * j + 1u, head.y, head.z, head.w));
    return SubScales(dd.x * vec2<f32>(sm_lo.x, sm_hi.x), dd.y * vec2<f32>(sm_lo.y, sm_hi.y));
}

// The field at bit `shift` of each byte of a word, `mask` wide (Q2_K, Q3_K: 2-bit quants and
// the 3rd bits of 8 groups packed in one byte).
fn byte_bits(q: u32, shift: u32, mask: u32) -> vec4<u32> {
    return (vec4<u32>(q) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(shift))) & vec4<u32>(mask);
}

// IQ4_NL / IQ4_XS: the 16 non-uniform levels a 4-bit index selects (ggml's kvalues_iq4nl).
// A `var<private>` never written, not a `const`: naga copies a dynamically indexed `const`
// array into a local variable at every access.
var<private> IQ4_LEVELS: array<f32, 16> = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0,
                                                        -22.0, -10.0, 1.0, 13.0, 25.0, 38.0, 53.0, 69.0,
                                                        89.0, 113.0);

fn iq4_levels(q: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(IQ4_LEVELS[q.x], IQ4_LEVELS[q.y], IQ4_LEVELS[q.z], IQ4_LEVELS[q.w]);
}

// IQ2 / IQ3: grid points (shaders/iq*_grid.wgsl: grid_entry(i), 8 or 4 packed level indices)
// with sign bits. The sign bits of 8 values from 7 stored ones: the 8th makes their count even.
fn iq_signs(s: u32) -> u32 {
    return s | ((countOneBits(s) & 1u) << 7u);
}

// v with the sign flipped where bits b .. b+3 of s are set
fn signed4(v: vec4<f32>, s: u32, b: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(bitcast<vec4<u32>>(v) ^ (bits4(s, b) << vec4<u32>(31u)));
}

// Level indices j .. j+3 of a grid entry, `bits` wide each
fn grid_indices(e: u32, j: u32, bits: u32) -> vec4<u32> {
    return (vec4<u32>(e) >> ((vec4<u32>(j) + vec4<u32>(0u, 1u, 2u, 3u)) * bits)) & vec4<u32>((1u << bits) - 1u);
}

// Values j .. j+3 of an IQ2 grid point: levels 8, 25, 43
fn iq2_levels(e: u32, j: u32) -> vec4<f32> {
    let c = grid_indices(e, j, 2u);
    return to_f32(8u + 17u * c + c / 2u, 0.0);
}

// An IQ2 unit: the 8 values of grid points e0 then e1, times d * (0.5 + sc) / 4 (sc its 4-bit
// scale), signed by the low 8 bits of s0 and of s1
fn iq2_unit(d: f32, sc: u32, e0: u32, s0: u32, e1: u32, s1: u32) -> Unit {
    let db = d * (0.5 + f32(sc)) * 0.25;
    return Unit(signed4(db * iq2_levels(e0, 0u), s0, 0u), signed4(db * iq2_levels(e0, 4u), s0, 4u),
                signed4(db * iq2_levels(e1, 0u), s1, 0u), signed4(db * iq2_levels(e1, 4u), s1, 4u));
}

// ---- the types ---------------------------------------------------------------------
// Each section defines unit_values() (or unit_words() and unit_decode()).

#ifdef Q4_0
alias UnitWords = array<vec2<u32>, 3>;   // words_at d, q0, q1

fn unit_bytes(row_byte: u32, u: u32) -> vec3<u32> {   // where d, q0, q1 are
    let blk = row_byte + (u / 2u) * BLOCK_BYTES;
    return vec3<u32>(blk, blk + 2u + (u % 2u) * 8u, blk + 6u + (u % 2u) * 8u);
}

fn unit_words(src: u32, row_byte: u32, u: u32) -> UnitWords {
    let at = unit_bytes(row_byte, u);
    return UnitWords(words_at(src, at.x), words_at(src, at.y), words_at(src, at.z));
}

fn unit_decode(w: UnitWords, row_byte: u32, u: u32) -> Unit {
    let at = unit_bytes(row_byte, u);
    let d = half_at(w[0].x, at.x);
    let q0 = joined(w[1], at.y);
    let q1 = joined(w[2], at.z);
    return Unit(d * to_f32(lo_nibbles(q0), 8.0), d * to_f32(lo_nibbles(q1), 8.0),
                d * to_f32(hi_nibbles(q0), 8.0), d * to_f32(hi_nibbles(q1), 8.0));
}
#endif

#ifdef Q4_1
alias UnitWords = vec3<u32>;   // words d|m, q0, q1 (20-byte blocks: whole words)

fn unit_words(src: u32, row_byte: u32, u: u32) -> UnitWords {
    let word = (row_byte + (u / 2u) * BLOCK_BYTES) >> 2u;
    return UnitWords(wword(src, word), wword(src, word + 1u + (u % 2u) * 2u), wword(src, word + 2u + (u % 2u) * 2u));
}

fn unit_decode(w: UnitWords, row_byte: u32, u: u32) -> Unit {
    let dm = unpack2x16float(w.x);
    return Unit(dm.x * to_f32(lo_nibbles(w.y), 0.0) + dm.y, dm.x * to_f32(lo_nibbles(w.z), 0.0) + dm.y,
                dm.x * to_f32(hi_nibbles(w.y), 0.0) + dm.y, dm.x * to_f32(hi_nibbles(w.z), 0.0) + dm.y);
}
#endif

#ifdef Q5_0
fn unit_values(src: u32, row_byte: u32, u: u32) -> Unit {
    let blk = row_byte + (u / 2u) * BLOCK_BYTES;
    let e = (u % 2u) * 8u;   // first element (low nibbles)
    let d = load_f16(src, blk);
    let qh = load_u32(src, blk + 2u);
    let q0 = load_u32(src, blk + 6u + e);
    let q1 = load_u32(src, blk + 10u + e);
    return Unit(d * to_f32(lo_nibbles(q0) | (bits4(qh, e) << vec4<u32>(4u)), 16.0),
                d * to_f32(lo_nibbles(q1) | (bits4(qh, e + 4u) << vec4<u32>(4u)), 16.0),
                d * to_f32(hi_nibbles(q0) | (bits4(qh, e + 16u) << vec4<u32>(4u)), 16.0),
                d * to_f32(hi_nibbles(q1) | (bits4(qh, e + 20u) << vec4<u32>(4u)), 16.0));
}
#endif

#ifdef Q5_1
fn unit_values(src: u32, row_byte: u32, u: u32) -> Unit {
    let word = (row_byte + (u / 2u) * BLOCK_BYTES) >> 2u;
    let e = (u % 2u) * 8u;
    let dm = unpack2x16float(wword(src, word));
    let qh = wword(src, word + 1u);
    let q0 = wword(src, word + 2u + e / 4u);
    let q1 = wword(src, word + 3u + e / 4u);
    return Unit(dm.x * to_f32(lo_nibbles(q0) | (bits4(qh, e) << vec4<u32>(4u)), 0.0) + dm.y,
                dm.x * to_f32(lo_nibbles(q1) | (bits4(qh, e + 4u) << vec4<u32>(4u)), 0.0) + dm.y,
                dm.x * to_f32(hi_nibbles(q0) | (bits4(qh, e + 16u) << vec4<u32>(4u)), 0.0) + dm.y,
                dm.x * to_f32(hi_nibbles(q1) | (bits4(qh, e + 20u) << vec4<u32>(4u)), 0.0) + dm.y);
}
#endif

#ifdef Q8_0
alias UnitWords = array<vec2<u32>, 5>;   // words_at d, then the unit's 4 quant words

fn unit_bytes(row_byte: u32, u: u32) -> vec2<u32> {   // where d and the unit's 16 quants are
    let blk = row_byte + (u / 2u) * BLOCK_BYTES;
    return vec2<u32>(blk, blk + 2u + (u % 2u) * 16u);
}

fn unit_words(src: u32, row_byte: u32, u: u32) -> UnitWords {
    let at = unit_bytes(row_byte, u);
    return UnitWords(words_at(src, at.x), words_at(src, at.y), words_at(src, at.y + 4u),
                     words_at(src, at.y + 8u), words_at(src, at.y + 12u));
}

fn unit_decode(w: UnitWords, row_byte: u32, u: u32) -> Unit {
    let at = unit_bytes(row_byte, u);
    let d = half_at(w[0].x, at.x);
    return Unit(d * i8x4(joined(w[1], at.y)), d * i8x4(joined(w[2], at.y + 4u)),
                d * i8x4(joined(w[3], at.y + 8u)), d * i8x4(joined(w[4], at.y + 12u)));
}
#endif

#ifdef Q2_K
// Group of 4 quants at `shift` of word q, scaled by the scale/min byte `sm`
fn q2_group(q: u32, shift: u32, sm: u32, dm: vec2<f32>) -> vec4<f32> {
    return dm.x * f32(sm & 15u) * to_f32(byte_bits(q, shift, 3u), 0.0) - dm.y * f32(sm >> 4u);
}

fn unit_values(src: u32, row_byte: u32, u: u32) -> Unit {
    let word = (row_byte + (u / 16u) * BLOCK_BYTES) >> 2u;
    let h = (u % 16u) / 8u;
    let i = u % 8u;
    let sc0 = wword(src, word + 2u * h);        // scales[8h .. 8h+3]
    let sc1 = wword(src, word + 2u * h + 1u);   // scales[8h+4 .. 8h+7]
    let q = wword(src, word + 4u + 8u * h + i);
    let dm = unpack2x16float(wword(src, word + 20u));   // d, dmin
    let sh = 8u * (i / 4u);
    return Unit(q2_group(q, 0u, (sc0 >> sh) & 0xFFu, dm), q2_group(q, 2u, (sc0 >> (sh + 16u)) & 0xFFu, dm),
                q2_group(q, 4u, (sc1 >> sh) & 0xFFu, dm), q2_group(q, 6u, (sc1 >> (sh + 16u)) & 0xFFu, dm));
}
#endif

#ifdef Q3_K
// Scale j (0..15) from the packed bytes s0 (0-3), s1 (4-7), s2 (8-11): its low 4 bits are
// nibble j/8 of byte j%8, its high 2 bits bits 2(j/4), +1 of byte 8 + j%4.
fn q3_scale(j: u32, s0: u32, s1: u32, s2: u32) -> f32 {
    let lo = (select(s0, s1, (j & 4u) != 0u) >> (8u * (j % 4u) + 4u * (j / 8u))) & 15u;
    let hi = (s2 >> (8u * (j % 4u) + 2u * (j / 4u))) & 3u;
    return f32(lo | (hi << 4u)) - 32.0;
}

fn q3_group(q: u32, hm: u32, s: u32, ds: f32) -> vec4<f32> {
    return ds * to_f32(byte_bits(q, 2u * s, 3u) | (byte_bits(hm, s, 1u) << vec4<u32>(2u)), 4.0);
}

fn unit_values(src: u32, row_byte: u32, u: u32) -> Unit {
    let blk = row_byte + (u / 16u) * BLOCK_BYTES;
    let h = (u % 16u) / 8u;
    let i = u % 8u;
    let hm = load_u32(src, blk + 4u * i) >> (4u * h);   // bit s of each byte: the 3rd bit of group s
    let q = load_u32(src, blk + 32u + 32u * h + 4u * i);
    let s0 = load_u32(src, blk + 96u);
    let s1 = load_u32(src, blk + 100u);
    let s2 = load_u32(src, blk + 104u);
    let d = load_f16(src, blk + 108u);
    let j = 8u * h + i / 4u;   // the sub-block of group 0; group s is in j + 2s
    return Unit(q3_group(q, hm, 0u, d * q3_scale(j, s0, s1, s2)),
                q3_group(q, hm, 1u, d * q3_scale(j + 2u, s0, s1, s2)),
                q3_group(q, hm, 2u, d * q3_scale(j + 4u, s0, s1, s2)),
                q3_group(q, hm, 3u, d * q3_scale(j + 6u, s0, s1, s2)));
}
#endif

#ifdef Q4_K
// A unit's words: its block's first quad (d, dmin | 12 scale bytes), then the quad holding
// its 8 quant bytes (144-byte blocks: whole quads).
alias UnitWords = array<vec4<u32>, 2>;

fn unit_words(src: u32, row_byte: u32, u: u32) -> UnitWords {
    let quad = (row_byte + (u / 16u) * BLOCK_BYTES) >> 4u;
    return UnitWords(wquad(src, quad), wquad(src, quad + 1u + 2u * ((u % 16u) / 4u) + (u % 4u) / 2u));
}

fn unit_decode(w: UnitWords, row_byte: u32, u: u32) -> Unit {
    let s = sub_scales_k(w[0], u);
    let q = quad_pair(w[1], u % 2u);
    return Unit(s.d.x * to_f32(lo_nibbles(q.x), 0.0) - s.m.x, s.d.x * to_f32(lo_nibbles(q.y), 0.0) - s.m.x,
                s.d.y * to_f32(hi_nibbles(q.x), 0.0) - s.m.y, s.d.y * to_f32(hi_nibbles(q.y), 0.0) - s.m.y);
}

// x = d n - m = 16 d * f - (16 d + m) for f = 1 + n/16 (unit_affine)
fn unit_affine(src: u32, row_byte: u32, u: u32) -> UnitAffine {
    let w = unit_words(src, row_byte, u);
    let s = sub_scales_k(w[0], u);
    let q = quad_pair(w[1], u % 2u);
    let a = 16.0 * s.d;
    return UnitAffine(Unit(lo_nibbles_f(q.x), lo_nibbles_f(q.y), hi_nibbles_f(q.x), hi_nibbles_f(q.y)),
                      a, -(a + s.m));
}
#endif

#ifdef Q5_K
fn qh_bits(h: u32, bit: u32) -> vec4<u32> {
    return ((vec4<u32>(h) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(bit))) & vec4<u32>(1u)) << vec4<u32>(4u);
}

// A unit's words: its block's first quad (d, dmin | 12 scale bytes), the quad holding its 8
// qh bytes, the quad holding its 8 quant bytes (176-byte blocks: whole quads).
alias UnitWords = array<vec4<u32>, 3>;

fn unit_words(src: u32, row_byte: u32, u: u32) -> UnitWords {
    let quad = (row_byte + (u / 16u) * BLOCK_BYTES) >> 4u;
    let i = u % 4u;
    return UnitWords(wquad(src, quad), wquad(src, quad + 1u + i / 2u),
                     wquad(src, quad + 3u + 2u * ((u % 16u) / 4u) + i / 2u));
}

fn unit_decode(w: UnitWords, row_byte: u32, u: u32) -> Unit {
    let j = (u % 16u) / 4u;
    let s = sub_scales_k(w[0], u);
    let h = quad_pair(w[1], u % 2u);
    let q = quad_pair(w[2], u % 2u);
    return Unit(s.d.x * to_f32(lo_nibbles(q.x) | qh_bits(h.x, 2u * j), 0.0) - s.m.x,
                s.d.x * to_f32(lo_nibbles(q.y) | qh_bits(h.y, 2u * j), 0.0) - s.m.x,
                s.d.y * to_f32(hi_nibbles(q.x) | qh_bits(h.x, 2u * j + 1u), 0.0) - s.m.y,
                s.d.y * to_f32(hi_nibbles(q.y) | qh_bits(h.y, 2u * j + 1u), 0.0) - s.m.y);
}
#endif

#ifdef Q6_K
fn i8_of(w: u32, k: u32) -> f32 {
    return f32(i8_at(w, k));
}

fn q6_high(h: u32, shift: u32) -> vec4<u32> {
    return ((vec4<u32>(h) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(shift))) & vec4<u32>(3u)) << vec4<u32>(4u);
}

alias UnitWords = array<vec2<u32>, 6>;   // words_at qa, qb, qh, sc0, sc1, d

fn unit_words(src: u32, row_byte: u32, u: u32) -> UnitWords {
    let at = unit_bytes(row_byte, u);
    return UnitWords(words_at(src, at[0]), words_at(src, at[1]), words_at(src, at[2]),
                     words_at(src, at[3]), words_at(src, at[4]), words_at(src, at[5]));
}

// A unit's fields from its words (no loads)
struct Q6Fields {
    qa: u32,
    qb: u32,
    qh: u32,
    sc0: u32,
    sc1: u32,
    d: f32,
}

fn q6_fields(w: UnitWords, row_byte: u32, u: u32) -> Q6Fields {
    let at = unit_bytes(row_byte, u);
    return Q6Fields(joined(w[0], at[0]), joined(w[1], at[1]), joined(w[2], at[2]), joined(w[3], at[3]),
                    joined(w[4], at[4]), half_at(w[5].x, at[5]));
}

fn unit_decode(w: UnitWords, row_byte: u32, u: u32) -> Unit {
    let f = q6_fields(w, row_byte, u);
    let is = (u % 8u) / 4u;
    return Unit(f.d * i8_of(f.sc0, is) * to_f32(lo_nibbles(f.qa) | q6_high(f.qh, 0u), 32.0),
                f.d * i8_of(f.sc0, is + 2u) * to_f32(lo_nibbles(f.qb) | q6_high(f.qh, 2u), 32.0),
                f.d * i8_of(f.sc1, is) * to_f32(hi_nibbles(f.qa) | q6_high(f.qh, 4u), 32.0),
                f.d * i8_of(f.sc1, is + 2u) * to_f32(hi_nibbles(f.qb) | q6_high(f.qh, 6u), 32.0));
}
#endif

#ifdef IQ4_NL
fn unit_values(src: u32, row_byte: u32, u: u32) -> Unit {
    let blk = row_byte + (u / 2u) * BLOCK_BYTES;
    let d = load_f16(src, blk);
    let q0 = load_u32(src, blk + 2u + (u % 2u) * 8u);
    let q1 = load_u32(src, blk + 6u + (u % 2u) * 8u);
    return Unit(d * iq4_levels(lo_nibbles(q0)), d * iq4_levels(lo_nibbles(q1)),
                d * iq4_levels(hi_nibbles(q0)), d * iq4_levels(hi_nibbles(q1)));
}
#endif

#ifdef IQ4_XS
fn unit_values(src: u32, row_byte: u32, u: u32) -> Unit {
    let word = (row_byte + (u / 16u) * BLOCK_BYTES) >> 2u;
    let b = (u % 16u) / 2u;
    let dh = wword(src, word);   // d | scales_h
    let lo = (wword(src, word + 1u) >> (4u * b)) & 15u;
    let hi = (dh >> (16u + 2u * b)) & 3u;
    let ds = unpack2x16float(dh).x * (f32(lo | (hi << 4u)) - 32.0);
    let q0 = wword(src, word + 2u + 4u * b + 2u * (u % 2u));
    let q1 = wword(src, word + 3u + 4u * b + 2u * (u % 2u));
    return Unit(ds * iq4_levels(lo_nibbles(q0)), ds * iq4_levels(lo_nibbles(q1)),
                ds * iq4_levels(hi_nibbles(q0)), ds * iq4_levels(hi_nibbles(q1)));
}
#endif

#ifdef IQ2_XXS
#include "iq2xxs_grid.wgsl"

fn unit_values(src: u32, row_byte: u32, u: u32) -> Unit {
    let blk = row_byte + (u / 16u) * BLOCK_BYTES;
    let b = (u % 16u) / 2u;
    let h = u % 2u;
    let idx = load_u32(src, blk + 2u + 8u * b) >> (16u * h);
    let w = load_u32(src, blk + 6u + 8u * b);
    let p0 = grid_entry(idx & 0xFFu);
    let p1 = grid_entry((idx >> 8u) & 0xFFu);
    let s0 = iq_signs((w >> (14u * h)) & 127u);
    let s1 = iq_signs((w >> (14u * h + 7u)) & 127u);
    return iq2_unit(load_f16(src, blk), w >> 28u, p0, s0, p1, s1);
}
#endif

#ifdef IQ2_XS
#include "iq2xs_grid.wgsl"

fn unit_values(src: u32, row_byte: u32, u: u32) -> Unit {
    let blk = row_byte + (u / 16u) * BLOCK_BYTES;
    let t = u % 16u;
    let qs = load_u32(src, blk + 2u + 4u * t);   // points 2t (low half), 2t+1
    let sc = (load_u32(src, blk + 66u + 4u * (t / 8u)) >> (4u * (t % 8u))) & 15u;
    let p0 = grid_entry(qs & 511u);
    let p1 = grid_entry((qs >> 16u) & 511u);
    let s0 = iq_signs((qs >> 9u) & 127u);
    let s1 = iq_signs(qs >> 25u);
    return iq2_unit(load_f16(src, blk), sc, p0, s0, p1, s1);
}
#endif

#ifdef IQ2_S
#include "iq2s_grid.wgsl"

fn unit_values(src: u32, row_byte: u32, u: u32) -> Unit {
    let blk = row_byte + (u / 16u) * BLOCK_BYTES;
    let t = u % 16u;
    let qs = load_u16(src, blk + 2u + 2u * t);
    let signs = load_u16(src, blk + 34u + 2u * t);
    let qh = load_u32(src, blk + 66u + 4u * (t / 8u)) >> (4u * (t % 8u));   // bits 0-1: point 2t, 2-3: 2t+1
    let sc = (load_u32(src, blk + 74u + 4u * (t / 8u)) >> (4u * (t % 8u))) & 15u;
    let p0 = grid_entry((qs & 0xFFu) | ((qh & 3u) << 8u));
    let p1 = grid_entry((qs >> 8u) | (((qh >> 2u) & 3u) << 8u));
    return iq2_unit(load_f16(src, blk), sc, p0, signs, p1, signs >> 8u);
}
#endif

#ifdef IQ3_XXS
#include "iq3xxs_grid.wgsl"

// The 4 values of a grid point: levels 4, 12, .., 52, 62
fn iq3xxs_point(idx: u32) -> vec4<f32> {
    let c = grid_indices(grid_entry(idx), 0u, 3u);
    return to_f32(4u + 8u * c + 2u * (c / 7u), 0.0);
}

fn unit_values(src: u32, row_byte: u32, u: u32) -> Unit {
    let blk = row_byte + (u / 16u) * BLOCK_BYTES;
    let b = (u % 16u) / 2u;
    let h = u % 2u;
    let idx = load_u32(src, blk + 2u + 8u * b + 4u * h);   // the 4 points' indices
    let w = load_u32(src, blk + 66u + 4u * b);
    let db = load_f16(src, blk) * (0.5 + f32(w >> 28u)) * 0.5;
    let s0 = iq_signs((w >> (14u * h)) & 127u);
    let s1 = iq_signs((w >> (14u * h + 7u)) & 127u);
    return Unit(signed4(db * iq3xxs_point(idx & 0xFFu), s0, 0u),
                signed4(db * iq3xxs_point((idx >> 8u) & 0xFFu), s0, 4u),
                signed4(db * iq3xxs_point((idx >> 16u) & 0xFFu), s1, 0u),
                signed4(db * iq3xxs_point(idx >> 24u), s1, 4u));
}
#endif

#ifdef IQ3_S
#include "iq3s_grid.wgsl"

// The 4 values of a grid point: levels 1, 3, .., 15
fn iq3s_point(idx: u32) -> vec4<f32> {
    return to_f32(1u + 2u * grid_indices(grid_entry(idx), 0u, 3u), 0.0);
}

fn unit_values(src: u32, row_byte: u32, u: u32) -> Unit {
    let blk = row_byte + (u / 16u) * BLOCK_BYTES;
    let b = (u % 16u) / 2u;
    let h = u % 2u;
    let idx = load_u32(src, blk + 2u + 8u * b + 4u * h);
    let qh = load_u32(src, blk + 66u + 4u * (b / 4u)) >> (8u * (b % 4u) + 4u * h);   // bit g: point 4h + g
    let signs = load_u16(src, blk + 74u + 4u * b + 2u * h);
    let sc = (load_u32(src, blk + 106u) >> (4u * b)) & 15u;
    let db = load_f16(src, blk) * f32(1u + 2u * sc);
    return Unit(signed4(db * iq3s_point((idx & 0xFFu) | ((qh & 1u) << 8u)), signs, 0u),
                signed4(db * iq3s_point(((idx >> 8u) & 0xFFu) | ((qh & 2u) << 7u)), signs, 4u),
                signed4(db * iq3s_point(((idx >> 16u) & 0xFFu) | ((qh & 4u) << 6u)), signs, 8u),
                signed4(db * iq3s_point((idx >> 24u) | ((qh & 8u) << 5u)), signs, 12u));
}
#endif

#ifdef F32
fn f32x4(src: u32, word: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(vec4<u32>(wword(src, word), wword(src, word + 1u), wword(src, word + 2u),
                                        wword(src, word + 3u)));
}

fn unit_values(src: u32, row_byte: u32, u: u32) -> Unit {
    let word = row_byte >> 2u;
    return Unit(f32x4(src, word + group_elem(u, 0u)), f32x4(src, word + group_elem(u, 1u)),
                f32x4(src, word + group_elem(u, 2u)), f32x4(src, word + group_elem(u, 3u)));
}
#endif

#ifdef F16
fn f16x4(src: u32, byte: u32) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(load_u32(src, byte)), unpack2x16float(load_u32(src, byte + 4u)));
}

fn unit_values(src: u32, row_byte: u32, u: u32) -> Unit {
    return Unit(f16x4(src, row_byte + 2u * group_elem(u, 0u)), f16x4(src, row_byte + 2u * group_elem(u, 1u)),
                f16x4(src, row_byte + 2u * group_elem(u, 2u)), f16x4(src, row_byte + 2u * group_elem(u, 3u)));
}
#endif

#ifdef BF16
fn bf16x4(src: u32, byte: u32) -> vec4<f32> {
    let a = load_u32(src, byte);
    let b = load_u32(src, byte + 4u);
    return bitcast<vec4<f32>>(vec4<u32>(a << 16u, a & 0xFFFF0000u, b << 16u, b & 0xFFFF0000u));
}

fn unit_values(src: u32, row_byte: u32, u: u32) -> Unit {
    return Unit(bf16x4(src, row_byte + 2u * group_elem(u, 0u)), bf16x4(src, row_byte + 2u * group_elem(u, 1u)),
                bf16x4(src, row_byte + 2u * group_elem(u, 2u)), bf16x4(src, row_byte + 2u * group_elem(u, 3u)));
}
#endif

#ifdef UNIT_WORDS
fn unit_values(src: u32, row_byte: u32, u: u32) -> Unit {
    return unit_decode(unit_words(src, row_byte, u), row_byte, u);
}
#else
alias UnitWords = Unit;

fn unit_words(src: u32, row_byte: u32, u: u32) -> UnitWords {
    return unit_values(src, row_byte, u);
}

fn unit_decode(w: UnitWords, row_byte: u32, u: u32) -> Unit {
    return w;
}
#endif
