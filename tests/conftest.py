"""Shared fixtures: one native GPU device (lavapipe on machines without a GPU) per session."""
import pytest


@pytest.fixture(scope="session")
def device():
    from cera.native import NativeDevice
    return NativeDevice()
