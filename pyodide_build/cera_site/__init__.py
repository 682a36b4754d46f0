"""cera_site: builds cera's static web site (page + Pyodide + verified wheels), run as
`python pyodide_build --help` from the repository root.

The builder lives in the folder pyodide_build/ but its import package is `cera_site`, so that it
never shadows PyPI's pyodide-build (import name `pyodide_build`) when both are installed: the
folder has no __init__.py, and pyodide_build/__main__.py puts the folder itself on sys.path
before importing cera_site.
"""
