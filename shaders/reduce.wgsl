// The sum over the workgroup of one value per invocation; every invocation gets the total.
// The including shader declares `const WG` (a power of two); call from uniform control flow.
//
// Flag SUBGROUPS (the device has the feature): each subgroup adds with subgroupAdd, its first
// invocation leaves the sum in workgroup memory, and one barrier later everyone adds those;
// the caller passes the `subgroup_size` builtin. Subgroups are taken to be consecutive runs
// of local_invocation_index (as on Vulkan, D3D12 and Metal for a 1-D workgroup).
#ifdef SUBGROUPS
enable subgroups;

var<workgroup> subgroup_sums: array<f32, WG / 4u>;   // WebGPU subgroups have 4 to 128 invocations

fn workgroup_sum(lid: u32, sg_size: u32, value: f32) -> f32 {
    let sum = subgroupAdd(value);
    if (lid % sg_size == 0u) {
        subgroup_sums[lid / sg_size] = sum;
    }
    workgroupBarrier();
    var total = 0.0;
    let subgroups = (WG + sg_size - 1u) / sg_size;   // one where WG < sg_size
    for (var i = 0u; i < (WG + 3u) / 4u; i++) {        // a constant bound (matvec.wgsl says why)
        if (i >= subgroups) {
            break;
        }
        total += subgroup_sums[i];
    }
    workgroupBarrier();   // everyone has read them before `subgroup_sums` is written again
    return total;
}
#else
var<workgroup> sum_partial: array<f32, WG>;
#include "tree_sum.wgsl" P=sum_partial T=f32 N=WG

fn workgroup_sum(lid: u32, value: f32) -> f32 {
    sum_partial_halvings(lid, value);
    let total = sum_partial[0];
    workgroupBarrier();   // everyone has read it before `sum_partial` is used again
    return total;
}
#endif
