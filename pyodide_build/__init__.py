"""Builds cera's static web site (page + Pyodide + verified wheels): `python -m pyodide_build --help`."""
