// The sum over the workgroup of one value per invocation; every invocation gets the total.
// The including shader declares `const WG` (a power of two) and
// `var<workgroup> partial: array<f32, WG>`; call from uniform control flow.
fn workgroup_sum(lid: u32, value: f32) -> f32 {
    partial[lid] = value;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            partial[lid] += partial[lid + s];
        }
        workgroupBarrier();
    }
    let total = partial[0];
    workgroupBarrier();   // everyone has read it before `partial` is used again
    return total;
}
