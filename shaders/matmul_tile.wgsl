// The opening statements of the tiled matmuls' `main` (matmul.wgsl, matmul_int.wgsl), included
// at its top: the workgroup's tile and its first slice of K, leaving at once past either end,
// and the invocation's place in the tile (tm along M, tt along tokens). Included text rather
// than a function: sharing the entry point through functions cost 5-9% on the Q4_1 matmuls
// (docs/PERFORMANCE.md, tried, not kept); text compiles as the kernel's own.
    let origin = tile_origin(wid, nwg);
    let s0 = tile_part(wid, nwg) * PART_SLICES;   // this workgroup's slices: s0 .. s0 + PART_SLICES - 1
    let n_tokens = origin.x;
    let t0 = origin.y;
    let m0 = origin.z;
    if (t0 >= n_tokens || m0 >= M) {
        return;   // uniform: whole workgroup
    }
    let tm = lid % NM;
    let tt = lid / NM;
