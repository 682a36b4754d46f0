"""`python pyodide_build`: assemble the static site that runs cera in the browser.

This folder holds the site builder, the import package `cera_site`; it is not itself a package
(no __init__.py), so an installed pyodide-build (PyPI's, import name `pyodide_build`) is never
shadowed by it. Run as a path, Python puts this folder on sys.path; run otherwise
(`python -m pyodide_build` with no pyodide-build installed), it is put there here.
"""
import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from cera_site.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
