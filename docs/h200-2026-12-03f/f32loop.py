"""Throwaway: the f32 prefill tile's inner loop alone (workgroup memory -> FMAs), per register
block: RM rows x RT tokens an invocation (GLU: gate and up), 256 invocations.
    python3 f32loop.py"""
import os, time, wgpu

ADAPTER = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
print(ADAPTER.info["device"], ADAPTER.info["backend_type"])
DEV = ADAPTER.request_device_sync(required_limits=dict(ADAPTER.limits))
R = int(os.environ.get("R", 400))
NWG = int(os.environ.get("NWG", 132 * 8))


def kernel(rm, rt, mats, mapping):
    nm, nt = 64 // rm * (2 if rt == 4 and rm == 8 else 1), 0
    # invocations: 256 = NM * NT with NM = tile_m / rm, NT = tile_t / rt
    tile_m = {(4, 4): 64, (8, 4): 128, (4, 8): 64, (8, 8): 128}[(rm, rt)]
    tile_t = 256 * rm * rt // tile_m
    nm, nt = tile_m // rm, tile_t // rt
    m4, t4 = tile_m // 4, tile_t // 4
    bk = 16
    accs = [f"a{m}{i}{j}" for m in range(mats) for i in range(rt // 4) for j in range(rm // 4)]
    body = []
    for i in range(rt // 4):
        body.append(f"let x{i} = xs[kk * {t4}u + {'tt * %du + %d' % (rt // 4, i) if mapping == 'adj' else 'tt + %du' % (i * nt)}];")
    for m in range(mats):
        for j in range(rm // 4):
            idx = f"tm * {rm // 4}u + {j}u" if mapping == "adj" else f"tm + {j * nm}u"
            body.append(f"let w{m}{j} = ws[({m}u * {bk}u + kk) * {m4}u + {idx}];")
    for m in range(mats):
        for i in range(rt // 4):
            for j in range(rm // 4):
                body.append(f"a{m}{i}{j} = ofma(a{m}{i}{j}, w{m}{j}, x{i});")
    total = " + ".join(f"dot({a} * vec4<f32>(1.0), vec4<f32>(1.0))" for a in accs)
    return f"""
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
var<workgroup> ws: array<vec4<f32>, {mats * bk * m4}>;
var<workgroup> xs: array<vec4<f32>, {bk * t4}>;
fn ofma(a: mat4x4<f32>, w: vec4<f32>, x: vec4<f32>) -> mat4x4<f32> {{
    return mat4x4<f32>(fma(w, vec4(x.x), a[0]), fma(w, vec4(x.y), a[1]), fma(w, vec4(x.z), a[2]), fma(w, vec4(x.w), a[3]));
}}
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
    for (var i = lid; i < {mats * bk * m4}u; i += 256u) {{ ws[i] = vec4<f32>(f32(i) * 1e-3, 1e-3, f32(wid.x) * 1e-4, 0.5); }}
    for (var i = lid; i < {bk * t4}u; i += 256u) {{ xs[i] = vec4<f32>(f32(i) * 2e-3, 1e-3, 0.25, f32(wid.x) * 1e-4); }}
    let tm = lid % {nm}u; let tt = lid / {nm}u;
    {" ".join(f"var {a}: mat4x4<f32>;" for a in accs)}
    for (var o = 0u; o < {R}u; o++) {{
        workgroupBarrier();
        for (var kk = 0u; kk < {bk}u; kk++) {{
            {chr(10).join(body)}
        }}
    }}
    out[wid.x * 256u + lid] = {total};
}}
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
    tf = NWG * 256 * macs_per_thread * R * 2 / best / 1e12
    print(f"{name:28s} {best * 1e3:7.2f} ms a dispatch, {tf:5.1f} TFLOP/s", flush=True)


for mats in (1, 2):
    for rm, rt in ((4, 4), (8, 4), (4, 8), (8, 8)):
        if mats == 2 and rm * rt == 64:
            continue
        for mapping in ("strided", "adj"):
            name = f"{'glu ' if mats == 2 else ''}{rm}x{rt} {mapping}"
            try:
                run(name, kernel(rm, rt, mats, mapping), 16 * mats * rm * rt)
            except Exception as e:
                print(name, "failed:", type(e).__name__, str(e)[:200], flush=True)
