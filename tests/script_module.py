"""A script of scripts/ loaded as a module, for the tests of that script (test_shape_clone.py,
test_kernels_matvec.py's iq_grids), without putting scripts/ on sys.path."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load(name: str) -> ModuleType:
    """scripts/{name}.py as the module `name` (loaded once)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module   # before running it: dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]
