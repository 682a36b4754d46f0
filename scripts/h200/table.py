"""The side-by-side table of one device run: decode and prefill tok/s per engine and model, from
the files scripts/h200/device.sh leaves in a folder, as a Markdown table.

    python scripts/h200/table.py OUT_DIR MODEL_NAME [...] [--history CSV] [--source NAME] [--date DAY] [--gpu NAME]

Files read (TAG: empty, or a tree's name when several trees ran): cera-native{TAG}-{model}.json
(`python -m cera bench --json`), cera-browser{TAG}-{model}.json (browser_bench.py),
llamacpp-{cuda,vk}-{model}.json (`llama-bench -o json`), plan{TAG}-{model}.json (plan totals), and
generate[-before]-{SETTING}-{model}.json (`python -m cera generate --chat -n 256 --json`, device.sh
sampling with BEFORE: an older tree's and this one's), as a second table.
Decode: cera after its bench prompt (512 tokens, or device.sh's DEPTH), llama.cpp at each depth
of its file (-d, flash attention; a row per depth past 0).

Each table also appends its rows (those with figures) to the run history, docs/perf/history.csv
(--history; '' for none): date, source (the run's folder, or --source), GPU, model, engine, prefill
and decode tok/s and the depth decode was measured at. A row the file already has (same source,
model, engine, depth) is not added again.
"""
import argparse
import csv
import datetime
import json
from pathlib import Path

HISTORY = Path(__file__).resolve().parents[2] / "docs" / "perf" / "history.csv"
HISTORY_FIELDS = ("date", "source", "gpu", "model", "engine", "prefill_tok_s", "decode_tok_s", "depth")


def load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def rows(out: Path, model: str):
    """(engine, decode tok/s, prefill tok/s, note, decode depth) for every result of `model` in `out`."""
    for path in sorted(out.glob(f"cera-native*-{model}.json")):
        tag = path.name[len("cera-native"): -len(f"-{model}.json")]
        c, plan = load(path), load(out / f"plan{tag}-{model}.json") or {}
        if c and "decode_tokens_per_s" in c:
            note = f"{c['dispatches_per_token']} dispatches/token, decode after {c['prompt_tokens']} tokens"
            if plan:
                note += f", {plan['bytes_read'] / 1e6:.0f} MB read/token"
            yield f"cera native{tag}", c["decode_tokens_per_s"], c["prefill_tokens_per_s"], note, c["prompt_tokens"]
        elif c is not None or path.exists():
            yield f"cera native{tag}", None, None, "failed: " + str(c)[:100], None
    for path in sorted(out.glob(f"cera-browser*-{model}.json")):
        tag = path.name[len("cera-browser"): -len(f"-{model}.json")]
        b = load(path)
        bench = b.get("bench") if b else None
        if isinstance(bench, str):
            r = json.loads(bench)
            yield f"cera Chromium{tag}", r["decode_tokens_per_s"], r["prefill_tokens_per_s"], \
                f"adapter {b.get('first_adapter')}", r.get("prompt_tokens", 512)
        else:
            yield f"cera Chromium{tag}", None, None, "failed: " + str((b or {}).get("info") or b)[:100], None
    for engine in ("cuda", "vk"):
        runs = load(out / f"llamacpp-{engine}-{model}.json") or []
        pp = max([r["avg_ts"] for r in runs if r["n_prompt"] and r.get("n_depth") == 0] or [0])
        tg = {d: max(r["avg_ts"] for r in runs if r["n_gen"] and r.get("n_depth") == d)
              for d in sorted({r.get("n_depth") for r in runs if r["n_gen"]})}
        for depth in [d for d in tg if d] or [0]:
            yield f"llama.cpp {engine}", tg.get(depth, 0), pp, \
                f"decode at depth {depth}" + (f"; {tg[0]:.0f} at depth 0" if 0 in tg else ""), depth


def gpu_of(out: Path) -> str:
    """The GPU the run's cera JSONs name (its adapter, less the API), else llama-bench's."""
    for path in sorted(out.glob("cera-native*.json")):
        adapter = (load(path) or {}).get("adapter")
        if isinstance(adapter, str) and adapter:
            return adapter.split(" via ")[0]
    for path in sorted(out.glob("llamacpp-*.json")):
        runs = load(path) or []
        if runs and runs[0].get("gpu_info"):
            return runs[0]["gpu_info"]
    return ""


def append_history(path: Path, rows_seen: list[dict]) -> None:
    """Add the table's rows to the history CSV at `path`, each (source, model, engine, depth) once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    old = list(csv.DictReader(path.open())) if path.exists() else []
    have = {(r["source"], r["model"], r["engine"], r["depth"]) for r in old}
    new = [r for r in rows_seen if (r["source"], r["model"], r["engine"], r["depth"]) not in have]
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, HISTORY_FIELDS, lineterminator="\n")
        if not old:
            w.writeheader()
        w.writerows(new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the folder device.sh's files are in")
    ap.add_argument("models", nargs="+", help="model names as in the files (smollm2, qwen15, ...)")
    ap.add_argument("--history", default=str(HISTORY), help="the CSV a row per result is appended to ('': none)")
    ap.add_argument("--source", help="the run's name in the history (default: the folder's path)")
    ap.add_argument("--date", help="the run's day, YYYY-MM-DD (default: today, UTC)")
    ap.add_argument("--gpu", help="the GPU's name (default: the adapter the files name)")
    args = ap.parse_args()
    out, models = args.out, args.models
    seen = []
    print("| model | engine | decode tok/s | prefill 512 tok/s | |")
    print("| --- | --- | ---: | ---: | --- |")
    for model in models:
        for engine, decode, prefill, note, depth in rows(out, model):
            fmt = lambda v: "-" if v is None else f"{v:,.0f}"
            print(f"| {model} | {engine} | {fmt(decode)} | {fmt(prefill)} | {note} |")
            if decode or prefill:
                seen.append(dict(model=model, engine=engine, prefill_tok_s=f"{prefill or 0:.0f}",
                                 decode_tok_s=f"{decode or 0:.0f}", depth=str(depth)))
    print("decode: at the depth each row's note gives (llama.cpp: -d, flash attention); prefill: cera's bench "
          "prompt, llama.cpp's 512 at depth 0")
    replies = [(model, path) for model in models for path in sorted(out.glob(f"generate-*-{model}.json"))]
    if replies:
        print("\n| model | tree, sampling | decode tok/s | tokens |\n| --- | --- | ---: | ---: |")
    for model, path in replies:
        r = load(path) or {}
        name = path.name[len("generate-"): -len(f"-{model}.json")]
        print(f"| {model} | {name} | {r.get('decode_tokens_per_s', 0):,.0f} | {len(r.get('tokens', []))} |")
    if args.history and seen:
        day = args.date or datetime.datetime.now(datetime.timezone.utc).date().isoformat()
        gpu, source = args.gpu or gpu_of(out), args.source or out.as_posix()
        append_history(Path(args.history), [dict(r, date=day, source=source, gpu=gpu) for r in seen])


if __name__ == "__main__":
    main()
