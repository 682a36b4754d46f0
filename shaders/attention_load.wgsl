// Loads for the attention kernels: a vec4 of q (load_q) or of a cache row (k_load4, v_load4), and
// (flag ROPE) stores to a cache row (k_store4, v_store4). The including shader declares q (not
// with ROPE: array<Elem>), k_cache (array<KWord>), v_cache (array<VWord>) and HEAD_DIM. Elem:
// vec4<f32> with flag VEC4, else f32; a cache's word type comes from its flags (cache_io.wgsl).

#ifdef VEC4
alias Elem = vec4<f32>;
#else
alias Elem = f32;
#endif
#include "cache_io.wgsl" C=k T=K
#include "cache_io.wgsl" C=v T=V

#ifndef ROPE
// Columns 4c..4c+3 of a head starting at float `base` (zero past HEAD_DIM).
fn load_q(base: u32, c: u32) -> vec4<f32> {
#ifdef VEC4
    return q[base / 4u + c];
#else
    return q_vec4(base, c);
#endif
}
#ifndef VEC4
#include "head_vec4.wgsl" A=q
#endif
#endif
