"""Throwaway: the f32 tile's inner loop alone, more shapes: vec4 accumulators along rows,
x loaded as vec4 (4 tokens) or as scalars (broadcast), TM x TT tiles, 128/256 invocations."""
import os, time, wgpu

ADAPTER = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
print(ADAPTER.info["device"], ADAPTER.info["backend_type"])
DEV = ADAPTER.request_device_sync(required_limits=dict(ADAPTER.limits))
R = int(os.environ.get("R", 200))
NWG = 132 * 8
BK = 16


def kernel(tm_rows, rm, rt, threads, xload):
    nm = tm_rows // rm
    nt = threads // nm
    tt_tok = nt * rt
    m4 = tm_rows // 4
    body = []
    if xload == "vec4":
        for i in range(rt // 4):
            body.append(f"let xv{i} = xs4[kk * {tt_tok // 4}u + tt + {i * nt}u];")
        xs = [f"xv{t // 4}.{'xyzw'[t % 4]}" for t in range(rt)]
        xdecl = f"var<workgroup> xs4: array<vec4<f32>, {BK * tt_tok // 4}>;"
        xinit = f"for (var i = lid; i < {BK * tt_tok // 4}u; i += {threads}u) {{ xs4[i] = vec4<f32>(f32(i) * 2e-3, 1e-3, 0.25, f32(wid.x) * 1e-4); }}"
    else:
        for t in range(rt):
            body.append(f"let xv{t} = xs1[kk * {tt_tok}u + tt + {t * nt}u];")
        xs = [f"xv{t}" for t in range(rt)]
        xdecl = f"var<workgroup> xs1: array<f32, {BK * tt_tok}>;"
        xinit = f"for (var i = lid; i < {BK * tt_tok}u; i += {threads}u) {{ xs1[i] = f32(i) * 2e-3; }}"
    for j in range(rm // 4):
        body.append(f"let w{j} = ws[kk * {m4}u + tm + {j * nm}u];")
    accs = []
    for j in range(rm // 4):
        for t in range(rt):
            a = f"a{j}_{t}"
            accs.append(a)
            body.append(f"{a} = fma(w{j}, vec4<f32>({xs[t]}), {a});")
    total = " + ".join(f"dot({a}, vec4<f32>(1.0))" for a in accs)
    return f"""
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
var<workgroup> ws: array<vec4<f32>, {BK * m4}>;
{xdecl}
@compute @workgroup_size({threads})
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
    for (var i = lid; i < {BK * m4}u; i += {threads}u) {{ ws[i] = vec4<f32>(f32(i) * 1e-3, 1e-3, f32(wid.x) * 1e-4, 0.5); }}
    {xinit}
    let tm = lid % {nm}u; let tt = lid / {nm}u;
    {" ".join(f"var {a}: vec4<f32>;" for a in accs)}
    for (var o = 0u; o < {R}u; o++) {{
        workgroupBarrier();
        for (var kk = 0u; kk < {BK}u; kk++) {{
            {chr(10).join(body)}
        }}
    }}
    out[wid.x * {threads}u + lid] = {total};
}}
""", 4 * len(accs)


def run(name, code, macs, threads):
    mod = DEV.create_shader_module(code=code)
    pipe = DEV.create_compute_pipeline(layout="auto", compute={"module": mod, "entry_point": "main"})
    buf = DEV.create_buffer(size=NWG * threads * 4, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
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
    tf = NWG * threads * macs * BK * R * 2 / best / 1e12
    print(f"{name:34s} {best * 1e3:7.2f} ms a dispatch, {tf:5.1f} TFLOP/s", flush=True)


for tm_rows, rm, rt, threads in ((64, 4, 4, 256), (128, 8, 8, 256), (128, 8, 8, 128), (128, 4, 8, 128),
                                 (128, 8, 16, 128), (256, 16, 8, 128), (128, 16, 8, 64), (64, 8, 8, 64),
                                 (128, 4, 16, 128), (256, 8, 8, 256)):
    for xload in ("vec4", "scalar"):
        name = f"{tm_rows}rows {rm}x{rt} {threads}inv x:{xload}"
        try:
            code, macs = kernel(tm_rows, rm, rt, threads, xload)
            run(name, code, macs, threads)
        except Exception as e:
            print(name, "failed:", type(e).__name__, str(e)[:200], flush=True)
