"""Shared fixtures: one native GPU device (lavapipe on machines without a GPU) per session."""
import pytest


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
