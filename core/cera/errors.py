"""The errors cera raises on purpose, one type per thing a user can act on.

Every other exception is a bug. Callers choose what to do by type, never by matching the
message: the CLI exits with `exit_status` (and prints `{"error": {"type", "message"}}` under
`--json`), the page picks its advice by `name`, the server maps them to HTTP statuses.
Each type also derives from the builtin a caller would have caught before (ValueError for
bad input, RuntimeError for GPU failures), so `except ValueError` keeps working.
"""
from __future__ import annotations

import re


class CeraError(Exception):
    """Base of cera's errors. `type` is the JSON name (the class name in snake case), `name` (the
    class name) the page's, `exit_status` the CLI's, given where each type is declared."""
    type = "error"
    exit_status = 1

    def __init_subclass__(cls, exit_status: int, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.type = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()
        cls.exit_status = exit_status

    @property
    def name(self) -> str:
        return type(self).__name__

    def to_dict(self) -> dict:
        return {"type": self.type, "message": str(self)}


class InvalidArgument(CeraError, ValueError, exit_status=2):
    """A request that cannot be run as given (empty prompt, token id out of range, bad option)."""


class ModelNotFound(CeraError, FileNotFoundError, exit_status=3):
    """No such model file or catalogue name."""


class BadFile(CeraError, ValueError, exit_status=4):
    """Not a GGUF, a truncated or corrupt one, or a download whose checksum does not match."""


class TruncatedFile(BadFile, exit_status=12):
    """A GGUF that ends before its header or tensors do: an interrupted download or copy."""


class Unsupported(CeraError, ValueError, exit_status=5):
    """A valid GGUF cera cannot run: its architecture, a weight type, a hyperparameter."""


class TooLarge(CeraError, ValueError, exit_status=6):
    """The model does not fit this GPU's limits (buffer size, binding size, workgroups)."""


class ContextFull(CeraError, ValueError, exit_status=7):
    """The tokens do not fit the context that was allocated."""


class NoGpu(CeraError, RuntimeError, exit_status=8):
    """No WebGPU adapter: no driver natively, or no WebGPU in the browser."""


class DeviceLost(CeraError, RuntimeError, exit_status=9):
    """The GPU device was lost (driver reset, out of memory)."""


class ShaderError(CeraError, RuntimeError, exit_status=10):
    """This adapter's WebGPU compiler rejected a kernel."""


class GpuError(CeraError, RuntimeError, exit_status=11):
    """WebGPU rejected an operation (a validation error: a cera bug for this adapter)."""


ERRORS = (InvalidArgument, ModelNotFound, BadFile, TruncatedFile, Unsupported, TooLarge, ContextFull, NoGpu,
          DeviceLost, ShaderError, GpuError)
