"""python3 .varA/wallprof.py MODEL.gguf: wallprof_code.py natively."""
import ast, asyncio, os, sys
from cera.engine import Engine
from cera.gguf_file import GGUFFile
from cera.native import NativeDevice

async def main(path):
    g = {"ENGINE": await Engine.load(GGUFFile.open(path), NativeDevice(), ctx=2048), "__name__": "wallprof"}
    code = compile(open(os.path.join(os.path.dirname(__file__), "wallprof_code.py")).read(), "wallprof_code.py",
                   "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    await eval(code, g)
    print(g["RESULT"], flush=True)

asyncio.run(main(sys.argv[1]))
