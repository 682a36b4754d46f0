"""Shared fixtures: one native GPU device (lavapipe on machines without a GPU) per session, and
the synthetic models of tests/synth.py, each written once; the browser tests' Chromium, site,
cera.js engine page and demo page (tests/web_fixtures.py), once for the session. `--webgpu-baseline` makes that device
one at WebGPU's default limits without shader-f16 or subgroups (CI runs the GPU tests so once).

The engine's default backend ("auto") would run the numpy reference on lavapipe; the tests
ask for the GPU (here and in every `python -m cera` they start) so its kernels are what runs."""
import os

import pytest

from web_fixtures import browser, engine_page, models, page, pw, server, site, synth  # noqa: F401  (shared)

os.environ["CERA_BACKEND"] = "gpu"


def pytest_addoption(parser):
    parser.addoption("--webgpu-baseline", action="store_true",
                     help="the GPU tests' device at WebGPU's default limits, without shader-f16 or subgroups")


def pytest_configure(config):
    if config.getoption("--webgpu-baseline"):
        os.environ["CERA_WEBGPU_BASELINE"] = "1"   # the `python -m cera` the tests start, too


def pytest_collection_modifyitems(config, items):
    """Under --webgpu-baseline only the tests on the shared device run: the rest have nothing to
    show about it."""
    if config.getoption("--webgpu-baseline"):
        off = [item for item in items if "device" not in getattr(item, "fixturenames", ())]
        config.hook.pytest_deselected(items=off)
        items[:] = [item for item in items if "device" in getattr(item, "fixturenames", ())]
    # The browser tests after every other (in their order): their Playwright, one for the session,
    # keeps an event loop running in this thread, where asyncio.run() would fail.
    items.sort(key=lambda item: "pw" in getattr(item, "fixturenames", ()))


@pytest.fixture(scope="session")
def device(request):
    from cera.native import NativeDevice
    return NativeDevice(baseline=request.config.getoption("--webgpu-baseline"))


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
