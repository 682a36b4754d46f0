"""A Hugging Face Hub on 127.0.0.1, for the tests: the endpoints huggingface_hub 2.4.0 calls
to list a repo and fetch a file (and web/hub.js calls from the page), over files held in memory.

    GET  /api/models/ORG/REPO/tree/REV[/PATH]?recursive=...   the listing (LFS sha256 for .gguf files)
    HEAD /ORG/REPO/resolve/REV/PATH    X-Repo-Commit, ETag, X-Linked-Etag, X-Linked-Size, Content-Length
    GET  /ORG/REPO/resolve/REV/PATH    the bytes; `Range: bytes=N-` answered with 206
    GET  /files/NAME                   a plain file, not on the Hub (Range answered too)

An unknown repo or file is a 404 with the X-Error-Code the Hub sends (any other path a plain
404). Every response allows any origin to read it (CORS), Content-Length included. Faults on
demand: `cut` (paths whose next GET without a Range stops half-way and drops the connection),
`corrupt` (paths served with one byte changed, same size, while the listing and ETag keep the
true sha256). `gets` records every GET of a file: (path, its Range header or None).
"""
from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_RESOLVE = re.compile(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)")
_TREE = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?")


class FakeHub:
    def __init__(self):
        self.repos: dict[str, dict[str, bytes]] = {}   # repo -> {path: bytes}
        self.files: dict[str, bytes] = {}               # plain files: name -> bytes
        self.cut: set[str] = set()
        self.corrupt: set[str] = set()
        self.gets: list[tuple[str, str | None]] = []
        handler = type("Handler", (_Handler,), {"hub": self})
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def gets_of(self, path: str) -> list[str | None]:
        """The Range headers of the GETs of `path` so far (None: none)."""
        return [r for p, r in self.gets if p == path]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "FakeHub":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _entry(path: str, data: bytes) -> dict:
    entry = {"type": "file", "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(), "size": len(data),
             "path": path}
    if path.endswith(".gguf"):
        entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
    return entry


class _Handler(http.server.BaseHTTPRequestHandler):
    hub: FakeHub

    def log_message(self, *args):
        pass

    def end_headers(self):
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Access-Control-Expose-Headers", "Content-Length, Content-Range, ETag, X-Repo-Commit")
        super().end_headers()

    def do_HEAD(self):
        self._answer(body=False)

    def do_GET(self):
        self._answer(body=True)

    def _answer(self, body: bool):
        path = unquote(urlparse(self.path).path)
        if m := _TREE.fullmatch(path):
            return self._tree(m["repo"], m["path"] or "")
        if m := _RESOLVE.fullmatch(path):
            repo = self.hub.repos.get(m["repo"])
            if repo is None:
                return self._error(404, "RepoNotFound")
            if m["file"] not in repo:
                return self._error(404, "EntryNotFound")
            data = repo[m["file"]]
            sha = hashlib.sha256(data).hexdigest()
            headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{sha}"', "X-Linked-Etag": f'"{sha}"',
                       "X-Linked-Size": str(len(data))}
            return self._file(f"{m['repo']}/{m['file']}", data, headers, body)
        if path.startswith("/files/") and path[7:] in self.hub.files:
            return self._file(path, self.hub.files[path[7:]], {}, body)
        self._send(404, b"not found", {})

    def _tree(self, repo: str, under: str):
        files = self.hub.repos.get(repo)
        if files is None:
            return self._error(404, "RepoNotFound")
        entries = [_entry(p, data) for p, data in sorted(files.items()) if p.startswith(under)]
        folders = sorted({p.rsplit("/", 1)[0] for p in files if "/" in p})
        entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": f} for f in folders]
        self._send(200, json.dumps(entries).encode(), {"Content-Type": "application/json"})

    def _file(self, key: str, data: bytes, headers: dict, body: bool):
        if key in self.hub.corrupt:
            data = data[:-1] + bytes([data[-1] ^ 0xFF])
        if not body:
            return self._send(200, b"", {**headers, "Content-Length": str(len(data))}, body=False)
        rng = self.headers.get("Range")
        self.hub.gets.append((key, rng))
        start = int(re.fullmatch(r"bytes=(\d+)-", rng)[1]) if rng else 0
        if rng:
            headers = {**headers, "Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
        if not rng and key in self.hub.cut:
            self.hub.cut.discard(key)
            self.send_response(200)
            for k, v in {**headers, "Content-Length": str(len(data))}.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self._send(206 if rng else 200, data[start:], headers)

    def _error(self, status: int, code: str):
        self._send(status, b'{"error": "not found"}', {"X-Error-Code": code, "Content-Type": "application/json"})

    def _send(self, status: int, data: bytes, headers: dict, body: bool = True):
        self.send_response(status)
        headers.setdefault("Content-Length", str(len(data)))
        headers.setdefault("Accept-Ranges", "bytes")
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if body:
            self.wfile.write(data)
