"""Which loops Chromium's shader compiler (Tint) guards with an iteration counter, kernel by
kernel: a page run with Dawn's `dump_shaders` toggle (`run_page`), its log's WGSL and SPIR-V
read back (`guarded_loops`). Used by test_web_kernels.py and scripts/guarded_loops.py (which
says why it matters).
"""
from __future__ import annotations

import collections
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# A log message starts with "[pid:tid:date/time:LEVEL:source(line)] "
_MESSAGE = re.compile(r"^\[\d+:\d+:\d+/\d+\.\d+:\w+:[^\]]*\] ", re.M)
_WGSL, _SPIRV = '"// Dumped WGSL:', '"/* Dumped SPIRV disassembly */'


def chromium_args(log: Path) -> list[str]:
    """Flags that make Chromium write every pipeline's WGSL and SPIR-V to `log`."""
    return ["--enable-dawn-features=dump_shaders", "--enable-logging", f"--log-file={log}", "--v=0"]


def _kernels() -> dict[str, str]:
    """The first line of each shader's header -> its name (each shader's must be its own)."""
    heads = {}
    for path in sorted((REPO / "shaders").glob("*.wgsl")):
        first = path.read_text().splitlines()[0]
        if first in heads:
            raise ValueError(f"{path.name} and {heads[first]}.wgsl start with the same line: tell them apart")
        heads[first] = path.stem
    return heads


def _kernel(wgsl: str, heads: dict[str, str]) -> str:
    """The shader a dumped WGSL was built from: its first comment line (the defines come first)."""
    first = next((line for line in wgsl.splitlines()[1:] if line.startswith("//")), "")
    return heads.get(first, "?")


def _loops(spirv: str) -> tuple[int, int]:
    """(loops, guarded loops) of a SPIR-V disassembly. Tint's guard is the first thing in a loop's
    body: load the vec2<u32> counter, compare it with zero, all(), branch out. A loop whose
    constant bound is 0 (`i < 0u`: its trip never runs for these defines) keeps a guard but pays
    nothing for it, and is not counted."""
    lines = spirv.splitlines()
    starts = [i for i, line in enumerate(lines) if "OpLoopMerge" in line]

    def guarded(i: int) -> bool:
        head, condition = lines[i + 1:i + 6], lines[i + 6:i + 14]
        return (any("OpAll %bool" in line for line in head) and any("%v2uint" in line for line in head)
                and not any("OpULessThan %bool" in line and line.endswith(" %uint_0") for line in condition))

    return len(starts), sum(map(guarded, starts))


def guarded_loops(log_text: str) -> dict[str, dict[str, int]]:
    """kernel -> {"pipelines", "loops", "guarded"} summed over the pipelines in a Chromium log."""
    heads = _kernels()
    totals: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    kernel = None
    for message in _MESSAGE.split(log_text):
        if message.startswith(_WGSL):
            kernel = _kernel(message, heads)
        elif message.startswith(_SPIRV) and kernel is not None:
            loops, guarded = _loops(message)
            totals[kernel].update(pipelines=1, loops=loops, guarded=guarded)
            kernel = None
    return {name: dict(counts) for name, counts in sorted(totals.items())}


def run_page(browser_type, site: Path, model: Path, log: Path, prompt: str = "Hi") -> str:
    """Load `model` in the site with the dump flags, generate greedily and sampled, reload it with
    int8 numerics and generate greedily; the log's text."""
    from web_fixtures import generate, open_engine_page
    from web_site import CHROMIUM, CHROMIUM_ARGS, Server
    server = Server(site)
    try:
        url = server.add(model, f"guarded-loops/{model.name}")
        browser = browser_type.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS + chromium_args(log),
                                      headless=True)
        try:
            page = open_engine_page(browser, server, boot_ms=300_000)   # cera.js in a page, an engine booted
            page.evaluate("(url) => engine.reload(url)", url)
            generate(page, prompt, 3)
            generate(page, prompt, 3, temperature=0.8, top_k=40)
            page.evaluate("(url) => engine.reload(url, {int8: true})", url)
            generate(page, prompt, 3)
        finally:
            browser.close()
    finally:
        server.close()
    return log.read_text(errors="replace")
