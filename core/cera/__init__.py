"""cera: GGUF language models on WebGPU compute shaders.

    import cera
    m = cera.load("smollm2-135m-instruct")
    print(m.generate("The capital of France is", max_tokens=8).text)
    fast = cera.load("qwen2.5-coder-1.5b-instruct", numerics=cera.Numerics(int8=True))   # opt-in speed
    f32 = cera.load("smollm2-135m-instruct", numerics=cera.Numerics(cache_type_k="f32", cache_type_v="f32"))

`load` and `Model` (cera.api) are imported on first use: the browser imports the core's modules
without the thread-backed API.
"""


def __getattr__(name: str):
    if name in ("load", "Model"):
        from cera import api
        return getattr(api, name)
    if name == "Numerics":
        from cera.gpu.numerics import Numerics
        return Numerics
    raise AttributeError(f"module 'cera' has no attribute {name!r}")


__all__ = ["load", "Model", "Numerics"]
