// Halvings through workgroup memory, written once for each array summed this way
// (#include "tree_sum.wgsl" P=name T=type N=size): ${P} (an array<${T}, WG> the includer
// declares) takes each invocation's value, and the first invocation of each aligned run of ${N}
// (a power of two) ends with the run's sum at its own index. Call from uniform control flow.
fn ${P}_halvings(lid: u32, value: ${T}) {
    ${P}[lid] = value;
    workgroupBarrier();
    for (var k = 1u; k <= countTrailingZeros(${N}); k++) {
        let s = ${N} >> k;
        if (lid % ${N} < s) {
            ${P}[lid] += ${P}[lid + s];
        }
        workgroupBarrier();
    }
}
