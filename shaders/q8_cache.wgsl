// The KV cache's q8_0 type (cera.gpu.numerics): llama.cpp's block_q8_0 made word-aligned, as
// cera.ops.Q8_0_BLOCK lays it out. A head's row (HEAD_DIM a multiple of 32) is blocks of 32
// values, each 9 u32: word 0 the f16 scale d in its low half (the high half 0), words 1..8 the
// 32 int8 quants q, four to a word, lowest byte first: 36 bytes a block (llama.cpp's are 34,
// the scale unpadded). Value i of a cache (its float index, as an f32 cache would have it) is
// q[i % 32] * d of block i / 32.
//
// Writes quantize as llama.cpp's quantize_row_q8_0_ref: per block amax = max |x|, d = amax / 127,
// id = 1 / d (0 where d is 0), q = roundf(x * id) (ties away from zero), d stored as f16 rounded
// to nearest even (half.wgsl). WGSL's division may be 2.5 ulp off, so d and id are corrected to
// the correctly rounded quotients by an exact integer residual (q8_quotient, q8_rounded; tested
// from quotients 3 ulp off, test_kernels_layers.py): the cache holds the bytes numpy's
// quantize_q8_0 gives. (Not for amax below 127 * 2^-126, where d is subnormal: d is stored as 0
// there either way, and every value reads back 0.)
// The includer declares the cache arrays (array<u32>) and does the reads and writes with these.

#include "half.wgsl"

const Q8_VALUES = 32u;   // values a block
const Q8_WORDS = 9u;     // u32 a block: the scale's word, then 8 of quants

// The word holding block i / 32's scale, and the one holding value i's quant (with values
// i - i % 4 .. + 3).
fn q8_scale_word(i: u32) -> u32 {
    return (i / Q8_VALUES) * Q8_WORDS;
}

fn q8_word(i: u32) -> u32 {
    return (i / Q8_VALUES) * Q8_WORDS + 1u + (i % Q8_VALUES) / 4u;
}

// The four values of quant word w, of the block whose scale word is `scale`.
fn q8_unpack4(scale: u32, w: u32) -> vec4<f32> {
    let q = bitcast<vec4<i32>>(vec4<u32>(w) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u);
    return vec4<f32>(q) * unpack2x16float(scale).x;
}

// The correctly rounded a / b for positive normal a, b and a normal quotient (else WGSL's own):
// WGSL's quotient c moved an ulp at a time while the exact residual a - b * c says a neighbour is
// nearer. With a = ma 2^(ea-150), b = mb 2^(eb-150), c = mc 2^(ec-150) (24-bit mantissas, biased
// exponents), R = (a - b c) 2^(300-eb-ec) = ma 2^(ea+150-eb-ec) - mb mc: an integer, small for a
// c within a few ulp of a / b, so exact in wrapping u32 arithmetic. c is a / b rounded iff
// |R| <= mb / 2 (the float below c is half as far when c is a power of two: |R| <= mb / 4 on
// that side); a quotient of floats is never a tie.
fn q8_quotient(a: f32, b: f32) -> f32 {
    return q8_rounded(a, b, a / b);
}

// a / b rounded, from a quotient c0 within a few ulp of it (q8_quotient).
fn q8_rounded(a: f32, b: f32, c0: f32) -> f32 {
    var c = c0;
    let ea = i32(bitcast<u32>(a) >> 23u);
    let eb = i32(bitcast<u32>(b) >> 23u);
    if (ea == 0 || eb == 0 || ea >= 255 || eb >= 255) {
        return c;
    }
    let ma = (bitcast<u32>(a) & 0x7fffffu) | 0x800000u;
    let mb = (bitcast<u32>(b) & 0x7fffffu) | 0x800000u;
    for (var n = 0u; n < 4u; n++) {
        let bits = bitcast<u32>(c);
        let ec = i32(bits >> 23u);
        let shift = ea + 150 - eb - ec;
        if (ec == 0 || ec >= 255 || shift < 0 || shift > 31) {
            return c;
        }
        let mc = (bits & 0x7fffffu) | 0x800000u;
        let r = bitcast<i32>((ma << u32(shift)) - mb * mc);
        if (2 * r > i32(mb)) {
            c = bitcast<f32>(bits + 1u);
        } else if (r < 0 && select(-2, -4, mc == 0x800000u) * r > i32(mb)) {
            c = bitcast<f32>(bits - 1u);
        } else {
            break;
        }
    }
    return c;
}

struct Q8Scale {
    word: u32,   // the block's scale word: d as f16 bits
    inv: f32,    // id = 1 / d in f32, what x is multiplied by
}

// A block's scale from the max |x| of its 32 values.
fn q8_scale(amax: f32) -> Q8Scale {
    let d = q8_quotient(amax, 127.0);
    return Q8Scale(half_bits(d), select(0.0, q8_quotient(1.0, d), d != 0.0));
}

// Four values' quant word: roundf(x * id), ties away from zero, as int8 bytes.
fn q8_pack4(x: vec4<f32>, inv: f32) -> u32 {
    let v = x * inv;
    let t = trunc(v);
    let q = bitcast<vec4<u32>>(vec4<i32>(t + select(vec4<f32>(0.0), sign(v), abs(v - t) >= vec4<f32>(0.5))));
    return (q.x & 0xffu) | ((q.y & 0xffu) << 8u) | ((q.z & 0xffu) << 16u) | (q.w << 24u);
}
