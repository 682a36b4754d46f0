"""Throwaway: the inner loop of a prefill tile in f32 FMAs against 8-bit dot4I8Packed, same MACs.
    python3 dp4a.py"""
import time, numpy as np, wgpu

ADAPTER = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
print(ADAPTER.info)
DEV = ADAPTER.request_device_sync(required_limits=dict(ADAPTER.limits))
import os
R = int(os.environ.get("R", 1000))
NWG = int(os.environ.get("NWG", 132 * 16))

HEAD = """
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
const R = %du;
""" % R

F32 = HEAD + """
var<workgroup> ws: array<vec4<f32>, 512>;
var<workgroup> xs: array<vec4<f32>, 512>;
fn ofma(a: mat4x4<f32>, w: vec4<f32>, x: vec4<f32>) -> mat4x4<f32> {
    return mat4x4<f32>(fma(w, vec4(x.x), a[0]), fma(w, vec4(x.y), a[1]), fma(w, vec4(x.z), a[2]), fma(w, vec4(x.w), a[3]));
}
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    ws[lid] = vec4<f32>(f32(lid) * 1e-3); ws[lid + 256u] = vec4<f32>(f32(wid.x) * 1e-3);
    xs[lid] = vec4<f32>(f32(lid) * 2e-3); xs[lid + 256u] = vec4<f32>(1e-3);
    let tm = lid % 16u; let tt = lid / 16u;
    var a: mat4x4<f32>;
    for (var o = 0u; o < R; o++) {
        workgroupBarrier();
        for (var kk = 0u; kk < 32u; kk++) {
            a = ofma(a, ws[kk * 16u + tm], xs[kk * 16u + tt]);
        }
    }
    out[wid.x * 256u + lid] = a[0].x + a[1].y + a[2].z + a[3].w + a[0].w + a[3].x;
}
"""

I8 = HEAD + """
var<workgroup> ws: array<vec4<u32>, 128>;
var<workgroup> xs: array<vec4<u32>, 128>;
fn d4(w: vec4<u32>, x: u32) -> vec4<i32> {
    return vec4<i32>(dot4I8Packed(w.x, x), dot4I8Packed(w.y, x), dot4I8Packed(w.z, x), dot4I8Packed(w.w, x));
}
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    if (lid < 128u) { ws[lid] = vec4<u32>(lid * 0x01010101u, wid.x, lid, 7u); xs[lid] = vec4<u32>(lid, 3u, lid * 5u, wid.x); }
    let tm = lid % 16u; let tt = lid / 16u;
    var s0: vec4<i32>; var s1: vec4<i32>; var s2: vec4<i32>; var s3: vec4<i32>;
    var f0: vec4<f32>; var f1: vec4<f32>; var f2: vec4<f32>; var f3: vec4<f32>;
    let sc = vec4<i32>(i32(lid & 7u), 3, 5, i32(wid.x & 15u));
    for (var o = 0u; o < R; o++) {
        workgroupBarrier();
        var d0: vec4<i32>; var d1: vec4<i32>; var d2: vec4<i32>; var d3: vec4<i32>;
        for (var k = 0u; k < 8u; k++) {
            let w = ws[k * 16u + tm]; let x = xs[k * 16u + tt];
            d0 += d4(w, x.x); d1 += d4(w, x.y); d2 += d4(w, x.z); d3 += d4(w, x.w);
        }
{ACC}
    }
    out[wid.x * 256u + lid] = f0.x + f1.y + f2.z + f3.w + f0.w + f3.x;
}
"""
SCALED = """        s0 += sc * d0; s1 += sc * d1; s2 += sc * d2; s3 += sc * d3;
        if ((o & 7u) == 7u) {
            f0 += vec4<f32>(s0) * 1e-3; f1 += vec4<f32>(s1) * 1e-3; f2 += vec4<f32>(s2) * 1e-3; f3 += vec4<f32>(s3) * 1e-3;
            s0 = vec4<i32>(); s1 = vec4<i32>(); s2 = vec4<i32>(); s3 = vec4<i32>();
        }
"""
PLAIN = """        f0 += vec4<f32>(d0); f1 += vec4<f32>(d1); f2 += vec4<f32>(d2); f3 += vec4<f32>(d3);
"""


def run(name, code, macs_per_thread):
    mod = DEV.create_shader_module(code=code)
    pipe = DEV.create_compute_pipeline(layout="auto", compute={"module": mod, "entry_point": "main"})
    buf = DEV.create_buffer(size=NWG * 256 * 4, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    bg = DEV.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": buf}}])
    best = 1e9
    for rep in range(5):
        enc = DEV.create_command_encoder()
        p = enc.begin_compute_pass(); p.set_pipeline(pipe); p.set_bind_group(0, bg)
        for _ in range(4):
            p.dispatch_workgroups(NWG)
        p.end()
        t = time.perf_counter(); DEV.queue.submit([enc.finish()]); DEV.queue.read_buffer(buf, size=4)
        best = min(best, (time.perf_counter() - t) / 4)
    tops = NWG * 256 * macs_per_thread * R * 2 / best / 1e12
    print(f"{name}: {best * 1e3:.2f} ms a dispatch, {tops:.1f} T(FL)OP/s (2 per MAC)", flush=True)


run("f32 4x4 tile loop", F32, 512)
run("i8 dot4I8Packed 4x4 tile loop", I8.replace("{ACC}", PLAIN), 512)
run("i8 + per-32 integer scale, f32 per 256", I8.replace("{ACC}", SCALED), 512)
