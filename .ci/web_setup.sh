#!/bin/bash
# The browser tests' system part: Debian's Chromium (WebGPU on SwiftShader; Playwright drives it,
# never `playwright install`), npm for the Pyodide runtime, Playwright for Python, then one build
# of the static site so the downloads (npm pyodide@0.27.7, PyPI wheels, ~80 MB) are cached in
# ~/.cache/cera/pyodide_build before pytest starts. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v npm >/dev/null 2>&1 || need+=(npm)
command -v node >/dev/null 2>&1 || need+=(nodejs)
if [ ${#need[@]} -gt 0 ]; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
python3 -c "import playwright, pytest_playwright" 2>/dev/null || python3 -m pip install -q "playwright==1.65.2" pytest-playwright
python3 -m pyodide_build --out dist/web
