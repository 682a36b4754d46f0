"""Drive cera's static page in headless Chromium over the DevTools protocol (aiohttp only: the
H200 machine has no Playwright) and time it the way `python -m cera bench` does: a random
512-token prompt, 128 greedy tokens, EOS ignored, every run from `engine.reset()` (the engine
would otherwise reuse the cached prompt and prefill one token), best of 3 after a warm-up.

    python3 browser_bench.py CHROMIUM SITE_URL MODEL_URL [flags...]
Prints one JSON object: adapter info, load result, bench figures, host calls. With PROFILE=1 in
the environment, also the GPU-time report of `cera.gpu.profile` from inside the page (a decode
step at KV length 513 and a 512-token prompt, as `scripts/profile_decode.py` prints natively),
with Chromium's timestamp quantization off (100 us steps otherwise). With SHADERS=DIR, each
DIR/NAME.wgsl replaces shaders/NAME.wgsl in the page before the model loads: an A/B of shader
variants on one build. With PROBE_JS=FILE, FILE's expression (resolving to a JSON string, e.g.
subgroup_matrix_probe.js) is evaluated in the page instead of the bench. With PRELOAD=CODE, that
Python runs in the page's worker before the model loads (e.g. a module's tuning table replaced).
With INT8=1 the model loads with the page's 8-bit activations (cera.gpu.numerics' int8). With
SAMPLING='{"temperature": 0.7, "top_k": 40, "seed": 1}' (cera.sampling.Sampler's fields), the
bench's tokens are drawn by that sampler instead of greedily. With RUN_PY=FILE, that Python runs in
the worker once the model is loaded, instead of the bench (its last expression: a JSON string),
e.g. constrained.py's page half.
"""
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

BENCH = """
import json, numpy as np
from cera.sampling import Sampler
from cera_web.session import sessions
e = sessions[-1].engine
ids = np.random.default_rng(0).integers(0, e.cfg.vocab_size, 512).tolist()
settings = json.loads(%r)
runs = []
for i in range(4):
    e.reset()
    r = await e.generate(ids, 128, stop_at_eos=False, sampler=Sampler(**settings))
    if i:
        runs.append(r)
json.dumps({"prefill_tokens_per_s": max(r.prefill_tokens_per_s for r in runs),
            "decode_tokens_per_s": max(r.decode_tokens_per_s for r in runs),
            "decode_runs": [r.decode_tokens_per_s for r in runs],
            "dispatches_per_token": e.backend.dispatches_per_token, "sampling": Sampler(**settings).label,
            "adapter": e.backend.device.adapter_name})
"""

PROFILE = """
from cera.gpu import profile
from cera_web.session import sessions
model = sessions[-1].engine.backend
lines = await profile.decode_report(model, 512, 2500.0, 12)
model.reset()
lines += await profile.prefill_report(model, list(range(1, 513)), 12)
"\\n".join(lines)
"""
OVERRIDE = """
import json
from cera import kernels
sources = json.loads(%r)
kernels.override(sources)
json.dumps(sorted(sources))
"""
ADAPTER = """(async () => { const a = await navigator.gpu?.requestAdapter({powerPreference: 'high-performance'});
    if (!a) return 'no adapter'; const i = a.info || {}; return JSON.stringify({vendor: i.vendor, architecture: i.architecture,
    device: i.device, description: i.description, features: [...a.features]}); })()"""
GENERATE = """(async () => {   // 32 greedy tokens streamed, as the page's Generate button asks for them
    const engine = testHook.engine;
    for await (const _ of await engine.completions.create({prompt: 'Hello', max_tokens: 32, temperature: 0, stream: true}));
    const r = (await engine.runtimeStats()).lastRequest;
    return JSON.stringify({n: r.tokens.length, d: r.decodeTokensPerS, calls: r.hostCalls, stop: r.stopReason});
})()"""
EXACT_TIMESTAMPS = ["--enable-webgpu-developer-features", "--disable-dawn-features=timestamp_quantization"]


async def main(chromium, site, model, flags):
    if os.environ.get("PROFILE"):
        flags = [*flags, *EXACT_TIMESTAMPS]
    port = 9333
    proc = subprocess.Popen([chromium, f"--remote-debugging-port={port}", "--user-data-dir=/tmp/chrprof",
                             "--no-first-run", "--no-sandbox", *flags, "about:blank"],
                            stdout=open("/tmp/chr.out", "w"), stderr=subprocess.STDOUT)
    out = {"flags": flags}
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(100):
                try:
                    async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                        targets = await r.json()
                    page = next(t for t in targets if t["type"] == "page")
                    break
                except Exception:
                    await asyncio.sleep(0.2)
            async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                n = [0]

                async def call(method, **params):
                    n[0] += 1
                    await ws.send_json({"id": n[0], "method": method, "params": params})
                    while True:
                        msg = await ws.receive_json()
                        if msg.get("id") == n[0]:
                            return msg

                async def js(expr, timeout=600):
                    r = await asyncio.wait_for(call("Runtime.evaluate", expression=expr, awaitPromise=True,
                                                    returnByValue=True), timeout)
                    res = r.get("result", {})
                    if "exceptionDetails" in res:
                        return {"error": res["exceptionDetails"].get("exception", {}).get("description")
                                or res["exceptionDetails"].get("text")}
                    return res.get("result", {}).get("value")

                out["raw_adapter"] = await js(ADAPTER, 60)
                await call("Page.navigate", url=site)
                await asyncio.sleep(3)
                out["first_adapter"] = await js("""(async () => { const a = await navigator.gpu?.requestAdapter({powerPreference: 'high-performance'});
                    return a ? (a.info || {}).vendor : 'no adapter'; })()""", 60)
                await call("Page.reload")      # the GPU process can fail its first start here (then restarts)
                await asyncio.sleep(2)
                t = time.time()
                if os.environ.get("PROBE_JS"):
                    await asyncio.sleep(1)
                    out["probe"] = await js(Path(os.environ["PROBE_JS"]).read_text(), 300)
                    return
                if os.environ.get("PROBE"):
                    await asyncio.sleep(1)
                    out["adapter"] = await js(ADAPTER, 60)
                    return
                # the demo's engine, through its test hook (web/app.js)
                out["ready"] = await js("window.testHook ? 1 : new Promise(r => { const i = setInterval(() => { if (window.testHook) { clearInterval(i); r(1); } }, 100); })", 120)
                out["info"] = await js("testHook.engine.ready.then(i => JSON.stringify(i))", 300)
                out["startup_s"] = round(time.time() - t, 1)
                if os.environ.get("SHADERS"):
                    sources = {f.name: f.read_text() for f in sorted(Path(os.environ["SHADERS"]).glob("*.wgsl"))}
                    out["shaders"] = await js(f"testHook.engine.python({json.dumps(OVERRIDE % json.dumps(sources))})", 60)
                if os.environ.get("PRELOAD"):
                    code = os.environ["PRELOAD"] + "\n'done'"
                    out["preload"] = await js(f"testHook.engine.python({json.dumps(code)})", 60)
                options = json.dumps({"int8": True} if os.environ.get("INT8") == "1" else {})   # older builds: none
                out["load"] = await js(f"testHook.engine.reload({json.dumps(model)}, {options}).then(m => JSON.stringify(m))",
                                       600)
                if os.environ.get("NO_BENCH"):
                    return
                if os.environ.get("RUN_PY"):   # that Python in the worker instead of the bench (a JSON string)
                    out["run"] = await js(f"testHook.engine.python({json.dumps(Path(os.environ['RUN_PY']).read_text())})",
                                          1800)
                    return
                out["generate"] = await js(GENERATE, 600)
                bench = BENCH % os.environ.get("SAMPLING", "{}")
                out["bench"] = await js(f"testHook.engine.python({json.dumps(bench)})", 900)
                out["stats"] = await js("testHook.engine.runtimeStats().then(s => JSON.stringify(s))", 60)
                if os.environ.get("PROFILE"):
                    out["profile"] = await js(f"testHook.engine.python({json.dumps(PROFILE)})", 900)
    finally:
        proc.terminate()
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]))
