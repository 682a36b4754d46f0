// Columns 4c..4c+3 of the head starting at float `base` of the f32 array ${A} (zero past
// HEAD_DIM): written once for every array read this way (#include "head_vec4.wgsl" A=name).
fn ${A}_vec4(base: u32, c: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        if (4u * c + i < HEAD_DIM) {
            v[i] = ${A}[base + 4u * c + i];
        }
    }
    return v;
}
