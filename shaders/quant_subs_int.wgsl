// Rows as 32-element sub-blocks of 8-bit integers (matmul_int.wgsl): the prefill matmul on x in
// integers. Defines: quant_blocks.wgsl's.
//
// Sub-block j of a row, elements 32j .. 32j+31 (within one 256-element block), as signed 8-bit
// quants: element 32j + 16h + 4c + i is byte i of q[h][c], and its weight is
// d.x * sc[h] * q - d.y * m. Defines: quant_blocks.wgsl's and SUB_SCALES (1: one scale for the
// sub-block, sc.x == sc.y; 2: one per 16 elements; cera.gpu.quant.INT_SUB_SCALES). A type of
// cera.gpu.quant.INT_TILE_TYPES defines, its loads apart from its arithmetic (as
// quant_units.wgsl's unit_words / unit_decode):
//     alias SubWords
//     fn sub_words(src, row_byte, j) -> SubWords
//     fn sub_decode(w: SubWords, j) -> SubInt
#include "quant_blocks.wgsl"

struct SubInt {
    q: array<vec4<u32>, 2>,
    sc: vec2<i32>,
    m: i32,
    d: vec2<f32>,
}

#ifdef Q4_K
// Sub-block j: s = j % 8 of its block, the low (s even) or high nibbles of qs[32 (s / 2) ..], two
// quads; its block's first quad for d, dmin and the scales (SUB_SCALES 1).
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

#ifdef Q6_K
// Sub-block j: s = j % 8 of its block, half h = s / 4, i = s % 4: elements 128h + 32i + l (l <
// 32) from bytes l of ql[64h + 32 (i % 2) ..] (nibble i / 2) and of qh[32h ..] (bits 2i, 2i+1),
// scales[8h + 2i + l / 16]: two 16-byte spans each, a word of scales and d (SUB_SCALES 2).
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
