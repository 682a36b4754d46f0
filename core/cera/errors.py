"""The errors cera raises on purpose, one type per thing a user can act on.

Every other exception is a bug. Callers choose what to do by type, never by matching the
message: the CLI exits with `exit_status` (and prints `{"error": {"type", "message"}}` under
`--json`), the page picks its advice by `name`, the server maps them to HTTP statuses.
Each type also derives from the builtin a caller would have caught before (ValueError for
bad input, RuntimeError for GPU failures), so `except ValueError` keeps working.
"""
from __future__ import annotations


class CeraError(Exception):
    """Base of cera's errors. `type` is the JSON name, `name` (the class name) the page's."""
    type = "error"
    exit_status = 1

    @property
    def name(self) -> str:
        return type(self).__name__

    def to_dict(self) -> dict:
        return {"type": self.type, "message": str(self)}


class InvalidArgument(CeraError, ValueError):
    """A request that cannot be run as given (empty prompt, token id out of range, bad option)."""
    type = "invalid_argument"
    exit_status = 2


class ModelNotFound(CeraError, FileNotFoundError):
    """No such model file or catalogue name."""
    type = "model_not_found"
    exit_status = 3


class BadFile(CeraError, ValueError):
    """Not a GGUF, a truncated or corrupt one, or a download whose checksum does not match."""
    type = "bad_file"
    exit_status = 4


class TruncatedFile(BadFile):
    """A GGUF that ends before its header or tensors do: an interrupted download or copy."""
    type = "truncated_file"
    exit_status = 12


class Unsupported(CeraError, ValueError):
    """A valid GGUF cera cannot run: its architecture, a weight type, a hyperparameter."""
    type = "unsupported"
    exit_status = 5


class TooLarge(CeraError, ValueError):
    """The model does not fit this GPU's limits (buffer size, binding size, workgroups)."""
    type = "too_large"
    exit_status = 6


class ContextFull(CeraError, ValueError):
    """The tokens do not fit the context that was allocated."""
    type = "context_full"
    exit_status = 7


class NoGpu(CeraError, RuntimeError):
    """No WebGPU adapter: no driver natively, or no WebGPU in the browser."""
    type = "no_gpu"
    exit_status = 8


class DeviceLost(CeraError, RuntimeError):
    """The GPU device was lost (driver reset, out of memory)."""
    type = "device_lost"
    exit_status = 9


class ShaderError(CeraError, RuntimeError):
    """This adapter's WebGPU compiler rejected a kernel."""
    type = "shader_error"
    exit_status = 10


class GpuError(CeraError, RuntimeError):
    """WebGPU rejected an operation (a validation error: a cera bug for this adapter)."""
    type = "gpu_error"
    exit_status = 11


ERRORS = (InvalidArgument, ModelNotFound, BadFile, TruncatedFile, Unsupported, TooLarge, ContextFull, NoGpu,
          DeviceLost, ShaderError, GpuError)
