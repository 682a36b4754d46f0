"""The side-by-side table of one device run: decode and prefill tok/s per engine and model, from
the files scripts/h200/device.sh leaves in a folder, as a Markdown table.

    python scripts/h200/table.py OUT_DIR MODEL_NAME [...]

Files read (TAG: empty, or a tree's name when several trees ran): cera-native{TAG}-{model}.json
(`python -m cera bench --json`), cera-browser{TAG}-{model}.json (browser_bench.py),
llamacpp-{cuda,vk}-{model}.json (`llama-bench -o json`), plan{TAG}-{model}.json (plan totals), and
generate[-before]-{SETTING}-{model}.json (`python -m cera generate --chat -n 256 --json`, device.sh
sampling with BEFORE: an older tree's and this one's), as a second table.
Decode: cera after its bench prompt (512 tokens, or device.sh's DEPTH), llama.cpp at each depth
of its file (-d, flash attention; a row per depth past 0).
"""
import json
import sys
from pathlib import Path


def load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def rows(out: Path, model: str):
    """(engine, decode tok/s, prefill tok/s, note) for every result of `model` in `out`."""
    for path in sorted(out.glob(f"cera-native*-{model}.json")):
        tag = path.name[len("cera-native"): -len(f"-{model}.json")]
        c, plan = load(path), load(out / f"plan{tag}-{model}.json") or {}
        if c and "decode_tokens_per_s" in c:
            note = f"{c['dispatches_per_token']} dispatches/token, decode after {c['prompt_tokens']} tokens"
            if plan:
                note += f", {plan['bytes_read'] / 1e6:.0f} MB read/token"
            yield f"cera native{tag}", c["decode_tokens_per_s"], c["prefill_tokens_per_s"], note
        elif c is not None or path.exists():
            yield f"cera native{tag}", None, None, "failed: " + str(c)[:100]
    for path in sorted(out.glob(f"cera-browser*-{model}.json")):
        tag = path.name[len("cera-browser"): -len(f"-{model}.json")]
        b = load(path)
        bench = b.get("bench") if b else None
        if isinstance(bench, str):
            r = json.loads(bench)
            yield f"cera Chromium{tag}", r["decode_tokens_per_s"], r["prefill_tokens_per_s"], \
                f"adapter {b.get('first_adapter')}"
        else:
            yield f"cera Chromium{tag}", None, None, "failed: " + str((b or {}).get("info") or b)[:100]
    for engine in ("cuda", "vk"):
        runs = load(out / f"llamacpp-{engine}-{model}.json") or []
        pp = max([r["avg_ts"] for r in runs if r["n_prompt"] and r.get("n_depth") == 0] or [0])
        tg = {d: max(r["avg_ts"] for r in runs if r["n_gen"] and r.get("n_depth") == d)
              for d in sorted({r.get("n_depth") for r in runs if r["n_gen"]})}
        for depth in [d for d in tg if d] or [0]:
            yield f"llama.cpp {engine}", tg.get(depth, 0), pp, \
                f"decode at depth {depth}" + (f"; {tg[0]:.0f} at depth 0" if 0 in tg else "")


def main() -> None:
    out, models = Path(sys.argv[1]), sys.argv[2:]
    print("| model | engine | decode tok/s | prefill 512 tok/s | |")
    print("| --- | --- | ---: | ---: | --- |")
    for model in models:
        for engine, decode, prefill, note in rows(out, model):
            fmt = lambda v: "-" if v is None else f"{v:,.0f}"
            print(f"| {model} | {engine} | {fmt(decode)} | {fmt(prefill)} | {note} |")
    print("decode: at the depth each row's note gives (llama.cpp: -d, flash attention); prefill: cera's bench "
          "prompt, llama.cpp's 512 at depth 0")
    replies = [(model, path) for model in models for path in sorted(out.glob(f"generate-*-{model}.json"))]
    if replies:
        print("\n| model | tree, sampling | decode tok/s | tokens |\n| --- | --- | ---: | ---: |")
    for model, path in replies:
        r = load(path) or {}
        name = path.name[len("generate-"): -len(f"-{model}.json")]
        print(f"| {model} | {name} | {r.get('decode_tokens_per_s', 0):,.0f} | {len(r.get('tokens', []))} |")


if __name__ == "__main__":
    main()
