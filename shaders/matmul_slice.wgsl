// The first statements of each step of the tiled matmuls' slice loop (matmul.wgsl,
// matmul_int.wgsl; `for (var i ...)` over PART_SLICES, as matmul_tile.wgsl): slice s0 + i
// staged from `fetched` into workgroup memory (the loop ends past K), then the next slice's
// loads issued, in flight while the includer's products of this slice run. Text, as
// matmul_tile.wgsl.
        let slice = s0 + i;
        if (slice >= N_SLICES) {
            break;   // the last part's end (uniform)
        }
        workgroupBarrier();   // the previous slice's reads are done
        stage(lid, fetched, m0, slice);
        workgroupBarrier();
        if (i + 1u < PART_SLICES && slice + 1u < N_SLICES) {
            fetched = fetch(lid, m0, t0, n_tokens, slice + 1u);
        }
