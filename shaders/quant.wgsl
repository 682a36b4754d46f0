// Dequantization of raw GGUF rows (ggml block layouts), read from `array<u32>` storage.
//
// Defines: one type flag (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K F16 BF16 F32) and K
// (elements per row, a multiple of the type's block size).
//
// The includer provides the weight fetch, so one shader can read two matrices of the
// same type (the gate and up projections of a GLU):
//     fn wword(src: u32, i: u32) -> u32    // word i of weight matrix `src`
//
// A row is cut into UNITS_PER_ROW "units": the slice of a block one thread decodes at a
// time, adjacent units being adjacent bytes. A unit yields UNIT_GROUPS groups of 4
// consecutive elements:
//     unit_values(src, row_byte, u)[g] = elements group_elem(u, g) .. +3 of the row
// For the float types the last unit may run past K (ROW_TAIL): the includer masks
// elements >= K. Everything that depends on the type stays in this file.

// ---- byte helpers ------------------------------------------------------------------
// Rows of 18-, 22-, 34- and 210-byte blocks (and f16 rows of odd length) start at
// 2-byte boundaries, so every field read here is at an even byte offset.

// 4 bytes at an even byte offset.
fn load_u32(src: u32, byte: u32) -> u32 {
    let lo = wword(src, byte >> 2u);
    if (WORD_ALIGNED) {
        return lo;
    }
    let hi = wword(src, (byte >> 2u) + 1u);
    return select((lo >> 16u) | (hi << 16u), lo, (byte & 2u) == 0u);
}

// 2 bytes at an even byte offset, in the low half.
fn load_u16(src: u32, byte: u32) -> u32 {
    return (wword(src, byte >> 2u) >> ((byte & 2u) * 8u)) & 0xFFFFu;
}

fn load_f16(src: u32, byte: u32) -> f32 {
    return unpack2x16float(load_u16(src, byte)).x;
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

// The four bytes of a word as signed int8, as f32.
fn i8x4(q: u32) -> vec4<f32> {
    let s = bitcast<vec4<i32>>(vec4<u32>(q) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u);
    return vec4<f32>(s);
}

// Bits b, b+1, b+2, b+3 of a word, each as 0 or 1.
fn bits4(q: u32, b: u32) -> vec4<u32> {
    return (vec4<u32>(q) >> (vec4<u32>(b) + vec4<u32>(0u, 1u, 2u, 3u))) & vec4<u32>(1u);
}

// Q4_K / Q5_K: scale and min of sub-block `is` (0..7) from the 12 packed scale bytes
// s0 (bytes 0-3), s1 (4-7), s2 (8-11): 6 bits each, sub-blocks 4-7 split across bytes.
fn scale_min_k4(is: u32, s0: u32, s1: u32, s2: u32) -> vec2<f32> {
    let sh = (is & 3u) * 8u;
    let b0 = (s0 >> sh) & 0xFFu;
    let b1 = (s1 >> sh) & 0xFFu;
    let b2 = (s2 >> sh) & 0xFFu;
    if (is < 4u) {
        return vec2<f32>(f32(b0 & 63u), f32(b1 & 63u));
    }
    return vec2<f32>(f32((b2 & 0xFu) | ((b0 >> 6u) << 4u)), f32((b2 >> 4u) | ((b1 >> 6u) << 4u)));
}


// ---- the types ---------------------------------------------------------------------
// Each section defines the block geometry, unit_values() and group_elem().

#ifdef Q4_0
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 18u;   // d: f16 | qs: 16 bytes (element j: low nibble of qs[j]; j+16: high nibble)
const UNITS_PER_BLOCK = 4u;   // unit i: qs[4i..4i+3] -> elements 4i.., 16+4i..

fn unit_values(src: u32, row_byte: u32, u: u32) -> array<vec4<f32>, UNIT_GROUPS> {
    let blk = row_byte + (u / 4u) * BLOCK_BYTES;
    let d = load_f16(src, blk);
    let q = load_u32(src, blk + 2u + (u % 4u) * 4u);
    return array<vec4<f32>, UNIT_GROUPS>(d * (vec4<f32>(lo_nibbles(q)) - 8.0),
                                         d * (vec4<f32>(hi_nibbles(q)) - 8.0));
}

fn group_elem(u: u32, g: u32) -> u32 {
    return (u / 4u) * 32u + g * 16u + (u % 4u) * 4u;
}
#endif

#ifdef Q4_1
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 20u;   // d: f16 | m: f16 | qs: 16 bytes; x = d * q + m
const UNITS_PER_BLOCK = 4u;

fn unit_values(src: u32, row_byte: u32, u: u32) -> array<vec4<f32>, UNIT_GROUPS> {
    let word = (row_byte + (u / 4u) * BLOCK_BYTES) >> 2u;
    let dm = unpack2x16float(wword(src, word));
    let q = wword(src, word + 1u + u % 4u);
    return array<vec4<f32>, UNIT_GROUPS>(dm.x * vec4<f32>(lo_nibbles(q)) + dm.y,
                                         dm.x * vec4<f32>(hi_nibbles(q)) + dm.y);
}

fn group_elem(u: u32, g: u32) -> u32 {
    return (u / 4u) * 32u + g * 16u + (u % 4u) * 4u;
}
#endif

#ifdef Q5_0
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 22u;   // d: f16 | qh: 32 bits (bit j: 5th bit of element j) | qs: 16 bytes; x = d * (q - 16)
const UNITS_PER_BLOCK = 4u;

fn unit_values(src: u32, row_byte: u32, u: u32) -> array<vec4<f32>, UNIT_GROUPS> {
    let blk = row_byte + (u / 4u) * BLOCK_BYTES;
    let i = u % 4u;
    let d = load_f16(src, blk);
    let qh = load_u32(src, blk + 2u);
    let q = load_u32(src, blk + 6u + i * 4u);
    let lo = lo_nibbles(q) | (bits4(qh, i * 4u) << vec4<u32>(4u));
    let hi = hi_nibbles(q) | (bits4(qh, 16u + i * 4u) << vec4<u32>(4u));
    return array<vec4<f32>, UNIT_GROUPS>(d * (vec4<f32>(lo) - 16.0), d * (vec4<f32>(hi) - 16.0));
}

fn group_elem(u: u32, g: u32) -> u32 {
    return (u / 4u) * 32u + g * 16u + (u % 4u) * 4u;
}
#endif

#ifdef Q5_1
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 24u;   // d: f16 | m: f16 | qh: 32 bits | qs: 16 bytes; x = d * q + m
const UNITS_PER_BLOCK = 4u;

fn unit_values(src: u32, row_byte: u32, u: u32) -> array<vec4<f32>, UNIT_GROUPS> {
    let word = (row_byte + (u / 4u) * BLOCK_BYTES) >> 2u;
    let i = u % 4u;
    let dm = unpack2x16float(wword(src, word));
    let qh = wword(src, word + 1u);
    let q = wword(src, word + 2u + i);
    let lo = lo_nibbles(q) | (bits4(qh, i * 4u) << vec4<u32>(4u));
    let hi = hi_nibbles(q) | (bits4(qh, 16u + i * 4u) << vec4<u32>(4u));
    return array<vec4<f32>, UNIT_GROUPS>(dm.x * vec4<f32>(lo) + dm.y, dm.x * vec4<f32>(hi) + dm.y);
}

fn group_elem(u: u32, g: u32) -> u32 {
    return (u / 4u) * 32u + g * 16u + (u % 4u) * 4u;
}
#endif

#ifdef Q8_0
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 34u;   // d: f16 | qs: 32 x i8; x = d * q
const UNITS_PER_BLOCK = 4u;   // unit i: qs[8i..8i+7]

fn unit_values(src: u32, row_byte: u32, u: u32) -> array<vec4<f32>, UNIT_GROUPS> {
    let blk = row_byte + (u / 4u) * BLOCK_BYTES;
    let d = load_f16(src, blk);
    let qs = blk + 2u + (u % 4u) * 8u;
    return array<vec4<f32>, UNIT_GROUPS>(d * i8x4(load_u32(src, qs)), d * i8x4(load_u32(src, qs + 4u)));
}

fn group_elem(u: u32, g: u32) -> u32 {
    return (u / 4u) * 32u + (u % 4u) * 8u + g * 4u;
}
#endif

#ifdef Q4_K
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 144u;  // d: f16 | dmin: f16 | scales: 12 bytes | qs: 128 bytes
const UNITS_PER_BLOCK = 16u;
// Chunk j (0..3) of 64 elements: qs[32j + l] holds element 64j + l (low nibble, sub-block
// 2j) and 64j + 32 + l (high nibble, sub-block 2j+1); x = d * sc * q - dmin * m.
// Unit (j, i): qs[32j + 8i .. +7].

fn unit_values(src: u32, row_byte: u32, u: u32) -> array<vec4<f32>, UNIT_GROUPS> {
    let word = (row_byte + (u / 16u) * BLOCK_BYTES) >> 2u;
    let j = (u % 16u) / 4u;
    let i = u % 4u;
    let dd = unpack2x16float(wword(src, word));   // d, dmin
    let s0 = wword(src, word + 1u);
    let s1 = wword(src, word + 2u);
    let s2 = wword(src, word + 3u);
    let sm_lo = scale_min_k4(2u * j, s0, s1, s2);
    let sm_hi = scale_min_k4(2u * j + 1u, s0, s1, s2);
    let q0 = wword(src, word + 4u + 8u * j + 2u * i);
    let q1 = wword(src, word + 5u + 8u * j + 2u * i);
    let d_lo = dd.x * sm_lo.x;
    let m_lo = dd.y * sm_lo.y;
    let d_hi = dd.x * sm_hi.x;
    let m_hi = dd.y * sm_hi.y;
    return array<vec4<f32>, UNIT_GROUPS>(d_lo * vec4<f32>(lo_nibbles(q0)) - m_lo,
                                         d_lo * vec4<f32>(lo_nibbles(q1)) - m_lo,
                                         d_hi * vec4<f32>(hi_nibbles(q0)) - m_hi,
                                         d_hi * vec4<f32>(hi_nibbles(q1)) - m_hi);
}

fn group_elem(u: u32, g: u32) -> u32 {
    return (u / 16u) * 256u + ((u % 16u) / 4u) * 64u + (u % 4u) * 8u + (g & 1u) * 4u + (g >> 1u) * 32u;
}
#endif

#ifdef Q5_K
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 176u;  // d: f16 | dmin: f16 | scales: 12 bytes | qh: 32 bytes | qs: 128 bytes
const UNITS_PER_BLOCK = 16u;
// As Q4_K, plus a 5th bit per element: bit 2j (low) / 2j+1 (high) of qh[l].

fn qh_bits(h: u32, bit: u32) -> vec4<u32> {
    return ((vec4<u32>(h) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(bit))) & vec4<u32>(1u)) << vec4<u32>(4u);
}

fn unit_values(src: u32, row_byte: u32, u: u32) -> array<vec4<f32>, UNIT_GROUPS> {
    let word = (row_byte + (u / 16u) * BLOCK_BYTES) >> 2u;
    let j = (u % 16u) / 4u;
    let i = u % 4u;
    let dd = unpack2x16float(wword(src, word));   // d, dmin
    let s0 = wword(src, word + 1u);
    let s1 = wword(src, word + 2u);
    let s2 = wword(src, word + 3u);
    let sm_lo = scale_min_k4(2u * j, s0, s1, s2);
    let sm_hi = scale_min_k4(2u * j + 1u, s0, s1, s2);
    let h0 = wword(src, word + 4u + 2u * i);
    let h1 = wword(src, word + 5u + 2u * i);
    let q0 = wword(src, word + 12u + 8u * j + 2u * i);
    let q1 = wword(src, word + 13u + 8u * j + 2u * i);
    let d_lo = dd.x * sm_lo.x;
    let m_lo = dd.y * sm_lo.y;
    let d_hi = dd.x * sm_hi.x;
    let m_hi = dd.y * sm_hi.y;
    return array<vec4<f32>, UNIT_GROUPS>(
        d_lo * vec4<f32>(lo_nibbles(q0) | qh_bits(h0, 2u * j)) - m_lo,
        d_lo * vec4<f32>(lo_nibbles(q1) | qh_bits(h1, 2u * j)) - m_lo,
        d_hi * vec4<f32>(hi_nibbles(q0) | qh_bits(h0, 2u * j + 1u)) - m_hi,
        d_hi * vec4<f32>(hi_nibbles(q1) | qh_bits(h1, 2u * j + 1u)) - m_hi);
}

fn group_elem(u: u32, g: u32) -> u32 {
    return (u / 16u) * 256u + ((u % 16u) / 4u) * 64u + (u % 4u) * 8u + (g & 1u) * 4u + (g >> 1u) * 32u;
}
#endif

#ifdef Q6_K
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 210u;  // ql: 128 bytes | qh: 64 bytes | scales: 16 x i8 | d: f16
const UNITS_PER_BLOCK = 16u;
// Half h (0, 1) of 128 elements, l in 0..31: ql[64h + l], ql[64h + 32 + l] and qh[32h + l]
// give elements 128h + l + {0, 32, 64, 96} (6 bits, minus 32), scaled by d * scales[8h + l/16 + {0, 2, 4, 6}].
// Unit (h, i): l = 4i .. 4i+3.

fn i8_of(w: u32, k: u32) -> f32 {
    return f32(bitcast<i32>(w << (24u - 8u * k)) >> 24u);
}

fn q6_high(h: u32, shift: u32) -> vec4<u32> {
    return ((vec4<u32>(h) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(shift))) & vec4<u32>(3u)) << vec4<u32>(4u);
}

fn unit_values(src: u32, row_byte: u32, u: u32) -> array<vec4<f32>, UNIT_GROUPS> {
    let blk = row_byte + (u / 16u) * BLOCK_BYTES;
    let h = (u % 16u) / 8u;
    let i = u % 8u;
    let qa = load_u32(src, blk + 64u * h + 4u * i);
    let qb = load_u32(src, blk + 64u * h + 32u + 4u * i);
    let qh = load_u32(src, blk + 128u + 32u * h + 4u * i);
    let sc0 = load_u32(src, blk + 192u + 8u * h);   // scales[8h .. 8h+3]
    let sc1 = load_u32(src, blk + 196u + 8u * h);   // scales[8h+4 .. 8h+7]
    let d = load_f16(src, blk + 208u);
    let is = i / 4u;
    return array<vec4<f32>, UNIT_GROUPS>(
        d * i8_of(sc0, is) * (vec4<f32>(lo_nibbles(qa) | q6_high(qh, 0u)) - 32.0),
        d * i8_of(sc0, is + 2u) * (vec4<f32>(lo_nibbles(qb) | q6_high(qh, 2u)) - 32.0),
        d * i8_of(sc1, is) * (vec4<f32>(hi_nibbles(qa) | q6_high(qh, 4u)) - 32.0),
        d * i8_of(sc1, is + 2u) * (vec4<f32>(hi_nibbles(qb) | q6_high(qh, 6u)) - 32.0));
}

fn group_elem(u: u32, g: u32) -> u32 {
    return (u / 16u) * 256u + ((u % 16u) / 8u) * 128u + (u % 8u) * 4u + g * 32u;
}
#endif

// Float types: a unit is 8 consecutive elements; the row needs no whole number of units.
#ifdef F32
const ROW_BYTES = K * 4u;
const UNITS_PER_ROW = (K + 7u) / 8u;
const UNIT_GROUPS = 2u;
const ROW_TAIL = K % 8u != 0u;   // the last unit runs past the row

fn group_elem(u: u32, g: u32) -> u32 {
    return 8u * u + 4u * g;
}
const WORD_ALIGNED = true;

fn unit_values(src: u32, row_byte: u32, u: u32) -> array<vec4<f32>, UNIT_GROUPS> {
    let word = (row_byte >> 2u) + 8u * u;
    var v: array<vec4<f32>, UNIT_GROUPS>;
    for (var g = 0u; g < UNIT_GROUPS; g++) {
        let a = word + 4u * g;
        v[g] = bitcast<vec4<f32>>(vec4<u32>(wword(src, a), wword(src, a + 1u), wword(src, a + 2u), wword(src, a + 3u)));
    }
    return v;
}
#endif

#ifdef F16
const ROW_BYTES = K * 2u;
const UNITS_PER_ROW = (K + 7u) / 8u;
const UNIT_GROUPS = 2u;
const ROW_TAIL = K % 8u != 0u;   // the last unit runs past the row

fn group_elem(u: u32, g: u32) -> u32 {
    return 8u * u + 4u * g;
}
const WORD_ALIGNED = ROW_BYTES % 4u == 0u;

fn unit_values(src: u32, row_byte: u32, u: u32) -> array<vec4<f32>, UNIT_GROUPS> {
    let byte = row_byte + 16u * u;
    var v: array<vec4<f32>, UNIT_GROUPS>;
    for (var g = 0u; g < UNIT_GROUPS; g++) {
        let a = byte + 8u * g;
        v[g] = vec4<f32>(unpack2x16float(load_u32(src, a)), unpack2x16float(load_u32(src, a + 4u)));
    }
    return v;
}
#endif

#ifdef BF16
const ROW_BYTES = K * 2u;
const UNITS_PER_ROW = (K + 7u) / 8u;
const UNIT_GROUPS = 2u;
const ROW_TAIL = K % 8u != 0u;   // the last unit runs past the row

fn group_elem(u: u32, g: u32) -> u32 {
    return 8u * u + 4u * g;
}
const WORD_ALIGNED = ROW_BYTES % 4u == 0u;

fn bf16x2(w: u32) -> vec2<f32> {
    return bitcast<vec2<f32>>(vec2<u32>(w << 16u, w & 0xFFFF0000u));
}

fn unit_values(src: u32, row_byte: u32, u: u32) -> array<vec4<f32>, UNIT_GROUPS> {
    let byte = row_byte + 16u * u;
    var v: array<vec4<f32>, UNIT_GROUPS>;
    for (var g = 0u; g < UNIT_GROUPS; g++) {
        let a = byte + 8u * g;
        v[g] = vec4<f32>(bf16x2(load_u32(src, a)), bf16x2(load_u32(src, a + 4u)));
    }
    return v;
}
#endif

// ---- block types: whole blocks per row; a unit is a quarter block (32-element blocks)
// or a sixteenth (256-element blocks) ------------------------------------------------------
#ifndef F32
#ifndef F16
#ifndef BF16
const ROW_BYTES = K / BLOCK_ELEMS * BLOCK_BYTES;
const UNITS_PER_ROW = K / BLOCK_ELEMS * UNITS_PER_BLOCK;
const UNIT_GROUPS = BLOCK_ELEMS / UNITS_PER_BLOCK / 4u;
const WORD_ALIGNED = BLOCK_BYTES % 4u == 0u;
const ROW_TAIL = false;
#endif
#endif
#endif
