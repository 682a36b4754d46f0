"""The static site the browser tests load: built by `python pyodide_build` from pinned,
verified parts (downloads cached in ~/.cache/cera), its wheels reproducible, its command line.
No browser runs here."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile


from web_site import REPO


def test_build_is_verified_and_self_contained(site):
    lock = json.loads((site / "pyodide" / "pyodide-lock.json").read_text())
    assert lock["info"]["version"] == "0.27.7"
    from pyodide_lock import PyodideLockSpec
    PyodideLockSpec.from_json(site / "pyodide" / "pyodide-lock.json").check_wheel_filenames()   # valid, consistent
    assert set(lock["packages"]) == {"numpy", "jinja2", "markupsafe", "pyyaml", "gguf", "cera", "cera-web"}
    from cera_site import manifest
    pinned = {"numpy": "ebb61241",   # Pyodide 0.27.7's own lock file lists this hash for its numpy wheel
              "jinja2": manifest.JINJA2.sha256, "gguf": manifest.GGUF.sha256}
    for name, sha in pinned.items():   # the wheels taken whole from PyPI/npm keep the hashes pinned upstream
        assert lock["packages"][name]["sha256"].startswith(sha), name
    # (the wheels built here are checked by Pyodide itself against the lock as the page installs them)
    for name in ("index.html", "app.js", "worker.js", "gpu.js", "models.js", "style.css", "catalogue.json",
                 "cera.js", "cera.d.ts", "errors.js", "example.html", "grammar.js", "xgrammar/index.js",
                 "pyodide/pyodide.mjs", "pyodide/pyodide.asm.wasm", "pyodide/python_stdlib.zip"):
        assert (site / name).is_file(), name
    with zipfile.ZipFile(site / "pyodide" / lock["packages"]["cera"]["file_name"]) as wheel:
        names = wheel.namelist()
    assert "cera/shaders/matvec.wgsl" in names and "cera/gpu/model.py" in names
    with zipfile.ZipFile(site / "pyodide" / lock["packages"]["markupsafe"]["file_name"]) as wheel:
        assert not [n for n in wheel.namelist() if n.endswith((".c", ".so"))]
        assert wheel.read("markupsafe-3.0.3.dist-info/WHEEL").endswith(b"Tag: py3-none-any\n")


def test_pure_wheels_are_reproducible(tmp_path):
    from cera_site import fetch, manifest, wheels
    pure = manifest.PURE_SDISTS[0]
    sdist = fetch.pypi_file(fetch.default_cache(), pure.sdist)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = wheels.pure_wheel_from_sdist(sdist, pure.src_dir, pure.package, tmp_path / "a")
    b = wheels.pure_wheel_from_sdist(sdist, pure.src_dir, pure.package, tmp_path / "b")
    assert a.read_bytes() == b.read_bytes()


def test_cli_help():
    out = subprocess.run([sys.executable, "pyodide_build", "--help"], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout
    assert "--out" in out and "dist/web" in out and "--gguf" in out


def test_the_builder_never_shadows_pypis_pyodide_build(tmp_path):
    """With a regular package `pyodide_build` installed (PyPI's pyodide-build; a stand-in here)
    and the repository root ahead of it on the path, `import pyodide_build` finds the installed
    one, and `python pyodide_build` still runs the site builder (cera_site)."""
    installed = tmp_path / "site-packages" / "pyodide_build"
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text("WHO = 'pypi'\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(installed.parent),
                                                        os.environ.get("PYTHONPATH", "")])}
    found = subprocess.run([sys.executable, "-c", "import pyodide_build; print(pyodide_build.WHO)"], env=env,
                           capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert found.strip() == "pypi"
    out = subprocess.run([sys.executable, "pyodide_build", "--help"], env=env, capture_output=True, text=True,
                         check=True, cwd=REPO).stdout
    assert "--out" in out and "--gguf" in out


def test_the_pages_cera_wheel_holds_no_site_builder(site):
    """The cera wheel the page installs holds the package alone: nothing of pyodide_build/."""
    lock = json.loads((site / "pyodide" / "pyodide-lock.json").read_text())
    with zipfile.ZipFile(site / "pyodide" / lock["packages"]["cera"]["file_name"]) as wheel:
        tops = {name.split("/")[0] for name in wheel.namelist()}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"cera"}
