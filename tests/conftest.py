"""Shared fixtures: one native GPU device (lavapipe on machines without a GPU) per session, and
the synthetic models of tests/synth.py, each written once.

The engine's default backend ("auto") would run the numpy reference on lavapipe; the tests
ask for the GPU (here and in every `python -m cera` they start) so its kernels are what runs."""
import os

import pytest

os.environ["CERA_BACKEND"] = "gpu"


@pytest.fixture(scope="session")
def device():
    from cera.native import NativeDevice
    return NativeDevice()


@pytest.fixture(scope="session")
def gpu(device):
    """The device with a kernel cache, for the kernel tests."""
    import types
    from cera.kernels import Kernels
    return types.SimpleNamespace(device=device, kernels=Kernels(device))


@pytest.fixture(scope="session")
def synth_gguf(tmp_path_factory):
    """variant name (synth.VARIANTS) -> its GGUFFile, written on first use."""
    from cera.gguf_file import GGUFFile
    from synth import write_variant
    folder, opened = tmp_path_factory.mktemp("synth"), {}

    def get(name: str):
        if name not in opened:
            opened[name] = GGUFFile.open(write_variant(folder / f"{name}.gguf", name))
        return opened[name]
    return get
