"""The Step uniform (shaders/common.wgsl `struct Step`), written once per submission."""
import struct

STEP_BYTES = 16


def pack_step(pos: int, n_tokens: int) -> bytes:
    # struct Step { pos: u32, n_tokens: u32, _pad0: u32, _pad1: u32 }
    return struct.pack("<4I", pos, n_tokens, 0, 0)
