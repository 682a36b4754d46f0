"""A GGUF byte source over a JS Blob or File (a local file, or a model cached in OPFS).

`read` is synchronous (the worker's FileReaderSync): the header parser and the few small
tensors the core converts on the CPU read through it. Weight uploads never do: the
host recognises a BlobSource and moves those bytes in JavaScript.
"""
from __future__ import annotations


class BlobSource:
    """`size` and `read(offset, n)` over a Blob, with the first bytes kept in Python."""

    PREFIX = 1 << 20

    def __init__(self, blob, host):
        self.blob, self._host = blob, host      # host: the JS GpuHost (its readBlob)
        self.size = int(blob.size)
        self.name = str(getattr(blob, "name", "") or "model.gguf")
        self.bytes_read = 0                     # bytes that came into wasm memory through read()
        self._prefix = self._read(0, min(self.size, self.PREFIX))

    def _read(self, offset: int, n: int) -> bytes:
        data = self._host.readBlob(self.blob, offset, n).to_bytes()
        self.bytes_read += len(data)
        return data

    def read(self, offset: int, n: int) -> bytes:
        end = min(offset + n, self.size)
        if end <= len(self._prefix):
            return self._prefix[offset:end]
        return self._read(offset, end - offset)
