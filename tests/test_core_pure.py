"""The core imports neither host: every module of `cera` except the native host loads, and a
model runs on the numpy reference, with `wgpu` and `js` made unimportable."""
import subprocess
import sys

from synth import write_variant

SCRIPT = """
import importlib, pkgutil, sys
sys.modules["wgpu"] = sys.modules["js"] = sys.modules["pyodide"] = None   # import of either raises
import cera
modules = [m.name for m in pkgutil.walk_packages(cera.__path__, "cera.") if not m.name.startswith(("cera.native", "cera.__main__"))]
for name in modules:
    importlib.import_module(name)
import asyncio
from cera.engine import Engine
from cera.gguf_file import GGUFFile
engine = asyncio.run(Engine.load(GGUFFile.open(sys.argv[1]), None, ctx=32))
print(len(modules), asyncio.run(engine.generate("hello", 3, stop_at_eos=False)).tokens)
"""


def test_core_imports_no_host(tmp_path):
    path = write_variant(tmp_path / "m.gguf", "llama_q4_0")
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    n_modules, tokens = out.stdout.split(maxsplit=1)
    assert int(n_modules) >= 20 and tokens.startswith("[")


def test_a_host_import_would_be_caught(tmp_path):
    """The blocking works: importing the native host under it fails."""
    code = 'import sys; sys.modules["wgpu"] = None; import cera.native'
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "wgpu" in out.stderr
