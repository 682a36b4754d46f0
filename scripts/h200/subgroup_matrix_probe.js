// What Chromium's `chromium-experimental-subgroup-matrix` offers on this adapter, and how fast an
// 8-bit integer tile of a prefill matmul runs on it: an expression for browser_bench.py's
// PROBE_JS (evaluated in the page, it resolves to a JSON string: the adapter's matrix configs,
// and per kernel variant its time, TOPS and one output against the host's integer dot product).
//
// The timed kernel is the inner loop a Q4_K x integer-x prefill matmul (8960x1536, 512 tokens)
// would run: a workgroup of subgroups owns weight rows x 64 tokens and walks K in 32-element
// sub-blocks (one Q4_K scale per row and sub-block, one x scale per token and sub-block). It
// stages the weights' 8-bit integers and the three byte planes of x's 24-bit integers in
// workgroup memory, multiplies 16x16x32 tiles on the matrix units (planes combined inside the
// matrix as sum 256^p * plane p, exact in 32-bit integers for a sub-block), stores each
// subgroup's 32x32 integer block to workgroup memory and scales it into f32 accumulators: the
// per-sub-block scales cannot be applied inside the matrix API. TOPS count 2 * M * N * K
// products a dispatch (planes not counted), from wall time over REPS dispatches in one submission.
// Dawn's spelling (Chromium 156): subgroupMatrixLoad<T, row_major | col_major>(ptr, offset,
// stride) and subgroupMatrixStore<row_major>(...), 8-bit matrices from array<u32> with offsets
// and strides in words; the older bool-argument form takes 8-bit matrices only from array<i32>.
(async () => {
  const out = {};
  const adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
  if (!adapter) return JSON.stringify({ error: "no adapter" });
  const info = adapter.info || {};
  out.adapter = [info.vendor, info.architecture, info.description].join(" ");
  out.subgroups = [info.subgroupMinSize, info.subgroupMaxSize];
  out.configs = [...(info.subgroupMatrixConfigs || [])].map((c) =>
    `${c.M}x${c.N}x${c.K} ${c.componentType}->${c.resultComponentType}`);
  out.wgsl = [...(navigator.gpu.wgslLanguageFeatures || [])];
  const wanted = ["chromium-experimental-subgroup-matrix", "subgroups", "shader-f16"];
  const features = wanted.filter((f) => adapter.features.has(f));
  out.features = features;
  if (!features.includes("chromium-experimental-subgroup-matrix")) return JSON.stringify(out);
  const requiredLimits = {};
  for (const name of ["maxComputeWorkgroupStorageSize", "maxStorageBufferBindingSize", "maxBufferSize",
    "maxComputeInvocationsPerWorkgroup", "maxComputeWorkgroupSizeX"]) requiredLimits[name] = adapter.limits[name];
  const device = await adapter.requestDevice({ requiredFeatures: features, requiredLimits });
  const i8 = [...info.subgroupMatrixConfigs].filter((c) => c.componentType === "i8" && c.resultComponentType === "i32");
  if (!i8.length) return JSON.stringify(out);
  const cfg = i8.find((c) => c.M === 16 && c.N === 16) || i8[0];
  out.config = `${cfg.M}x${cfg.N}x${cfg.K}`;

  // The kernel, by variant: SGS subgroups of 32 (a workgroup of 32 * SGS rows x 64 tokens, a
  // subgroup 32 x 32), KC sub-blocks staged per round, PREFETCH: the next round's loads issued
  // before this round's products, POST: each sub-block's integers scaled into f32 (false: kept
  // in the matrix across K, the products' own cost).
  const M = 8960, N = 512, K = 1536, PLANES = 3, REPS = 20;
  const tiles = [];
  for (let i = 0; i < 32 / cfg.M; i++) for (let j = 0; j < 32 / cfg.N; j++) tiles.push([i, j]);
  const right = (plane) => `subgroupMatrixLoad<R, col_major>(&bs, ((${plane}) * TN + col) * RW + kc * KW, RW)`;
  const source = ({ SGS, KC, PREFETCH, POST, SCALE = true }) => `
enable chromium_experimental_subgroup_matrix;
enable subgroups;
const SM = ${cfg.M}u; const SN = ${cfg.N}u; const SK = ${cfg.K}u;
const PLANES = ${PLANES}u;
const K = ${K}u;
const SGS = ${SGS}u; const WG = 32u * SGS; const KC = ${KC}u;
const TM = 32u * SGS / 2u; const TN = 64u;
const BM = 32u; const BN = 32u;
const TILES_M = BM / SM; const TILES_N = BN / SN;
const KW = SK / 4u;                       // words of a sub-block of one row or token
const RW = KC * KW;                       // words of a round of one row or token
const AV = TM * RW / 4u; const BV = PLANES * TN * RW / 4u;   // vec4 loads of a round
const AR = (AV + WG - 1u) / WG; const BR = (BV + WG - 1u) / WG;
alias L = subgroup_matrix_left<i8, SK, SM>;
alias R = subgroup_matrix_right<i8, SN, SK>;
alias C = subgroup_matrix_result<i32, SN, SM>;
@group(0) @binding(0) var<storage, read> a: array<vec4<u32>>;    // (M, K / 16) rows' 8-bit integers
@group(0) @binding(1) var<storage, read> b: array<vec4<u32>>;    // (PLANES, N, K / 16)
@group(0) @binding(2) var<storage, read> sa: array<f32>;         // (M, K / SK) scales
@group(0) @binding(3) var<storage, read> sb: array<f32>;         // (N, K / SK)
@group(0) @binding(4) var<storage, read_write> out: array<${POST ? "f32" : "i32"}>;  // (N, M)
var<workgroup> as_: array<u32, TM * RW>;
var<workgroup> bs: array<u32, PLANES * TN * RW>;
${POST ? "var<workgroup> cs: array<i32, SGS * BM * BN>;" : ""}
var<workgroup> ssa: array<f32, TM * KC>;
var<workgroup> ssb: array<f32, TN * KC>;
var<private> ra: array<vec4<u32>, AR>;
var<private> rb: array<vec4<u32>, BR>;
const NS = (TM + TN) * KC; const SR = (NS + WG - 1u) / WG;   // a round's scales
var<private> rs: array<f32, SR>;
fn fetch(lid: u32, m0: u32, t0: u32, n_tok: u32, r: u32) {
  for (var n = 0u; n < AR; n++) {
    let q = n * WG + lid;
    if (q < AV) { ra[n] = a[(m0 + q / (RW / 4u)) * (K / 16u) + r * (RW / 4u) + q % (RW / 4u)]; }
  }
  for (var n = 0u; n < BR; n++) {
    let q = n * WG + lid;
    if (q < BV) {
      let pt = q / (RW / 4u);
      b_idx(n, pt, q, t0, n_tok, r);
    }
  }
  for (var n = 0u; n < SR; n++) {
    let q = n * WG + lid;
    if (q < TM * KC) { rs[n] = sa[(m0 + q / KC) * (K / SK) + r * KC + q % KC]; }
    else if (q < NS) { let i = q - TM * KC; rs[n] = sb[(t0 + i / KC) * (K / SK) + r * KC + i % KC]; }
  }
}
fn b_idx(n: u32, pt: u32, q: u32, t0: u32, n_tok: u32, r: u32) {
  rb[n] = b[((pt / TN) * n_tok + t0 + pt % TN) * (K / 16u) + r * (RW / 4u) + q % (RW / 4u)];
}
fn stage(lid: u32) {
  for (var n = 0u; n < AR; n++) {
    let q = n * WG + lid;
    if (q < AV) { let at = q * 4u; as_[at] = ra[n].x; as_[at + 1u] = ra[n].y; as_[at + 2u] = ra[n].z; as_[at + 3u] = ra[n].w; }
  }
  for (var n = 0u; n < BR; n++) {
    let q = n * WG + lid;
    if (q < BV) { let at = q * 4u; bs[at] = rb[n].x; bs[at + 1u] = rb[n].y; bs[at + 2u] = rb[n].z; bs[at + 3u] = rb[n].w; }
  }
  for (var n = 0u; n < SR; n++) {
    let q = n * WG + lid;
    if (q < TM * KC) { ssa[q] = rs[n]; }
    else if (q < NS) { ssb[q - TM * KC] = rs[n]; }
  }
}
@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, @builtin(subgroup_id) sg: u32) {
  let M = nwg.x * TM;
  let n_tok = nwg.y * TN;
  let m0 = wid.x * TM;
  let t0 = wid.y * TN;
  let lane = lid % 32u;
  let sm0 = (sg % (SGS / 2u)) * BM;   // the subgroup's block in the tile
  let sn0 = (sg / (SGS / 2u)) * BN;
  var acc: array<f32, BM>;
  for (var i = 0u; i < BM; i++) { acc[i] = 0.0; }
  ${POST ? "" : tiles.map(([i, j]) => `var c${i}${j}: C;`).join(" ")}
  fetch(lid, m0, t0, n_tok, 0u);
  for (var r = 0u; r < K / SK / KC; r++) {
    workgroupBarrier();
    stage(lid);
    workgroupBarrier();
    ${PREFETCH ? "if (r + 1u < K / SK / KC) { fetch(lid, m0, t0, n_tok, r + 1u); }" : ""}
    for (var kc = 0u; kc < KC; kc++) {
${tiles.map(([i, j]) => `      {
        let left = subgroupMatrixLoad<L, row_major>(&as_, (sm0 + ${i}u * SM) * RW + kc * KW, RW);
        let col = sn0 + ${j}u * SN;
        ${POST ? "var c = subgroupMatrixMultiply<i32>(left, " + right("PLANES - 1u") + ");" : ""}
        for (var p = ${POST ? 1 : 0}u; p < PLANES; p++) {
          ${POST ? "c = subgroupMatrixScalarMultiply(c, 256i);\n          c = " : `c${i}${j} = `}subgroupMatrixMultiplyAccumulate(left, ${right("PLANES - 1u - p")}, ${POST ? "c" : `c${i}${j}`});
        }
        ${POST ? `subgroupMatrixStore<row_major>(&cs, sg * BM * BN + ${i}u * SM * BN + ${j}u * SN, c, BN);` : ""}
      }`).join("\n")}
      ${POST ? `workgroupBarrier();
      ${SCALE ? `let tb = ssb[(sn0 + lane) * KC + kc];
      for (var i = 0u; i < BM; i++) {
        acc[i] += f32(cs[sg * BM * BN + i * BN + lane]) * (ssa[(sm0 + i) * KC + kc] * tb);
      }` : `acc[kc] += f32(cs[sg * BM * BN + lane]);`}
      workgroupBarrier();` : ""}
    }
    ${PREFETCH ? "" : "if (r + 1u < K / SK / KC) { fetch(lid, m0, t0, n_tok, r + 1u); }"}
  }
  ${POST ? "" : tiles.map(([i, j]) => `subgroupMatrixStore<row_major>(&out, (t0 + sn0 + ${j}u * SN) * M + m0 + sm0 + ${i}u * SM, c${i}${j}, M);`).join("\n  ")}
  ${POST ? "for (var i = 0u; i < BM; i++) { out[(t0 + sn0 + lane) * M + m0 + sm0 + i] = acc[i]; }" : ""}
}`;
  const variants = {
    base: { SGS: 4, KC: 1, PREFETCH: false, POST: true },
    sg8: { SGS: 8, KC: 1, PREFETCH: true, POST: true },
    noscale: { SGS: 4, KC: 1, PREFETCH: true, POST: true, SCALE: false },
    nopost: { SGS: 4, KC: 1, PREFETCH: true, POST: false },
    nopost2: { SGS: 4, KC: 2, PREFETCH: true, POST: false },
    nopost8: { SGS: 8, KC: 2, PREFETCH: true, POST: false },
  };
  const buf = (bytes, fill) => {
    const b = device.createBuffer({ size: bytes, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC });
    if (fill) {
      const words = new Uint32Array(bytes / 4);
      for (let i = 0; i < words.length; i++) words[i] = fill(i);
      device.queue.writeBuffer(b, 0, words);
    }
    return b;
  };
  const f1 = new Float32Array([1.0]);
  const one = new Uint32Array(f1.buffer)[0];
  const small = (i) => ((i * 2654435761) >>> 0) & 0x0F0F0F0F;         // bytes 0..15 (a Q4_K nibble)
  const a = buf(M * K, small);
  const sa = buf(M * K / 8, () => one);
  const sb = buf(N * K / 8, () => one);
  const o = buf(M * N * 4);
  const b = buf(PLANES * N * K, small);
  // output (token 5, row 7) as the host's integer dot product has it (every scale is 1)
  let want = 0;
  for (let k = 0; k < K; k++) {
    const w = (small((7 * K + k) >> 2) >>> (8 * (k & 3))) & 0xFF;
    let x = 0;
    for (let p = 0; p < PLANES; p++) x += ((small((p * N * K + 5 * K + k) >> 2) >>> (8 * (k & 3))) & 0xFF) * 256 ** p;
    want += w * x;
  }
  const clocksUp = device.createCommandEncoder();   // the GPU's clocks up before the first variant
  for (let i = 0; i < 50; i++) clocksUp.copyBufferToBuffer(a, 0, o, 0, M * K);
  device.queue.submit([clocksUp.finish()]);
  await device.queue.onSubmittedWorkDone();
  out.runs = {};
  for (const [key, v] of Object.entries(variants)) {
    const module = device.createShaderModule({ code: source(v) });
    const ci = await module.getCompilationInfo();
    const errors = ci.messages.filter((m) => m.type === "error").map((m) => `${m.lineNum}:${m.linePos} ${m.message}`);
    if (errors.length) { out.runs[key] = { errors: errors.slice(0, 3).map((e) => e.slice(0, 400)) }; continue; }
    device.pushErrorScope("validation");
    const pipeline = device.createComputePipeline({ layout: "auto", compute: { module, entryPoint: "main" } });
    const group = device.createBindGroup({ layout: pipeline.getBindGroupLayout(0), entries:
      [a, b, sa, sb, o].map((buffer, binding) => ({ binding, resource: { buffer } })) });
    const perr = await device.popErrorScope();
    if (perr) { out.runs[key] = { errors: [perr.message.slice(0, 400)] }; continue; }
    const tm = 32 * v.SGS / 2;
    const run = async (n) => {
      const enc = device.createCommandEncoder();
      const pass = enc.beginComputePass();
      pass.setPipeline(pipeline); pass.setBindGroup(0, group);
      for (let r = 0; r < n; r++) pass.dispatchWorkgroups(M / tm, N / 64);
      pass.end();
      device.queue.submit([enc.finish()]);
      await device.queue.onSubmittedWorkDone();
    };
    await run(5);
    const t = performance.now();
    await run(REPS);
    const ms = (performance.now() - t) / REPS;
    out.runs[key] = { ms: +ms.toFixed(4), tops: +(2 * M * N * K / ms / 1e9).toFixed(1) };
    if (!v.POST || v.SCALE === false) continue;   // no scaled result to check
    const read = device.createBuffer({ size: 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    const enc = device.createCommandEncoder();
    enc.copyBufferToBuffer(o, (5 * M + 7) * 4, read, 0, 4);
    device.queue.submit([enc.finish()]);
    await read.mapAsync(GPUMapMode.READ);
    Object.assign(out.runs[key], { got: new Float32Array(read.getMappedRange())[0], want });
  }
  return JSON.stringify(out);
})()
