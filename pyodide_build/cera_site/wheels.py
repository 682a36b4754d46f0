"""Wheels the site ships that no registry has in a form Pyodide can install.

Wheels written here are reproducible: fixed timestamps, sorted members, so the
same inputs always give the same sha256 (the site's lock file records it).
"""
from __future__ import annotations

import base64
import re
import hashlib
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

_EPOCH = (1980, 1, 1, 0, 0, 0)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_pure_wheel(out_dir: Path, name: str, version: str, files: dict[str, bytes], metadata: str) -> Path:
    """A py3-none-any wheel holding `files` (archive path -> bytes)."""
    dist_info = f"{name}-{version}.dist-info"
    members = dict(sorted(files.items()))
    members[f"{dist_info}/METADATA"] = metadata.encode()
    members[f"{dist_info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: cera pyodide_build\n"
                                     b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in members.items())
    members[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    path = out_dir / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for member, data in members.items():
            info = zipfile.ZipInfo(member, _EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            wheel.writestr(info, data)
    return path


def pure_wheel_from_sdist(sdist: Path, src_dir: str, package: str, out_dir: Path) -> Path:
    """A pure-Python wheel of `package` from its sdist: only the .py files under `src_dir`.

    For packages whose C speedups are optional (MarkupSafe falls back to
    markupsafe._native, PyYAML to its pure-Python loader when _yaml is missing)."""
    files, metadata = {}, None
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/", 1)
            if len(parts) < 2 or not member.isfile():
                continue
            rel = parts[1]
            if rel == "PKG-INFO":
                metadata = tar.extractfile(member).read().decode()
            elif rel.startswith(src_dir + "/") and rel.endswith((".py", "py.typed")) and rel.count("/") == src_dir.count("/") + 1:
                files[f"{package}/" + rel.rsplit("/", 1)[1]] = tar.extractfile(member).read()
    if metadata is None or f"{package}/__init__.py" not in files:
        raise RuntimeError(f"{sdist} has no {src_dir}/__init__.py and PKG-INFO")
    field = lambda key: next(line.split(":", 1)[1].strip() for line in metadata.splitlines()
                             if line.startswith(key + ":"))
    return write_pure_wheel(out_dir, re.sub(r"[-_.]+", "_", field("Name")).lower(), field("Version"), files, metadata)


def cera_web_wheel(web_dir: Path, version: str, out_dir: Path) -> Path:
    """The browser host (web/cera_web/*.py) as its own small wheel."""
    files = {f"cera_web/{p.name}": p.read_bytes() for p in sorted((web_dir / "cera_web").glob("*.py"))}
    metadata = (f"Metadata-Version: 2.1\nName: cera_web\nVersion: {version}\n"
                "Summary: cera's Device over the browser's WebGPU, for Pyodide\n")
    return write_pure_wheel(out_dir, "cera_web", version, files, metadata)


def cera_wheel(repo: Path, out_dir: Path) -> Path:
    """`pip wheel --no-deps .` of this repository (shaders ride along as package data)."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                        "--wheel-dir", tmp, str(repo)], check=True)
        built = list(Path(tmp).glob("cera-*.whl"))
        if len(built) != 1:
            raise RuntimeError(f"pip wheel built {built}, expected one cera wheel")
        target = out_dir / built[0].name
        target.write_bytes(built[0].read_bytes())
    return target
