"""The GPU side of the core: dispatch builders per kernel family and the per-token plan.

Nothing here imports a host: kernels are compiled and bound through cera.device.Device."""
