"""The site builder's command line (`python pyodide_build`, pyodide_build/__main__.py)."""
from __future__ import annotations

import argparse
from pathlib import Path

from . import fetch, site


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python pyodide_build",
        description="Assemble a self-contained static site (page, Pyodide 0.27.7, numpy, jinja2, cera) "
                    "from pinned, sha256-verified npm and PyPI parts. Serve the output folder with any "
                    "static file server, e.g. `python -m http.server -d dist/web`.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("dist/web"), help="folder to write the site into")
    parser.add_argument("--cache", type=Path, default=fetch.default_cache(),
                        help="where npm and PyPI downloads are kept between builds")
    parser.add_argument("--model", action="append", default=[], metavar="NAME",
                        help="bundle a model of cera's catalogue (e.g. smollm2-135m-instruct) into models/ "
                             "and the page's dropdown; may repeat")
    parser.add_argument("--gguf", action="append", default=[], type=Path, metavar="PATH",
                        help="bundle a local GGUF file into models/ and the dropdown; may repeat")
    parser.add_argument("--fetch-only", action="store_true",
                        help="only download and verify the pinned parts into --cache (no site is written)")
    args = parser.parse_args(argv)
    if args.fetch_only:
        fetch.prefetch(args.cache)
        print(f"pinned parts verified in {args.cache}")
        return 0
    info = site.build(args.out, args.cache, args.model, args.gguf)
    print(f"built {args.out}: {info['bytes'] / 1e6:.1f} MB without models; "
          f"{len(info['packages'])} wheels, {len(info['models'])} bundled models")
    return 0

