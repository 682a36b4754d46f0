"""Which loops Chromium's shader compiler guards, kernel by kernel.

Tint (Chromium's WGSL compiler) wraps every loop it cannot prove finite in a 64-bit iteration
counter, tested on each trip (robustness: a page must not hang the GPU). Only a loop of the form
`for (var i = INIT; i < BOUND; i++)` with a constant BOUND escapes it, which is why cera's kernels
count rounds instead of striding (shaders/matvec.wgsl). A guard costs a load, a compare and a
branch per trip, which the page's decode kernels paid for (docs/PERFORMANCE.md, decisions).

This loads a GGUF in the page (dist/web or --site) with Dawn's `dump_shaders` toggle, generates a
few tokens greedily and sampled, then again greedily with the opt-in 8-bit activations (their
integer kernels; cera.gpu.numerics), reads the WGSL and SPIR-V of every pipeline from Chromium's log
and prints, per kernel (shaders/NAME.wgsl), its pipelines, loops and guarded loops. No tool reads
this out of Chromium otherwise, hence the log parsing here.

    python scripts/guarded_loops.py MODEL.gguf [--site dist/web] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from chromium_shaders import guarded_loops, run_page  # noqa: E402  (tests/chromium_shaders.py)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path, help="a GGUF to load in the page")
    parser.add_argument("--site", type=Path, default=REPO / "dist" / "web",
                        help="the built site (python pyodide_build; default dist/web)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if not args.model.is_file():
        parser.error(f"{args.model}: no such file")
    if not (args.site / "index.html").exists():
        parser.error(f"{args.site} holds no built site: run python pyodide_build")
    from playwright.sync_api import sync_playwright
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        found = guarded_loops(run_page(pw.chromium, args.site, args.model, Path(tmp) / "chromium.log"))
    if args.json:
        print(json.dumps(found))
        return
    print(f"{'kernel':<20} {'pipelines':>9} {'loops':>6} {'guarded':>8}")
    for name, c in found.items():
        print(f"{name:<20} {c['pipelines']:>9} {c['loops']:>6} {c['guarded']:>8}")


if __name__ == "__main__":
    main()
