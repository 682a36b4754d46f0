"""cera in the browser: a Device over WebGPU from Pyodide (host), Blob byte sources, and the
worker's session (app) that loads a GGUF and generates."""
