// Rows dotted with x in integers (matvec_int.wgsl), per 256-element block: the decode matvec's
// integer dot products. Defines: quant_blocks.wgsl's, X_PLANES, ITEM_UNITS.
//
// The includer holds x per 256-element block b as a step d and integers q = round(x / d) in
// X_PLANES signed bytes each (8 bits as llama.cpp's CPU backend quantizes the activations of its
// k-quant dot products (Q8_K), or 24), and defines fn x_group(p, g) -> vec4<u32> (byte p of the
// q of elements 16g .. 16g+15, four to a word, low byte first), fn x_sum(g) -> i32 (their sum)
// and fn x_step(b) -> f32 (block b's d). A type of
// cera.gpu.quant.X_INT_TYPES defines
//     fn item_dot_int(src, row_byte, p) -> f32     dot(W[row, item p], x as staged)
// over its items of ITEM_UNITS units (ITEM_UNITS * 16 elements; the define comes from
// cera.gpu.quant.X_INT_ITEM_UNITS)
// with every product of quants an exact integer (dot4I8Packed: four 8-bit products a call),
// summed per plane in integers and across planes in f32.
#include "quant_blocks.wgsl"

// The dot of 16 packed signed bytes (four words) with plane p of x's group g
fn dot16_int(w: vec4<u32>, g: u32, p: u32) -> i32 {
    let x = x_group(p, g);
    return dot4I8Packed(w.x, x.x) + dot4I8Packed(w.y, x.y) + dot4I8Packed(w.z, x.z) + dot4I8Packed(w.w, x.w);
}

// plane p's integer sum as its share of the whole: 256^p * sum
fn plane_value(sum: i32, p: u32) -> f32 {
    return ldexp(f32(sum), i32(8u * p));
}

#ifdef Q4_K
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
    let mins = f32(sm_lo.y) * f32(x_sum(g)) + f32(sm_hi.y) * f32(x_sum(g + 2u));
    let dd = unpack2x16float(head.x);
    return x_step(blk) * (dd.x * qs - dd.y * mins);
}
#endif

#ifdef Q6_K
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
    return load_f16(src, at[5]) * x_step(p / 4u) * sum;
}
#endif
