// Dequantization of raw GGUF rows (ggml block layouts), read from `array<u32>` storage.
//
// Defines: one type flag (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ2_XXS IQ2_XS IQ2_S
// IQ3_XXS IQ3_S IQ4_NL IQ4_XS F16 BF16 F32) and K (elements per row, a multiple of the type's
// block size).
//
// The includer provides the weight fetches (weights.wgsl), so one shader can read two matrices
// of the same type (the gate and up projections of a GLU), bound as `array<WeightWords>`:
//     fn wword(src: u32, i: u32) -> u32            // word i of weight matrix `src`
//     fn wquad(src: u32, q: u32) -> vec4<u32>      // words 4q .. 4q+3
// With WEIGHT_QUADS (Q4_K, Q5_K: cera.gpu.quant.weight_flags) the binding holds vec4<u32> and
// the wider fetches are single loads.
//
// A row is cut into UNITS_PER_ROW "units" of 16 elements: the slice of a block one thread
// decodes at a time (half a 32-element block, a sixteenth of a 256-element one; four
// strided groups of a float row), adjacent units being adjacent bytes. A unit is 4 groups of 4 consecutive elements:
//     unit_values(src, row_byte, u)[g] = elements group_elem(u, g) .. +3 of the row
// Index a Unit with constants only: a dynamically indexed array goes to local memory on
// NVIDIA (measured: 30% slower). For the float types the last unit may run past K
// (ROW_TAIL): the includer masks elements >= K. Everything that depends on the type
// stays in this file.
//
// The loads of a unit and its arithmetic, apart, for a caller that issues a unit's loads long
// before it needs its values (the prefill matmul fetches its next K slice while it multiplies
// the current one):
//     unit_words(src, row_byte, u) -> UnitWords    the unit's storage loads, nothing else
//     unit_decode(w, row_byte, u) -> Unit          its arithmetic, no loads
// unit_values(src, row_byte, u) is unit_decode(unit_words(src, row_byte, u), row_byte, u).
// The types with flag UNIT_WORDS (cera.gpu.quant.weight_flags) define the two; for the
// others unit_words is unit_values itself (their loads are used as soon as they are made).

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

#ifdef WEIGHT_QUADS
alias WeightWords = vec4<u32>;
#else
alias WeightWords = u32;
#endif

// ---- byte helpers ------------------------------------------------------------------
// Rows of 18-, 22-, 34-, 66-, 74-, 82-, 98-, 110- and 210-byte blocks (and f16 rows of odd
// length) start at 2-byte boundaries, so every field read here is at an even byte offset.

// 4 bytes at an even byte offset: the word(s) holding them (words_at: the second only where
// rows may be unaligned), joined (joined: no loads).
fn words_at(src: u32, byte: u32) -> vec2<u32> {
    let i = byte >> 2u;
    if (WORD_ALIGNED) {
        return vec2<u32>(wword(src, i), 0u);
    }
    return vec2<u32>(wword(src, i), wword(src, i + 1u));
}

fn joined(w: vec2<u32>, byte: u32) -> u32 {
    if (WORD_ALIGNED) {
        return w.x;
    }
    return select((w.x >> 16u) | (w.y << 16u), w.x, (byte & 2u) == 0u);
}

fn load_u32(src: u32, byte: u32) -> u32 {
    return joined(words_at(src, byte), byte);
}

// 16 bytes at an even byte offset, as 4 words: 4 word loads, or 5 where rows may be unaligned.
fn span16(src: u32, byte: u32) -> vec4<u32> {
    let i = byte >> 2u;
    let a = vec4<u32>(wword(src, i), wword(src, i + 1u), wword(src, i + 2u), wword(src, i + 3u));
    if (WORD_ALIGNED) {
        return a;
    }
    let b = vec4<u32>(a.yzw, wword(src, i + 4u));
    return select((a >> vec4<u32>(16u)) | (b << vec4<u32>(16u)), a, (byte & 2u) == 0u);
}

// 2 bytes at an even byte offset, in the low half.
fn load_u16(src: u32, byte: u32) -> u32 {
    return (wword(src, byte >> 2u) >> ((byte & 2u) * 8u)) & 0xFFFFu;
}

// The f16 at an even byte offset, from the word holding it (half_at: no loads).
fn half_at(word: u32, byte: u32) -> f32 {
    return unpack2x16float(word >> ((byte & 2u) * 8u)).x;
}

fn load_f16(src: u32, byte: u32) -> f32 {
    return half_at(wword(src, byte >> 2u), byte);
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

// Q4_K / Q5_K: scale and min of sub-block `is` (0..7) from the 12 packed scale bytes
// s0 (bytes 0-3), s1 (4-7), s2 (8-11): 6 bits each, sub-blocks 4-7 split across bytes.
fn scale_min_k4(is: u32, s0: u32, s1: u32, s2: u32) -> vec2<u32> {
    let sh = (is & 3u) * 8u;
    let b0 = (s0 >> sh) & 0xFFu;
    let b1 = (s1 >> sh) & 0xFFu;
    let b2 = (s2 >> sh) & 0xFFu;
    if (is < 4u) {
        return vec2<u32>(b0 & 63u, b1 & 63u);
    }
    return vec2<u32>((b2 & 0xFu) | ((b0 >> 6u) << 4u), (b2 >> 4u) | ((b1 >> 6u) << 4u));
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

#ifdef X_INT
// ---- dot products with x in integers (matvec.wgsl X_INT) -----------------------------------
// The includer stages x per 256-element block b as a step xd[b] and integers q = round(x / xd[b])
// in X_PLANES signed bytes each (8 bits as llama.cpp's CPU backend quantizes the activations of
// its k-quant dot products (Q8_K), or 24); xq[p * K / 16 + g] holds byte p of the q of
// elements 16g .. 16g+15 (four to a word, low byte first) and xsum[g] their sum. A type with
// X_INT support (cera.gpu.quant.X_INT_TYPES) defines
//     fn item_dot_int(src, row_byte, p) -> f32     dot(W[row, item p], x as staged)
// over its items of ITEM_UNITS units (ITEM_UNITS * 16 elements; the define comes from
// cera.gpu.quant.X_INT_ITEM_UNITS)
// with every product of quants an exact integer (dot4I8Packed: four 8-bit products a call),
// summed per plane in integers and across planes in f32.

// Plane p of x's group g (elements 16g .. 16g+15)
fn x_group(p: u32, g: u32) -> vec4<u32> {
    return xq[p * (K / 16u) + g];
}

// The dot of 16 packed signed bytes (four words) with plane p of x's group g
fn dot16_int(w: vec4<u32>, g: u32, p: u32) -> i32 {
    let x = x_group(p, g);
    return dot4I8Packed(w.x, x.x) + dot4I8Packed(w.y, x.y) + dot4I8Packed(w.z, x.z) + dot4I8Packed(w.w, x.w);
}

// plane p's integer sum as its share of the whole: 256^p * sum
fn plane_value(sum: i32, p: u32) -> f32 {
    return ldexp(f32(sum), i32(8u * p));
}
#endif

#ifdef TILE_INT
// ---- 32-element sub-blocks in integers (matmul_int.wgsl) --------------------------------
// Sub-block j of a row, elements 32j .. 32j+31 (within one 256-element block), as signed 8-bit
// quants: element 32j + 16h + 4c + i is byte i of q[h][c], and its weight is
// d.x * sc[h] * q - d.y * m. A type with TILE_INT support (cera.gpu.quant.INT_TILE_TYPES)
// defines, its loads apart from its arithmetic (as unit_words / unit_decode):
//     const SUB_SCALES   1: one scale for the sub-block (sc.x == sc.y), 2: one per 16 elements
//     alias SubWords
//     fn sub_words(src, row_byte, j) -> SubWords
//     fn sub_decode(w: SubWords, j) -> SubInt
struct SubInt {
    q: array<vec4<u32>, 2>,
    sc: vec2<i32>,
    m: i32,
    d: vec2<f32>,
}
#endif

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

// ---- the types ---------------------------------------------------------------------
// Each section defines the block geometry, unit_values() and group_elem().

// 32-element blocks: unit i (0, 1) of a block takes qs[8i .. 8i+7] (words q0, q1); for the
// 4-bit types their low nibbles are elements 8i.. (g 0, 1), the high ones 16+8i.. (g 2, 3).
#ifdef Q4_0
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 18u;   // d: f16 | qs: 16 bytes (element j: low nibble of qs[j]; j+16: high nibble)

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

fn group_elem(u: u32, g: u32) -> u32 {
    return (u / 2u) * 32u + (u % 2u) * 8u + (g & 1u) * 4u + (g >> 1u) * 16u;
}
#endif

#ifdef Q4_1
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 20u;   // d: f16 | m: f16 | qs: 16 bytes; x = d * q + m

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

fn group_elem(u: u32, g: u32) -> u32 {
    return (u / 2u) * 32u + (u % 2u) * 8u + (g & 1u) * 4u + (g >> 1u) * 16u;
}
#endif

#ifdef Q5_0
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 22u;   // d: f16 | qh: 32 bits (bit j: 5th bit of element j) | qs: 16 bytes; x = d * (q - 16)

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

fn group_elem(u: u32, g: u32) -> u32 {
    return (u / 2u) * 32u + (u % 2u) * 8u + (g & 1u) * 4u + (g >> 1u) * 16u;
}
#endif

#ifdef Q5_1
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 24u;   // d: f16 | m: f16 | qh: 32 bits | qs: 16 bytes; x = d * q + m

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

fn group_elem(u: u32, g: u32) -> u32 {
    return (u / 2u) * 32u + (u % 2u) * 8u + (g & 1u) * 4u + (g >> 1u) * 16u;
}
#endif

#ifdef Q8_0
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 34u;   // d: f16 | qs: 32 x i8; x = d * q

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

fn group_elem(u: u32, g: u32) -> u32 {
    return u * 16u + g * 4u;
}
#endif

#ifdef Q2_K
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 84u;   // scales: 16 bytes | qs: 64 bytes | d: f16 | dmin: f16
// Half h (0, 1) of 128 elements, l in 0..31: bits 2s, 2s+1 of qs[32h + l] give element
// 128h + 32s + l, of sub-block j = 8h + 2s + l/16 (16 elements); x = d * sc * q - dmin * m
// with sc, m the low and high nibble of scales[j]. Unit (h, i): l = 4i .. 4i+3.

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

fn group_elem(u: u32, g: u32) -> u32 {
    return (u / 16u) * 256u + ((u % 16u) / 8u) * 128u + (u % 8u) * 4u + g * 32u;
}
#endif

#ifdef Q3_K
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 110u;  // hmask: 32 bytes | qs: 64 bytes | scales: 12 bytes | d: f16
// The 2-bit quants of Q2_K (qs at byte 32), plus a 3rd bit: bit 4h + s of hmask[l], which
// when clear subtracts 4; x = d * (sc - 32) * q with sc the 6-bit scale of sub-block j.

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

fn group_elem(u: u32, g: u32) -> u32 {
    return (u / 16u) * 256u + ((u % 16u) / 8u) * 128u + (u % 8u) * 4u + g * 32u;
}
#endif

#ifdef Q4_K
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 144u;  // d: f16 | dmin: f16 | scales: 12 bytes | qs: 128 bytes
// Chunk j (0..3) of 64 elements: qs[32j + l] holds element 64j + l (low nibble, sub-block
// 2j) and 64j + 32 + l (high nibble, sub-block 2j+1); x = d * sc * q - dmin * m.
// Unit (j, i): qs[32j + 8i .. +7].

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

fn group_elem(u: u32, g: u32) -> u32 {
    return (u / 16u) * 256u + ((u % 16u) / 4u) * 64u + (u % 4u) * 8u + (g & 1u) * 4u + (g >> 1u) * 32u;
}
#ifdef X_INT

// Item p: quant quad k = p % 8 of block p / 8, 16 low nibbles (sub-block 2j, j = k / 2, x's
// group 4j + k % 2 of the block) and their 16 high nibbles (sub-block 2j + 1, group + 2). As
// llama.cpp's: d * sum(sc * q.x) - dmin * sum(m * sum(x)), in integers but for d and dmin.
fn item_dot_int(src: u32, row_byte: u32, p: u32) -> f32 {
    let blk = p / 8u;
    let quad = (row_byte + blk * BLOCK_BYTES) >> 4u;
    let head = wquad(src, quad);
    let q = wquad(src, quad + 1u + p % 8u);
    let j = (p % 8u) / 2u;
    let g = blk * 16u + 4u * j + p % 2u;
    let sm_lo = vec2<i32>(scale_min_k4(2u * j, head.y, head.z, head.w));
    let sm_hi = vec2<i32>(scale_min_k4(2u * j + 1u, head.y, head.z, head.w));
    let nibbles = vec4<u32>(0x0F0F0F0Fu);
    let lo = q & nibbles;
    let hi = (q >> vec4<u32>(4u)) & nibbles;
    var qs = 0.0;
    for (var plane = 0u; plane < X_PLANES; plane++) {
        qs += plane_value(sm_lo.x * dot16_int(lo, g, plane) + sm_hi.x * dot16_int(hi, g + 2u, plane), plane);
    }
    let mins = f32(sm_lo.y) * f32(xsum[g]) + f32(sm_hi.y) * f32(xsum[g + 2u]);
    let dd = unpack2x16float(head.x);
    return xd[blk] * (dd.x * qs - dd.y * mins);
}
#endif
#ifdef TILE_INT

// Sub-block j: s = j % 8 of its block, the low (s even) or high nibbles of qs[32 (s / 2) ..], two
// quads; its block's first quad for d, dmin and the scales.
const SUB_SCALES = 1u;
alias SubWords = array<vec4<u32>, 3>;

fn sub_words(src: u32, row_byte: u32, j: u32) -> SubWords {
    let quad = (row_byte + (j / 8u) * BLOCK_BYTES) >> 4u;
    let chunk = quad + 1u + 2u * ((j % 8u) / 2u);
    return SubWords(wquad(src, quad), wquad(src, chunk), wquad(src, chunk + 1u));
}

fn sub_decode(w: SubWords, j: u32) -> SubInt {
    let s = j % 8u;
    let shift = vec4<u32>(4u * (s % 2u));
    let nibbles = vec4<u32>(0x0F0F0F0Fu);
    let sm = vec2<i32>(scale_min_k4(s, w[0].y, w[0].z, w[0].w));
    return SubInt(array<vec4<u32>, 2>((w[1] >> shift) & nibbles, (w[2] >> shift) & nibbles), vec2<i32>(sm.x),
                  sm.y, unpack2x16float(w[0].x));
}
#endif
#endif

#ifdef Q5_K
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 176u;  // d: f16 | dmin: f16 | scales: 12 bytes | qh: 32 bytes | qs: 128 bytes
// As Q4_K, plus a 5th bit per element: bit 2j (low) / 2j+1 (high) of qh[l].

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

fn group_elem(u: u32, g: u32) -> u32 {
    return (u / 16u) * 256u + ((u % 16u) / 4u) * 64u + (u % 4u) * 8u + (g & 1u) * 4u + (g >> 1u) * 32u;
}
#endif

#ifdef Q6_K
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 210u;  // ql: 128 bytes | qh: 64 bytes | scales: 16 x i8 | d: f16
// Half h (0, 1) of 128 elements, l in 0..31: ql[64h + l], ql[64h + 32 + l] and qh[32h + l]
// give elements 128h + l + {0, 32, 64, 96} (6 bits, minus 32), scaled by
// d * scales[8h + l/16 + {0, 2, 4, 6}]. Unit (h, i): l = 4i .. 4i+3.

// Byte k of w as a signed integer
fn i8_at(w: u32, k: u32) -> i32 {
    return bitcast<i32>(w << (24u - 8u * k)) >> 24u;
}

fn i8_of(w: u32, k: u32) -> f32 {
    return f32(i8_at(w, k));
}

fn q6_high(h: u32, shift: u32) -> vec4<u32> {
    return ((vec4<u32>(h) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(shift))) & vec4<u32>(3u)) << vec4<u32>(4u);
}

alias UnitWords = array<vec2<u32>, 6>;   // words_at qa, qb, qh, sc0, sc1, d

// Where a unit's fields are: qa (ql[64h + 4i ..]), qb (ql[64h + 32 + 4i ..]), qh, sc0
// (scales[8h .. 8h+3]), sc1 (scales[8h+4 .. 8h+7]), d
fn unit_bytes(row_byte: u32, u: u32) -> array<u32, 6> {
    let blk = row_byte + (u / 16u) * BLOCK_BYTES;
    let h = (u % 16u) / 8u;
    let i = u % 8u;
    return array<u32, 6>(blk + 64u * h + 4u * i, blk + 64u * h + 32u + 4u * i, blk + 128u + 32u * h + 4u * i,
                         blk + 192u + 8u * h, blk + 196u + 8u * h, blk + 208u);
}

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

fn group_elem(u: u32, g: u32) -> u32 {
    return (u / 16u) * 256u + ((u % 16u) / 8u) * 128u + (u % 8u) * 4u + g * 32u;
}

// 6-bit quants q to the signed bytes q - 32: q + 96 stays below 256, and flipping its top bit
// subtracts 128
fn q6_signed(q: vec4<u32>) -> vec4<u32> {
    return (q + vec4<u32>(0x60606060u)) ^ vec4<u32>(0x80808080u);
}
#ifdef X_INT

// Item p: units u = 4p .. 4p+3, i = 4k .. 4k+3 of one half (k = p % 2): l = 16k .. 16k+15, so
// its qa, qb and qh are 16 consecutive bytes each and its 4 units share their 4 scales. Its
// fields in 3 spans (5 word loads each where blocks may be unaligned) and 3 words, where 4
// single units take 24 loads. Each group's 16 products with x (the quants as q - 32) summed and
// scaled in integers, then d.
fn item_dot_int(src: u32, row_byte: u32, p: u32) -> f32 {
    let at = unit_bytes(row_byte, 4u * p);   // the first unit's fields: the item's spans start there
    let k = p % 2u;
    let qa = span16(src, at[0]);
    let qb = span16(src, at[1]);
    let qh = span16(src, at[2]);
    let sc0 = load_u32(src, at[3]);
    let sc1 = load_u32(src, at[4]);
    let scales = vec4<i32>(i8_at(sc0, k), i8_at(sc0, k + 2u), i8_at(sc1, k), i8_at(sc1, k + 2u));
    let nibbles = vec4<u32>(0x0F0F0F0Fu);
    let high = vec4<u32>(0x30303030u);   // qh's 2 bits of each quant, moved to bits 4-5
    // group g (elements + 32g) of the 4 units, word c unit c's
    let q = array<vec4<u32>, 4>(q6_signed((qa & nibbles) | ((qh << vec4<u32>(4u)) & high)),
                                q6_signed((qb & nibbles) | ((qh << vec4<u32>(2u)) & high)),
                                q6_signed(((qa >> vec4<u32>(4u)) & nibbles) | (qh & high)),
                                q6_signed(((qb >> vec4<u32>(4u)) & nibbles) | ((qh >> vec4<u32>(2u)) & high)));
    let x = group_elem(4u * p, 0u) / 16u;   // x's group of the item's group 0; group g's: + 2g
    var sum = 0.0;
    for (var plane = 0u; plane < X_PLANES; plane++) {
        let dots = vec4<i32>(dot16_int(q[0], x, plane), dot16_int(q[1], x + 2u, plane),
                             dot16_int(q[2], x + 4u, plane), dot16_int(q[3], x + 6u, plane));
        sum += plane_value(dot(scales, dots), plane);
    }
    return load_f16(src, at[5]) * xd[p / 4u] * sum;
}
#endif
#ifdef TILE_INT

// Sub-block j: s = j % 8 of its block, half h = s / 4, i = s % 4: elements 128h + 32i + l (l <
// 32) from bytes l of ql[64h + 32 (i % 2) ..] (nibble i / 2) and of qh[32h ..] (bits 2i, 2i+1),
// scales[8h + 2i + l / 16]: two 16-byte spans each, a word of scales and d.
const SUB_SCALES = 2u;
alias SubWords = array<vec4<u32>, 5>;   // ql, ql, qh, qh, (scales, d)

fn sub_words(src: u32, row_byte: u32, j: u32) -> SubWords {
    let blk = row_byte + (j / 8u) * BLOCK_BYTES;
    let h = (j % 8u) / 4u;
    let i = j % 4u;
    let ql = blk + 64u * h + 32u * (i % 2u);
    let qh = blk + 128u + 32u * h;
    let sc = blk + 192u + 8u * h + 2u * i;
    return SubWords(span16(src, ql), span16(src, ql + 16u), span16(src, qh), span16(src, qh + 16u),
                    vec4<u32>(load_u32(src, sc), load_u16(src, blk + 208u), 0u, 0u));
}

fn sub_decode(w: SubWords, j: u32) -> SubInt {
    let i = j % 4u;
    let lo = vec4<u32>(4u * (i / 2u));
    let hi = vec4<u32>(2u * i);
    let nibbles = vec4<u32>(0x0F0F0F0Fu);
    let bits = vec4<u32>(0x03030303u);
    let q0 = q6_signed(((w[0] >> lo) & nibbles) | (((w[2] >> hi) & bits) << vec4<u32>(4u)));
    let q1 = q6_signed(((w[1] >> lo) & nibbles) | (((w[3] >> hi) & bits) << vec4<u32>(4u)));
    return SubInt(array<vec4<u32>, 2>(q0, q1), vec2<i32>(i8_at(w[4].x, 0u), i8_at(w[4].x, 1u)), 0,
                  vec2<f32>(unpack2x16float(w[4].y).x, 0.0));
}
#endif
#endif

#ifdef IQ4_NL
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 18u;   // d: f16 | qs: 16 bytes, nibbles as Q4_0's; x = d * IQ4_LEVELS[q]

fn unit_values(src: u32, row_byte: u32, u: u32) -> Unit {
    let blk = row_byte + (u / 2u) * BLOCK_BYTES;
    let d = load_f16(src, blk);
    let q0 = load_u32(src, blk + 2u + (u % 2u) * 8u);
    let q1 = load_u32(src, blk + 6u + (u % 2u) * 8u);
    return Unit(d * iq4_levels(lo_nibbles(q0)), d * iq4_levels(lo_nibbles(q1)),
                d * iq4_levels(hi_nibbles(q0)), d * iq4_levels(hi_nibbles(q1)));
}

fn group_elem(u: u32, g: u32) -> u32 {
    return (u / 2u) * 32u + (u % 2u) * 8u + (g & 1u) * 4u + (g >> 1u) * 16u;
}
#endif

#ifdef IQ4_XS
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 136u;  // d: f16 | scales_h: u16 | scales_l: 4 bytes | qs: 128 bytes
// 8 sub-blocks of 32 elements laid out as IQ4_NL blocks (qs[16b ..] for sub-block b), with
// scale sc = (nibble b%2 of scales_l[b/2] | bits 2b, 2b+1 of scales_h << 4) - 32;
// x = d * sc * IQ4_LEVELS[q]. Units as IQ4_NL's: two per sub-block.

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

fn group_elem(u: u32, g: u32) -> u32 {
    return (u / 2u) * 32u + (u % 2u) * 8u + (g & 1u) * 4u + (g >> 1u) * 16u;
}
#endif

#ifdef IQ2_XXS
#include "iq2xxs_grid.wgsl"
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 66u;   // d: f16 | 8 x (4 grid indices: bytes | signs and scale: u32 w)
// Sub-block b (0..7) of 32 elements: points l = 0..3 of 8 values, IQ2XXS_GRID entry of index
// byte l, signs iq_signs(bits 7l .. 7l+6 of w); x = d * (0.5 + (w >> 28)) / 4 * value.
// Unit (b, h): points 2h, 2h+1.

fn unit_values(src: u32, row_byte: u32, u: u32) -> Unit {
    let blk = row_byte + (u / 16u) * BLOCK_BYTES;
    let b = (u % 16u) / 2u;
    let h = u % 2u;
    let idx = load_u32(src, blk + 2u + 8u * b) >> (16u * h);
    let w = load_u32(src, blk + 6u + 8u * b);
    let db = load_f16(src, blk) * (0.5 + f32(w >> 28u)) * 0.25;
    let p0 = grid_entry(idx & 0xFFu);
    let p1 = grid_entry((idx >> 8u) & 0xFFu);
    let s0 = iq_signs((w >> (14u * h)) & 127u);
    let s1 = iq_signs((w >> (14u * h + 7u)) & 127u);
    return Unit(signed4(db * iq2_levels(p0, 0u), s0, 0u), signed4(db * iq2_levels(p0, 4u), s0, 4u),
                signed4(db * iq2_levels(p1, 0u), s1, 0u), signed4(db * iq2_levels(p1, 4u), s1, 4u));
}

fn group_elem(u: u32, g: u32) -> u32 {
    return u * 16u + g * 4u;
}
#endif

#ifdef IQ2_XS
#include "iq2xs_grid.wgsl"
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 74u;   // d: f16 | qs: 32 x u16 | scales: 8 bytes
// Point k (0..31) of 8 values: qs[k] = IQ2XS_GRID index (9 bits) | 7 sign bits << 9. Unit t
// (0..15): points 2t, 2t+1, x = d * (0.5 + nibble t of scales) / 4 * value.

fn unit_values(src: u32, row_byte: u32, u: u32) -> Unit {
    let blk = row_byte + (u / 16u) * BLOCK_BYTES;
    let t = u % 16u;
    let qs = load_u32(src, blk + 2u + 4u * t);   // points 2t (low half), 2t+1
    let sc = (load_u32(src, blk + 66u + 4u * (t / 8u)) >> (4u * (t % 8u))) & 15u;
    let db = load_f16(src, blk) * (0.5 + f32(sc)) * 0.25;
    let p0 = grid_entry(qs & 511u);
    let p1 = grid_entry((qs >> 16u) & 511u);
    let s0 = iq_signs((qs >> 9u) & 127u);
    let s1 = iq_signs(qs >> 25u);
    return Unit(signed4(db * iq2_levels(p0, 0u), s0, 0u), signed4(db * iq2_levels(p0, 4u), s0, 4u),
                signed4(db * iq2_levels(p1, 0u), s1, 0u), signed4(db * iq2_levels(p1, 4u), s1, 4u));
}

fn group_elem(u: u32, g: u32) -> u32 {
    return u * 16u + g * 4u;
}
#endif

#ifdef IQ2_S
#include "iq2s_grid.wgsl"
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 82u;   // d: f16 | qs: 32 bytes | signs: 32 bytes | qh: 8 bytes | scales: 8 bytes
// Point k (0..31) of 8 values: IQ2S_GRID index qs[k] | bits 2(k%4), +1 of qh[k/4] << 8, signs
// the byte signs[k]. Unit t (0..15): points 2t, 2t+1, x = d * (0.5 + nibble t of scales) / 4 * value.

fn unit_values(src: u32, row_byte: u32, u: u32) -> Unit {
    let blk = row_byte + (u / 16u) * BLOCK_BYTES;
    let t = u % 16u;
    let qs = load_u16(src, blk + 2u + 2u * t);
    let signs = load_u16(src, blk + 34u + 2u * t);
    let qh = load_u32(src, blk + 66u + 4u * (t / 8u)) >> (4u * (t % 8u));   // bits 0-1: point 2t, 2-3: 2t+1
    let sc = (load_u32(src, blk + 74u + 4u * (t / 8u)) >> (4u * (t % 8u))) & 15u;
    let db = load_f16(src, blk) * (0.5 + f32(sc)) * 0.25;
    let p0 = grid_entry((qs & 0xFFu) | ((qh & 3u) << 8u));
    let p1 = grid_entry((qs >> 8u) | (((qh >> 2u) & 3u) << 8u));
    return Unit(signed4(db * iq2_levels(p0, 0u), signs, 0u), signed4(db * iq2_levels(p0, 4u), signs, 4u),
                signed4(db * iq2_levels(p1, 0u), signs, 8u), signed4(db * iq2_levels(p1, 4u), signs, 12u));
}

fn group_elem(u: u32, g: u32) -> u32 {
    return u * 16u + g * 4u;
}
#endif

#ifdef IQ3_XXS
#include "iq3xxs_grid.wgsl"
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 98u;   // d: f16 | qs: 64 grid indices (bytes) | 8 x signs and scale (u32 w)
// Sub-block b (0..7) of 32 elements: points p = 0..7 of 4 values, IQ3XXS_GRID entry of index
// qs[8b + p]; points 2l, 2l+1 take the signs iq_signs(bits 7l .. 7l+6 of w of b);
// x = d * (0.5 + (w >> 28)) / 2 * value. Unit (b, h): points 4h .. 4h+3, a group each.

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

fn group_elem(u: u32, g: u32) -> u32 {
    return u * 16u + g * 4u;
}
#endif

#ifdef IQ3_S
#include "iq3s_grid.wgsl"
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 110u;  // d: f16 | qs: 64 bytes | qh: 8 bytes | signs: 32 bytes | scales: 4 bytes
// Sub-block b (0..7) of 32 elements: points p = 0..7 of 4 values, IQ3S_GRID entry of index
// qs[8b + p] | bit p of qh[b] << 8, signs bits 4(p%2) .. of byte signs[4b + p/2];
// x = d * (1 + 2 * nibble b of scales) * value. Unit (b, h): points 4h .. 4h+3, a group each.

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

fn group_elem(u: u32, g: u32) -> u32 {
    return u * 16u + g * 4u;
}
#endif

// Float types: unit u is the groups u, u + UNITS_PER_ROW, ... of 4 elements, so that the
// threads of a row read consecutive bytes; a row needs no whole number of units.
#ifdef F32
const ROW_BYTES = K * 4u;
const WORD_ALIGNED = true;
const UNITS_PER_ROW = (K + 15u) / 16u;
const ROW_TAIL = K % 16u != 0u;   // the last unit runs past the row

fn group_elem(u: u32, g: u32) -> u32 {
    return (u + g * UNITS_PER_ROW) * 4u;   // strided: adjacent units read adjacent bytes
}

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
const ROW_BYTES = K * 2u;
const WORD_ALIGNED = ROW_BYTES % 4u == 0u;
const UNITS_PER_ROW = (K + 15u) / 16u;
const ROW_TAIL = K % 16u != 0u;   // the last unit runs past the row

fn group_elem(u: u32, g: u32) -> u32 {
    return (u + g * UNITS_PER_ROW) * 4u;   // strided: adjacent units read adjacent bytes
}

fn f16x4(src: u32, byte: u32) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(load_u32(src, byte)), unpack2x16float(load_u32(src, byte + 4u)));
}

fn unit_values(src: u32, row_byte: u32, u: u32) -> Unit {
    return Unit(f16x4(src, row_byte + 2u * group_elem(u, 0u)), f16x4(src, row_byte + 2u * group_elem(u, 1u)),
                f16x4(src, row_byte + 2u * group_elem(u, 2u)), f16x4(src, row_byte + 2u * group_elem(u, 3u)));
}
#endif

#ifdef BF16
const ROW_BYTES = K * 2u;
const WORD_ALIGNED = ROW_BYTES % 4u == 0u;
const UNITS_PER_ROW = (K + 15u) / 16u;
const ROW_TAIL = K % 16u != 0u;   // the last unit runs past the row

fn group_elem(u: u32, g: u32) -> u32 {
    return (u + g * UNITS_PER_ROW) * 4u;   // strided: adjacent units read adjacent bytes
}

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

// ---- block types: whole blocks per row, 16 elements per unit ------------------------------
#ifndef F32
#ifndef F16
#ifndef BF16
const ROW_BYTES = K / BLOCK_ELEMS * BLOCK_BYTES;
const UNITS_PER_ROW = K / 16u;
const WORD_ALIGNED = BLOCK_BYTES % 4u == 0u;
const ROW_TAIL = false;
#endif
#endif
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
