// 256-element blocks of a row of x into its record of integers (x_int_record.wgsl), as the
// integer prefill matmul reads them: 256 invocations take four blocks at a time, 64 a block,
// four elements each. Shared by quantize_x.wgsl and the fused RMSNorm (rms_norm.wgsl X_INT).
// The includer declares `xi` (array<u32>, read_write) and includes x_int.wgsl and
// x_int_record.wgsl.

var<workgroup> part: array<f32, 256>;   // per block (a quarter) the max |x| of each invocation's four, then of pairs ...
var<workgroup> sums: array<i32, 256>;   // each invocation's sum of q

// Invocation lid's four elements v (4 (lid % 64) .. of block b) into the record at word
// `record`; a block past K / 256 writes nothing. Call from uniform control flow.
fn quantize_blocks(lid: u32, v: vec4<f32>, record: u32, b: u32) {
    let l = lid % 64u;
    let a = abs(v);
    part[lid] = max(max(a.x, a.y), max(a.z, a.w));
    for (var n = 0u; n < 6u; n++) {   // a tree over the block's 64 invocations' maxima
        workgroupBarrier();
        let half = 32u >> n;
        if (l < half) {
            part[lid] = max(part[lid], part[lid + half]);
        }
    }
    workgroupBarrier();
    let inv = x_int_inv(part[lid - l]);
    let q = x_int4(v, inv);
    sums[lid] = q.x + q.y + q.z + q.w;
    workgroupBarrier();
    if (b < K / 256u) {
        for (var p = 0u; p < X_PLANES; p++) {
            xi[record + p * (K / 4u) + 64u * b + l] = x_int_plane(q, p);
        }
        if (l % (X_SUM_ELEMS / 4u) == 0u) {   // each sub-block's sum: X_SUM_ELEMS / 4 invocations'
            var s = 0;
            for (var i = 0u; i < X_SUM_ELEMS / 4u; i++) {
                s += sums[lid + i];
            }
            xi[record + X_SUMS + 256u / X_SUM_ELEMS * b + l / (X_SUM_ELEMS / 4u)] = bitcast<u32>(s);
        }
        if (l == 0u) {
            xi[record + X_STEPS + b] = bitcast<u32>(x_int_step(inv));
        }
    }
    workgroupBarrier();   // part and sums are free again (a caller's next round)
}
