"""Helpers for the browser tests: build the static site once, serve it from 127.0.0.1.

Chromium is Debian's /usr/bin/chromium (never `playwright install`), headless with WebGPU
on SwiftShader.
"""
from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from pathlib import Path

CHROMIUM = os.environ.get("CERA_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--headless=new", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                 "--enable-unsafe-webgpu"]
REPO = Path(__file__).resolve().parent.parent


def build_site(out: Path, ggufs=()) -> Path:
    """python pyodide_build --out OUT (cached downloads make repeats fast)."""
    from cera_site import site
    site.build(out, site.fetch.default_cache(), ggufs=list(ggufs))
    return out


class _Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".mjs": "text/javascript", ".js": "text/javascript", ".wasm": "application/wasm"}
    cors = False   # answer with Access-Control-Allow-Origin: *

    def end_headers(self):
        if self.cors:
            self.send_header("Access-Control-Allow-Origin", "*")
        super().end_headers()

    def log_message(self, *args):
        pass


class _CorsHandler(_Handler):
    cors = True


class Server:
    """http.server on 127.0.0.1 in a thread, serving `root`; extra files can be added under it.
    No COOP/COEP headers (the site needs no cross-origin isolation); with `cors`, every
    response allows any origin to read it."""

    def __init__(self, root: Path, cors: bool = False):
        self.root = Path(root)
        handler = functools.partial(_CorsHandler if cors else _Handler, directory=str(self.root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def add(self, path: Path, name: str) -> str:
        """Serve a copy (hard link where possible) of `path` at url + name."""
        target = self.root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            target.unlink()
        try:
            os.link(path, target)
        except OSError:
            shutil.copyfile(path, target)
        return self.url + name

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
