// The block layouts of raw GGUF rows (ggml's), read from `array<u32>` storage: what every
// interface to the weights needs (quant_units.wgsl: 16-element units as floats, for the matvec,
// the prefill matmul and the embedding lookup; quant_items_int.wgsl: the integer x dot products
// of matvec_int.wgsl; quant_subs_int.wgsl: the integer sub-blocks of matmul_int.wgsl). Each
// includes this file; a kernel includes the interface it uses.
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
// strided groups of a float row), adjacent units being adjacent bytes. A unit is 4 groups of 4
// consecutive elements, group g of unit u starting at element group_elem(u, g) of the row. For
// the float types the last unit may run past K (ROW_TAIL): the includer masks elements >= K.
// Each type's section here gives its block geometry (BLOCK_ELEMS, BLOCK_BYTES, UNITS: how its
// units lie, for group_elem; the row's ROW_BYTES, UNITS_PER_ROW, WORD_ALIGNED, ROW_TAIL), and the
// field helpers more than one interface reads.

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

// ---- unit layouts -------------------------------------------------------------------
// Where a block type's units lie (its section's UNITS, for group_elem): in runs of `run` units
// whose 16 * run elements are consecutive in the row, each unit starting `step` elements after
// the one before it in its run; group g of a unit starts (g & 1) * odd + (g >> 1) * high
// elements after the unit does.
struct UnitLayout {
    run: u32,
    step: u32,
    odd: u32,
    high: u32,
}

// 16 consecutive elements (8-bit quants, IQ2 and IQ3 grid points)
const CONSECUTIVE = UnitLayout(1u, 16u, 4u, 8u);
// 32 elements as 16 bytes of nibbles, the low ones first: unit i (0, 1) the bytes 8i .. 8i+7,
// elements 8i .. (groups 0, 1) and 16 + 8i .. (2, 3)
const NIBBLE_HALVES = UnitLayout(2u, 8u, 4u, 16u);
// 64 elements as 32 bytes of nibbles (Q4_K, Q5_K): as NIBBLE_HALVES, four units, the high
// nibbles 32 elements on
const NIBBLE_CHUNKS = UnitLayout(4u, 8u, 4u, 32u);
// 128 elements as four quarters of 32 whose element l shares byte positions (Q2_K, Q3_K, Q6_K):
// unit i takes l = 4i .. 4i+3, group g from quarter g
const BIT_PLANES = UnitLayout(8u, 4u, 32u, 64u);

// ---- the types ---------------------------------------------------------------------

// 32-element blocks: unit i (0, 1) of a 4-bit type's block takes qs[8i .. 8i+7] (words q0, q1).
#ifdef Q4_0
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 18u;   // d: f16 | qs: 16 bytes (element j: low nibble of qs[j]; j+16: high nibble)
const UNITS = NIBBLE_HALVES;
#endif

#ifdef Q4_1
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 20u;   // d: f16 | m: f16 | qs: 16 bytes; x = d * q + m
const UNITS = NIBBLE_HALVES;
#endif

#ifdef Q5_0
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 22u;   // d: f16 | qh: 32 bits (bit j: 5th bit of element j) | qs: 16 bytes; x = d * (q - 16)
const UNITS = NIBBLE_HALVES;
#endif

#ifdef Q5_1
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 24u;   // d: f16 | m: f16 | qh: 32 bits | qs: 16 bytes; x = d * q + m
const UNITS = NIBBLE_HALVES;
#endif

#ifdef Q8_0
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 34u;   // d: f16 | qs: 32 x i8; x = d * q
const UNITS = CONSECUTIVE;   // unit i (0, 1): qs[16i .. 16i+15]
#endif

#ifdef Q2_K
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 84u;   // scales: 16 bytes | qs: 64 bytes | d: f16 | dmin: f16
// Half h (0, 1) of 128 elements, l in 0..31: bits 2s, 2s+1 of qs[32h + l] give element
// 128h + 32s + l, of sub-block j = 8h + 2s + l/16 (16 elements); x = d * sc * q - dmin * m
// with sc, m the low and high nibble of scales[j].
const UNITS = BIT_PLANES;   // unit (h, i): l = 4i .. 4i+3
#endif

#ifdef Q3_K
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 110u;  // hmask: 32 bytes | qs: 64 bytes | scales: 12 bytes | d: f16
// The 2-bit quants of Q2_K (qs at byte 32), plus a 3rd bit: bit 4h + s of hmask[l], which
// when clear subtracts 4; x = d * (sc - 32) * q with sc the 6-bit scale of sub-block j.
const UNITS = BIT_PLANES;   // as Q2_K's
#endif

#ifdef Q4_K
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 144u;  // d: f16 | dmin: f16 | scales: 12 bytes | qs: 128 bytes
// Chunk j (0..3) of 64 elements: qs[32j + l] holds element 64j + l (low nibble, sub-block
// 2j) and 64j + 32 + l (high nibble, sub-block 2j+1); x = d * sc * q - dmin * m.
const UNITS = NIBBLE_CHUNKS;   // unit (j, i): qs[32j + 8i .. +7]
#endif

#ifdef Q5_K
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 176u;  // d: f16 | dmin: f16 | scales: 12 bytes | qh: 32 bytes | qs: 128 bytes
// As Q4_K, plus a 5th bit per element: bit 2j (low) / 2j+1 (high) of qh[l].
const UNITS = NIBBLE_CHUNKS;   // as Q4_K's
#endif

#ifdef Q6_K
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 210u;  // ql: 128 bytes | qh: 64 bytes | scales: 16 x i8 | d: f16
// Half h (0, 1) of 128 elements, l in 0..31: ql[64h + l], ql[64h + 32 + l] and qh[32h + l]
// give elements 128h + l + {0, 32, 64, 96} (6 bits, minus 32), scaled by
// d * scales[8h + l/16 + {0, 2, 4, 6}].
const UNITS = BIT_PLANES;   // unit (h, i): l = 4i .. 4i+3

// Byte k of w as a signed integer
fn i8_at(w: u32, k: u32) -> i32 {
    return bitcast<i32>(w << (24u - 8u * k)) >> 24u;
}

// Where a unit's fields are: qa (ql[64h + 4i ..]), qb (ql[64h + 32 + 4i ..]), qh, sc0
// (scales[8h .. 8h+3]), sc1 (scales[8h+4 .. 8h+7]), d
fn unit_bytes(row_byte: u32, u: u32) -> array<u32, 6> {
    let blk = row_byte + (u / 16u) * BLOCK_BYTES;
    let h = (u % 16u) / 8u;
    let i = u % 8u;
    return array<u32, 6>(blk + 64u * h + 4u * i, blk + 64u * h + 32u + 4u * i, blk + 128u + 32u * h + 4u * i,
                         blk + 192u + 8u * h, blk + 196u + 8u * h, blk + 208u);
}

// 6-bit quants q to the signed bytes q - 32: q + 96 stays below 256, and flipping its top bit
// subtracts 128
fn q6_signed(q: vec4<u32>) -> vec4<u32> {
    return (q + vec4<u32>(0x60606060u)) ^ vec4<u32>(0x80808080u);
}
#endif

#ifdef IQ4_NL
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 18u;   // d: f16 | qs: 16 bytes, nibbles as Q4_0's; x = d * IQ4_LEVELS[q]
const UNITS = NIBBLE_HALVES;
#endif

#ifdef IQ4_XS
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 136u;  // d: f16 | scales_h: u16 | scales_l: 4 bytes | qs: 128 bytes
// 8 sub-blocks of 32 elements laid out as IQ4_NL blocks (qs[16b ..] for sub-block b), with
// scale sc = (nibble b%2 of scales_l[b/2] | bits 2b, 2b+1 of scales_h << 4) - 32;
// x = d * sc * IQ4_LEVELS[q].
const UNITS = NIBBLE_HALVES;   // as IQ4_NL's: two per sub-block
#endif

#ifdef IQ2_XXS
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 66u;   // d: f16 | 8 x (4 grid indices: bytes | signs and scale: u32 w)
// Sub-block b (0..7) of 32 elements: points l = 0..3 of 8 values, IQ2XXS_GRID entry of index
// byte l, signs iq_signs(bits 7l .. 7l+6 of w); x = d * (0.5 + (w >> 28)) / 4 * value.
const UNITS = CONSECUTIVE;   // unit (b, h): points 2h, 2h+1
#endif

#ifdef IQ2_XS
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 74u;   // d: f16 | qs: 32 x u16 | scales: 8 bytes
// Point k (0..31) of 8 values: qs[k] = IQ2XS_GRID index (9 bits) | 7 sign bits << 9; in unit
// t, x = d * (0.5 + nibble t of scales) / 4 * value.
const UNITS = CONSECUTIVE;   // unit t (0..15): points 2t, 2t+1
#endif

#ifdef IQ2_S
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 82u;   // d: f16 | qs: 32 bytes | signs: 32 bytes | qh: 8 bytes | scales: 8 bytes
// Point k (0..31) of 8 values: IQ2S_GRID index qs[k] | bits 2(k%4), +1 of qh[k/4] << 8, signs
// the byte signs[k]; in unit t, x = d * (0.5 + nibble t of scales) / 4 * value.
const UNITS = CONSECUTIVE;   // unit t (0..15): points 2t, 2t+1
#endif

#ifdef IQ3_XXS
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 98u;   // d: f16 | qs: 64 grid indices (bytes) | 8 x signs and scale (u32 w)
// Sub-block b (0..7) of 32 elements: points p = 0..7 of 4 values, IQ3XXS_GRID entry of index
// qs[8b + p]; points 2l, 2l+1 take the signs iq_signs(bits 7l .. 7l+6 of w of b);
// x = d * (0.5 + (w >> 28)) / 2 * value.
const UNITS = CONSECUTIVE;   // unit (b, h): points 4h .. 4h+3, a group each
#endif

#ifdef IQ3_S
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 110u;  // d: f16 | qs: 64 bytes | qh: 8 bytes | signs: 32 bytes | scales: 4 bytes
// Sub-block b (0..7) of 32 elements: points p = 0..7 of 4 values, IQ3S_GRID entry of index
// qs[8b + p] | bit p of qh[b] << 8, signs bits 4(p%2) .. of byte signs[4b + p/2];
// x = d * (1 + 2 * nibble b of scales) * value.
const UNITS = CONSECUTIVE;   // unit (b, h): points 4h .. 4h+3, a group each
#endif

// Float types (flag FLOAT_ROWS): unit u is the groups u, u + UNITS_PER_ROW, ... of 4 elements,
// so that the threads of a row read consecutive bytes; a row needs no whole number of units.
#ifdef F32
const ROW_BYTES = K * 4u;
const WORD_ALIGNED = true;
#endif

#ifdef F16
const ROW_BYTES = K * 2u;
const WORD_ALIGNED = ROW_BYTES % 4u == 0u;
#endif

#ifdef BF16
const ROW_BYTES = K * 2u;
const WORD_ALIGNED = ROW_BYTES % 4u == 0u;
#endif

#ifdef FLOAT_ROWS
const UNITS_PER_ROW = (K + 15u) / 16u;
const ROW_TAIL = K % 16u != 0u;   // the last unit runs past the row

fn group_elem(u: u32, g: u32) -> u32 {
    return (u + g * UNITS_PER_ROW) * 4u;   // strided: adjacent units read adjacent bytes
}
#else
// ---- block types: whole blocks per row, 16 elements per unit ------------------------------
const ROW_BYTES = K / BLOCK_ELEMS * BLOCK_BYTES;
const UNITS_PER_ROW = K / 16u;
const WORD_ALIGNED = BLOCK_BYTES % 4u == 0u;
const ROW_TAIL = false;

// As the type's UNITS lay them out (the unit layouts above)
fn group_elem(u: u32, g: u32) -> u32 {
    return (u / UNITS.run) * (16u * UNITS.run) + (u % UNITS.run) * UNITS.step + (g & 1u) * UNITS.odd
         + (g >> 1u) * UNITS.high;
}
#endif
