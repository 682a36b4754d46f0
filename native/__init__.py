"""The native host: cera's Device interface on wgpu-py (Vulkan, Metal, D3D12)."""
from .device import NativeDevice

__all__ = ["NativeDevice"]
